// The sim running a 128-layer step, and heuristic planning of a 128-layer, 8-slot stack
// (goal: 50 ms or less).
#include <benchmark/benchmark.h>

#include <tide/plan/compare.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/plan/training.hpp>
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

// The published experiment's DeepSeek-V3 row set (examples/plan --published): 61 layers with FSDP
// gathers, regathers and reduce-scatters, the five fixed strategies and the seeded planner, on
// GB200 at micro-batch 8.
void published_deepseek_v3_strategy_table(benchmark::State& state) {
  auto const m = tide::models::deepseek_v3(4096, 8, 1);
  auto const hw = tide::hardware::gb200();
  tide::training_spec const t{.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}};
  auto const st = tide::transformer_stack(m);
  auto const costs = tide::transformer_costs(m, hw, t);
  auto const resident = tide::transformer_resident_memory(m, hw, t);
  tide::strategy_options o;
  o.device_budget = tide::activation_budget(hw, resident);
  o.host_budget = hw.pinnable_host_bytes();
  o.resident_bytes = resident.total();
  o.collectives = tide::training_collectives(t);
  o.offload_slots = {"q_latent", "kv_latent", "mlp_up"};
  o.remat_rest = true;
  for (auto _ : state) benchmark::DoNotOptimize(tide::compare_strategies(st, costs, o).size());
}
BENCHMARK(published_deepseek_v3_strategy_table)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
