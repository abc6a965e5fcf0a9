// The CUDA backend on a real GPU: gradients bitwise equal between policies, graph replay equal to
// eager steps, budgets, error paths, timelines, user streams and resources, NCCL hooks. Without a
// device the program exits 77 before running anything (Meson: skipped).
#include <gtest/gtest.h>

#include "model.hpp"

#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/backends/cuda/cuda_graph.hpp>
#if TIDE_HAS_NCCL
#include <tide/collectives/nccl.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

using cuda_stack::bitwise_equal;

namespace {

cuda_stack::dims const small{4, 64, 48};

bool contains(std::string const& s, char const* what) { return s.find(what) != std::string::npos; }

tide::schedule keep_schedule() { return cuda_stack::build(small, cuda_stack::policy_cases(small)[0]); }
tide::schedule hidden_schedule() { return cuda_stack::build(small, cuda_stack::policy_cases(small)[3]); }

}  // namespace

// nvcc's front end passes a class-type template argument on to the host compiler as a brace list,
// so a layer_bound must be constructible from one: this did not compile in a .cu file once (the
// check is that this file compiles; CI compiles it).
TEST(CudaBackend, LayerRangeFromTheEndCompilesInACuFile) {
  tide::rule_spec r;
  tide::layer_range<tide::from_end(1), tide::from_end(0)>::apply(r);
  EXPECT_EQ(r.first_layer, tide::from_end(1));
}

TEST(CudaBackend, SatisfiesTheBackendConcept) {
  static_assert(tide::backend<tide::cuda_backend>);
  static_assert(std::is_same_v<tide::cuda_backend::stream_type, cudaStream_t>);
  static_assert(!tide::cuda_backend::device_memory_is_host_accessible);
}

TEST(CudaBackend, GradientsAreBitwiseEqualBetweenPolicies) {
  cuda_stack::model const m(small);
  auto const cases = cuda_stack::policy_cases(small);
  cuda_stack::run_options o;
  o.exec.debug_checks = true;  // prefetch checks run as host functions (release builds too)
  auto const keep = cuda_stack::run(m, cuda_stack::build(small, cases[0]), o);
  ASSERT_FALSE(keep.grads.empty());
  bool nonzero = false;
  for (float g : keep.grads) nonzero |= g != 0.0f;
  EXPECT_TRUE(nonzero) << "the gradients are all zero: the stack computes nothing";
  for (std::size_t i = 1; i < cases.size(); ++i) {
    auto const r = cuda_stack::run(m, cuda_stack::build(small, cases[i]), o);
    EXPECT_TRUE(bitwise_equal(r.grads, keep.grads)) << cases[i].name;
  }
  // Chunk sizes that do not divide the slot, and phase regions not shared.
  auto odd = cases[4];
  odd.strategy.pipeline.chunk_bytes = 4096 + 256;
  odd.strategy.buffers.share_phase_regions = false;
  EXPECT_TRUE(bitwise_equal(cuda_stack::run(m, cuda_stack::build(small, odd), o).grads, keep.grads));
  // Mixed: remat some layers, offload others, just-in-time prefetch, one staging buffer.
  cuda_stack::policy_case const mixed{
      "mixed",
      {.policy = {tide::rule_spec{.where = tide::placement::remat, .slots = {"act"}, .last_layer = 2},
                  tide::rule_spec{.where = tide::placement::offload, .slots = {"input", "pre"}, .first_layer = 1}},
       .buffers = {.staging_buffers = 1},
       .pipeline = {.prefetch_distance = 0, .max_offloads_in_flight = 1}}};
  EXPECT_TRUE(bitwise_equal(cuda_stack::run(m, cuda_stack::build(small, mixed), o).grads, keep.grads));
}

