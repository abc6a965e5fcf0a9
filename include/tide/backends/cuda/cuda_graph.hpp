#pragma once
//! \file
//! CUDA graphs: the capture machinery the CUDA backend runs a step through, and a whole
//! executor step captured into a graph and replayed step after step.
//!
//! Capture runs the executor's ordinary step with the backend in capture mode: the compute stream
//! begins a capture, the side streams join it through a fork event, every wait, record, kernel,
//! copy, host task and collective becomes a graph node, and a join event per side stream brings
//! them back before the capture ends. Nothing runs during capture; `replay` launches the graph on
//! the compute stream (or any stream) and returns without waiting.
//!
//! What replay reuses, so what must outlive the graph: the backend (its arenas, at stable
//! addresses, its streams and events, its pool of host tasks), the executor, every buffer and
//! pointer the user's lambdas passed to their kernels when they were captured, the NCCL
//! communicator and `nccl_hooks` (their failure flags are graph nodes' operands), and a cuBLAS
//! handle with its workspace (a captured GEMM uses that workspace). The executor's debug checks
//! must be off. Timelines are not recorded in replay.

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/backends/cuda/nvtx.hpp>
#include <tide/core/error.hpp>
#include <tide/core/vocabulary.hpp>
#include <tide/executor/backend.hpp>

namespace tide {

namespace detail {

//! Host tasks handed to `cudaLaunchHostFunc` need an address that stays valid until they run
//! (and, once captured into a graph, for the graph's lifetime). Blocks are kept and reused.
class task_pool {
 public:
  task* acquire(task t) {
    if (used_ == blocks_.size() * block_size) blocks_.push_back(std::make_unique<task[]>(block_size));
    auto* p = &blocks_[used_ / block_size][used_ % block_size];
    ++used_;
    *p = t;
    return p;
  }
  void reset() noexcept { used_ = 0; }

 private:
  static constexpr std::size_t block_size = 256;
  std::vector<std::unique_ptr<task[]>> blocks_;
  std::size_t used_ = 0;
};

// C++ linkage: an `extern "C"` inline function would be one weak global symbol, silently
// replaced by any other C function of the same name in the program.
inline void CUDART_CB run_host_task(void* p) { (*static_cast<task const*>(p))(); }

}  // namespace detail

//! One step captured into a CUDA graph (not yet instantiated) and the host tasks it calls; owns
//! the graph.
struct captured_step {
  cudaGraph_t graph = nullptr;  //!< owned; null when nothing was captured
  detail::task_pool tasks{};    //!< the host tasks the graph's host nodes point to: they live as long as it

  captured_step() = default;
  //! Takes `o`'s graph and tasks; `o` is left empty.
  captured_step(captured_step&& o) noexcept : graph(std::exchange(o.graph, nullptr)), tasks(std::move(o.tasks)) {}
  //! Destroys this graph, then takes `o`'s graph and tasks.
  captured_step& operator=(captured_step&& o) noexcept {
    if (this != &o) {
      reset();
      graph = std::exchange(o.graph, nullptr);
      tasks = std::move(o.tasks);
    }
    return *this;
  }
  ~captured_step() { reset(); }
  //! Destroys the graph (the tasks are kept for reuse).
  void reset() noexcept {
    if (graph) static_cast<void>(cudaGraphDestroy(graph));
    graph = nullptr;
  }
};

namespace detail {

using side_streams = std::array<cudaStream_t, stream_count>;
using fork_join_events = std::array<cudaEvent_t, stream_count>;

//! Fork: the side streams wait on `fork`, recorded on the compute stream (`s[0]`). Every call is
//! made; the first failure is noted in `f`.
inline void fork_side_streams(side_streams const& s, cudaEvent_t fork, first_failure& f) noexcept {
  TIDE_CUDA_NOTE(f, cudaEventRecord(fork, s[0]));
  for (std::size_t r = 1; r < stream_count; ++r) TIDE_CUDA_NOTE(f, cudaStreamWaitEvent(s[r], fork, 0));
}
//! Join: the compute stream waits on each side stream's event `e[r]`, recorded there.
inline void join_side_streams(side_streams const& s, fork_join_events const& e, first_failure& f) noexcept {
  for (std::size_t r = 1; r < stream_count; ++r) {
    TIDE_CUDA_NOTE(f, cudaEventRecord(e[r], s[r]));
    TIDE_CUDA_NOTE(f, cudaStreamWaitEvent(s[0], e[r], 0));
  }
}

//! The backend's capture state: a requested capture, the one in progress, and the captured step
//! not yet claimed. Fork: the side streams join the capture by waiting on an event recorded in
//! the capturing compute stream. Join: the compute stream waits on each side stream before the
//! capture ends.
class stream_capture {
 public:
  using streams = side_streams;
  using events = fork_join_events;

  void request() noexcept { requested_ = true; }
  void cancel() noexcept { requested_ = false; }
  //! True once: the step about to begin takes up the request.
  bool take_request() noexcept { return std::exchange(requested_, false); }
  bool active() const noexcept { return active_; }
  task_pool& tasks() noexcept { return captured_.tasks; }
  captured_step claim() {
    if (!captured_.graph) throw error("tide: cuda_backend::end_capture: no step was captured");
    return std::exchange(captured_, captured_step{});
  }

