// Overlap on the host backend with a paced link, side by side in one run: keep-all, offload
// with latency hiding, offload with copies on the compute stream, and remat, on the mlp demo's
// network. The link is paced so that the offloads take `ratio` of the forward compute time they
// can hide behind, and the prefetches `ratio` of the backward compute time. Goal: latency-hidden
// offload within 5% of keep-all's step time when the link time is at most 70% of compute time;
// the naive variant measurably slower.
#include <benchmark/benchmark.h>

#include "../examples/mlp/mlp.hpp"

#include <tide/tide.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <utility>

namespace {

mlp::config const net_cfg{24, 160, 32, 0.01f};

tide::stack_spec const& stack() {
  static auto const s = mlp::make_stack(net_cfg);
  return s;
}

tide::schedule const& schedule_of(int policy) {
  static std::map<int, tide::schedule> cache;
  if (auto it = cache.find(policy); it != cache.end()) return it->second;
  using tide::placement;
  // The last two layers' activations are consumed soon after they are produced: kept (their
  // offload and prefetch could hide behind nothing but each other).
  tide::policy_spec const offload{tide::rule_spec{
      .where = placement::offload, .slots = {"input", "pre_act", "act"}, .last_layer = net_cfg.layers - 2}};
  tide::policy_spec const remat{tide::rule_spec{.where = placement::remat, .slots = {"pre_act", "act", "inv_rms"}}};
  tide::buffer_spec const b{.staging_buffers = 3};
  switch (policy) {
    case 0: return cache[policy] = tide::build_schedule(stack(), {.buffers = b});
    case 1:
      return cache[policy] = tide::build_schedule(
                 stack(), {.policy = offload,
                           .buffers = b,
                           .pipeline = {.latency_hiding = true, .prefetch_distance = 2, .max_offloads_in_flight = 2}});
    case 2:
      return cache[policy] = tide::build_schedule(
                 stack(), {.policy = offload,
                           .buffers = b,
                           .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1}});
    default: return cache[policy] = tide::build_schedule(stack(), {.policy = remat, .buffers = b});
  }
}

//! Forward and backward compute time of one keep-all step, measured once on an unpaced backend.
std::pair<double, double> compute_seconds() {
  static auto const s = [] {
    tide::host_backend b;
    tide::timeline t;
    tide::executor exec(b, schedule_of(0), {.debug_checks = false, .check_schedule = false, .timeline = &t});
    mlp::network net(net_cfg);
    std::pair<double, double> best{1e30, 1e30};
    for (int i = 0; i < 8; ++i) {
      exec.step([&](auto const& c) { net.forward(c); }, [&](auto const& c) { net.backward(c); });
      net.update();
      auto const sum = tide::summarize(t, schedule_of(0));
      best.first = std::min(best.first, sum.forward_us * 1e-6);
      best.second = std::min(best.second, sum.backward_us * 1e-6);
    }
    return best;
  }();
  return s;
}

void step_time(benchmark::State& state, int policy) {
  double const ratio = static_cast<double>(state.range(0)) / 100.0;
  double const bytes = static_cast<double>(schedule_of(1).peak_host_bytes());
  auto const [fwd_s, bwd_s] = compute_seconds();
  tide::host_backend_options o;
  o.d2h = {.bytes_per_second = bytes / (ratio * fwd_s), .latency_us = 20};
  o.h2d = {.bytes_per_second = bytes / (ratio * bwd_s), .latency_us = 20};
  tide::host_backend b(o);
  tide::timeline t;
  auto const& s = schedule_of(policy);
  tide::executor exec(b, s, {.debug_checks = false, .check_schedule = false, .timeline = &t});
  mlp::network net(net_cfg);
  auto f = [&](auto const& c) { net.forward(c); };
  auto g = [&](auto const& c) { net.backward(c); };
  exec.step(f, g);  // warm up
  double exposed = 0;
  for (auto _ : state) {
    exec.step(f, g);
    state.PauseTiming();
    net.update();
    exposed += tide::summarize(t, s).exposed_transfer_us;
    state.ResumeTiming();
  }
  state.counters["exposed_ms"] = exposed / 1000.0 / static_cast<double>(state.iterations());
  state.counters["device_KiB"] = static_cast<double>(s.peak_device_bytes()) / 1024.0;
  state.counters["link_over_compute"] = ratio;
}

//! The paced link's own timing: a chain of `copies` copies, each behind the previous one on the
//! other copy stream (an offload, a prefetch waiting for it, an offload waiting for that, ...),
//! each nominally 0.5 ms. With `busy` (range 0), the compute stream spins meanwhile, as compute
//! beside copies does, so the two copy workers share what is left of the cores. `vs_nominal`: the
//! chain's time over its nominal time; what the workers' wake-ups and memcpys add to the link.
void paced_chain(benchmark::State& state) {
  constexpr std::uint32_t copies = 32;
  constexpr std::size_t bytes = 256 << 10;
  constexpr double copy_s = 0.5e-3;
  bool const busy = state.range(0) != 0;
  tide::host_backend_options o;
  o.d2h = o.h2d = {.bytes_per_second = static_cast<double>(bytes) / copy_s, .latency_us = 0};
  tide::host_backend b(o);
  auto const a = b.setup({.ops = 3 * copies, .events = copies, .device_bytes = bytes, .host_bytes = bytes});
  tide::op const offload{.kind = tide::op_kind::offload, .stream = tide::stream_role::d2h};
  tide::op const prefetch{.kind = tide::op_kind::prefetch, .stream = tide::stream_role::h2d};
  std::atomic<bool> done{false};
  auto const spin = [](void* d, std::uint32_t) noexcept {
    while (!static_cast<std::atomic<bool>*>(d)->load(std::memory_order_acquire)) {
    }
  };
  auto const stop = [](void* d, std::uint32_t) noexcept { static_cast<std::atomic<bool>*>(d)->store(true, std::memory_order_release); };
  double seconds = 0;
  for (auto _ : state) {
    done.store(false);
    auto const t0 = std::chrono::steady_clock::now();
    b.begin_step({});
    if (busy) b.host_task(tide::stream_role::compute, {spin, &done, 0});
    for (std::uint32_t i = 0; i < copies; ++i) {
      bool const up = i % 2 != 0;
      auto const r = up ? tide::stream_role::h2d : tide::stream_role::d2h;
      if (i > 0) b.wait(r, i - 1);
      if (up) b.copy(r, i, prefetch, a.device, a.host, bytes);
      else b.copy(r, i, offload, a.host, a.device, bytes);
      b.record(r, i);
      if (i + 1 == copies) b.host_task(r, {stop, &done, 0});
    }
    b.end_step();
    b.wait_step();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.counters["vs_nominal"] = seconds / static_cast<double>(state.iterations()) / (copies * copy_s);
}

void register_all() {
  benchmark::RegisterBenchmark("paced_chain/idle", paced_chain)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("paced_chain/beside_compute", paced_chain)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (int ratio : {30, 50, 70}) {
    auto const r = std::to_string(ratio);
    benchmark::RegisterBenchmark(("keep_all/link" + r).c_str(), step_time, 0)->Arg(ratio)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("offload_hidden/link" + r).c_str(), step_time, 1)->Arg(ratio)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("offload_naive/link" + r).c_str(), step_time, 2)->Arg(ratio)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("remat/link" + r).c_str(), step_time, 3)->Arg(ratio)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

// Run with --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true and compare
// medians: on a shared 2-core machine step times drift by more than the effects measured.
int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
