// The gradient of a seismic misfit by the adjoint-state method, with the states of the reverse
// sweep kept, recomputed or moved to host memory as tide's checkpointing schedules say.
//
// A 2-D acoustic wave equation (wave.hpp) runs `--steps` steps forward; its adjoint runs them
// backward and needs every state in reverse order. This program reverses the chain with:
//   - store-all: every state kept (Revolve with as many snapshots as steps);
//   - the configuration asked for: `--snapshots S` device snapshots (the initial state included)
//     and, with `--host-snapshots H > 0`, H host snapshots (tide::two_tier_plan), else one tier
//     (tide::revolve_schedule, binomial checkpointing: optimal forward recomputations);
//   - with `--disk-snapshots K --disk-dir PATH`, K disk snapshots too (tide::three_tier_plan):
//     states written to an unlinked file in PATH through a host snapshot and read back ahead of
//     use (io_uring with O_DIRECT where the file system allows), the disk's rates measured first
//     (tide::calibrate_storage);
// each timed in tide's chain model (tide::evaluate_chain), then run by tide's executor: the time
// stepper is a stack of one layer per step whose carry is the state; the strategy's checkpoints
// store, offload and recompute the states, the builder expands them into ops, the checker proves
// them, and the host backend runs them with real data (copies between the tiers on its d2h and
// h2d threads, overlapped with the steps) under `--device-budget`. The gradients are bitwise
// equal whatever the schedule (each backward step reads the same state), and a Taylor test shows
// the gradient is right: the remainder |J(m + h dm) - J(m) - h <g, dm>| falls as h^2.
//
//   adjoint [--steps N] [--size N] [--snapshots S] [--host-snapshots H] [--disk-snapshots K --disk-dir PATH]
//           [--device-budget BYTES] [--json] [--trace FILE] [--check]
//
// `--check` exits 1 unless the gradients are bitwise equal, the one-tier run's extra forward
// steps equal the closed form t(n, s) - (n - 1) (docs/checkpointing.md), and the Taylor order is
// at least 1.9.
#include <tide/plan/checkpointing.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "example.hpp"
#include "wave.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  int steps = 400;
  int size = 160;
  int snapshots = 8;
  int host_snapshots = 0;
  int disk_snapshots = 0;
  std::string disk_dir;
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();
  bool json = false;
  bool check = false;
  std::string trace;
};

struct outcome {
  std::string name;
  std::string error;  // out_of_memory under the budget
  int device_snapshots = 0, host_snapshots = 0, disk_snapshots = 0;
  std::vector<double> grad;
  std::int64_t forward_steps = 0;
  std::uint64_t advances = 0;     // the schedule's segment recomputations
  std::size_t device_bytes = 0, host_bytes = 0, disk_bytes = 0;
  std::string storage;  // the spill file's path and I/O (with disk snapshots)
  double ms = 0;
  double predicted_us = 0;  // tide's chain model (evaluate_chain) with the measured costs
  tide::schedule schedule;
  tide::timeline timeline;
};

//! The time stepper as a tide stack: one layer per step, no saved slots, the state s[n] as the
//! carry (layer n reads s[n] and writes s[n + 1]).
tide::stack_spec stepper(adjoint::problem const& P) {
  tide::stack_spec st;
  st.append({"step", {}}, static_cast<std::uint32_t>(P.steps));
  st.carry = {"state", P.state_size() * sizeof(double)};
  return st;
}