  void begin(streams const& s, events const& fork_join) {
    auto const compute = s[0];
    captured_ = captured_step{};  // an unclaimed earlier capture is dropped (before capture mode)
    TIDE_CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
    active_ = true;
    first_failure f;
    fork_side_streams(s, fork_join[0], f);
    if (f.code != cudaSuccess) {
      abandon(compute);
      f.raise();
    }
  }
  void finish(streams const& s, events const& fork_join) {
    auto const compute = s[0];
    first_failure f;
    join_side_streams(s, fork_join, f);
    cudaGraph_t g = nullptr;
    TIDE_CUDA_NOTE(f, cudaStreamEndCapture(compute, &g));  // always, so the stream leaves capture mode
    active_ = false;
    if (f.code != cudaSuccess) {
      if (g) static_cast<void>(cudaGraphDestroy(g));
      captured_ = captured_step{};
      f.raise();
    }
    captured_.graph = g;
  }
  void abandon(cudaStream_t compute) noexcept {
    cudaGraph_t g = nullptr;
    static_cast<void>(cudaStreamEndCapture(compute, &g));
    if (g) static_cast<void>(cudaGraphDestroy(g));
    static_cast<void>(cudaGetLastError());
    active_ = false;
    captured_ = captured_step{};
  }

 private:
  bool requested_ = false, active_ = false;
  captured_step captured_;
};

}  // namespace detail

//! An executor step captured once and replayed as an instantiated CUDA graph, so that a step
//! costs one launch instead of one per op. Move-only; owns the graph and its instantiation.
class cuda_graph {
 public:
  cuda_graph() = default;
  //! Takes `o`'s graph; `o` is left empty.
  cuda_graph(cuda_graph&& o) noexcept
      : step_(std::move(o.step_)), exec_(std::exchange(o.exec_, nullptr)), stream_(o.stream_) {}
  //! Destroys this graph, then takes `o`'s.
  cuda_graph& operator=(cuda_graph&& o) noexcept {
    if (this != &o) {
      destroy();
      step_ = std::move(o.step_);
      exec_ = std::exchange(o.exec_, nullptr);
      stream_ = o.stream_;
    }
    return *this;
  }
  ~cuda_graph() { destroy(); }

  //! Captures one step of `ex`, an executor on a `cuda_backend` (the arguments of
  //! `executor::step`: forward, backward, optionally `tide::turn{f}` and `tide::hooks{...}`; the
  //! turn is captured with the step, on the compute stream), and instantiates it.
  //! Replaces an earlier capture. Throws what the step throws, or `cuda_error` when capture fails
  //! (e.g. a lambda made a call that is illegal during capture, such as a synchronization);
  //! `error` when `ex` has debug checks on.
  template <class Executor, class Forward, class Backward, class... More>
  void capture(Executor& ex, Forward&& forward, Backward&& backward, More&&... more) {
    static_assert(sizeof...(More) <= 2,
                  "tide::cuda_graph::capture(ex, forward, backward[, tide::turn{f}][, tide::hooks{...}]): a turn and hooks at most");
    // Debug-check host nodes would replay with counters never reset and errors never rethrown.
    if (ex.options().debug_checks)
      throw error("tide::cuda_graph::capture: turn off executor_options::debug_checks for captured steps");
    auto& be = ex.backend();
    be.capture_next_step();
    // Whatever happens (a step that throws before it begins, "already running"), the request is
    // withdrawn, so the next eager step is not silently captured.
    struct withdraw {
      decltype(be)& b;
      ~withdraw() { b.cancel_capture(); }
    } guard{be};
    ex.step(std::forward<Forward>(forward), std::forward<Backward>(backward), std::forward<More>(more)...);
    auto step = be.end_capture();
    // Uploaded at instantiation (the first replay does not pay for it), and kernel nodes keep the
    // priority of the stream they were captured on (the prefetch stream's, when raised).
    cudaGraphInstantiateParams params{};
    params.flags = cudaGraphInstantiateFlagUpload | cudaGraphInstantiateFlagUseNodePriority;
    params.uploadStream = be.stream(stream_role::compute);
    cudaGraphExec_t exec = nullptr;
    TIDE_CUDA_CHECK(cudaGraphInstantiateWithParams(&exec, step.graph, &params));
    if (params.result_out != cudaGraphInstantiateSuccess) {
      if (exec) static_cast<void>(cudaGraphExecDestroy(exec));
      throw error("tide::cuda_graph::capture: cudaGraphInstantiateWithParams failed (cudaGraphInstantiateResult " +
                  std::to_string(static_cast<int>(params.result_out)) + ")");
    }
    destroy();
    step_ = std::move(step);
    exec_ = exec;
    stream_ = be.stream(stream_role::compute);
  }

  //! True once a capture succeeded: `replay` has a graph to launch.
  bool ready() const noexcept { return exec_ != nullptr; }
  //! The captured graph (null before a capture), e.g. for `cudaGraphDebugDotPrint`.
  cudaGraph_t graph() const noexcept { return step_.graph; }
  //! The instantiated graph (null before a capture), for launching it by hand.
  cudaGraphExec_t exec() const noexcept { return exec_; }

  //! Launches the captured step on the backend's compute stream; does not wait.
  void replay() { replay(stream_); }
  //! Launches the captured step on `s`; does not wait.
  void replay(cudaStream_t s) {
    if (!exec_) throw error("tide: cuda_graph::replay: nothing was captured");
    nvtx_push("tide graph replay");
    auto const e = cudaGraphLaunch(exec_, s);
    nvtx_pop();
    detail::check_cuda(e, "cudaGraphLaunch(exec, stream)", __FILE__, __LINE__);
  }

 private:
  void destroy() noexcept {
    if (exec_) static_cast<void>(cudaGraphExecDestroy(exec_));
    exec_ = nullptr;
    step_.reset();
  }

  captured_step step_;
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace tide
