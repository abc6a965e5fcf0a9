// GPU benchmarks, side by side in one run (bench/gpu/check.sh prints them as a table):
// - pinned D2H/H2D bandwidth through tide's backend against raw cudaMemcpyAsync, same sizes;
// - step time of keep-all, remat, offload with copies on the compute stream, offload with latency
//   hiding (with and without a high-priority prefetch stream), and latency hiding with chunked
//   copies, on a stack where keep-all fits;
// - the largest batch that fits under a device budget, per policy.
// Without a GPU it says so and exits 77.
#include <benchmark/benchmark.h>

#include "model.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

// ---- copy bandwidth ---------------------------------------------------------------------------

struct copy_buffers {
  std::size_t bytes;
  void* device = nullptr;
  void* host = nullptr;
  explicit copy_buffers(std::size_t n) : bytes(n) {
    TIDE_CUDA_CHECK(cudaMalloc(&device, n));
    TIDE_CUDA_CHECK(cudaHostAlloc(&host, n, cudaHostAllocPortable));
    TIDE_CUDA_CHECK(cudaMemset(device, 1, n));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~copy_buffers() {
    static_cast<void>(cudaFree(device));
    static_cast<void>(cudaFreeHost(host));
  }
};

// Both variants time enqueue + completion of one copy with the host clock, so they are measured
// the same way; tide's includes its NVTX range, the end-of-step join and the synchronization of
// four streams.
void raw_copy(benchmark::State& state, bool to_host) {
  auto const n = static_cast<std::size_t>(state.range(0));
  copy_buffers b(n);
  cudaStream_t s = nullptr;
  TIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    if (to_host)
      TIDE_CUDA_CHECK(cudaMemcpyAsync(b.host, b.device, n, cudaMemcpyDeviceToHost, s));
    else
      TIDE_CUDA_CHECK(cudaMemcpyAsync(b.device, b.host, n, cudaMemcpyHostToDevice, s));
    TIDE_CUDA_CHECK(cudaStreamSynchronize(s));
    state.SetIterationTime(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  TIDE_CUDA_CHECK(cudaStreamDestroy(s));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void tide_copy(benchmark::State& state, bool to_host) {
  auto const n = static_cast<std::size_t>(state.range(0));
  tide::cuda_backend_options o;
  o.nvtx = true;
  tide::cuda_backend be(o);
  auto const a = be.setup({.ops = 1, .device_bytes = n, .host_bytes = n});
  TIDE_CUDA_CHECK(cudaMemset(a.device, 1, n));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  tide::op op;
  op.kind = to_host ? tide::op_kind::offload : tide::op_kind::prefetch;
  op.stream = to_host ? tide::stream_role::d2h : tide::stream_role::h2d;
  op.bytes = n;
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    be.begin_step({});  // no schedule: the copy's NVTX range names no slot
    if (to_host)
      be.copy(op.stream, 0, op, a.host, a.device, n);
    else
      be.copy(op.stream, 0, op, a.device, a.host, n);
    be.end_step();   // everything enqueued (does not block)
    be.wait_step();  // the copy has completed
    state.SetIterationTime(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void copy_sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t mib : {1, 16, 64, 256}) b->Arg(mib << 20);
  b->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
}

void d2h_raw(benchmark::State& s) { raw_copy(s, true); }
void d2h_tide(benchmark::State& s) { tide_copy(s, true); }
void h2d_raw(benchmark::State& s) { raw_copy(s, false); }
void h2d_tide(benchmark::State& s) { tide_copy(s, false); }
BENCHMARK(d2h_raw)->Apply(copy_sizes);
BENCHMARK(d2h_tide)->Apply(copy_sizes);
BENCHMARK(h2d_raw)->Apply(copy_sizes);
BENCHMARK(h2d_tide)->Apply(copy_sizes);

// ---- step time per policy -------------------------------------------------------------------------

// 16 layers, 1024 wide, 4096 tokens: 16 MiB per slot, 768 MiB for keep-all, which fits; the
// GEMMs make recompute expensive relative to a copy.
cuda_stack::dims const step_dims{16, 1024, 4096};
// Wide: 8 layers, 8192 wide, 1024 tokens: 32 MiB per slot, as step_dims's per-slot bytes x 2
// with 16x the GEMM work per byte, so that the copies can hide behind the compute (on an H200
// step_dims's copies take about 3.5x the compute; G2 is asserted only at a ratio up to 0.7).
cuda_stack::dims const wide_dims{8, 8192, 1024};

cuda_stack::model const& step_model(cuda_stack::dims const& d) {
  if (d.width == wide_dims.width) {
    static cuda_stack::model const m(wide_dims);
    return m;
  }
  static cuda_stack::model const m(step_dims);
  return m;
}

void step_time(benchmark::State& state, std::size_t policy, bool prefetch_priority, cuda_stack::dims const& dims = step_dims) {
  auto const& m = step_model(dims);
  auto const c = cuda_stack::policy_cases(dims).at(policy);
  auto const s = cuda_stack::build(dims, c);
  tide::cuda_backend_options bo;
  bo.prefetch_priority = prefetch_priority;
  tide::cuda_backend be(bo);
  tide::executor_options eo;
  eo.debug_checks = false;
  eo.check_schedule = false;
  tide::executor ex(be, s, eo);
  auto fwd = [&](tide::forward_context<cudaStream_t> const& ctx) { m.forward(ctx); };
  auto bwd = [&](tide::backward_context<cudaStream_t> const& ctx) { m.backward(ctx); };
  ex.step(fwd, bwd);  // warm-up
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    ex.step(fwd, bwd);
    state.SetIterationTime(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  state.counters["device_MiB"] = static_cast<double>(s.peak_device_bytes()) / (1 << 20);
  state.counters["host_MiB"] = static_cast<double>(s.peak_host_bytes()) / (1 << 20);
  state.SetLabel(c.name + (prefetch_priority ? "" : ", default prefetch priority"));
}

void step_keep_all(benchmark::State& s) { step_time(s, 0, true); }
void step_remat(benchmark::State& s) { step_time(s, 1, true); }
void step_offload_on_compute(benchmark::State& s) { step_time(s, 2, true); }
void step_offload_hidden(benchmark::State& s) { step_time(s, 3, true); }
void step_offload_hidden_default_priority(benchmark::State& s) { step_time(s, 3, false); }
void step_offload_hidden_chunked(benchmark::State& s) { step_time(s, 4, true); }
BENCHMARK(step_keep_all)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_remat)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_offload_on_compute)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_offload_hidden)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_offload_hidden_default_priority)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_offload_hidden_chunked)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
void step_wide_keep_all(benchmark::State& s) { step_time(s, 0, true, wide_dims); }
void step_wide_offload_on_compute(benchmark::State& s) { step_time(s, 2, true, wide_dims); }
void step_wide_offload_hidden(benchmark::State& s) { step_time(s, 3, true, wide_dims); }
BENCHMARK(step_wide_keep_all)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_wide_offload_on_compute)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);
BENCHMARK(step_wide_offload_hidden)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(10);