//! Runs the adjoint with tide's executor on the host backend (threads as streams: copies between
//! the tiers run on the d2h and h2d threads, overlapped with the steps). The schedule stores,
//! offloads and recomputes the states as `checkpoints` says; its device arena (the carry buffers)
//! and the adjoint state are under `budget` (tide::out_of_memory beyond it).
outcome reverse(adjoint::problem const& P, std::string name, tide::checkpoint_spec checkpoints,
                std::span<tide::chain_action const> model_actions, tide::chain_costs const& costs, std::size_t budget,
                std::string const& disk_dir = {}) {
  outcome o;
  o.name = std::move(name);
  o.device_snapshots = static_cast<int>(std::min<std::uint64_t>(checkpoints.device_snapshots, static_cast<std::uint64_t>(P.steps)));
  o.host_snapshots = static_cast<int>(checkpoints.host_snapshots);
  o.disk_snapshots = static_cast<int>(checkpoints.disk_snapshots);
  o.predicted_us = tide::evaluate_chain(P.steps, tide::chain_tiers{.device = o.device_snapshots, .host = o.host_snapshots, .disk = o.disk_snapshots},
                                        costs, model_actions)
                       .time_us;
  auto const S = P.state_size();
  auto const mu_bytes = S * sizeof(double);  // the adjoint state: device memory of the user's own
  o.schedule = tide::build_schedule(stepper(P), tide::strategy{.checkpoints = std::move(checkpoints)});
  o.advances = o.schedule.carry.advances;
  o.device_bytes = o.schedule.peak_device_bytes() + mu_bytes;
  o.host_bytes = o.schedule.peak_host_bytes();
  o.disk_bytes = o.schedule.peak_storage_bytes();
  tide::host_backend_options bo;
  bo.device_budget = budget > mu_bytes ? budget - mu_bytes : 0;
  bo.storage = {.directory = disk_dir, .quiet = true};  // the fallback, if any, is said in the table's header
  tide::host_backend backend(bo);
  std::vector<double> mu(S, 0.0);
  o.grad.assign(P.cells(), 0.0);
  try {
    tide::executor ex(backend, o.schedule, {.debug_checks = false, .check_schedule = true, .timeline = &o.timeline});
    auto in = ex.carry_input();
    std::fill(in.begin(), in.end(), std::byte{0});  // state 0: at rest (+0.0 is all zero bytes)
    auto forward = [&](auto const& c) {
      if (!c.produces_carry()) return;  // no recomputes: the stack saves no slots
      auto const from = c.template carry_in<double>();
      auto const to = c.template carry_out<double>();
      std::copy(from.begin(), from.end(), to.begin());
      adjoint::step(P, static_cast<int>(c.layer), to);
      ++o.forward_steps;
    };
    auto backward = [&](auto const& c) {
      auto const s = c.template carry_in<double>();
      if (c.layer + 1 == static_cast<std::uint32_t>(P.steps)) adjoint::seed(P, s, mu);
      adjoint::backward(P, static_cast<int>(c.layer), s, mu, o.grad);
    };
    auto const t0 = clock_type::now();
    ex.step(forward, backward);
    o.ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    if (auto const* f = backend.storage()) o.storage = f->description();
  } catch (tide::out_of_memory const& e) {
    o.error = e.what();
  } catch (tide::storage_error const& e) {  // the disk snapshots' file: not creatable, or the disk full
    o.error = e.what();
  }
  return o;
}

//! The model's costs, measured here: one forward step, one backward step, one state copy; with a
//! disk directory, one state written to and read from a file there (tide::calibrate_storage).
tide::chain_costs measure_costs(adjoint::problem const& P, std::string const& disk_dir) {
  std::vector<double> s(P.state_size(), 0.0), mu(P.state_size(), 0.0), g(P.cells(), 0.0), h(P.state_size());
  auto time_us = [](auto&& f) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < 5; ++r) {
      auto const t = clock_type::now();
      f();
      best = std::min(best, std::chrono::duration<double, std::micro>(clock_type::now() - t).count());
    }
    return best;
  };
  double const f = time_us([&] { adjoint::step(P, 0, s); });
  double const b = time_us([&] { adjoint::backward(P, 1, s, mu, g); });
  double const c = time_us([&] { std::memcpy(h.data(), s.data(), s.size() * sizeof(double)); });
  auto costs = tide::chain_costs::constant(f, b, c, c);
  if (!disk_dir.empty()) {
    auto const bytes = P.state_size() * sizeof(double);
    auto const link = tide::calibrate_storage({.directory = disk_dir, .quiet = true}, {.sizes = {bytes, 4 * bytes}, .repeats = 3});
    costs.disk_write_us = link.write.time_us(bytes);
    costs.disk_read_us = link.read.time_us(bytes);
  }
  return costs;
}