// The storage tier, staged through the pinned spill ring: stores and loads as host functions on
// the storage stream, reading and writing a spill file (io_uring where the machine has it).
TEST(CudaBackend, SpilledSlotsAreBitwiseEqualToKeepAll) {
  cuda_stack::model const m(small);
  auto const cases = cuda_stack::policy_cases(small);
  cuda_stack::run_options o;
  o.exec.debug_checks = true;
  auto const keep = cuda_stack::run(m, cuda_stack::build(small, cases[0]), o);
  char dir[] = "/tmp/tide-cuda-spill-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  o.backend.storage = {.directory = dir, .quiet = true};
  o.backend.gpu_direct = tide::gpu_direct_mode::off;
  for (bool hiding : {true, false}) {
    cuda_stack::policy_case const spill{
        hiding ? "spill" : "spill, serial",
        {.policy = {tide::rule_spec{.where = tide::placement::spill, .slots = {"input", "pre"}}},
         .buffers = {.spill_buffers = 1},
         .pipeline = {.latency_hiding = hiding, .chunk_bytes = 4096 + 256}}};
    auto const sched = cuda_stack::build(small, spill);
    ASSERT_GT(sched.peak_storage_bytes(), 0u);
    auto const r = cuda_stack::run(m, sched, o);
    EXPECT_TRUE(bitwise_equal(r.grads, keep.grads)) << spill.name;
    EXPECT_EQ(r.storage_path.rfind("staged through the pinned ring (gpu_direct_mode::off)", 0), 0u) << r.storage_path;
    EXPECT_EQ(r.gpu_direct_ring_bytes, 0u);
  }
  ::rmdir(dir);
}

TEST(CudaBackend, GraphReplayEqualsEagerStep) {
  cuda_stack::model const m(small);
  for (auto const& c : cuda_stack::policy_cases(small)) {
    auto const s = cuda_stack::build(small, c);
    cuda_stack::run_options eager;
    eager.exec.debug_checks = false;
    auto const e = cuda_stack::run(m, s, eager);
    cuda_stack::run_options graph = eager;
    graph.graph = true;
    auto const g = cuda_stack::run(m, s, graph);
    EXPECT_TRUE(bitwise_equal(g.grads, e.grads)) << c.name;
  }
  // Debug checks cannot be captured: their host nodes would replay with stale counters.
  auto const s = hidden_schedule();
  tide::cuda_backend be(example::backend_options());
  tide::executor_options eo;
  eo.debug_checks = true;
  tide::executor ex(be, s, eo);
  tide::cuda_graph g;
  EXPECT_THROW(g.capture(
                   ex, [&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); },
                   [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); }),
               tide::error);
  EXPECT_FALSE(g.ready());
  EXPECT_FALSE(be.capturing());
}

// The turn (tide::turn{f}) runs on the compute stream between the last forward and the first
// backward, eagerly and inside a captured graph (its memset becomes a node of the graph).
TEST(CudaBackend, TheTurnRunsOnTheComputeStreamEagerAndCaptured) {
  cuda_stack::model const m(small);
  auto const s = hidden_schedule();
  tide::cuda_backend be(example::backend_options());
  tide::executor_options eo;
  eo.debug_checks = false;
  tide::executor ex(be, s, eo);
  int* flag = nullptr;
  ASSERT_EQ(cudaMalloc(&flag, sizeof(int)), cudaSuccess);
  int turns = 0;
  cudaStream_t seen = nullptr;
  auto fwd = [&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); };
  auto bwd = [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); };
  tide::turn const turn{[&](tide::turn_context<cudaStream_t> const& c) {
    ++turns;
    seen = c.stream;
    EXPECT_EQ(c.layer, s.layer_count() - 1);
    EXPECT_TRUE(c.output().empty());  // cuda_stack has no carry
    TIDE_CUDA_CHECK(cudaMemsetAsync(flag, 1, sizeof(int), c.stream));
  }};
  auto read_flag = [&] {
    int v = 0;
    TIDE_CUDA_CHECK(cudaMemcpy(&v, flag, sizeof(int), cudaMemcpyDeviceToHost));
    TIDE_CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
    return v;
  };
  TIDE_CUDA_CHECK(cudaMemset(flag, 0, sizeof(int)));
  ex.step(fwd, bwd, turn);
  EXPECT_EQ(turns, 1);
  EXPECT_EQ(seen, be.stream(tide::stream_role::compute));
  EXPECT_EQ(read_flag(), 0x01010101);
  tide::cuda_graph g;
  g.capture(ex, fwd, bwd, turn);  // runs nothing on the device: the memset is captured
  EXPECT_EQ(turns, 2);
  for (int i = 0; i < 2; ++i) {
    g.replay();
    TIDE_CUDA_CHECK(cudaStreamSynchronize(be.stream(tide::stream_role::compute)));
    EXPECT_EQ(read_flag(), 0x01010101) << "replay " << i;
  }
  EXPECT_EQ(turns, 2);  // a replay calls no host code
  static_cast<void>(cudaFree(flag));
}