// ---- the largest batch under a device budget ----------------------------------------------------

// The budget is what keep-all needs at the step benchmark's batch. The search is over the
// schedule's predicted peak (what setup allocates); the result is then confirmed by allocating
// the arenas under the budget on the GPU.
void max_batch(benchmark::State& state, std::size_t policy) {
  auto const c = cuda_stack::policy_cases(step_dims).at(policy);
  auto const budget = cuda_stack::build(step_dims, cuda_stack::policy_cases(step_dims)[0]).peak_device_bytes();
  auto peak = [&](std::uint32_t batch) {
    auto d = step_dims;
    d.batch = batch;
    return cuda_stack::build(d, c).peak_device_bytes();
  };
  // The peak grows with the batch: scan up in steps of 64 tokens until it no longer fits.
  std::uint32_t const step = 64, limit = step_dims.batch * 64;
  std::uint32_t lo = 0;
  for (std::uint32_t b = step; b <= limit && peak(b) <= budget; b += step) lo = b;
  for (auto _ : state) {
    if (lo == 0) continue;
    auto d = step_dims;
    d.batch = lo;
    auto const s = cuda_stack::build(d, c);
    tide::cuda_backend_options bo;
    bo.device_budget = budget;
    tide::cuda_backend be(bo);
    tide::executor_options eo;
    eo.check_schedule = false;
    tide::executor ex(be, s, eo);  // allocates the arenas under the budget, or throws
    benchmark::DoNotOptimize(ex.memory().device);
  }
  state.counters["max_batch"] = lo;
  state.counters["budget_MiB"] = static_cast<double>(budget) / (1 << 20);
  state.SetLabel(c.name);
}

void max_batch_keep_all(benchmark::State& s) { max_batch(s, 0); }
void max_batch_remat(benchmark::State& s) { max_batch(s, 1); }
void max_batch_offload_hidden(benchmark::State& s) { max_batch(s, 3); }
BENCHMARK(max_batch_keep_all)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(max_batch_remat)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(max_batch_offload_hidden)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (auto const rc = example::without_device("gpu_bench")) return *rc;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
