#pragma once
// A real CUDA layer stack for tide: each layer is y = rmsnorm(relu(x W)), backward included.
// Each layer saves three slots for backward: its input, the pre-activation and the activation.
// The running activation, the gradient flowing down and the weights live in the model's own
// buffers; tide manages only what is saved for backward.
//
// In recompute mode the forward rebuilds the remat slots from the saved input with the same
// kernels, which are deterministic, so gradients are bitwise equal under every policy. Shared by
// the example, the CUDA tests and the GPU benchmarks.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/backends/cuda/cuda_graph.hpp>
#include <tide/executor/executor.hpp>
#include <tide/tide.hpp>
#include <tide/trace/summary.hpp>

#include "kernels.hpp"

namespace cuda_stack {

//! Exit code that makes Meson count a test as skipped.
inline constexpr int skip_exit_code = 77;

//! True when a CUDA device can be used (false on a machine without GPU or driver).
inline bool have_device() {
  int n = 0;
  auto const e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) static_cast<void>(cudaGetLastError());
  return e == cudaSuccess && n > 0;
}

struct dims {
  std::uint32_t layers = 8;
  std::uint32_t width = 512;  //!< features per token (must be a multiple of nothing in particular)
  std::uint32_t batch = 512;  //!< tokens
  std::size_t elements() const noexcept { return std::size_t{batch} * width; }
  std::size_t slot_bytes() const noexcept { return elements() * sizeof(float); }
};

enum slot_index : std::uint16_t { input = 0, pre = 1, act = 2 };

inline tide::stack_spec make_stack(dims const& d) {
  tide::stack_spec s;
  s.append({"block", {{"input", d.slot_bytes()}, {"pre", d.slot_bytes()}, {"act", d.slot_bytes()}}}, d.layers);
  return s;
}

//! A device buffer of floats.
class device_floats {
 public:
  explicit device_floats(std::size_t n) : n_(n) { TIDE_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(float))); }
  device_floats(device_floats const&) = delete;
  device_floats& operator=(device_floats const&) = delete;
  ~device_floats() { static_cast<void>(cudaFree(p_)); }
  float* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  float* p_ = nullptr;
  std::size_t n_;
};