TEST(CudaBackend, ArenasAreAllocatedOnceAtStableAddresses) {
  struct counting_resource {
    int allocations = 0;
    void* allocate(std::size_t n, std::size_t a) {
      ++allocations;
      return tide::device_memory_resource{}.allocate(n, a);
    }
    void deallocate(void* p, std::size_t n, std::size_t a) noexcept { tide::device_memory_resource{}.deallocate(p, n, a); }
  } counting;
  cuda_stack::model const m(small);
  auto const s = hidden_schedule();
  auto bo = example::backend_options();
  bo.device_resource = counting;
  tide::cuda_backend be(bo);
  tide::executor ex(be, s);
  auto const before = ex.memory();
  auto fwd = [&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); };
  auto bwd = [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); };
  for (int i = 0; i < 3; ++i) ex.step(fwd, bwd);
  EXPECT_EQ(counting.allocations, 1);
  EXPECT_EQ(ex.memory().device, before.device);
  EXPECT_EQ(ex.memory().host, before.host);
  EXPECT_GE(be.device_arena_bytes(), s.peak_device_bytes());
  EXPECT_GE(be.host_arena_bytes(), s.peak_host_bytes());
}

TEST(CudaBackend, UserComputeStream) {
  cuda_stack::model const m(small);
  cudaStream_t user = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> grads;
  {
    tide::cuda_backend be(user);  // a cudaStream_t converts to cuda::stream_ref
    EXPECT_EQ(be.stream(tide::stream_role::compute), user);
    EXPECT_NE(be.stream(tide::stream_role::h2d), user);
    auto const s = hidden_schedule();
    tide::executor ex(be, s);
    m.clear_gradients();
    ex.step([&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); },
            [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); });
    grads = m.gradients();
  }
  EXPECT_EQ(cudaStreamDestroy(user), cudaSuccess);  // tide did not destroy the user's stream
  EXPECT_TRUE(bitwise_equal(grads, cuda_stack::run(m, keep_schedule(), {}).grads));
}

TEST(CudaBackend, OutOfMemoryUnderABudget) {
  auto const s = hidden_schedule();
  auto bo = example::backend_options();
  bo.device_budget = s.peak_device_bytes() - 1;
  tide::cuda_backend be(bo);
  try {
    tide::executor ex(be, s);
    FAIL() << "expected tide::out_of_memory";
  } catch (tide::out_of_memory const& e) {
    EXPECT_EQ(e.requested, s.peak_device_bytes());
    EXPECT_EQ(e.budget, bo.device_budget);
    EXPECT_TRUE(contains(e.what(), "device arena")) << e.what();
  }
  auto host = example::backend_options();
  host.host_budget = s.peak_host_bytes() / 2;
  tide::cuda_backend hb(host);
  EXPECT_THROW(tide::executor(hb, s), tide::out_of_memory);
  // Exactly the predicted peak fits.
  auto exact = example::backend_options();
  exact.device_budget = s.peak_device_bytes();
  exact.host_budget = s.peak_host_bytes();
  tide::cuda_backend eb(exact);
  EXPECT_NO_THROW(tide::executor(eb, s));
}

TEST(CudaBackend, UserExceptionsAreRethrownAfterTheStep) {
  cuda_stack::model const m(small);
  auto const s = hidden_schedule();
  tide::cuda_backend be(example::backend_options());
  tide::executor ex(be, s);
  auto bwd = [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); };
  auto bad = [&](tide::forward_context<cudaStream_t> const& c) {
    if (c.layer == 2) throw std::runtime_error("layer 2 failed");
    m.forward(c);
  };
  EXPECT_THROW(ex.step(bad, bwd), std::runtime_error);
  EXPECT_NO_THROW(ex.step([&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); }, bwd));
}