struct taylor_result {
  std::vector<double> remainders;  // for h0, h0/2, h0/4, ...
  double order = 0;                // the smallest observed order between consecutive h
};

//! |J(m + h dm) - J(m) - h <g, dm>| for halving h: second order when g is the gradient.
taylor_result taylor_test(adjoint::problem const& P, std::vector<double> const& grad) {
  std::vector<double> dm(P.cells(), 0.0);
  for (int z = 1; z < P.nz - 1; ++z)
    for (int x = 1; x < P.nx - 1; ++x) {
      double const u = static_cast<double>(x) / P.nx, w = static_cast<double>(z) / P.nz;
      dm[static_cast<std::size_t>(z * P.nx + x)] = 0.05 * std::sin(3.1 * u + 0.7) * std::cos(2.3 * w - 0.4);
    }
  double const j0 = adjoint::misfit(P);
  double gdm = 0;
  for (std::size_t c = 0; c < dm.size(); ++c) gdm += grad[c] * dm[c];
  taylor_result r;
  r.order = std::numeric_limits<double>::infinity();
  double h = 1.0;
  for (int k = 0; k < 5; ++k, h /= 2) {
    auto Q = P;
    for (std::size_t c = 0; c < dm.size(); ++c) Q.m[c] += h * dm[c];
    r.remainders.push_back(std::abs(adjoint::misfit(Q) - j0 - h * gdm));
    if (k > 0) r.order = std::min(r.order, std::log2(r.remainders[k - 1] / r.remainders[k]));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  example::cli cli("adjoint");
  cli.option("--steps", o.steps, "N", "time steps (default 400)")
      .option("--size", o.size, "N", "grid cells a side (default 160)")
      .option("--snapshots", o.snapshots, "S", "device snapshots, the initial state included (S >= steps: store all)")
      .option("--host-snapshots", o.host_snapshots, "H", "host snapshots (0: one tier)")
      .option("--disk-snapshots", o.disk_snapshots, "K", "disk snapshots (a file in --disk-dir; needs --host-snapshots >= 1)")
      .option("--disk-dir", o.disk_dir, "PATH", "directory of the disk snapshots' file (unlinked at once: nothing stays)")
      .option("--device-budget", o.device_budget, "BYTES", "device arena budget (default: none)")
      .flag("--json", o.json, "the results as JSON on stdout")
      .option("--trace", o.trace, "FILE", "Chrome trace of the checkpointed run")
      .flag("--check", o.check, "exit 1 unless gradients are bitwise equal, counts match the closed form, Taylor order >= 1.9");
  cli.parse(argc, argv);
  if (o.steps < 2) cli.fail("need --steps >= 2");
  if (o.size < 8) cli.fail("need --size >= 8");
  if (o.snapshots < 1) cli.fail("need --snapshots >= 1 (the initial state needs a slot)");
  if (o.host_snapshots < 0) cli.fail("need --host-snapshots >= 0");
  if (o.disk_snapshots < 0) cli.fail("need --disk-snapshots >= 0");
  if (o.disk_snapshots > 0 && o.disk_dir.empty()) cli.fail("--disk-snapshots needs --disk-dir PATH (a directory for the snapshots' file)");
  if (o.disk_snapshots > 0 && o.host_snapshots < 1)
    cli.fail("--disk-snapshots needs --host-snapshots >= 1 (every disk snapshot is written from and read into a host snapshot)");
  if (o.disk_snapshots == 0 && !o.disk_dir.empty()) cli.fail("--disk-dir without --disk-snapshots: give both");
  // Store-all keeps every state on the device: the disk tier would be dropped without a word.
  if (o.disk_snapshots > 0 && o.snapshots >= o.steps)
    cli.fail("--disk-snapshots " + std::to_string(o.disk_snapshots) + " with --snapshots " + std::to_string(o.snapshots) + " >= --steps " +
             std::to_string(o.steps) + " (store all: every state stays on the device, nothing goes to disk): give --snapshots "
             "below --steps, or drop --disk-snapshots and --disk-dir");
  if (!o.disk_dir.empty()) {  // looked at before anything runs, whatever the schedule
    std::error_code ec;
    if (!std::filesystem::is_directory(o.disk_dir, ec))
      cli.fail("--disk-dir " + o.disk_dir + ": " +
               (std::filesystem::exists(o.disk_dir, ec) ? "not a directory" : "no such directory") +
               " (give an existing directory for the disk snapshots' file)");
  }
  int const s = std::min(o.snapshots, o.steps);
  bool const two_tier = o.host_snapshots > 0 && s < o.steps;
  bool const three_tier = two_tier && o.disk_snapshots > 0;

  auto const P = adjoint::make_problem(o.size, o.steps);
  tide::chain_costs costs;
  try {
    costs = measure_costs(P, three_tier ? o.disk_dir : std::string());
  } catch (tide::storage_error const& e) {  // an unwritable or full directory: said by name
    std::fprintf(stderr, "adjoint: %s\n", e.what());
    return 2;
  }
  std::vector<outcome> runs;
  runs.push_back(reverse(P, "store all", {}, tide::revolve_schedule(o.steps, o.steps), costs, o.device_budget));
  if (s < o.steps)
    runs.push_back(reverse(P, "revolve, " + std::to_string(s) + " snapshots", {.device_snapshots = static_cast<std::uint32_t>(s)},
                           tide::revolve_schedule(o.steps, s), costs, o.device_budget));
  if (two_tier) {
    auto const plan = tide::two_tier_plan(o.steps, s, o.host_snapshots, costs);
    runs.push_back(reverse(P, "two tiers, " + std::to_string(s) + " + " + std::to_string(o.host_snapshots) + " host",
                           {.device_snapshots = static_cast<std::uint32_t>(s),
                            .host_snapshots = static_cast<std::uint32_t>(o.host_snapshots),
                            .reversal = plan.actions},
                           plan.actions, costs, o.device_budget));
  }
  if (three_tier) {
    auto const plan = tide::three_tier_plan(o.steps, {.device = s, .host = o.host_snapshots, .disk = o.disk_snapshots}, costs);
    runs.push_back(reverse(P,
                           "three tiers, " + std::to_string(s) + " + " + std::to_string(o.host_snapshots) + " host + " +
                               std::to_string(o.disk_snapshots) + " disk",
                           {.device_snapshots = static_cast<std::uint32_t>(s),
                            .host_snapshots = static_cast<std::uint32_t>(o.host_snapshots),
                            .reversal = plan.actions,
                            .disk_snapshots = static_cast<std::uint32_t>(o.disk_snapshots)},
                           plan.actions, costs, o.device_budget, o.disk_dir));
  }
  auto const& chosen = runs.back();
  if (!chosen.error.empty()) {
    std::fprintf(stderr, "adjoint: %s: %s\n", chosen.name.c_str(), chosen.error.c_str());
    return 1;
  }
  auto const taylor = taylor_test(P, chosen.grad);
  std::int64_t const closed_form = s < o.steps ? tide::revolve_extra_forwards(o.steps, s) : 0;

  bool equal = true;
  for (auto const& r : runs)
    if (r.error.empty() && r.grad != chosen.grad) equal = false;
  std::int64_t const one_tier_extra = runs.size() >= 2 && runs[1].error.empty() ? runs[1].forward_steps - o.steps : 0;
  bool const counts_ok = s >= o.steps || one_tier_extra == closed_form;

  if (o.json) {
    std::vector<example::json_object> rs;
    for (auto const& r : runs) {
      auto& j = rs.emplace_back();
      j.field("strategy", r.name)
          .field("snapshots", r.device_snapshots)
          .field("host_snapshots", r.host_snapshots)
          .field("disk_snapshots", r.disk_snapshots);
      if (!r.error.empty()) {
        j.field("error", r.error);
        continue;
      }
      j.field("forward_steps", r.forward_steps)
          .field("advance_ops", r.advances)
          .field("extra_forward_steps", r.forward_steps - o.steps)
          .field("peak_device_bytes", r.device_bytes)
          .field("peak_host_bytes", r.host_bytes)
          .field("peak_disk_bytes", r.disk_bytes)
          .field("step_ms", r.ms, 3)
          .field("predicted_ms", r.predicted_us / 1000, 3)
          .field("gradient_checksum", example::hex(adjoint::checksum(r.grad)));
    }
    example::json_object out;
    out.field("steps", o.steps)
        .field("size", o.size)
        .field("snapshots", chosen.device_snapshots)
        .field("host_snapshots", chosen.host_snapshots)
        .field("disk_snapshots", chosen.disk_snapshots)
        .field("forward_steps", chosen.forward_steps)
        .field("extra_forward_steps", chosen.forward_steps - o.steps)
        .field("revolve_extra_forward_steps", closed_form)
        .field("peak_device_bytes", chosen.device_bytes)
        .field("peak_host_bytes", chosen.host_bytes)
        .field("peak_disk_bytes", chosen.disk_bytes)
        .field("step_ms", chosen.ms, 3)
        .field("gradient_checksum", example::hex(adjoint::checksum(chosen.grad)))
        .field("gradients_bitwise_equal", equal)
        .field("taylor_order", taylor.order, 3)
        .raw("runs", example::json_array(rs, true));
    std::printf("%s\n", out.str().c_str());
  } else {
    std::printf("adjoint: 2-D acoustic wave, %d x %d cells, %d steps, one state %s; measured: step %.1f us, backward %.1f "
                "us, state copy %.1f us\n\n",
                o.size, o.size, o.steps, tide::format_bytes(static_cast<double>(P.state_size() * sizeof(double))).c_str(),
                costs.forward(0), costs.backward(0), costs.d2h_us);
    if (three_tier)
      std::printf("disk: write %.1f us, read %.1f us a state (measured); %s\n\n", costs.disk_write_us, costs.disk_read_us,
                  chosen.storage.c_str());
    example::table t({{"strategy", -36}, {"forward", 8}, {"extra", 7}, {"device", 11}, {"host", 11}, {"disk", 11}, {"ms", 9},
                      {"model ms", 9}, {"grad checksum", -16, 2}});
    for (auto const& r : runs) {
      if (!r.error.empty()) {
        t.note(r.name, r.error);
        continue;
      }
      t.row({r.name, std::to_string(r.forward_steps), std::to_string(r.forward_steps - o.steps),
             tide::format_bytes(static_cast<double>(r.device_bytes)), tide::format_bytes(static_cast<double>(r.host_bytes)),
             tide::format_bytes(static_cast<double>(r.disk_bytes)), example::fixed(r.ms, 1), example::fixed(r.predicted_us / 1000, 1), example::hex(adjoint::checksum(r.grad))});
    }
    t.print();
    std::printf("\ngradients %s; one-tier extra forward steps %lld, closed form t(n, s) - (n - 1) = %lld\n",
                equal ? "bitwise equal" : "DIFFER", static_cast<long long>(one_tier_extra), static_cast<long long>(closed_form));
    std::printf("Taylor test |J(m + h dm) - J(m) - h <g, dm>|:");
    for (auto e : taylor.remainders) std::printf(" %.3e", e);
    std::printf("\n  order %.3f (2 for a correct gradient)\n", taylor.order);
  }
  if (!o.trace.empty()) {
    std::ofstream out(o.trace);
    tide::write_chrome_trace(out, chosen.timeline, chosen.schedule, chosen.name);
  }
  if (o.check && (!equal || !counts_ok || !(taylor.order >= 1.9))) {
    std::fprintf(stderr, "adjoint: check failed:%s%s%s\n", equal ? "" : " gradients differ;",
                 counts_ok ? "" : " extra forward steps differ from the closed form;", taylor.order >= 1.9 ? "" : " Taylor order below 1.9");
    return 1;
  }
  return 0;
}
