// GPU benchmarks, side by side in one run (bench/gpu/check.sh prints them as a table):
// - pinned D2H/H2D bandwidth through tide's backend against raw cudaMemcpyAsync, same sizes;
// - step time of keep-all, remat, offload with copies on the compute stream, offload with latency
//   hiding (with and without a high-priority prefetch stream), and latency hiding with chunked
//   copies, on a stack where keep-all fits;
// - tide's fixed cost of one step (no op): the copy rows' tide time includes it once;
// - the largest batch that fits under a device budget, per policy.
// Without a GPU it says so and exits 77. Rows are JSON Lines (harness.hpp), written as each case ends.
#include "harness.hpp"
#include "model.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using gpu_bench::clock_type;
using gpu_bench::row;
using gpu_bench::seconds_since;

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
void raw_copy(row& r, std::size_t n, bool to_host, double min_time) {
  copy_buffers b(n);
  cudaStream_t s = nullptr;
  TIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto const [iterations, total] = gpu_bench::repeat(
      [&] {
        auto const t0 = clock_type::now();
        if (to_host)
          TIDE_CUDA_CHECK(cudaMemcpyAsync(b.host, b.device, n, cudaMemcpyDeviceToHost, s));
        else
          TIDE_CUDA_CHECK(cudaMemcpyAsync(b.device, b.host, n, cudaMemcpyHostToDevice, s));
        TIDE_CUDA_CHECK(cudaStreamSynchronize(s));
        return seconds_since(t0);
      },
      min_time, 5);
  TIDE_CUDA_CHECK(cudaStreamDestroy(s));
  r.set("iterations", iterations);
  r.set("us", 1e6 * total / iterations);
  r.set("bytes_per_second", static_cast<double>(n) * iterations / total);
}

// One tide step around one copy (`n` bytes), or around nothing (`n` = 0): the empty step is tide's
// fixed cost per step (begin, the end-of-step join of its streams, the wait), which every copy row
// of tide pays once and a bare cudaMemcpyAsync does not.
void tide_copy(row& r, std::size_t n, bool to_host, double min_time) {
  tide::cuda_backend_options o;
  o.nvtx = true;
  tide::cuda_backend be(o);
  auto const a = be.setup({.ops = 1, .device_bytes = std::max<std::size_t>(n, 1), .host_bytes = std::max<std::size_t>(n, 1)});
  if (n) TIDE_CUDA_CHECK(cudaMemset(a.device, 1, n));
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  tide::op op;
  op.kind = to_host ? tide::op_kind::offload : tide::op_kind::prefetch;
  op.stream = to_host ? tide::stream_role::d2h : tide::stream_role::h2d;
  op.bytes = n;
  auto const [iterations, total] = gpu_bench::repeat(
      [&] {
        auto const t0 = clock_type::now();
        be.begin_step({});  // no schedule: the copy's NVTX range names no slot
        if (n && to_host)
          be.copy(op.stream, 0, op, a.host, a.device, n);
        else if (n)
          be.copy(op.stream, 0, op, a.device, a.host, n);
        be.end_step();   // everything enqueued (does not block)
        be.wait_step();  // the copy has completed
        return seconds_since(t0);
      },
      min_time, 5);
  r.set("iterations", iterations);
  r.set("us", 1e6 * total / iterations);
  if (n) r.set("bytes_per_second", static_cast<double>(n) * iterations / total);
}

void add_copies(gpu_bench::runner& run) {
  for (bool to_host : {true, false})
    for (std::size_t mib : {1, 16, 64, 256}) {
      auto const n = mib << 20;
      std::string const d = to_host ? "d2h" : "h2d";
      run.add(d + "_raw/" + std::to_string(n), [=, &run](row& r) { raw_copy(r, n, to_host, run.min_time()); });
      run.add(d + "_tide/" + std::to_string(n), [=, &run](row& r) { tide_copy(r, n, to_host, run.min_time()); });
    }
  run.add("step_empty", [&run](row& r) {
    tide_copy(r, 0, true, run.min_time());
    r.set("label", "tide step with no op (fixed cost per step)");
  });
}

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

void step_time(row& r, std::size_t policy, bool prefetch_priority, cuda_stack::dims const& dims = step_dims) {
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
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    auto const t0 = clock_type::now();
    ex.step(fwd, bwd);
    ms.push_back(1e3 * seconds_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double m : ms) sum += m;
  r.set("real_time", sum / static_cast<double>(ms.size()));  // ms, the mean of 10 steps
  r.set("median_ms", (ms[4] + ms[5]) / 2);
  r.set("min_ms", ms.front());
  r.set("device_MiB", static_cast<double>(s.peak_device_bytes()) / (1 << 20));
  r.set("host_MiB", static_cast<double>(s.peak_host_bytes()) / (1 << 20));
  r.set("label", c.name + (prefetch_priority ? "" : ", default prefetch priority"));
}

void add_steps(gpu_bench::runner& run) {
  run.add("step_keep_all", [](row& r) { step_time(r, 0, true); });
  run.add("step_remat", [](row& r) { step_time(r, 1, true); });
  run.add("step_offload_on_compute", [](row& r) { step_time(r, 2, true); });
  run.add("step_offload_hidden", [](row& r) { step_time(r, 3, true); });
  run.add("step_offload_hidden_default_priority", [](row& r) { step_time(r, 3, false); });
  run.add("step_offload_hidden_chunked", [](row& r) { step_time(r, 4, true); });
  run.add("step_wide_keep_all", [](row& r) { step_time(r, 0, true, wide_dims); });
  run.add("step_wide_offload_on_compute", [](row& r) { step_time(r, 2, true, wide_dims); });
  run.add("step_wide_offload_hidden", [](row& r) { step_time(r, 3, true, wide_dims); });
}

// ---- the largest batch under a device budget ----------------------------------------------------

// The budget is what keep-all needs at the step benchmark's batch. The search is over the
// schedule's predicted peak (what setup allocates); the result is then confirmed by allocating
// the arenas under the budget on the GPU.
void max_batch(row& r, std::size_t policy) {
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
  if (lo != 0) {
    auto d = step_dims;
    d.batch = lo;
    auto const s = cuda_stack::build(d, c);
    tide::cuda_backend_options bo;
    bo.device_budget = budget;
    tide::cuda_backend be(bo);
    tide::executor_options eo;
    eo.check_schedule = false;
    tide::executor ex(be, s, eo);  // allocates the arenas under the budget, or throws
    if (ex.memory().device == nullptr) throw std::runtime_error("max_batch: the executor allocated no device arena");
  }
  r.set("max_batch", lo);
  r.set("budget_MiB", static_cast<double>(budget) / (1 << 20));
  r.set("label", c.name);
}

void add_max_batches(gpu_bench::runner& run) {
  run.add("max_batch_keep_all", [](row& r) { max_batch(r, 0); });
  run.add("max_batch_remat", [](row& r) { max_batch(r, 1); });
  run.add("max_batch_offload_hidden", [](row& r) { max_batch(r, 3); });
}

}  // namespace

int main(int argc, char** argv) {
  gpu_bench::runner run(argc, argv);
  add_copies(run);
  add_steps(run);
  add_max_batches(run);
  // --list needs no device: the GPU check's dry run reads the case names from it.
  if (!run.listing())
    if (auto const rc = example::without_device("gpu_bench")) return *rc;
  return run.run();
}
