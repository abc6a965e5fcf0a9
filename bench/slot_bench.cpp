// The cost of naming a slot inside a lambda, side by side: a handle resolved at compile time
// (`ctx.slot(handle)`), a name resolved once per thread and layer type then cached
// (`ctx.slot<"name">()`), and a name searched at run time (`ctx.slot(ctx.slot_index(name))`,
// the only way in 0.1), on a layer of 16 slots asking for the last one.
#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <string_view>

#include <tide/tide.hpp>

namespace {

using wide = tide::layer<"wide", tide::slot<"s00", 64>, tide::slot<"s01", 64>, tide::slot<"s02", 64>,
                         tide::slot<"s03", 64>, tide::slot<"s04", 64>, tide::slot<"s05", 64>, tide::slot<"s06", 64>,
                         tide::slot<"s07", 64>, tide::slot<"s08", 64>, tide::slot<"s09", 64>, tide::slot<"s10", 64>,
                         tide::slot<"s11", 64>, tide::slot<"s12", 64>, tide::slot<"s13", 64>, tide::slot<"s14", 64>,
                         tide::slot<"the_last_slot", 64>>;
constexpr auto last = tide::slot_handle_of<wide, "the_last_slot", float>;

//! A forward context of layer 0 of a one-layer stack of `wide`, over a real arena.
struct fixture {
  tide::schedule s = tide::build_schedule(tide::stack<tide::independent_layers, wide>::spec(), tide::strategy{});
  std::array<std::byte, 1 << 14> arena{};
  tide::forward_context<int> ctx;
  fixture() {
    ctx.bindings = s.view().slots_of(0);
    ctx.type_name = s.layers[0].type_name;
    ctx.device = arena.data();
  }
};

void handle(benchmark::State& state) {
  fixture f;
  for (auto _ : state) benchmark::DoNotOptimize(f.ctx.slot(last).data());
}
BENCHMARK(handle);

void cached_name(benchmark::State& state) {
  fixture f;
  for (auto _ : state) benchmark::DoNotOptimize(f.ctx.slot<"the_last_slot", float>().data());
}
BENCHMARK(cached_name);

void searched_name(benchmark::State& state) {
  fixture f;
  std::string_view name = "the_last_slot";
  benchmark::DoNotOptimize(name);
  for (auto _ : state) benchmark::DoNotOptimize(f.ctx.slot(f.ctx.slot_index(name)).data());
}
BENCHMARK(searched_name);

}  // namespace

BENCHMARK_MAIN();
