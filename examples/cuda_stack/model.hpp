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

#include "cuda_device.hpp"  // example::without_device (examples/common)
#include "kernels.hpp"

TIDE_DESIGNATED_INIT_BEGIN  // strategies name only the fields they set

namespace cuda_stack {

struct dims {
  std::uint32_t layers = 8;
  std::uint32_t width = 512;  //!< features per token (must be a multiple of nothing in particular)
  std::uint32_t batch = 512;  //!< tokens
  std::size_t elements() const noexcept { return std::size_t{batch} * width; }
  std::size_t slot_bytes() const noexcept { return elements() * sizeof(float); }
};

//! The layer type; its slots are sized at run time from the dims (`make_stack`).
using block = tide::layer<"block", tide::input_slot<"input">, tide::slot<"pre">, tide::slot<"act">>;

//! The slots as typed handles, resolved at compile time.
inline constexpr auto input = tide::slot_handle_of<block, "input", float>;
inline constexpr auto pre = tide::slot_handle_of<block, "pre", float>;
inline constexpr auto act = tide::slot_handle_of<block, "act", float>;

//! `d.layers` blocks, each slot `d.batch` x `d.width` floats.
inline tide::stack_spec make_stack(dims const& d) {
  tide::stack_spec s;
  s.append(block::spec(), d.layers);
  return tide::bind_sizes(s, {{"input", d.slot_bytes()}, {"pre", d.slot_bytes()}, {"act", d.slot_bytes()}});
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
    if (c.mode != tide::forward_mode::forward && c.produces(input))
      throw tide::slot_error("cuda_stack: the layer input cannot be rematerialized (nothing before it is saved)");
    auto const s = c.stream;
    auto const n = d_.elements();
    // What this call writes: slot(); what a recompute reads without rebuilding it: its saved data
    // (in a recompute, slot() of such a slot is scratch tide lends).
    auto const read = [&](tide::slot_handle<float> h) -> float const* {
      return c.mode == tide::forward_mode::recompute && !c.produces(h) ? c.saved(h).data() : c.slot(h).data();
    };
    if (c.mode == tide::forward_mode::forward)
      TIDE_CUDA_CHECK(cudaMemcpyAsync(c.slot(input).data(), c.layer == 0 ? x0_.get() : running_.get(), d_.slot_bytes(),
                                      cudaMemcpyDeviceToDevice, s));
    auto const* in = read(input);
    auto* activ = c.slot(act).data();
    int const b = static_cast<int>(d_.batch), w = static_cast<int>(d_.width);
    if (c.produces(pre)) gemm(b, w, w, in, w, 1, weight(c.layer), w, 1, c.slot(pre).data(), s);
    if (c.produces(act)) relu_forward(read(pre), activ, n, s);
    if (c.mode == tide::forward_mode::forward) rmsnorm_forward(activ, running_.get(), b, w, s);
  }

  //! The backward lambda's body; the loss is |y|^2 / 2 of the last layer's output y.
  void backward(tide::backward_context<cudaStream_t> const& c) const {
    auto const s = c.stream;
    auto const n = d_.elements();
    auto const* in = c.slot(input).data();
    auto const* pre_act = c.slot(pre).data();
    auto const* activ = c.slot(act).data();
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

  dims d_;
  device_floats w_, dw_, x0_, running_, grad_, tmp_;
};

// ---- policies and runs, shared by the example, the tests and the benchmarks ----------------

//! A named strategy: a row of the example's table.
struct policy_case {
  std::string name;
  tide::strategy strategy;
};

//! keep-all, remat, offload with copies on the compute stream, offload with latency hiding, and
//! latency hiding with each copy in four chunks; no collectives (set `strategy.collectives`).
inline std::vector<policy_case> policy_cases(dims const& d) {
  using tide::placement;
  tide::policy_spec const remat{tide::rule_spec{.where = placement::remat, .slots = {"pre", "act"}}};
  tide::policy_spec const offload{tide::rule_spec{.where = placement::offload, .slots = {"input", "pre", "act"}}};
  tide::buffer_spec const buffers{.staging_buffers = 3};
  std::size_t const chunk = tide::align_up((d.slot_bytes() + 3) / 4, 4096);
  return {
      {"keep-all", {.buffers = buffers}},
      {"remat", {.policy = remat, .buffers = buffers}},
      {"offload (copies on compute stream)",
       {.policy = offload,
        .buffers = buffers,
        .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1}}},
      {"offload (latency hiding)", {.policy = offload, .buffers = buffers, .pipeline = {.prefetch_distance = 2}}},
      {"offload (latency hiding, chunked)",
       {.policy = offload, .buffers = buffers, .pipeline = {.prefetch_distance = 2, .chunk_bytes = chunk}}},
  };
}

