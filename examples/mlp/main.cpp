// The main demo: a 16-layer CPU network trained for a few steps on the host backend under
// keep-all, remat, and offload (latency-hidden and naive), then under a device budget that
// keep-all exceeds. Prints one table and a gradient checksum per policy; the checksums are
// bitwise equal. `--json` prints the same as JSON, `--trace FILE` writes the offload run's
// timeline as Chrome trace JSON.
#include "example.hpp"
#include "mlp.hpp"

#include <tide/tide.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct run_result {
  std::string name;
  tide::step_summary summary;
  double step_ms = 0;
  float first_loss = 0, last_loss = 0;
  std::uint64_t checksum = 0;
  std::string error;
};

struct options {
  mlp::config net;
  int steps = 4;
  double link_ratio = 0.5;  // copy time over the compute time it can hide behind
  bool json = false;
  std::string trace;
};

options parse(int argc, char** argv) {
  options o;
  example::cli cli("mlp");
  cli.flag("--json", o.json, "print the results as JSON")
      .option("--trace", o.trace, "FILE", "write the latency-hidden offload run's timeline as Chrome trace JSON")
      .option("--layers", o.net.layers, "N", "layers (at least 2)")
      .option("--width", o.net.width, "N", "features per row")
      .option("--batch", o.net.batch, "N", "rows per batch")
      .option("--steps", o.steps, "N", "steps per policy (at least 2; the first is a warm-up)")
      .option("--link-ratio", o.link_ratio, "R", "copy time over the compute time it can hide behind");
  cli.parse(argc, argv);
  if (o.net.layers < 2 || o.net.width == 0 || o.net.batch == 0 || o.steps < 2 || !(o.link_ratio > 0))
    cli.fail("need --layers >= 2, --steps >= 2, a positive width, batch and link ratio");
  return o;
}