TEST(CudaBackend, TimelineFromTimedEvents) {
  cuda_stack::model const m(small);
  auto const s = hidden_schedule();
  cuda_stack::run_options o;
  o.trace = true;
  auto const r = cuda_stack::run(m, s, o);
  ASSERT_EQ(r.trace.ops.size(), s.ops.size());
  std::size_t side = 0;
  for (auto const& span : r.trace.ops) {
    EXPECT_GE(span.begin_us, 0.0);
    EXPECT_GE(span.end_us, span.begin_us);
    EXPECT_EQ(span.stream, s.ops[span.op].stream);
    side += span.stream != tide::stream_role::compute;
  }
  EXPECT_GT(side, 0u);
  EXPECT_GT(r.summary.step_us, 0.0);
}

#if TIDE_HAS_NCCL
TEST(CudaBackend, NcclAllReduceAfterBackward) {
  ncclComm_t comm = nullptr;
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  TIDE_NCCL_CHECK(ncclCommInitAll(&comm, 1, &dev));
  {
    cuda_stack::model const m(small);
    auto const c = cuda_stack::policy_cases(small)[3];
    auto with_reduce = c.strategy;
    with_reduce.collectives = {.after_backward = true};
    auto const s = cuda_stack::build(small, with_reduce);
    tide::nccl_hooks hooks(comm, small.layers);
    for (std::uint32_t l = 0; l < small.layers; ++l) hooks.all_reduce(l, m.weight_grad(l), m.weight_elements());
    auto const plain = cuda_stack::run(m, cuda_stack::build(small, c), {});
    tide::hooks const reduce{.after_backward = std::ref(hooks)};  // stateful: by reference
    auto const reduced = cuda_stack::run(m, s, {}, reduce);  // one rank: the sum is the identity
    EXPECT_TRUE(bitwise_equal(reduced.grads, plain.grads));
    cuda_stack::run_options graph;
    graph.graph = true;
    EXPECT_TRUE(bitwise_equal(cuda_stack::run(m, s, graph, reduce).grads, plain.grads));
    EXPECT_THROW(hooks.all_reduce(small.layers, m.weight_grad(0), 1), tide::collective_error);
  }
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}
#endif

// ---- ordering and failure guarantees (docs/cuda.md) --------------------------------------------

namespace {
//! Spins for about `ns` nanoseconds, then sets *flag: work "already queued" on a stream.
__global__ void spin_then_set(int* flag, unsigned long long ns) {
  auto const start = clock64();
  // clock64 counts SM cycles; ~1 GHz or more, so this spins at least `ns` nanoseconds.
  while (static_cast<unsigned long long>(clock64() - start) < ns) {
  }
  *flag = 1;
}
__global__ void copy_int(int const* from, int* to) { *to = *from; }
//! Spins until *release (mapped pinned memory) is non-zero: a collective whose peer never comes.
__global__ void wait_for(int const volatile* release) {
  while (*release == 0) {
  }
}
}  // namespace

