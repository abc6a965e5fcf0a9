// The storage tier on this machine, side by side in one run:
// - the spill file's path: io_uring or pread/pwrite, O_DIRECT or buffered, 64 MiB transfers each
//   way (bytes per second);
// - a step of the chain workload (layer i + 1 reads layer i's output, 16 layers of 24 MiB) on the
//   host backend, its saved data kept, offloaded to pinned host memory, spilled to the file, or
//   rematerialized where a layer's recompute allows; the ratios to keep-all are the figures in
//   docs/performance.md.
// The directory is TIDE_BENCH_STORAGE_DIR, else the system's temporary directory: put it on the
// drive to be measured (a tmpfs measures memory, and refuses O_DIRECT).
#include <benchmark/benchmark.h>

#include <tide/tide.hpp>

#include "../tests/workload.hpp"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <string>

namespace {

std::string storage_dir() {
  if (auto const* d = std::getenv("TIDE_BENCH_STORAGE_DIR")) return d;
  return std::filesystem::temp_directory_path().string();
}

constexpr std::size_t transfer_bytes = std::size_t{64} << 20;

// args: io (0 io_uring, 1 pread/pwrite), direct (0/1), write (1) or read (0).
void BM_SpillFile(benchmark::State& state) {
  auto const io = state.range(0) == 0 ? tide::storage_io::io_uring : tide::storage_io::posix;
  bool const direct = state.range(1) != 0, write = state.range(2) != 0;
  tide::storage_options o{.directory = storage_dir(), .io = io, .direct = direct, .quiet = true};
  tide::spill_file f(o, transfer_bytes, 4096);
  auto* buf = static_cast<std::byte*>(::operator new(transfer_bytes, std::align_val_t{4096}));
  for (std::size_t i = 0; i < transfer_bytes; ++i) buf[i] = static_cast<std::byte>(i * 2654435761u >> 24);
  f.register_memory({buf, transfer_bytes});
  f.write(buf, 0, transfer_bytes);  // what the reads read
  for (auto _ : state) {
    if (write) f.write(buf, 0, transfer_bytes);
    else f.read(buf, 0, transfer_bytes);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * transfer_bytes));
  state.SetLabel(f.description());
  ::operator delete(buf, std::align_val_t{4096});
}
BENCHMARK(BM_SpillFile)
    ->ArgNames({"posix", "direct", "write"})
    ->ArgsProduct({{0, 1}, {1, 0}, {1, 0}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The chain workload's step: 16 layers, each saving its 16 MiB input and an 8 MiB derived slot.
tide::stack_spec const& chain_stack() {
  static auto const s = tide::stack_spec{}.append(
      tide::layer_spec{"blk", {{"input", std::size_t{16} << 20, true}, {"h", std::size_t{8} << 20}}}, 16);
  return s;
}

tide::schedule const& schedule_of(int policy) {
  static std::map<int, tide::schedule> cache;
  if (auto it = cache.find(policy); it != cache.end()) return it->second;
  using tide::placement;
  tide::strategy how;
  // The last two layers are consumed right after they are produced: kept.
  auto const upto = tide::from_end(2);
  if (policy == 1) how.policy = {tide::rule_spec{.where = placement::offload, .last_layer = upto}};
  if (policy == 2) how.policy = {tide::rule_spec{.where = placement::spill, .last_layer = upto}};
  if (policy == 3)
    how.policy = {tide::rule_spec{.where = placement::spill, .slots = {"input"}, .last_layer = upto},
                  tide::rule_spec{.where = placement::remat, .slots = {"h"}}};
  return cache[policy] = tide::build_schedule(chain_stack(), how);
}

// args: policy (0 keep-all, 1 offload, 2 spill, 3 spill the input and remat the rest).
void BM_ChainStep(benchmark::State& state) {
  auto const& s = schedule_of(static_cast<int>(state.range(0)));
  tide::host_backend_options o;
  o.storage = {.directory = storage_dir(), .quiet = true};
  tide::host_backend b(o);
  tide::executor ex(b, s, {.debug_checks = false, .check_schedule = false});
  workload::chain w(s);
  auto f = [&](auto const& c) { w.forward(c); };
  auto g = [&](auto const& c) { w.backward(c); };
  ex.step(f, g);  // warm: the file is written once before it is timed
  for (auto _ : state) ex.step(f, g);
  state.counters["device_MiB"] = static_cast<double>(s.peak_device_bytes()) / (1 << 20);
  state.counters["host_MiB"] = static_cast<double>(s.peak_host_bytes()) / (1 << 20);
  state.counters["storage_MiB"] = static_cast<double>(s.peak_storage_bytes()) / (1 << 20);
  static char const* names[] = {"keep-all", "offload", "spill", "spill input, remat h"};
  state.SetLabel(names[state.range(0)]);
}
BENCHMARK(BM_ChainStep)->ArgName("policy")->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