class model {
 public:
  explicit model(dims d, std::uint32_t data_seed = 1)
      : d_(d),
        w_(std::size_t{d.layers} * d.width * d.width),
        dw_(w_.size()),
        x0_(d.elements()),
        running_(d.elements()),
        grad_(d.elements()),
        tmp_(d.elements()) {
    float const scale = 1.5f / std::sqrt(static_cast<float>(d.width));
    fill_random(w_.get(), w_.size(), 7, scale, nullptr);
    fill_random(x0_.get(), x0_.size(), data_seed, 1.0f, nullptr);
    TIDE_CUDA_CHECK(cudaMemset(dw_.get(), 0, dw_.size() * sizeof(float)));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  dims const& shape() const noexcept { return d_; }
  float* weight_grad(std::uint32_t layer) const noexcept { return dw_.get() + std::size_t{layer} * d_.width * d_.width; }
  std::size_t weight_elements() const noexcept { return std::size_t{d_.width} * d_.width; }

  //! The forward lambda's body: y = rmsnorm(relu(x W)), saving input, pre and act.
  void forward(tide::forward_context<cudaStream_t> const& c) const {
    if (c.recompute && c.produces(input))
      throw tide::slot_error("cuda_stack: the layer input cannot be rematerialized (nothing before it is saved)");
    auto const s = c.stream;
    auto const n = d_.elements();
    auto* in = slot(c, input);
    auto* pre_act = slot(c, pre);
    auto* activ = slot(c, act);
    if (!c.recompute)
      TIDE_CUDA_CHECK(cudaMemcpyAsync(in, c.layer == 0 ? x0_.get() : running_.get(), d_.slot_bytes(),
                                      cudaMemcpyDeviceToDevice, s));
    int const b = static_cast<int>(d_.batch), w = static_cast<int>(d_.width);
    if (c.produces(pre)) gemm(b, w, w, in, w, 1, weight(c.layer), w, 1, pre_act, s);
    if (c.produces(act)) relu_forward(pre_act, activ, n, s);
    if (!c.recompute) rmsnorm_forward(activ, running_.get(), b, w, s);
  }

  //! The backward lambda's body; the loss is |y|^2 / 2 of the last layer's output y.
  void backward(tide::backward_context<cudaStream_t> const& c) const {
    auto const s = c.stream;
    auto const n = d_.elements();
    auto const* in = slot(c, input);
    auto const* pre_act = slot(c, pre);
    auto const* activ = slot(c, act);
    int const b = static_cast<int>(d_.batch), w = static_cast<int>(d_.width);
    if (c.layer + 1 == d_.layers)
      TIDE_CUDA_CHECK(cudaMemcpyAsync(grad_.get(), running_.get(), d_.slot_bytes(), cudaMemcpyDeviceToDevice, s));
    rmsnorm_backward(grad_.get(), activ, tmp_.get(), b, w, s);                  // d act
    relu_backward(tmp_.get(), pre_act, tmp_.get(), n, s);                       // d pre
    gemm(w, w, b, in, 1, w, tmp_.get(), w, 1, weight_grad(c.layer), s);         // dW = in^T d pre
    gemm(b, w, w, tmp_.get(), w, 1, weight(c.layer), 1, w, grad_.get(), s);     // d in = d pre W^T
  }

  //! Every weight gradient, then the input gradient (after the step has completed).
  std::vector<float> gradients() const {
    std::vector<float> h(dw_.size() + grad_.size());
    TIDE_CUDA_CHECK(cudaMemcpy(h.data(), dw_.get(), dw_.size() * sizeof(float), cudaMemcpyDeviceToHost));
    TIDE_CUDA_CHECK(
        cudaMemcpy(h.data() + dw_.size(), grad_.get(), grad_.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
  //! Clears the gradients, so that a later step visibly rewrites them.
  void clear_gradients() const {
    TIDE_CUDA_CHECK(cudaMemset(dw_.get(), 0, dw_.size() * sizeof(float)));
    TIDE_CUDA_CHECK(cudaMemset(grad_.get(), 0, grad_.size() * sizeof(float)));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  float* weight(std::uint32_t layer) const noexcept { return w_.get() + std::size_t{layer} * d_.width * d_.width; }
  static float* slot(tide::forward_context<cudaStream_t> const& c, std::uint16_t k) {
    return reinterpret_cast<float*>(c.slot(k).data());
  }
  static float const* slot(tide::backward_context<cudaStream_t> const& c, std::uint16_t k) {
    return reinterpret_cast<float const*>(c.slot(k).data());
  }

  dims d_;
  device_floats w_, dw_, x0_, running_, grad_, tmp_;
};

// ---- policies and runs, shared by the example, the tests and the benchmarks ----------------

struct policy_case {
  std::string name;
  tide::policy_spec policy;
  tide::pipeline_spec pipeline;
  tide::buffer_spec buffers;
};

//! keep-all, remat, offload with copies on the compute stream, offload with latency hiding, and
//! latency hiding with each copy in four chunks.
inline std::vector<policy_case> policy_cases(dims const& d) {
  using tide::placement;
  tide::policy_spec const remat{tide::rule_spec{placement::remat, {"pre", "act"}, 0, tide::all_layers, 0}};
  tide::policy_spec const offload{tide::rule_spec{placement::offload, {"input", "pre", "act"}, 0, tide::all_layers, 0}};
  tide::buffer_spec buffers;
  buffers.staging_buffers = 3;
  std::size_t const chunk = tide::align_up((d.slot_bytes() + 3) / 4, 4096);
  return {
      {"keep-all", {}, {}, buffers},
      {"remat", remat, {}, buffers},
      {"offload (copies on compute stream)", offload, {false, 0, 0, 1}, buffers},
      {"offload (latency hiding)", offload, {true, 2, 0, 2}, buffers},
      {"offload (latency hiding, chunked)", offload, {true, 2, chunk, 2}, buffers},
  };
}

inline tide::schedule build(dims const& d, policy_case const& p, tide::collective_spec coll = {}) {
  return tide::build_schedule(make_stack(d), p.policy, p.buffers, p.pipeline, coll);
}

struct run_options {
  int steps = 3;              //!< the first is a warm-up, excluded from the step time
  bool trace = false;         //!< record a timeline of the last step (timed events; not in step_ms if steps > 2)
  bool graph = false;         //!< capture one step into a CUDA graph and replay it `steps` times
  tide::cuda_backend_options backend{};
  tide::executor_options exec{};
  //! Called once the executor (and its arenas) exists, before the first step: data parallel
  //! ranks meet at a barrier here, so that no collective starts while a rank still allocates.
  std::function<void()> before_first_step;
  //! Polled while the backend waits for its streams (e.g. an NCCL communicator's health).
  tide::cuda_backend::watcher watcher;
};

struct run_result {
  std::vector<float> grads;
  double step_ms = 0;
  tide::timeline trace;
  tide::step_summary summary;
};

//! Runs `o.steps` steps of `m` under schedule `s` on a fresh backend; returns the gradients.
template <class Collective = tide::no_hook>
run_result run(model const& m, tide::schedule const& s, run_options const& o, Collective&& collective = {}) {
  using clock = std::chrono::steady_clock;
  run_result r;
  m.clear_gradients();
  tide::cuda_backend be(o.backend);
  if (o.watcher) be.watch(o.watcher);
  be.name_ranges(s);
  auto exec_opt = o.exec;
  if (o.graph) exec_opt.debug_checks = false;  // their host tasks would replay stale counters
  tide::executor ex(be, s, exec_opt);
  if (o.before_first_step) o.before_first_step();
  auto fwd = [&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); };
  auto bwd = [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); };
  tide::cuda_graph g;
  if (o.graph) g.capture(ex, fwd, bwd, tide::no_hook{}, collective);
  // The traced last step (timed events around every op) is left out of the average too, unless
  // it is the only step after the warm-up.
  bool const traced = o.trace && !o.graph;
  double total_ms = 0;
  int timed = 0;
  for (int i = 0; i < o.steps; ++i) {
    bool const last = i + 1 == o.steps;
    if (traced && last) be.record_timeline(&r.trace);
    auto const t0 = clock::now();
    if (o.graph) {
      g.replay();
      be.synchronize();
    } else {
      ex.step(fwd, bwd, tide::no_hook{}, collective);
    }
    auto const ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if ((i > 0 || o.steps == 1) && !(traced && last && o.steps > 2)) {
      total_ms += ms;
      ++timed;
    }
  }
  be.record_timeline(nullptr);
  r.step_ms = timed > 0 ? total_ms / timed : 0;
  if (o.trace && !o.graph) r.summary = tide::summarize(r.trace, s);
  r.grads = m.gradients();
  return r;
}

//! FNV-1a over the bytes of `v`: a short fingerprint for tables.
inline std::uint64_t checksum(std::vector<float> const& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto const* p = reinterpret_cast<unsigned char const*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

inline bool bitwise_equal(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace cuda_stack
