// Chain checkpointing at scale (issue 10, item 4): the reversal of a 100,000-step chain with 20
// device snapshots, one tier (Revolve) and with a host tier (two_tier_plan; at this length it
// skips the DP for the segment family and compares it with Revolve in the model). Counters: the
// actions stored, their bytes, and the extra forward steps.
#include <benchmark/benchmark.h>

#include <tide/plan/checkpointing.hpp>
#include <tide/tide.hpp>

namespace {

constexpr std::int64_t steps = 100'000;
constexpr std::int64_t device_snapshots = 20;

void set_counters(benchmark::State& state, std::vector<tide::chain_action> const& a, std::int64_t extra) {
  state.counters["actions"] = static_cast<double>(a.size());
  state.counters["action_bytes"] = static_cast<double>(a.capacity() * sizeof(tide::chain_action));
  state.counters["actions_per_step"] = static_cast<double>(a.size()) / steps;
  state.counters["extra_forwards"] = static_cast<double>(extra);
}

void revolve_100k_steps_20_snapshots(benchmark::State& state) {
  std::vector<tide::chain_action> a;
  for (auto _ : state) {
    a = tide::revolve_schedule(steps, device_snapshots);
    benchmark::DoNotOptimize(a.data());
  }
  set_counters(state, a, tide::revolve_extra_forwards(steps, device_snapshots));
}
BENCHMARK(revolve_100k_steps_20_snapshots)->Unit(benchmark::kMillisecond);

void two_tier_100k_steps_20_plus_host(benchmark::State& state) {
  auto const host = state.range(0);
  // Assumed costs (a label, not a measurement): a backward step twice a forward one, a state copy
  // a fifth of a forward step each way (a fast link against a heavy step).
  auto const costs = tide::chain_costs::constant(1.0, 2.0, 0.2, 0.2);
  tide::two_tier_result r;
  for (auto _ : state) {
    r = tide::two_tier_plan(steps, device_snapshots, host, costs);
    benchmark::DoNotOptimize(r.actions.data());
  }
  set_counters(state, r.actions, r.extra_forwards);
  state.counters["segments"] = r.method == tide::two_tier_method::segments ? 1 : 0;
}
BENCHMARK(two_tier_100k_steps_20_plus_host)->Arg(50)->Arg(500)->Unit(benchmark::kMillisecond);

// The op program of a 100,000-layer stack with a carry (no slots), built by build_schedule from
// the checkpoints: Revolve with 20 device snapshots (Arg 0), or those plus 50 host snapshots and
// two_tier_plan's reversal (Arg 50, the reversal made once, outside the timing). Counters: ops,
// waits, the bytes of both, and the advances.
void carry_schedule_100k_layers_20_snapshots(benchmark::State& state) {
  auto const host = state.range(0);
  tide::stack_spec st;
  st.append({"step", {}}, static_cast<std::uint32_t>(steps));
  st.carry = {"state", 1 << 20};
  tide::strategy how{.checkpoints = {.device_snapshots = static_cast<std::uint32_t>(device_snapshots)}};
  if (host > 0) {
    how.checkpoints.host_snapshots = static_cast<std::uint32_t>(host);
    how.checkpoints.reversal = tide::two_tier_plan(steps, device_snapshots, host, tide::chain_costs::constant(1.0, 2.0, 0.2, 0.2)).actions;
  }
  tide::schedule s;
  for (auto _ : state) {
    tide::build_schedule_into(s, st, how);
    benchmark::DoNotOptimize(s.ops.data());
  }
  state.counters["ops"] = static_cast<double>(s.ops.size());
  state.counters["waits"] = static_cast<double>(s.waits.size());
  state.counters["program_bytes"] = static_cast<double>(s.ops.capacity() * sizeof(tide::op) + s.waits.capacity() * 4);
  state.counters["advances"] = static_cast<double>(s.carry.advances);
  state.counters["carry_buffers"] = static_cast<double>(s.carry.device_buffers);
}
BENCHMARK(carry_schedule_100k_layers_20_snapshots)->Arg(0)->Arg(50)->Unit(benchmark::kMillisecond);

// The three-tier planner at the longest chain it takes, 2^20 layers (issue 40, item 2: it grew as
// n^2 up to the n it accepted; issue 54: a million steps within 10 s of CPU). Arg: the tier set,
// 0: 2/2/4; 1: 8 device and n host and disk snapshots; 2: n of each; 3: 2/2/n; 4: 4/16/64 (the
// slowest set measured at 10^6). Counters: the plan's time against `three_tier_lower_bound`.
// Assumed costs (a label, not a measurement): f = 1, b = 2, a carry's copy half a step each way,
// disk copies as the model's defaults (1 us).
void three_tier_at_its_limit(benchmark::State& state) {
  constexpr std::int64_t n = tide::max_three_tier_layers;
  tide::chain_tiers const tiers[] = {{.device = 2, .host = 2, .disk = 4},
                                     {.device = 8, .host = n, .disk = n},
                                     {.device = n, .host = n, .disk = n},
                                     {.device = 2, .host = 2, .disk = n},
                                     {.device = 4, .host = 16, .disk = 64}};
  auto const t = tiers[state.range(0)];
  auto const costs = tide::chain_costs::constant(1.0, 2.0, 0.5, 0.5);
  tide::three_tier_result r;
  for (auto _ : state) {
    r = tide::three_tier_plan(n, t, costs);
    benchmark::DoNotOptimize(r.actions.data());
  }
  state.counters["actions"] = static_cast<double>(r.actions.size());
  state.counters["segments"] = r.segments;
  state.counters["predicted_us"] = r.predicted_us;
  state.counters["gap_to_bound"] = r.predicted_us / tide::three_tier_lower_bound(n, t, costs) - 1;
}
BENCHMARK(three_tier_at_its_limit)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->Iterations(1);

// two_tier_plan with two device and two host snapshots (the segment family with one-slot
// Revolve inside each segment: O(n^2) forwards, which the evaluator used to time one by one).
void two_tier_2_2(benchmark::State& state) {
  auto const costs = tide::chain_costs::constant(1.0, 2.0, 0.5, 0.5);
  tide::two_tier_result r;
  for (auto _ : state) {
    r = tide::two_tier_plan(state.range(0), 2, 2, costs);
    benchmark::DoNotOptimize(r.actions.data());
  }
  state.counters["actions"] = static_cast<double>(r.actions.size());
}
BENCHMARK(two_tier_2_2)->Arg(50000)->Arg(tide::max_chain_steps)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
