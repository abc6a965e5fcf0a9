// The transformer demo's policies on the host backend with a paced link, side by side in one run:
// keep-all, full remat, and DeepSeek's projection offload with copies on the compute stream,
// with latency hiding, and pipelined. The link is paced so that the offloads take `ratio` of the
// forward compute they can hide behind and the prefetches `ratio` of the backward. Goal: at a
// ratio of 70% latency-hidden offload's exposed copy time under 10% of the naive pipeline's.
#include <benchmark/benchmark.h>

#include "../examples/transformer/task.hpp"
#include "../examples/transformer/tide_model.hpp"

#include <tide/tide.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace {

transformer::config const net{.vocab = 32,
                              .width = 96,
                              .heads = 4,
                              .kv_heads = 2,
                              .layers = 8,
                              .dense_layers = 2,
                              .mlp_hidden = 256,
                              .experts = 8,
                              .top_k = 2,
                              .expert_hidden = 96,
                              .shared_hidden = 96};
transformer::shape const batch{8, 48};

tide::stack_spec const& stack() {
  static auto const s = transformer::make_stack(net, batch);
  return s;
}
std::vector<transformer::named_strategy> const& policies() {
  static auto const p = transformer::published_strategies();
  return p;
}
tide::schedule const& schedule_of(std::size_t i) {
  static std::map<std::size_t, tide::schedule> cache;
  if (auto it = cache.find(i); it != cache.end()) return it->second;
  return cache[i] = tide::build_schedule(stack(), policies()[i].strategy);
}
std::size_t index_of(std::string_view name) {
  for (std::size_t i = 0; i < policies().size(); ++i)
    if (policies()[i].name == name) return i;
  return 0;
}

struct data {
  std::vector<std::int32_t> tokens, targets;
};
data const& the_data() {
  static auto const d = [] {
    data x;
    transformer::rng r{1};
    transformer::copy_task{.length = batch.seq / 2, .vocab = net.vocab}.sample(r, batch.batch, x.tokens, x.targets);
    return x;
  }();
  return d;
}

//! Forward and backward compute time of one keep-all step, the best of a few, on an unpaced backend.
std::pair<double, double> compute_seconds() {
  static auto const s = [] {
    tide::host_backend b;
    tide::timeline t;
    tide::executor exec(b, schedule_of(0), {.debug_checks = false, .check_schedule = false, .timeline = &t});
    transformer::trainer tr(net, batch);
    std::pair<double, double> best{1e30, 1e30};
    for (int i = 0; i < 6; ++i) {
      tr.step(exec, the_data().tokens, the_data().targets);
      auto const sum = tide::summarize(t, schedule_of(0));
      best.first = std::min(best.first, sum.forward_us * 1e-6);
      best.second = std::min(best.second, sum.backward_us * 1e-6);
    }
    return best;
  }();
  return s;
}

void step_time(benchmark::State& state, std::size_t policy) {
  double const ratio = static_cast<double>(state.range(0)) / 100.0;
  double const bytes = static_cast<double>(schedule_of(index_of("deepseek-lhs")).peak_host_bytes());
  auto const [fwd_s, bwd_s] = compute_seconds();
  tide::host_backend_options o;
  o.d2h = {.bytes_per_second = bytes / (ratio * fwd_s), .latency_us = 20};
  o.h2d = {.bytes_per_second = bytes / (ratio * bwd_s), .latency_us = 20};
  tide::host_backend b(o);
  tide::timeline t;
  auto const& s = schedule_of(policy);
  tide::executor exec(b, s, {.debug_checks = false, .check_schedule = false, .timeline = &t});
  transformer::trainer tr(net, batch);
  tr.step(exec, the_data().tokens, the_data().targets);  // warm up
  double exposed = 0;
  for (auto _ : state) {
    tr.step(exec, the_data().tokens, the_data().targets);
    state.PauseTiming();
    exposed += tide::summarize(t, s).exposed_transfer_us;
    state.ResumeTiming();
  }
  state.counters["exposed_ms"] = exposed / 1000.0 / static_cast<double>(state.iterations());
  state.counters["device_KiB"] = static_cast<double>(s.peak_device_bytes()) / 1024.0;
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(batch.tokens()) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["link_over_compute"] = ratio;
}

void register_all() {
  for (int ratio : {50, 70})
    for (auto name : {"keep-all", "full-remat", "deepseek-naive", "deepseek-lhs", "deepseek-lhs-pipelined"}) {
      auto const label = std::string(name) + "/link" + std::to_string(ratio);
      benchmark::RegisterBenchmark(label.c_str(), step_time, index_of(name))->Arg(ratio)->UseRealTime()->Unit(benchmark::kMillisecond);
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
