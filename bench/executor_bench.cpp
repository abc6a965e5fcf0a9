// Executor overhead per op: the generic expansion (waits, enqueue, event records, context
// construction) onto a backend that does nothing but run the task inline. Goal: <= 100 ns/op.
#include <benchmark/benchmark.h>

#include <tide/tide.hpp>

namespace {

//! Satisfies tide::backend and does no work: what remains is the executor's own cost.
struct null_backend {
  using tide_backend_tag = void;
  using stream_type = tide::stream_role;
  static constexpr bool device_memory_is_host_accessible = false;
  std::vector<std::byte> device, host;
  tide::arenas setup(tide::backend_setup const& s) {
    device.resize(s.device_bytes);
    host.resize(s.host_bytes);
    return {device.data(), host.data()};
  }
  stream_type stream(tide::stream_role r) const noexcept { return r; }
  void record(tide::stream_role, std::uint32_t) noexcept {}
  void wait(tide::stream_role, std::uint32_t) noexcept {}
  void run(tide::stream_role, std::uint32_t, tide::op const&, tide::task t) noexcept { t(); }
  void copy(tide::stream_role, std::uint32_t, tide::op const&, void*, void const*, std::size_t) noexcept {}
  void run_after_all(tide::stream_role, tide::task t) noexcept { t(); }
  void host_task(tide::stream_role, tide::task t) noexcept { t(); }
  void record_timeline(tide::timeline*) noexcept {}
  void begin_step(tide::schedule_view) noexcept {}
  void end_step() noexcept {}
  void wait_step() noexcept {}
};

//! `layers` layers of six 4 KiB slots: three offloaded in 1 KiB chunks, one rematted, with
//! gather and reduce hooks: every kind of op.
tide::schedule program(std::uint32_t layers) {
  tide::stack_spec st;
  st.independent_layers = true;  // empty lambdas: no layer reads another's output
  st.append({"l", {{"a", 4096}, {"b", 4096}, {"c", 4096}, {"d", 4096}, {"e", 4096}, {"f", 4096}}}, layers);
  return tide::build_schedule(
      st, {.policy = {tide::rule_spec{.where = tide::placement::offload, .slots = {"a", "b", "c"}},
                      tide::rule_spec{.where = tide::placement::remat, .slots = {"d"}}},
           .pipeline = {.latency_hiding = true, .prefetch_distance = 2, .chunk_bytes = 1024, .max_offloads_in_flight = 2},
           .collectives = {.before_forward = true, .after_backward = true}});
}

void executor_overhead(benchmark::State& state) {
  auto const s = program(static_cast<std::uint32_t>(state.range(0)));
  null_backend b;
  tide::executor exec(b, s, {.debug_checks = false, .check_schedule = false});
  std::uint64_t calls = 0;
  auto f = [&](auto const&) { ++calls; };
  auto const hooks = tide::hooks{.before_forward = f, .after_backward = f};
  for (auto _ : state) exec.step(f, f, hooks);
  benchmark::DoNotOptimize(calls);
  state.counters["ops"] = static_cast<double>(s.ops.size());
  // Seconds per op (printed with an SI prefix: "45n" is 45 ns).
  state.counters["time_per_op"] = benchmark::Counter(static_cast<double>(s.ops.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(executor_overhead)->Arg(16)->Arg(128)->Unit(benchmark::kMicrosecond);

// The same program on the host backend with empty lambdas and unpaced copies of 4 KiB: the cost
// of its queues, worker hand-offs and event waits, per op (wall time: the work is on 4 threads).
void host_backend_overhead(benchmark::State& state) {
  auto const s = program(static_cast<std::uint32_t>(state.range(0)));
  tide::host_backend b;
  tide::executor exec(b, s, {.debug_checks = false, .check_schedule = false});
  auto f = [](auto const&) {};
  auto const hooks = tide::hooks{.before_forward = f, .after_backward = f};
  for (auto _ : state) exec.step(f, f, hooks);
  state.counters["ops"] = static_cast<double>(s.ops.size());
  state.counters["time_per_op"] = benchmark::Counter(static_cast<double>(s.ops.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(host_backend_overhead)->Arg(16)->Arg(128)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
