#pragma once
//! \file A whole executor step captured into a CUDA graph and replayed step after step.
//!
//! Capture runs the executor's ordinary step with the backend in capture mode: the compute stream
//! begins a capture, the side streams join it through a fork event, every wait, record, kernel,
//! copy, host task and collective becomes a graph node, and a join event per side stream brings
//! them back before the capture ends. Nothing runs during capture; `replay` launches the graph on
//! the compute stream (or any stream) and returns without waiting.
//!
//! What replay reuses: the arenas (their addresses are stable), the pointers and sizes the user's
//! lambdas passed to their kernels when they were captured, and the executor, which must outlive
//! the graph. The executor's debug checks must be off. Timelines are not recorded in replay.

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/backends/cuda/nvtx.hpp>
#include <tide/executor/executor.hpp>

namespace tide {

class cuda_graph {
 public:
  cuda_graph() = default;
  cuda_graph(cuda_graph&& o) noexcept
      : step_(std::move(o.step_)), exec_(std::exchange(o.exec_, nullptr)), stream_(o.stream_) {}
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

  //! Captures one step of `ex` (the arguments of `executor::step`) and instantiates it. Replaces
  //! an earlier capture. Throws what the step throws, or `cuda_error` when capture fails (e.g. a
  //! lambda made a call that is illegal during capture, such as a synchronization); `error` when
  //! `ex` has debug checks on.
  template <class Forward, class Backward, class Gather = no_hook, class Collective = no_hook>
  void capture(executor<cuda_backend>& ex, Forward&& forward, Backward&& backward, Gather&& gather = {},
               Collective&& collective = {}) {
    // Debug-check host nodes would replay with counters never reset and errors never rethrown.
    if (ex.options().debug_checks)
      throw error("tide::cuda_graph::capture: turn off executor_options::debug_checks for captured steps");
    auto& be = ex.backend();
    be.capture_next_step();
    // Whatever happens (a step that throws before it begins, "already running"), the request is
    // withdrawn, so the next eager step is not silently captured.
    struct withdraw {
      cuda_backend& be;
      ~withdraw() { be.cancel_capture(); }
    } guard{be};
    ex.step(std::forward<Forward>(forward), std::forward<Backward>(backward), std::forward<Gather>(gather),
            std::forward<Collective>(collective));
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

  bool ready() const noexcept { return exec_ != nullptr; }
  cudaGraph_t graph() const noexcept { return step_.graph; }
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