//! The schedule of the stack of `d` under `how`.
inline tide::schedule build(dims const& d, tide::strategy const& how) { return tide::build_schedule(make_stack(d), how); }
inline tide::schedule build(dims const& d, policy_case const& p) { return build(d, p.strategy); }

struct run_options {
  int steps = 3;              //!< the first is a warm-up, excluded from the step time
  bool trace = false;         //!< record a timeline of the last step (timed events; not in step_ms if steps > 2)
  bool graph = false;         //!< capture one step into a CUDA graph and replay it `steps` times
  tide::cuda_backend_options backend = example::backend_options();
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
  std::string storage_path;               //!< how spilled slots moved (`cuda_backend::storage_path()`)
  std::size_t gpu_direct_ring_bytes = 0;  //!< device memory of the spill ring under GPUDirect Storage
};

//! Runs `o.steps` steps of `m` under schedule `s` on a fresh backend; returns the gradients.
//! `hooks`: the step's collective hooks, `tide::hooks{.after_backward = std::ref(nccl)}`.
template <class Hooks = tide::hooks<>>
run_result run(model const& m, tide::schedule const& s, run_options const& o, Hooks&& hooks = {}) {
  using clock = std::chrono::steady_clock;
  run_result r;
  m.clear_gradients();
  tide::cuda_backend be(o.backend);
  if (o.watcher) be.watch(o.watcher);
  auto exec_opt = o.exec;
  if (o.graph) exec_opt.debug_checks = false;  // their host tasks would replay stale counters
  tide::executor ex(be, s, exec_opt);
  if (o.before_first_step) o.before_first_step();
  auto fwd = [&](tide::forward_context<cudaStream_t> const& c) { m.forward(c); };
  auto bwd = [&](tide::backward_context<cudaStream_t> const& c) { m.backward(c); };
  tide::cuda_graph g;
  if (o.graph) g.capture(ex, fwd, bwd, hooks);
  // The traced last step (timed events around every op) is left out of the average too, unless
  // it is the only step after the warm-up.
  bool const traced = o.trace && !o.graph;
  double total_ms = 0;
  int timed = 0;
  for (int i = 0; i < o.steps; ++i) {
    bool const last = i + 1 == o.steps;
    if (traced && last) ex.record_timeline(&r.trace);
    auto const t0 = clock::now();
    if (o.graph) {
      g.replay();
      be.synchronize();
    } else {
      ex.step(fwd, bwd, hooks);
    }
    auto const ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if ((i > 0 || o.steps == 1) && !(traced && last && o.steps > 2)) {
      total_ms += ms;
      ++timed;
    }
  }
  ex.record_timeline(nullptr);
  r.step_ms = timed > 0 ? total_ms / timed : 0;
  if (o.trace && !o.graph) r.summary = tide::summarize(r.trace, s);
  r.grads = m.gradients();
  r.storage_path = be.storage_path();
  r.gpu_direct_ring_bytes = be.gpu_direct_ring_bytes();
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

TIDE_DESIGNATED_INIT_END