// Item 1: the side streams are forked from the compute stream at every step start, traced or not,
// so a gather (comm stream, no waits in the program) sees what was queued before the step.
TEST(CudaBackend, SideStreamsStartAfterWorkQueuedBeforeTheStep) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 2 * sizeof(int)), cudaSuccess);
  {
    tide::cuda_backend be(example::backend_options());
    auto with_gather = cuda_stack::policy_cases(small)[0].strategy;
    with_gather.collectives = {.before_forward = true};
    auto const s = cuda_stack::build(small, with_gather);
    tide::executor ex(be, s);
    spin_then_set<<<1, 1, 0, be.stream(tide::stream_role::compute)>>>(d, 50'000'000);  // ~50 ms
    auto none = [](auto const&) {};
    ex.step(none, none, tide::hooks{.before_forward = [&](tide::collective_context<cudaStream_t> const& c) {
              if (c.layer == 0) copy_int<<<1, 1, 0, c.stream>>>(d, d + 1);
            }});
  }
  int seen = 0;
  ASSERT_EQ(cudaMemcpy(&seen, d + 1, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(seen, 1) << "the gather ran before the work queued on the compute stream finished";
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

// enqueue returns with the compute stream carrying the whole step: work queued on it afterwards
// sees what a side stream (here the reduce hook on the comm stream) did, without a host wait;
// and a second step on the same backend is refused until the first is waited for.
TEST(CudaBackend, EnqueueJoinsTheStepIntoTheComputeStream) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 2 * sizeof(int)), cudaSuccess);
  {
    tide::cuda_backend be(example::backend_options());
    auto with_reduce = cuda_stack::policy_cases(small)[3].strategy;
    with_reduce.collectives = {.after_backward = true};
    auto const s = cuda_stack::build(small, with_reduce);
    tide::executor ex(be, s);
    tide::executor other(be, s);
    auto none = [](auto const&) {};
    auto reduce = [&](tide::collective_context<cudaStream_t> const& c) {
      if (c.layer == 0) spin_then_set<<<1, 1, 0, c.stream>>>(d, 50'000'000);  // ~50 ms, the step's last op
    };
    tide::hooks h{.after_backward = reduce};
    ex.enqueue(none, none, h);
    try {
      other.enqueue(none, none, h);
      ADD_FAILURE() << "a second step was enqueued on a backend with one pending";
    } catch (tide::error const& e) {
      EXPECT_TRUE(contains(e.what(), "a step is already enqueued on this backend")) << e.what();
    }
    auto const compute = be.stream(tide::stream_role::compute);
    copy_int<<<1, 1, 0, compute>>>(d, d + 1);
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    int seen = 0;
    ASSERT_EQ(cudaMemcpy(&seen, d + 1, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(seen, 1) << "work queued on the compute stream after enqueue ran before the step's reduce hook";
    ex.wait();
    EXPECT_NO_THROW(other.step(none, none, h));
  }
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

// Item 3: a stream that never finishes (a collective whose peer died) ends in an error, not a
// hang: the watcher is told of the timeout, releases the work (as ncclCommAbort would) and throws.
TEST(CudaBackend, SynchronizationTimesOutThroughTheWatchers) {
  int* release = nullptr;
  ASSERT_EQ(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped), cudaSuccess);
  *release = 0;
  int* release_d = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&release_d, release, 0), cudaSuccess);
  {
    auto o = example::backend_options();
    o.sync_timeout = std::chrono::milliseconds(200);
    tide::cuda_backend be(o);
    bool told = false;
    be.watch([&](bool timed_out) {
      if (!timed_out) return;
      told = true;
      __atomic_store_n(release, 1, __ATOMIC_SEQ_CST);
      throw tide::collective_error("peer lost");
    });
    auto const s = keep_schedule();
    tide::executor ex(be, s);
    auto none = [](auto const&) {};
    auto const t0 = std::chrono::steady_clock::now();
    try {
      ex.step([&](tide::forward_context<cudaStream_t> const& c) {
        if (c.layer == 0) wait_for<<<1, 1, 0, c.stream>>>(release_d);
      }, none);
      FAIL() << "expected the watcher's error";
    } catch (tide::collective_error const& e) {
      EXPECT_TRUE(contains(e.what(), "peer lost")) << e.what();
    }
    EXPECT_TRUE(told);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    ex.step(none, none);  // the next step works
  }
  ASSERT_EQ(cudaFreeHost(release), cudaSuccess);
}

namespace {
struct pageable_resource {
  void* allocate(std::size_t n, std::size_t) { return std::malloc(n); }
  void deallocate(void* p, std::size_t, std::size_t) noexcept { std::free(p); }
};
}  // namespace

TEST(CudaBackend, PageableHostResourceIsRejected) {
  pageable_resource pageable;
  auto o = example::backend_options();
  o.host_resource = tide::resource_ref(pageable);
  tide::cuda_backend be(o);
  auto const s = hidden_schedule();
  try {
    tide::executor ex(be, s);
    FAIL() << "expected an error";
  } catch (tide::error const& e) {
    EXPECT_TRUE(contains(e.what(), "pageable host memory")) << e.what();
  }
}

TEST(CudaBackend, UnsuitableComputeStreamsAreRejected) {
  EXPECT_THROW(tide::cuda_backend{cudaStreamLegacy}, tide::error);
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  try {
    tide::cuda_backend be(blocking);
    FAIL() << "expected an error";
  } catch (tide::error const& e) {
    EXPECT_TRUE(contains(e.what(), "cudaStreamNonBlocking")) << e.what();
  }
  auto o = example::backend_options();
  o.allow_blocking_compute_stream = true;
  EXPECT_NO_THROW(tide::cuda_backend(blocking, o));
  ASSERT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

TEST(CudaBackend, ScheduleAlignmentReachesTheArenas) {
  tide::buffer_spec const b{.device_alignment = std::size_t{1} << 16, .host_alignment = std::size_t{1} << 16};
  auto how = cuda_stack::policy_cases(small)[3].strategy;
  how.buffers = b;
  auto const s = tide::build_schedule(cuda_stack::make_stack(small), how);
  tide::cuda_backend be(example::backend_options());
  try {
    tide::executor ex(be, s);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ex.memory().device) % b.device_alignment, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ex.memory().host) % b.host_alignment, 0u);
  } catch (tide::error const& e) {
    // cudaMalloc may not honour 64 KiB: then the backend must say so rather than misalign.
    EXPECT_TRUE(contains(e.what(), "aligned to less than")) << e.what();
  }
}

