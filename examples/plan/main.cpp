// examples/plan: what should I offload, and how fast will it be?
//
// For each preset model on each preset machine: the strategy table (keep all, full remat,
// offload with copies on the compute stream, with latency hiding, chunked with deeper prefetch,
// and the planner's choice), the plan as C++ types; then the calibration comparison on the host
// backend with a paced link: costs measured from a run, the sim's predicted step against the
// measured one.
//
//   plan [--seq N] [--micro-batch N] [--budget-fraction F] [--small] [--json] [--trace FILE]
//   plan --published [--json]
//
// --budget-fraction: the activation budget as a share of the keep-all peak (default 0.35).
// --small: a fast configuration (short sequences, fewer layers) for the test suite.
// --json: the tables as JSON on stdout. --trace FILE: the Chrome trace of the last planned
// schedule in the sim, and FILE.host.json the measured host run of the calibration.
// --published: the published GB200 experiment from physics (published.hpp): per strategy the step
// and its parts (forward, backward, recompute, exposed copies and collectives), model TFLOP/s per
// device, whole-device and activation peaks, host bytes, whether it fits and the largest
// micro-batch that fits, then the ceiling and a what-if; with --json the rows as JSON.
#include "example.hpp"
#include "published.hpp"

#include <tide/tide.hpp>  // the planner, calibration, simulation, host backend and traces
#include <tide/plan/policy_codegen.hpp>  // to_cpp_types (not in tide.hpp)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace {

struct args {
  std::optional<std::uint64_t> seq;  // none: the model's default (0 is refused; it had meant "not given")
  std::uint64_t micro_batch = 1;
  double budget_fraction = 0.35;
  bool small = false;
  bool json = false;
  bool published = false;
  std::string trace;
};

args parse(int argc, char** argv) {
  args a;
  example::cli cli("plan");
  cli.option("--seq", a.seq, "N", "sequence length (default: the model's)")
      .option("--micro-batch", a.micro_batch, "N", "sequences per micro-batch")
      .option("--budget-fraction", a.budget_fraction, "F", "the activation budget as a share of the keep-all peak")
      .flag("--small", a.small, "a fast configuration (short sequences, fewer layers)")
      .flag("--json", a.json, "the tables as JSON on stdout")
      .flag("--published", a.published, "the published GB200 experiment (DeepSeek-V3, Llama 3.1 405B) from physics")
      .option("--trace", a.trace, "FILE", "the sim's trace of the last planned schedule, and FILE.host.json");
  cli.parse(argc, argv);
  if (a.micro_batch == 0 || !(a.budget_fraction > 0)) cli.fail("need a positive --micro-batch and --budget-fraction");
  if (a.seq && *a.seq == 0) cli.fail("--seq 0: give a sequence length of at least 1, or leave --seq out for the model's");
  return a;
}

