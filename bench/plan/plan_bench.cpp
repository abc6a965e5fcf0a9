// The sim running a 128-layer step, and heuristic planning of a 128-layer, 8-slot stack
// (goal: 50 ms or less).
#include <benchmark/benchmark.h>

#include <tide/plan/hardware.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/plan/transformer.hpp>

namespace {

// A Llama-3.1-405B-like dense stack (8 slots per layer) with 128 layers.
tide::transformer_spec model() {
  auto m = tide::models::llama3_405b(8192, 1, 8);
  m.layer_count = 128;
  return m;
}

void sim_step_128_layers(benchmark::State& state) {
  auto const m = model();
  auto const st = tide::transformer_stack(m);
  auto const costs = tide::transformer_costs(m, tide::hardware::h100_sxm());
  auto const s = tide::build_schedule(
      st, {.policy = {tide::rule_spec{.where = tide::placement::offload, .slots = {"mlp_up", "attn_norm"}},
                      tide::rule_spec{.where = tide::placement::remat, .slots = {"mlp_act"}}},
           .pipeline = {.latency_hiding = true, .prefetch_distance = 2, .chunk_bytes = 64 << 20, .max_offloads_in_flight = 2}});
  for (auto _ : state) benchmark::DoNotOptimize(tide::simulate_step_us(s, costs));
  state.counters["ops"] = static_cast<double>(s.ops.size());
}
BENCHMARK(sim_step_128_layers)->Unit(benchmark::kMicrosecond);

void heuristic_plan_128_layers_8_slots(benchmark::State& state) {
  auto const m = model();
  auto const st = tide::transformer_stack(m);
  auto const costs = tide::transformer_costs(m, tide::hardware::h100_sxm());
  tide::plan_options opt;
  opt.device_budget = tide::build_schedule(st, tide::strategy{}).peak_device_bytes() / 3;
  opt.method = tide::plan_method::heuristic;
  std::size_t evaluations = 0;
  for (auto _ : state) {
    auto p = tide::make_plan(st, costs, opt);
    evaluations = p.evaluations;
    benchmark::DoNotOptimize(p.step_us);
  }
  state.counters["schedules"] = static_cast<double>(evaluations);
}
BENCHMARK(heuristic_plan_128_layers_8_slots)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
