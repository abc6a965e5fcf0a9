// Building a schedule at run time, 8 to 1024 layers of 6 slots, under a policy that offloads,
// recomputes and keeps, with chunked latency-hidden copies. Goal: 128 layers in <= 100 us.
#include <benchmark/benchmark.h>

#include <tide/tide.hpp>

namespace {

tide::stack_spec make_stack(std::uint32_t layers) {
  tide::stack_spec s;
  s.append({"dense", {{"layer_input", 1 << 20, true}, {"q_proj", 1 << 20}, {"kv_proj", 1 << 18}, {"attn_out", 1 << 20},
                      {"mlp_up", 4 << 20}, {"mlp_act", 4 << 20}}},
           3);
  s.append({"moe", {{"layer_input", 1 << 20, true}, {"q_proj", 1 << 20}, {"kv_proj", 1 << 18}, {"attn_out", 1 << 20},
                    {"experts_up", 8 << 20}, {"experts_act", 8 << 20}}},
           layers - 3);
  return s;
}

// Three slots offloaded and two rematted per layer, 2 MiB chunks, prefetch distance 2.
tide::strategy const strategy{
    .policy = {tide::rule_spec{.where = tide::placement::offload, .slots = {"q_proj", "attn_out", "experts_up"}},
               tide::rule_spec{.where = tide::placement::remat, .slots = {"mlp_act", "experts_act"}}},
    .buffers = {.staging_buffers = 3, .device_alignment = 256, .host_alignment = 64, .guard_bytes = 0, .share_phase_regions = true},
    .pipeline = {.latency_hiding = true, .prefetch_distance = 2, .chunk_bytes = 2 << 20, .max_offloads_in_flight = 2}};

void schedule_build(benchmark::State& state) {
  auto const layers = static_cast<std::uint32_t>(state.range(0));
  auto const stack = make_stack(layers);
  std::size_t ops = 0;
  for (auto _ : state) {
    auto s = tide::build_schedule(stack, strategy);
    ops = s.ops.size();
    benchmark::DoNotOptimize(s.arena.device_bytes);
  }
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["layers"] = layers;
}
BENCHMARK(schedule_build)->RangeMultiplier(2)->Range(8, 1024)->Unit(benchmark::kMicrosecond);

// The same into a reused schedule (build_schedule_into): what a planner's inner loop pays. The
// difference from the above is allocation: above ~128 KiB glibc maps fresh pages per vector.
void schedule_build_into(benchmark::State& state) {
  auto const layers = static_cast<std::uint32_t>(state.range(0));
  auto const stack = make_stack(layers);
  tide::schedule s;
  for (auto _ : state) {
    tide::build_schedule_into(s, stack, strategy);
    benchmark::DoNotOptimize(s.arena.device_bytes);
  }
  state.counters["ops"] = static_cast<double>(s.ops.size());
}
BENCHMARK(schedule_build_into)->RangeMultiplier(2)->Range(8, 1024)->Unit(benchmark::kMicrosecond);

void schedule_check(benchmark::State& state) {  // the checker is for tests; this shows its cost
  auto const layers = static_cast<std::uint32_t>(state.range(0));
  auto const s = tide::build_schedule(
      make_stack(layers),
      {.policy = {tide::rule_spec{.where = tide::placement::offload, .slots = {"q_proj", "experts_up"}}},
       .pipeline = {.latency_hiding = true, .prefetch_distance = 2, .chunk_bytes = 2 << 20, .max_offloads_in_flight = 2}});
  for (auto _ : state) benchmark::DoNotOptimize(tide::check_schedule(s).conflicting_pairs);
}
BENCHMARK(schedule_check)->Arg(16)->Arg(128)->Unit(benchmark::kMillisecond);

// What a debug-build executor pays on construction for a large program: 126 layers x 8 slots of
// 2 MiB, 7 of them offloaded in 64 KiB chunks (~57k ops, every ring buffer region reused by
// thousands of copies), latency hiding, prefetch distance 2. Goal: well under 1 s.
tide::schedule make_large_chunked_schedule() {
  tide::stack_spec st;
  st.append({"block", {{"layer_input", 2 << 20, true}, {"q_proj", 2 << 20}, {"k_proj", 2 << 20}, {"v_proj", 2 << 20},
                       {"attn_out", 2 << 20}, {"mlp_up", 2 << 20}, {"mlp_act", 2 << 20}, {"mlp_out", 2 << 20}}},
            126);
  tide::policy_spec const offload_most{
      tide::rule_spec{.where = tide::placement::offload,
                      .slots = {"q_proj", "k_proj", "v_proj", "attn_out", "mlp_up", "mlp_act", "mlp_out"}}};
  return tide::build_schedule(
      st, {.policy = offload_most,
           .buffers = {.staging_buffers = 3, .device_alignment = 256, .host_alignment = 64, .guard_bytes = 0, .share_phase_regions = true},
           .pipeline = {.latency_hiding = true, .prefetch_distance = 2, .chunk_bytes = 64 << 10, .max_offloads_in_flight = 2}});
}

void check_schedule(benchmark::State& state) {
  auto const s = make_large_chunked_schedule();
  for (auto _ : state) benchmark::DoNotOptimize(tide::check_schedule(s).conflicting_pairs);
  state.counters["ops"] = static_cast<double>(s.ops.size());
}
BENCHMARK(check_schedule)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
