// examples/plan: what should I offload, and how fast will it be?
//
// For each preset model on each preset machine: the strategy table (keep all, full remat,
// offload with copies on the compute stream, with latency hiding, chunked with deeper prefetch,
// and the planner's choice), the plan as C++ types; then the calibration comparison on the host
// backend with a paced link: costs measured from a run, the sim's predicted step against the
// measured one.
//
//   plan [--seq N] [--micro-batch N] [--budget-fraction F] [--small] [--json] [--trace FILE]
//
// --budget-fraction: the activation budget as a share of the keep-all peak (default 0.35).
// --small: a fast configuration (short sequences, fewer layers) for the test suite.
// --json: the tables as JSON on stdout. --trace FILE: the Chrome trace of the last planned
// schedule in the sim, and FILE.host.json the measured host run of the calibration.
#include <tide/backends/host/host_backend.hpp>
#include <tide/backends/sim/sim_backend.hpp>
#include <tide/plan/calibrate.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/strategy.hpp>
#include <tide/plan/transformer.hpp>
#include <tide/trace/chrome_trace.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct args {
  std::uint64_t seq = 0;  // 0: the model's default
  std::uint64_t micro_batch = 1;
  double budget_fraction = 0.35;
  bool small = false;
  bool json = false;
  std::string trace;
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&]() -> char const* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "plan: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--seq") a.seq = std::strtoull(next(), nullptr, 10);
    else if (s == "--micro-batch") a.micro_batch = std::strtoull(next(), nullptr, 10);
    else if (s == "--budget-fraction") a.budget_fraction = std::strtod(next(), nullptr);
    else if (s == "--small") a.small = true;
    else if (s == "--json") a.json = true;
    else if (s == "--trace") a.trace = next();
    else {
      std::fprintf(stderr, "plan: unknown argument '%s'\nusage: plan [--seq N] [--micro-batch N] "
                           "[--budget-fraction F] [--small] [--json] [--trace FILE]\n", s.c_str());
      std::exit(2);
    }
  }
  return a;
}

std::string json_string(std::string_view v) { return "\"" + std::string(v) + "\""; }