TEST(CudaBackend, WithdrawnCaptureLeavesTheNextStepEager) {
  cuda_stack::model const m(small);
  tide::cuda_backend be(example::backend_options());
  auto const s = keep_schedule();
  tide::executor ex(be, s);
  be.capture_next_step();
  be.cancel_capture();
  m.clear_gradients();
  ex.step([&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); },
          [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); });
  EXPECT_FALSE(be.capturing());
  EXPECT_THROW(be.end_capture(), tide::error);  // nothing was captured: the step ran
  EXPECT_TRUE(bitwise_equal(m.gradients(), cuda_stack::run(m, s, {}).grads));
}

#if TIDE_HAS_NCCL
// A rank whose step failed still joins its peers' collectives, and every rank learns of it in the
// step-end agreement (one rank here: its own flag comes back).
TEST(CudaBackend, NcclHooksAgreeOnAFailedStep) {
  ncclComm_t comm = nullptr;
  int dev = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  TIDE_NCCL_CHECK(ncclCommInitAll(&comm, 1, &dev));
  {
    float* buf = nullptr;
    ASSERT_EQ(cudaMalloc(&buf, 16 * sizeof(float)), cudaSuccess);
    tide::nccl_hooks hooks(comm, 2);
    hooks.all_reduce(1, buf, 16);
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    hooks({1, st, tide::op_kind::reduce, /*step_failed=*/true});
    hooks.agree({st, /*step_failed=*/true});
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    try {
      hooks.finish_step();
      FAIL() << "expected collective_error";
    } catch (tide::collective_error const& e) {
      EXPECT_TRUE(contains(e.what(), "rank 0 failed during this step")) << e.what();
    }
    hooks({1, st, tide::op_kind::reduce, false});
    hooks.agree({st, false});
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_NO_THROW(hooks.finish_step());
    EXPECT_TRUE(hooks.check_progress());
    ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
    ASSERT_EQ(cudaFree(buf), cudaSuccess);
  }
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}
#endif

// Last: should the invalid copy fail asynchronously after all, it cannot spoil the other tests.
TEST(CudaBackend, FailuresNameTheCall) {
  try {
    TIDE_CUDA_CHECK(cudaSetDevice(-1));
    FAIL() << "expected tide::cuda_error";
  } catch (tide::cuda_error const& e) {
    EXPECT_EQ(e.code, cudaErrorInvalidDevice);
    EXPECT_TRUE(contains(e.what(), "cudaSetDevice(-1)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cudaErrorInvalidDevice")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cuda_test.cu:")) << e.what();
    EXPECT_FALSE(e.sticky);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the non-sticky error was cleared

  // An invalid copy through the backend: reported as a cuda_error naming the call.
  tide::cuda_backend be(example::backend_options());
  be.setup({.ops = 1, .device_bytes = 256, .host_bytes = 256});
  tide::op o;
  o.kind = tide::op_kind::offload;
  o.stream = tide::stream_role::d2h;
  try {
    be.copy(tide::stream_role::d2h, 0, o, nullptr, nullptr, 64);
    be.synchronize();
    FAIL() << "expected tide::cuda_error";
  } catch (tide::cuda_error const& e) {
    EXPECT_TRUE(contains(e.what(), "cudaMemcpyAsync") || contains(e.what(), "cudaStreamSynchronize")) << e.what();
  }
  // ... and the backend still works afterwards.
  cuda_stack::model const m(small);
  EXPECT_NO_THROW(cuda_stack::run(m, hidden_schedule(), {}));
}

int main(int argc, char** argv) {
  if (auto const rc = example::without_device("cuda_test")) return *rc;
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