void spin_us(double us) {
  auto const until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

int published_experiment(bool json) {
  using namespace tide;
  std::vector<example::json_object> rows;
  for (auto const& hw : {hardware::gb200(), hardware::vera_rubin()})
    for (auto const& s : published::setups()) {
      resident_memory res;
      published::rows_of(s, hw, false, &res);
      auto const out = published::run(s, hw);
      if (!json) {
        auto const params = transformer_parameters(s.model);
        std::printf("\n== %s (%.0fB parameters, %s), micro-batch %llu, seq %llu, on 128 x %s: FSDP %u, EP %u, TP %u\n",
                    std::string(s.model.name).c_str(), params.total / 1e9, std::string(to_string(s.model.matmul)).c_str(),
                    static_cast<unsigned long long>(s.model.micro_batch), static_cast<unsigned long long>(s.model.seq_len),
                    std::string(hw.name).c_str(), s.training.layout.fsdp, s.training.layout.expert_parallel,
                    s.model.tensor_parallel);
        std::printf("  resident %.1f GiB (weights %.1f, gradients %.1f, optimizer %.1f, gathered %.1f, gradient buffer %.1f, "
                    "workspace %.1f, logits %.1f, all-to-all %.1f, collective buffers %.1f, fragmentation %.1f) of %.1f GiB "
                    "HBM; host %.1f GiB pinnable\n",
                    published::gib(res.total()), published::gib(res.weights), published::gib(res.gradients),
                    published::gib(res.optimizer), published::gib(res.gathered_weights), published::gib(res.gradient_buffer),
                    published::gib(res.workspace), published::gib(res.logits), published::gib(res.layer_workspace),
                    published::gib(res.collective_buffers), published::gib(res.fragmentation),
                    published::gib(hw.hbm_bytes), published::gib(hw.pinnable_host_bytes()));
        example::table t({{"strategy", -22}, {"step ms", 10}, {"fwd", 8}, {"bwd", 8}, {"recomp", 8}, {"copies", 7},
                          {"coll.", 7}, {"TFLOP/s", 8}, {"device GiB", 10}, {"activ. GiB", 10}, {"host GiB", 8}, {"fits", 4},
                          {"largest mb", 10}},
                         "  ");
        for (auto const& r : out)
          t.row({r.strategy, example::fixed(r.step_ms, 1), example::fixed(r.forward_ms, 0), example::fixed(r.backward_ms, 0),
                 example::fixed(r.recompute_ms, 0), example::fixed(r.exposed_copy_ms, 0), example::fixed(r.exposed_collective_ms, 0),
                 example::fixed(r.tflops_per_device, 1), example::fixed(r.device_peak_gib, 1),
                 example::fixed(r.activation_peak_gib, 1), example::fixed(r.host_gib, 1), r.fits ? "yes" : "no",
                 std::to_string(r.largest_microbatch)});
        t.print();
        auto find = [&](std::string_view k) -> published::row const* {
          for (auto const& r : out)
            if (r.strategy == k) return &r;
          return nullptr;
        };
        auto const* lhs = find("offload-lhs");
        auto const* remat = find("full-remat");
        auto const* naive = find("offload-naive");
        auto const* pipe = find("offload-lhs-pipelined");
        if (lhs && remat && naive && pipe)
          std::printf("  offload-lhs vs full-remat %.3fx, vs offload-naive %.3fx; pipelined vs lhs %+.2f%%; device peak over "
                      "offload-naive: lhs %+.1f GiB, pipelined (prefetch 7) %+.1f GiB\n",
                      remat->step_ms / lhs->step_ms, naive->step_ms / lhs->step_ms, 100 * (lhs->step_ms / pipe->step_ms - 1),
                      lhs->device_peak_gib - naive->device_peak_gib, pipe->device_peak_gib - naive->device_peak_gib);
        // The ceiling and the what-if (docs/planning.md); the study's DeepSeek-V3 ratio is 1.57.
        if (s.model.experts > 0 && hw.name == hardware::gb200().name) {
          auto const c = published::ceiling_of(s, hw, out, 1.57);
          std::printf("  ceiling: full remat / offload-lhs <= 1 + F/(F+B) = 1 + %.0f/(%.0f + %.0f) = %.3f (model: %.3f)\n"
                      "  what-if (not a prediction): full remat with its collectives not overlapped %.1f ms (%.3fx); "
                      "1.57x would need %.0f ms exposed in the remat run alone\n",
                      c.forward_ms, c.forward_ms, c.backward_ms, c.bound, c.ratio, c.remat_without_overlap_ms,
                      c.remat_without_overlap_ms / lhs->step_ms, c.exposed_needed_ms);
        }
      }
      for (auto const& r : out)
        rows.emplace_back()
            .field("model", r.model)
            .field("hardware", r.hardware)
            .field("microbatch", r.microbatch)
            .field("strategy", r.strategy)
            .field("step_ms", r.step_ms)
            .field("forward_ms", r.forward_ms)
            .field("backward_ms", r.backward_ms)
            .field("recompute_ms", r.recompute_ms)
            .field("exposed_copy_ms", r.exposed_copy_ms)
            .field("exposed_collective_ms", r.exposed_collective_ms)
            .field("tflops_per_device", r.tflops_per_device)
            .field("device_peak_gib", r.device_peak_gib)
            .field("activation_peak_gib", r.activation_peak_gib)
            .field("host_gib", r.host_gib)
            .field("fits", r.fits)
            .field("largest_microbatch", r.largest_microbatch);
    }
  if (json) std::printf("%s\n", example::json_array(rows, true).c_str());
  return 0;
}

int main(int argc, char** argv) {
  using namespace tide;
  auto const a = parse(argc, argv);
  if (a.published) return published_experiment(a.json);
  std::vector<transformer_spec> model_list = {
      models::deepseek_v3(a.seq.value_or(4096), a.micro_batch, 1),
      models::llama3_405b(a.seq.value_or(8192), a.micro_batch, 8),
  };
  if (a.small)
    for (auto& m : model_list) {
      m.seq_len = a.seq.value_or(512);
      m.layer_count = 12;
    }
  std::vector<hardware_spec> machines = {hardware::h100_sxm(), hardware::h200_sxm(), hardware::gh200(), hardware::gb200(),
                                         hardware::vera_rubin()};

  std::vector<example::json_object> strategy_json;
  schedule last_plan;
  cost_table last_costs;
  for (auto const& m : model_list) {
    auto const st = transformer_stack(m);
    auto const keep_peak = build_schedule(st, strategy{}).peak_device_bytes();
    auto const budget = static_cast<std::size_t>(static_cast<double>(keep_peak) * a.budget_fraction);
    for (auto const& hw : machines) {
      auto const costs = transformer_costs(m, hw);
      strategy_options so;
      so.device_budget = budget;
      so.host_budget = hw.pinnable_host_bytes();  // the host memory this GPU may pin
      auto const t0 = std::chrono::steady_clock::now();
      auto const rows = compare_strategies(st, costs, so);
      plan_options po;
      po.device_budget = budget;
      po.host_budget = hw.pinnable_host_bytes();
      auto const p = make_plan(st, costs, po);
      auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!a.json) {
        std::printf("\n== %s (%u layers, seq %llu, micro-batch %llu, TP %u) on %s: activation budget %s (%.0f%% of keep-all)\n",
                    std::string(m.name).c_str(), m.layer_count, static_cast<unsigned long long>(m.seq_len),
                    static_cast<unsigned long long>(m.micro_batch), m.tensor_parallel, std::string(hw.name).c_str(),
                    format_bytes(static_cast<double>(budget)).c_str(), 100 * a.budget_fraction);
        std::printf("%s", format_strategy_table(rows).c_str());
        if (p.fits) {
          std::size_t off = 0, rem = 0;
          for (auto d : p.decisions) off += d == placement::offload, rem += d == placement::remat;
          std::printf("  plan: %zu offloaded, %zu rematted of %zu slots; %zu schedules built; table + plan in %.1f ms\n%s",
                      off, rem, p.decisions.size(), p.evaluations, ms, to_cpp_types(p.strategy).c_str());
        } else {
          std::printf("  plan: cannot fit; smallest device peak reached %s\n",
                      format_bytes(static_cast<double>(p.smallest_activation_bytes)).c_str());
        }
      }
      for (auto const& r : rows)
        strategy_json.emplace_back()
            .field("model", m.name)
            .field("hardware", hw.name)
            .field("budget", budget)
            .field("strategy", r.name)
            .field("step_us", r.step_us)
            .field("exposed_transfer_us", r.exposed_transfer_us)
            .field("whole_device_bytes", r.whole_device_bytes)
            .field("host_bytes", r.host_bytes)
            .field("fits", r.fits);
      if (p.fits) {
        last_plan = p.build(st);
        last_costs = costs;
      }
    }
  }

  // ---- calibration on the host backend with a paced link --------------------------------------
  // A small stack whose "GPU" compute is a spin of known length and whose link is paced at 1 GB/s,
  // so copy and compute times have the ratios of a real machine, scaled to a CPU.
  stack_spec cal;
  cal.append({"blk", {{"x", 256 << 10, /*input=*/true}, {"qkv", 768 << 10}, {"mlp_up", 1 << 20}}}, a.small ? 6 : 12);
  host_backend_options ho;
  ho.d2h = ho.h2d = {.bytes_per_second = 1e9, .latency_us = 10};
  host_backend backend(ho);
  // The stack is built at run time with no layer type: its slots are reached by index.
  auto fwd = [](forward_context<stream_role> const& c) {
    spin_us(600);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (c.produces(k)) c.slot(k)[0] = std::byte{1};
  };
  auto bwd = [](backward_context<stream_role> const& c) { spin_us(1200 + 0 * c.layer); };
  auto const measured_costs = calibrate(cal, backend, fwd, bwd);
  struct comparison {
    std::string name;
    double predicted, measured;
  };
  std::vector<comparison> cmp;
  timeline host_trace;
  schedule host_sched;
  auto compare = [&](std::string name, strategy const& how) {
    auto s = build_schedule(cal, how);
    auto const predicted = simulate_step_us(s, measured_costs);
    executor<host_backend> ex(backend, s);
    ex.step(fwd, bwd);
    std::vector<double> ms;
    timeline t;
    ex.record_timeline(&t);
    for (int i = 0; i < 5; ++i) {
      ex.step(fwd, bwd);
      ms.push_back(summarize(t, s).step_us);
    }
    ex.record_timeline(nullptr);
    host_trace = t;
    host_sched = s;
    cmp.push_back({std::move(name), predicted, detail::median(ms)});
  };
  policy_spec const off_big{rule_spec{.where = placement::offload, .slots = {"qkv", "mlp_up"}}};
  compare("keep all", strategy{});
  compare("remat mlp_up", {.policy = {rule_spec{.where = placement::remat, .slots = {"mlp_up"}}}});
  compare("offload qkv+mlp_up, copies on compute",
          {.policy = off_big, .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1}});
  compare("offload qkv+mlp_up, latency hiding", {.policy = off_big, .pipeline = {.prefetch_distance = 1}});
  compare("offload qkv+mlp_up, chunked, prefetch 2",
          {.policy = off_big, .buffers = {.staging_buffers = 3}, .pipeline = {.prefetch_distance = 2, .chunk_bytes = 256 << 10}});
  plan_options cpo;
  cpo.device_budget = build_schedule(cal, strategy{}).peak_device_bytes() / 2;
  auto const cal_plan = make_plan(cal, measured_costs, cpo);
  if (cal_plan.fits) compare("planner, budget 1/2 of keep-all", cal_plan.strategy);

  double worst = 0;
  example::table t({{"schedule", -42}, {"predicted ms", 12}, {"measured ms", 12}, {"error", 8}}, "  ");
  std::vector<example::json_object> calibration_json;
  for (auto const& c : cmp) {
    auto const err = (c.predicted - c.measured) / c.measured;
    worst = std::max(worst, std::abs(err));
    t.row({c.name, example::fixed(c.predicted / 1e3, 2), example::fixed(c.measured / 1e3, 2),
           (err >= 0 ? "+" : "") + example::fixed(100 * err, 1) + "%"});
    calibration_json.emplace_back().field("schedule", c.name).field("predicted_us", c.predicted).field("measured_us", c.measured);
  }
  if (a.json) {
    example::json_object out;
    out.raw("strategies", example::json_array(strategy_json, true))
        .raw("calibration", example::json_array(calibration_json, true))
        .field("worst_calibration_error", worst);
    std::printf("%s\n", out.str().c_str());
  } else {
    std::printf("\n== calibration on the host backend (paced link 1 GB/s + 10 us, compute spins 600/1200 us per layer)\n");
    std::printf("  measured: forward %.0f us, backward %.0f us, recompute %.0f us, d2h %.2f GB/s + %.0f us, h2d %.2f GB/s + "
                "%.0f us, sync %.0f us\n",
                measured_costs.layers[0].forward_us, measured_costs.layers[0].backward_us,
                measured_costs.layers[0].full_recompute_us(), measured_costs.link.d2h.bytes_per_second / 1e9,
                measured_costs.link.d2h.latency_us, measured_costs.link.h2d.bytes_per_second / 1e9,
                measured_costs.link.h2d.latency_us, measured_costs.sync_latency_us);
    t.print();
    std::printf("  worst |predicted - measured| / measured: %.1f%% (goal: 10%%)\n", 100 * worst);
  }

  if (!a.trace.empty()) {
    if (!last_plan.ops.empty()) {
      std::ofstream out(a.trace);
      auto r = simulate(last_plan, last_costs);
      write_chrome_trace(out, r.trace, last_plan, "tide sim: last planned schedule");
      if (!a.json) std::printf("wrote %s (sim) and %s.host.json (host run)\n", a.trace.c_str(), a.trace.c_str());
    }
    std::ofstream host_out(a.trace + ".host.json");
    write_chrome_trace(host_out, host_trace, host_sched, "tide host backend: last calibration schedule");
  }
  return 0;
}