run_result train(std::string name, options const& opt, tide::schedule const& s, tide::host_backend_options bo,
                 tide::timeline* keep_trace = nullptr) {
  run_result r;
  r.name = std::move(name);
  try {
    tide::host_backend backend(bo);
    tide::timeline tl;
    tide::executor exec(backend, s, {.timeline = &tl});
    mlp::network net(opt.net);
    auto fwd = [&](auto const& ctx) { net.forward(ctx); };
    auto bwd = [&](auto const& ctx) { net.backward(ctx); };
    double total_ms = 0;
    for (int i = 0; i < opt.steps; ++i) {
      auto const t0 = std::chrono::steady_clock::now();
      exec.step(fwd, bwd);
      auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) total_ms += ms;  // the first step warms caches and queues
      if (i == 0) r.first_loss = net.loss();
      r.last_loss = net.loss();
      r.checksum = net.update();
    }
    r.step_ms = total_ms / (opt.steps - 1);
    r.summary = tide::summarize(tl, s);
    if (keep_trace) *keep_trace = tl;
  } catch (tide::error const& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  auto const opt = parse(argc, argv);
  auto const stack = mlp::make_stack(opt.net);
  using tide::placement;
  tide::buffer_spec const buffers{.staging_buffers = 3};
  tide::strategy const keep_all{.buffers = buffers};
  tide::strategy const remat{.policy = {tide::rule_spec{.where = placement::remat, .slots = {"pre_act", "act", "inv_rms"}}},
                             .buffers = buffers};
  // The last layer's activations are used right after they are produced: keep them.
  tide::policy_spec const offload{tide::rule_spec{
      .where = placement::offload, .slots = {"input", "pre_act", "act"}, .last_layer = opt.net.layers - 1}};
  tide::strategy const hidden{.policy = offload, .buffers = buffers, .pipeline = {.prefetch_distance = 2}};
  tide::strategy const naive{
      .policy = offload, .buffers = buffers, .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1}};

  auto const s_keep = tide::build_schedule(stack, keep_all);
  auto const s_remat = tide::build_schedule(stack, remat);
  auto const s_hidden = tide::build_schedule(stack, hidden);
  auto const s_naive = tide::build_schedule(stack, naive);

  // Pace the link so that the offloads take `link_ratio` of the forward compute time they hide
  // behind, and the prefetches `link_ratio` of the backward compute time.
  auto const base = train("keep-all", opt, s_keep, {});
  auto const bytes = static_cast<double>(s_hidden.peak_host_bytes());
  tide::host_backend_options paced;
  paced.d2h = {.bytes_per_second = bytes / (opt.link_ratio * base.summary.forward_us * 1e-6)};
  paced.h2d = {.bytes_per_second = bytes / (opt.link_ratio * base.summary.backward_us * 1e-6)};

  tide::timeline trace;
  std::vector<run_result> runs;
  runs.push_back(train("keep-all", opt, s_keep, paced));
  runs.push_back(train("remat", opt, s_remat, paced));
  runs.push_back(train("offload (copies on compute stream)", opt, s_naive, paced));
  runs.push_back(train("offload (latency hiding)", opt, s_hidden, paced, &trace));

  // A device budget keep-all exceeds and latency-hidden offload fits.
  auto budget_opts = paced;
  budget_opts.device_budget = s_hidden.peak_device_bytes();
  auto over = train("keep-all under budget", opt, s_keep, budget_opts);
  auto fits = train("offload under budget", opt, s_hidden, budget_opts);
  runs.push_back(over);
  runs.push_back(fits);

  bool same = true;
  for (auto const& r : runs)
    if (r.error.empty() && r.checksum != runs[0].checksum) same = false;
  bool const descended = runs[0].last_loss < runs[0].first_loss;

  if (!opt.trace.empty()) {
    std::ofstream f(opt.trace);
    tide::write_chrome_trace(f, trace, s_hidden, "tide mlp: offload (latency hiding)");
  }

  if (opt.json) {
    std::vector<example::json_object> rows;
    for (auto const& r : runs) {
      auto& j = rows.emplace_back();
      j.field("policy", r.name);
      if (!r.error.empty()) {
        j.field("error", r.error);
        continue;
      }
      auto const& s = r.summary;
      j.field("step_ms", r.step_ms, 3)
          .field("predicted_device_bytes", s.predicted_device_bytes)
          .field("measured_device_bytes", s.measured_device_bytes)
          .field("host_bytes", s.predicted_host_bytes)
          .field("exposed_transfer_ms", s.exposed_transfer_us / 1000, 3)
          .field("overlap", s.overlap_fraction, 3)
          .field("first_loss", r.first_loss)
          .field("last_loss", r.last_loss)
          .field("checksum", example::hex(r.checksum));
    }
    example::json_object out;
    out.field("layers", opt.net.layers)
        .field("width", opt.net.width)
        .field("batch", opt.net.batch)
        .field("steps", opt.steps)
        .field("d2h_bytes_per_second", paced.d2h.bytes_per_second, 0)
        .field("h2d_bytes_per_second", paced.h2d.bytes_per_second, 0)
        .field("device_budget", budget_opts.device_budget)
        .field("checksums_equal", same)
        .field("loss_decreased", descended)
        .raw("runs", example::json_array(rows));
    std::printf("%s\n", out.str().c_str());
  } else {
    std::printf("tide mlp demo: %u layers, width %u, batch %u, %d steps; link paced at %.1f MB/s d2h, %.1f MB/s h2d "
                "(copies = %.0f%% of the compute they can hide behind)\n\n",
                opt.net.layers, opt.net.width, opt.net.batch, opt.steps, paced.d2h.bytes_per_second / 1e6,
                paced.h2d.bytes_per_second / 1e6, opt.link_ratio * 100);
    example::table t({{"policy", -36},
                      {"step ms", 9},
                      {"pred device", 12},
                      {"meas device", 12},
                      {"host", 11},
                      {"exposed ms", 11},
                      {"overlap", 8},
                      {"loss", 10},
                      {"grad checksum", -13, 2}});
    for (auto const& r : runs) {
      if (!r.error.empty()) {
        t.note(r.name, r.error);
        continue;
      }
      auto const& s = r.summary;
      t.row({r.name, example::fixed(r.step_ms, 2), tide::format_bytes(static_cast<double>(s.predicted_device_bytes)),
             tide::format_bytes(static_cast<double>(s.measured_device_bytes)),
             tide::format_bytes(static_cast<double>(s.predicted_host_bytes)), example::fixed(s.exposed_transfer_us / 1000, 2),
             tide::overlap_text(s), example::fixed(r.last_loss, 6), example::hex(r.checksum)});
    }
    t.print();
    std::printf("\ndevice budget %s: keep-all %s; offload %s\n",
                tide::format_bytes(static_cast<double>(budget_opts.device_budget)).c_str(),
                over.error.empty() ? "fits" : "does not fit (out_of_memory)", fits.error.empty() ? "fits" : "fails");
    std::printf("gradient checksums %s; loss %s (%.6f -> %.6f)\n", same ? "bitwise equal" : "DIFFER",
                descended ? "decreased" : "did NOT decrease", runs[0].first_loss, runs[0].last_loss);
  }
  // On tiny stacks the staging and source buffers can cost more than offloading saves; then
  // keep-all fits the budget too, and that is the right answer.
  bool const keep_should_fit = s_keep.peak_device_bytes() <= budget_opts.device_budget;
  bool const ok = same && descended && over.error.empty() == keep_should_fit && fits.error.empty();
  return ok ? 0 : 1;
}