void spin_us(double us) {
  auto const until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tide;
  auto const a = parse(argc, argv);
  std::vector<transformer_spec> model_list = {
      models::deepseek_v3(a.seq ? a.seq : 4096, a.micro_batch, 1),
      models::llama3_405b(a.seq ? a.seq : 8192, a.micro_batch, 8),
  };
  if (a.small)
    for (auto& m : model_list) {
      m.seq_len = a.seq ? a.seq : 512;
      m.layers = 12;
    }
  std::vector<hardware_spec> machines = {hardware::h100_sxm(), hardware::h200_sxm(), hardware::gh200(), hardware::gb200()};

  std::string json = "{\"strategies\":[";
  bool first_json = true;
  schedule last_plan;
  cost_table last_costs;
  for (auto const& m : model_list) {
    auto const st = transformer_stack(m);
    auto const keep_peak = build_schedule(st, {}).peak_device_bytes();
    auto const budget = static_cast<std::size_t>(static_cast<double>(keep_peak) * a.budget_fraction);
    for (auto const& hw : machines) {
      auto const costs = transformer_costs(m, hw);
      strategy_options so;
      so.device_budget = budget;
      auto const t0 = std::chrono::steady_clock::now();
      auto const rows = compare_strategies(st, costs, so);
      plan_options po;
      po.device_budget = budget;
      auto const p = make_plan(st, costs, po);
      auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!a.json) {
        std::printf("\n== %s (%u layers, seq %llu, micro-batch %llu, TP %u) on %s: activation budget %s (%.0f%% of keep-all)\n",
                    std::string(m.name).c_str(), m.layers, static_cast<unsigned long long>(m.seq_len),
                    static_cast<unsigned long long>(m.micro_batch), m.tensor_parallel, std::string(hw.name).c_str(),
                    format_bytes(static_cast<double>(budget)).c_str(), 100 * a.budget_fraction);
        std::printf("%s", format_strategy_table(rows).c_str());
        if (p.fits) {
          std::size_t off = 0, rem = 0;
          for (auto d : p.decisions) off += d == placement::offload, rem += d == placement::remat;
          std::printf("  plan: %zu offloaded, %zu rematted of %zu slots; %zu schedules built; table + plan in %.1f ms\n%s",
                      off, rem, p.decisions.size(), p.evaluations, ms, to_cpp_types(p).c_str());
        } else {
          std::printf("  plan: cannot fit; smallest device peak reached %s\n",
                      format_bytes(static_cast<double>(p.smallest_device_bytes)).c_str());
        }
      }
      for (auto const& r : rows) {
        json += std::string(first_json ? "\n" : ",\n") + "{\"model\":" + json_string(m.name) + ",\"hardware\":" +
                json_string(hw.name) + ",\"budget\":" + std::to_string(budget) + ",\"strategy\":" + json_string(r.name) +
                ",\"step_us\":" + std::to_string(r.step_us) + ",\"exposed_transfer_us\":" +
                std::to_string(r.exposed_transfer_us) + ",\"device_bytes\":" + std::to_string(r.device_bytes) +
                ",\"host_bytes\":" + std::to_string(r.host_bytes) + ",\"fits\":" + (r.fits ? "true" : "false") + "}";
        first_json = false;
      }
      if (p.fits) {
        last_plan = p.build(st);
        last_costs = costs;
      }
    }
  }
  json += "\n],";

  // ---- calibration on the host backend with a paced link --------------------------------------
  // A small stack whose "GPU" compute is a spin of known length and whose link is paced at 1 GB/s,
  // so copy and compute times have the ratios of a real machine, scaled to a CPU.
  stack_spec cal;
  cal.append({"blk", {{"x", 256 << 10}, {"qkv", 768 << 10}, {"mlp_up", 1 << 20}}}, a.small ? 6 : 12);
  host_backend_options ho;
  ho.d2h = ho.h2d = {1e9, 10e-6};
  host_backend backend(ho);
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
  auto compare = [&](std::string name, policy_spec p, pipeline_spec pl, buffer_spec b) {
    auto s = build_schedule(cal, p, b, pl);
    auto const predicted = simulate_step_us(s, measured_costs);
    executor<host_backend> ex(backend, s);
    ex.step(fwd, bwd);
    std::vector<double> ms;
    timeline t;
    for (int i = 0; i < 5; ++i) {
      backend.record_timeline(&t);
      ex.step(fwd, bwd);
      ms.push_back(summarize(t, s).step_us);
    }
    backend.record_timeline(nullptr);
    host_trace = t;
    host_sched = s;
    cmp.push_back({std::move(name), predicted, detail::median(ms)});
  };
  policy_spec off_big{rule_spec{placement::offload, {"qkv", "mlp_up"}, 0, all_layers, 0}};
  buffer_spec three;
  three.staging_buffers = 3;
  compare("keep all", {}, {}, {});
  compare("remat mlp_up", {rule_spec{placement::remat, {"mlp_up"}, 0, all_layers, 0}}, {}, {});
  compare("offload qkv+mlp_up, copies on compute", off_big, {false, 0, 0, 1}, {});
  compare("offload qkv+mlp_up, latency hiding", off_big, {true, 1, 0, 2}, {});
  compare("offload qkv+mlp_up, chunked, prefetch 2", off_big, {true, 2, 256 << 10, 2}, three);
  plan_options cpo;
  cpo.device_budget = build_schedule(cal, {}).peak_device_bytes() / 2;
  auto const cal_plan = make_plan(cal, measured_costs, cpo);
  if (cal_plan.fits) compare("planner, budget 1/2 of keep-all", cal_plan.policy, cal_plan.pipeline, cal_plan.buffers);

  double worst = 0;
  if (!a.json) {
    std::printf("\n== calibration on the host backend (paced link 1 GB/s + 10 us, compute spins 600/1200 us per layer)\n");
    std::printf("  measured: forward %.0f us, backward %.0f us, recompute %.0f us, d2h %.2f GB/s + %.0f us, h2d %.2f GB/s + "
                "%.0f us, sync %.0f us\n",
                measured_costs.layers[0].forward_us, measured_costs.layers[0].backward_us,
                measured_costs.layers[0].full_recompute_us(), measured_costs.link.d2h.bytes_per_second / 1e9,
                measured_costs.link.d2h.latency_s * 1e6, measured_costs.link.h2d.bytes_per_second / 1e9,
                measured_costs.link.h2d.latency_s * 1e6, measured_costs.sync_latency_us);
    std::printf("  %-42s %12s %12s %8s\n", "schedule", "predicted ms", "measured ms", "error");
  }
  json += "\"calibration\":[";
  for (std::size_t i = 0; i < cmp.size(); ++i) {
    auto const err = (cmp[i].predicted - cmp[i].measured) / cmp[i].measured;
    worst = std::max(worst, std::abs(err));
    if (!a.json)
      std::printf("  %-42s %12.2f %12.2f %+7.1f%%\n", cmp[i].name.c_str(), cmp[i].predicted / 1e3, cmp[i].measured / 1e3,
                  100 * err);
    json += std::string(i ? ",\n" : "\n") + "{\"schedule\":" + json_string(cmp[i].name) + ",\"predicted_us\":" +
            std::to_string(cmp[i].predicted) + ",\"measured_us\":" + std::to_string(cmp[i].measured) + "}";
  }
  json += "\n],\"worst_calibration_error\":" + std::to_string(worst) + "}\n";
  if (a.json) std::cout << json;
  else std::printf("  worst |predicted - measured| / measured: %.1f%% (goal: 10%%)\n", 100 * worst);

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
