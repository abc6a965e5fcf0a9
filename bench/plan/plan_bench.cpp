// The sim running a 128-layer step, heuristic planning of a 128-layer, 8-slot stack (goal: 50 ms
// or less), and planning at the sizes issue 22 names (61 x 11, 126 x 9 and 1,000 x 10 decisions,
// with the strategy table's rows as seeds where there is one), each with its gap to the lower bound.
#include <benchmark/benchmark.h>

#include <string_view>
#include <utility>
#include <vector>

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

// The strategy table's options as tide-plan sets them: the budgets the whole device leaves, the
// training's collectives, `offload` in the offload rows and the rest rematerialized there.
tide::strategy_options table_options(tide::transformer_spec const& m, tide::hardware_spec const& hw,
                                     tide::training_spec const& t, std::vector<tide::name> offload) {
  auto const resident = tide::transformer_resident_memory(m, hw, t);
  tide::strategy_options o;
  o.device_budget = tide::activation_budget(hw, resident);
  o.host_budget = hw.pinnable_host_bytes();
  o.resident_bytes = resident.total();
  o.collectives = tide::training_collectives(t);
  o.offload_slots = std::move(offload);
  o.remat_rest = true;
  return o;
}

// The published experiment's DeepSeek-V3 row set (examples/plan --published): 61 layers with FSDP
// gathers, regathers and reduce-scatters, the five fixed strategies and the seeded planner, on
// GB200 at micro-batch 8.
void published_deepseek_v3_strategy_table(benchmark::State& state) {
  auto const m = tide::models::deepseek_v3(4096, 8, 1);
  auto const hw = tide::hardware::gb200();
  tide::training_spec const t{.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}};
  auto const st = tide::transformer_stack(m);
  auto const costs = tide::transformer_costs(m, hw, t);
  auto const o = table_options(m, hw, t, {"q_latent", "kv_latent", "mlp_up"});
  for (auto _ : state) benchmark::DoNotOptimize(tide::compare_strategies(st, costs, o).size());
}
BENCHMARK(published_deepseek_v3_strategy_table)->Unit(benchmark::kMillisecond);

// Plans `st` under `costs` as tide-plan does (seeded with the table's rows when `o` has offload
// slots) and reports the plan's gap to the lower bound and the schedules built.
void plan_and_report(benchmark::State& state, tide::stack_spec const& st, tide::cost_table const& costs,
                     tide::strategy_options o) {
  o.include_plan = false;
  auto const rows = tide::compare_strategies(st, costs, o);
  tide::plan p;
  for (auto _ : state) {
    p = tide::plan_seeded_by(st, costs, o, rows);
    benchmark::DoNotOptimize(p.step_us);
  }
  double fastest_row = 0;
  for (auto const& r : rows)
    if (r.fits && (fastest_row == 0 || r.step_us < fastest_row)) fastest_row = r.step_us;
  state.counters["decisions"] = static_cast<double>(p.decisions.size());
  state.counters["schedules"] = static_cast<double>(p.evaluations);
  state.counters["gap_to_bound_pct"] = 100 * p.gap_to_bound();
  state.counters["plan_vs_best_row"] = fastest_row > 0 ? p.step_us / fastest_row : 0;
}

// DeepSeek-V3 on GB200 at micro-batch 8 (61 layers x 11 slots): tide-plan's command in the README.
void plan_61_layers_11_slots(benchmark::State& state) {
  auto const m = tide::models::deepseek_v3(4096, 8, 1);
  auto const hw = tide::hardware::gb200();
  tide::training_spec const t{.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}};
  auto const o = table_options(m, hw, t, {"q_latent", "kv_latent", "mlp_up"});
  plan_and_report(state, tide::transformer_stack(m), tide::transformer_costs(m, hw, t), o);
}
BENCHMARK(plan_61_layers_11_slots)->Unit(benchmark::kMillisecond);

// Llama-3.1-405B (FP8) on GB200 at batch 2 (126 layers x 8 slots: 1,008 decisions).
void plan_126_layers_8_slots(benchmark::State& state) {
  auto m = tide::models::llama3_405b(8192, 2, 1);
  m.matmul = tide::precision::fp8;
  auto const hw = tide::hardware::gb200();
  tide::training_spec const t{.layout = {.gpus = 128, .fsdp = 128}};
  auto const o = table_options(m, hw, t, {"qkv"});
  plan_and_report(state, tide::transformer_stack(m), tide::transformer_costs(m, hw, t), o);
}
BENCHMARK(plan_126_layers_8_slots)->Unit(benchmark::kMillisecond);

// 1,000 layers of one 10-slot type (an input slot, nine others; synthetic sizes and costs, a
// PCIe-like link), a device budget at a third of keep-all's peak and a host cap at a third of
// what offloading everything takes.
void plan_1000_layers_10_slots(benchmark::State& state) {
  tide::layer_spec block{"block", {{"in", 1 << 20, true}}};
  static constexpr std::string_view names[] = {"s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"};
  tide::layer_cost c{.forward_us = 400, .backward_us = 800, .slot_recompute_us = {400}};
  for (std::size_t k = 0; k < 9; ++k) {
    block.slots.push_back({names[k], std::size_t{1} << (19 + k % 4)});
    c.slot_recompute_us.push_back(10.0 + 15.0 * static_cast<double>((k * 7) % 9));
  }
  tide::stack_spec st;
  st.append(block, 1000);
  auto const costs = tide::uniform_costs(1000, c, tide::host_link::symmetric(50e9, 5));
  tide::strategy_options o;
  o.device_budget = tide::build_schedule(st, tide::strategy{}).peak_device_bytes() / 3;
  o.host_budget = tide::build_schedule(st, {.policy = {tide::rule_spec{.where = tide::placement::offload}}}).peak_host_bytes() / 3;
  o.keep_slots = {"in"};  // the rows keep the input (the layers' recomputes read it)
  plan_and_report(state, st, costs, o);
}
BENCHMARK(plan_1000_layers_10_slots)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
