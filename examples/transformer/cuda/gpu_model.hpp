#pragma once
// The transformer on the GPU, layer by layer, with the CPU model's layouts and order of work
// (../model.hpp): parameters drawn by the CPU model and copied, cuBLAS for the matrix products
// (row-major calls mapped onto column-major cuBLAS), the kernels of kernels.hpp for the rest.
// Forward, recompute (of `which`, reading `available`) and backward take device pointers and a
// stream and never synchronize nor allocate: the MoE routing and the experts' GEMMs read the
// per-expert row offsets on the device (kernels.hpp), every work buffer is allocated up front, and
// the optimizer's clipping reads the gradient norm on the device, so a step can be captured into
// a CUDA graph.

#include "../model.hpp"
#include "kernels.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace transformer::cuda {

[[noreturn]] inline void fail(char const* call, std::string const& what) {
  throw std::runtime_error(std::string("transformer::cuda: ") + call + ": " + what);
}
inline void check(cudaError_t e, char const* call) {
  if (e != cudaSuccess) fail(call, cudaGetErrorString(e));
}
inline void check(cublasStatus_t e, char const* call) {
  if (e != CUBLAS_STATUS_SUCCESS) fail(call, "cuBLAS status " + std::to_string(static_cast<int>(e)));
}
#define TRANSFORMER_CUDA(x) ::transformer::cuda::check((x), #x)

//! A device buffer of floats (or any trivially copyable T), allocated once.
template <class T>
class device_array {
 public:
  device_array() = default;
  explicit device_array(std::size_t n) : n_(n) {
    if (n) TRANSFORMER_CUDA(cudaMalloc(&p_, n * sizeof(T)));
  }
  device_array(device_array&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  device_array& operator=(device_array&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_array() {
    if (p_) static_cast<void>(cudaFree(p_));
  }
  T* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

//! Row-major GEMMs as in blas.hpp, on cuBLAS: C[m x n] = op(A) op(B) + beta C.
struct gemms {
  cublasHandle_t h;
  float* workspace = nullptr;  //!< cuBLAS's workspace, bound with every stream
  std::size_t workspace_bytes = 0;
  //! The stream the next GEMMs run on, with the fixed workspace again: cublasSetStream drops a
  //! user workspace, and without one a GEMM captured into a graph picks other algorithms than
  //! the same GEMM run eagerly (and the graph gains memory nodes).
  void bind(cudaStream_t st) const {
    TRANSFORMER_CUDA(cublasSetStream(h, st));
    TRANSFORMER_CUDA(cublasSetWorkspace(h, workspace, workspace_bytes));
  }
  void nn(std::size_t m, std::size_t n, std::size_t k, float const* a, float const* b, float beta, float* c) const {
    if (!m || !n) return;
    float const one = 1.0f;
    TRANSFORMER_CUDA(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, int(n), a, int(k), &beta, c, int(n)));
  }
  void nt(std::size_t m, std::size_t n, std::size_t k, float const* a, float const* b, float beta, float* c) const {
    if (!m || !n) return;
    float const one = 1.0f;
    TRANSFORMER_CUDA(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, int(k), a, int(k), &beta, c, int(n)));
  }
  void tn(std::size_t m, std::size_t n, std::size_t k, float const* a, float const* b, float beta, float* c) const {
    if (!m || !n || !k) return;
    float const one = 1.0f;
    TRANSFORMER_CUDA(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, int(n), int(m), int(k), &one, b, int(n), a, int(m), &beta, c, int(n)));
  }
};

//! The model on the GPU for batch shape `s` (its work buffers are sized for it).
class gpu_model {
 public:
  //! A layer's saved tensors by `tensor_index` (its input, the carry, is given apart).
  using saved = std::array<float*, tensor_count>;
  //! The same, read-only: what a backward reads.
  using views = std::array<float const*, tensor_count>;

  gpu_model(config c, shape s, std::uint64_t seed, cublasHandle_t h) : c_(c), s_(s), g_{h} {
    workspace_ = device_array<float>(workspace_bytes / sizeof(float));
    pair_scratch_[0] = device_array<float>(tensor_elements(c_, tensor::attention_out, s_));
    pair_scratch_[1] = device_array<float>(tensor_elements(c_, tensor::attention_lse, s_));
    g_.workspace = workspace_.get();
    g_.workspace_bytes = workspace_bytes;
    transformer::model cpu(c, seed);  // the very same initial weights
    params_ = cpu.parameter_tensors();
    auto const total = cpu.parameters().size();
    w_ = device_array<float>(total);
    grad_ = device_array<float>(total);
    m_ = device_array<float>(total);
    v_ = device_array<float>(total);
    decay_ = device_array<std::uint8_t>(total);
    TRANSFORMER_CUDA(cudaMemcpy(w_.get(), cpu.parameters().data(), total * sizeof(float), cudaMemcpyHostToDevice));
    TRANSFORMER_CUDA(cudaMemset(m_.get(), 0, total * sizeof(float)));
    TRANSFORMER_CUDA(cudaMemset(v_.get(), 0, total * sizeof(float)));
    std::vector<std::uint8_t> decay(total, 0);
    for (auto const& p : params_)
      for (std::size_t i = p.offset; i < p.offset + p.size; ++i) decay[i] = p.decay;
    TRANSFORMER_CUDA(cudaMemcpy(decay_.get(), decay.data(), total, cudaMemcpyHostToDevice));
    // The memsets and copies above ran on the legacy stream, which tide's non-blocking streams
    // do not wait for: they must be complete before the first step.
    TRANSFORMER_CUDA(cudaDeviceSynchronize());
    // The CPU model's layout, tensor for tensor.
    embedding_ = cpu.embedding_offset();
    final_norm_ = cpu.final_norm_offset();
    for (std::size_t l = 0; l < c.layers; ++l) layers_.push_back(cpu.offsets(l));
    // Work buffers, once, for shape s: the widest of each use.
    std::size_t const n = s.tokens(), d = c.width, K = c.top_k, E = c.experts;
    std::size_t const wide = std::max({c.mlp_hidden, c.heads * c.head_dim(), K * c.expert_hidden, c.shared_hidden, c.vocab, d});
    for (auto* b : {&xn_, &h_, &hn_, &dhn_, &gy_, &dxn_, &tmp_}) *b = device_array<float>(n * std::max(d, wide));
    for (auto* b : {&act_, &dact_, &dg_, &du_, &dq_, &dk_, &dv_, &do_}) *b = device_array<float>(n * wide);
    for (auto* b : {&xg_, &dxg_, &dyg_}) *b = device_array<float>(n * K * d);
    logits_ = device_array<float>(n * c.vocab);
    probs_ = device_array<double>(n * E);
    for (auto* b : {&expert_, &row_, &token_, &sorted_expert_, &pair_in_, &pair_out_}) *b = device_array<std::uint32_t>(n * K);
    weight_ = device_array<float>(n * K);
    offset_ = device_array<std::uint32_t>(E + 1);
    if (E > 0) sort_temp_ = device_array<std::byte>(std::max<std::size_t>(route_sort_bytes(n, E, K), 1));
    dweight_ = device_array<double>(n * K);
    dlogits_ = device_array<float>(n * std::max<std::size_t>(E, 1));
    loss_ = device_array<double>(3);  // loss, count, the squared gradient norm
    reduce_work_ = device_array<double>(std::max(n, norm_blocks));  // each token's loss, or the norm's partials
  }

  layer_kind kind(std::size_t l) const { return l < c_.dense_layers ? layer_kind::dense : layer_kind::moe; }
  config const& cfg() const noexcept { return c_; }

  // ---- the pieces outside the decoder layers (model.hpp's embed, embed_backward, head) ----
  void zero_gradients(cudaStream_t st) { TRANSFORMER_CUDA(cudaMemsetAsync(grad_.get(), 0, grad_.size() * sizeof(float), st)); }
  void embed_tokens(std::int32_t const* tokens, float* carry, cudaStream_t st) {
    transformer::cuda::embed(tokens, w(embedding_), s_.tokens(), c_.width, carry, st);
  }
  void embed_backward_tokens(std::int32_t const* tokens, float const* grad_carry, cudaStream_t st) {
    embed_backward(tokens, grad_carry, s_.tokens(), c_.vocab, c_.width, dw(embedding_), st);
  }
  //! Final RMSNorm, logits, cross-entropy; its backward into grad_carry (may alias carry). The
  //! mean loss lands in loss_on_device()[0] (read it after the stream synchronizes).
  void head(float const* carry, std::int32_t const* targets, float* grad_carry, cudaStream_t st) {
    g_.bind(st);
    std::size_t const n = s_.tokens(), d = c_.width, V = c_.vocab;
    float* inv = dlogits_.get();  // n floats at least (n * max(E, 1))
    float* hf = xn_.get();
    rms_inv(carry, n, d, c_.norm_eps, inv, st);
    rms_apply(carry, inv, w(final_norm_), n, d, hf, st);
    g_.nt(n, V, d, hf, w(embedding_), 0.0f, logits_.get());
    cross_entropy(logits_.get(), targets, n, V, loss_.get(), reduce_work_.get(), st);
    g_.nn(n, d, V, logits_.get(), w(embedding_), 0.0f, tmp_.get());  // dhf
    g_.tn(V, d, n, logits_.get(), hf, 1.0f, dw(embedding_));
    TRANSFORMER_CUDA(cudaMemsetAsync(dxn_.get(), 0, n * d * sizeof(float), st));
    rms_backward(carry, inv, w(final_norm_), tmp_.get(), n, d, dxn_.get(), dw(final_norm_), st);
    TRANSFORMER_CUDA(cudaMemcpyAsync(grad_carry, dxn_.get(), n * d * sizeof(float), cudaMemcpyDeviceToDevice, st));
  }
  double const* loss_on_device() const noexcept { return loss_.get(); }
  //! One AdamW step (model.hpp's adamw_step: global-norm clipping, bias correction), enqueued on
  //! `st`: the clipping reads the norm on the device, so nothing synchronizes.
  void adamw_step(transformer::adamw const& h, cudaStream_t st) {
    squared_norm(grad_.get(), grad_.size(), loss_.get() + 2, reduce_work_.get(), st);
    ++steps_;
    adamw(w_.get(), grad_.get(), m_.get(), v_.get(), decay_.get(), w_.size(), h.learning_rate, h.beta1, h.beta2,
          h.epsilon, h.weight_decay, h.max_grad_norm, loss_.get() + 2, steps_, st);
  }
  //! The gradients' checksum (FNV-1a of their bytes, as the CPU trainer's); synchronizes.
  std::uint64_t gradient_checksum() const {
    std::vector<float> g(grad_.size());
    TRANSFORMER_CUDA(cudaMemcpy(g.data(), grad_.get(), g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return fnv1a(std::as_bytes(std::span<float const>(g)));
  }
  //! The gradients, copied to the host (synchronizes).
  std::vector<float> host_gradients() const {
    std::vector<float> g(grad_.size());
    TRANSFORMER_CUDA(cudaMemcpy(g.data(), grad_.get(), g.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return g;
  }
  float* gradients() const { return grad_.get(); }
  std::size_t parameter_count() const { return w_.size(); }

  // The layer API of ../model.hpp, on device pointers (saved[i] may be null for tensors not given).
  // Every tensor a layer computes is one it saves: a forward writes them all into `sv`, and a
  // recompute is given each as produced or available, so the model needs no scratch of its own
  // but for attention's pair (one kernel writes its output and log-sum-exp together).
  void layer_forward(std::size_t l, float const* input, saved const& sv, float* output, cudaStream_t st) {
    run_forward(l, input, sv, layer_tensor_set(kind(l)) & ~input_set(), output, {}, st);
  }
  void layer_recompute(std::size_t l, float const* input, saved const& sv, tensor_set which, tensor_set available,
                       cudaStream_t st) {
    available &= layer_tensor_set(kind(l)) & ~which & ~input_set();
    run_forward(l, input, sv, which, nullptr, available, st);
  }
  //! Backward of layer l: reads the saved tensors; writes grad_input (may alias grad_output) and
  //! accumulates the parameter gradients, in model.hpp's order.
  void layer_backward(std::size_t l, float const* x, views const& sv, float const* grad_output, float* grad_input,
                      cudaStream_t st) {
    using enum tensor;
    g_.bind(st);
    auto const& p = layers_[l];
    auto in = [&](tensor t) -> float const* { return sv[tensor_index(t)]; };
    std::size_t const n = s_.tokens(), d = c_.width, hd = c_.head_dim(), qw = c_.heads * hd, kvw = c_.kv_heads * hd;
    float* gy = gy_.get();  // grad_input may alias grad_output
    TRANSFORMER_CUDA(cudaMemcpyAsync(gy, grad_output, n * d * sizeof(float), cudaMemcpyDeviceToDevice, st));
    add(x, in(out_proj), n * d, h_.get(), st);
    float const* r2 = in(mlp_norm_inv_rms);
    float* hn = hn_.get();
    rms_apply(h_.get(), r2, w(p.mlp_norm), n, d, hn, st);
    float* dhn = dhn_.get();
    if (kind(l) == layer_kind::dense) {
      swiglu_block_backward(hn, in(mlpwi_0), in(mlpwi_1), gy, n, c_.mlp_hidden, p.w_gate, p.w_up, p.w_down, dhn, 0.0f, st);
    } else {
      std::size_t const E = c_.experts, K = c_.top_k, he = c_.expert_hidden, hs = c_.shared_hidden;
      swiglu_block_backward(hn, in(shared_mlpwi_0), in(shared_mlpwi_1), gy, n, hs, p.shared_gate, p.shared_up,
                            p.shared_down, dhn, 0.0f, st);
      route(in(router_logits), n, E, K, c_.renormalize_top_k, route_buffers(), st);
      float const* eg = in(moe_mlpwi_0);
      float const* eu = in(moe_mlpwi_1);
      moe_combine_backward(gy, weight_.get(), row_.get(), in(moe_mlpwo), n, K, d, dyg_.get(), dweight_.get(), st);
      gather_rows(hn, token_.get(), n * K, d, xg_.get(), st);
      swiglu(eg, eu, n * K * he, act_.get(), st);
      // Per expert, on its rows (offsets on the device; at most n rows an expert).
      std::uint32_t const* off = offset_.get();
      experts_tn(off, E, he, d, act_.get(), dyg_.get(), 1.0f, dw(p.expert_down), he * d, st);
      experts_nt(off, E, n, he, d, dyg_.get(), w(p.expert_down), he * d, 0.0f, dact_.get(), st);
      swiglu_backward(eg, eu, dact_.get(), n * K * he, dg_.get(), du_.get(), st);
      experts_tn(off, E, d, he, xg_.get(), dg_.get(), 1.0f, dw(p.expert_gate), d * he, st);
      experts_tn(off, E, d, he, xg_.get(), du_.get(), 1.0f, dw(p.expert_up), d * he, st);
      experts_nt(off, E, n, d, he, dg_.get(), w(p.expert_gate), d * he, 0.0f, dxg_.get(), st);
      experts_nt(off, E, n, d, he, du_.get(), w(p.expert_up), d * he, 1.0f, dxg_.get(), st);
      scatter_rows_add(dxg_.get(), row_.get(), n, K, d, dhn, st);
      route_backward(route_buffers(), n, E, K, c_.renormalize_top_k, dweight_.get(), dlogits_.get(), st);
      g_.tn(d, E, n, hn, dlogits_.get(), 1.0f, dw(p.router));
      g_.nt(n, d, E, dlogits_.get(), w(p.router), 1.0f, dhn);
    }
    float* dh = gy;  // the residual's gradient, plus the MLP block's through its norm
    rms_backward(h_.get(), r2, w(p.mlp_norm), dhn, n, d, dh, dw(p.mlp_norm), st);

    // Attention block.
    float const* o = in(attention_out);
    g_.tn(qw, d, n, o, dh, 1.0f, dw(p.wo));
    g_.nt(n, qw, d, dh, w(p.wo), 0.0f, do_.get());
    attention_dims const ad{s_.batch, s_.seq, c_.heads, c_.kv_heads, hd};
    attention_backward(ad, in(query_proj), in(key_proj), in(value_proj), o, in(attention_lse), do_.get(), dq_.get(), dk_.get(),
                       dv_.get(), st);
    rope_apply(dq_.get(), n, s_.seq, c_.heads, hd, c_.rope_theta, true, st);
    rope_apply(dk_.get(), n, s_.seq, c_.kv_heads, hd, c_.rope_theta, true, st);
    float const* r1 = in(attention_norm_inv_rms);
    rms_apply(x, r1, w(p.attention_norm), n, d, xn_.get(), st);
    g_.tn(d, qw, n, xn_.get(), dq_.get(), 1.0f, dw(p.wq));
    g_.tn(d, kvw, n, xn_.get(), dk_.get(), 1.0f, dw(p.wk));
    g_.tn(d, kvw, n, xn_.get(), dv_.get(), 1.0f, dw(p.wv));
    g_.nt(n, d, qw, dq_.get(), w(p.wq), 0.0f, dxn_.get());
    g_.nt(n, d, kvw, dk_.get(), w(p.wk), 1.0f, dxn_.get());
    g_.nt(n, d, kvw, dv_.get(), w(p.wv), 1.0f, dxn_.get());
    rms_backward(x, r1, w(p.attention_norm), dxn_.get(), n, d, dh, dw(p.attention_norm), st);
    TRANSFORMER_CUDA(cudaMemcpyAsync(grad_input, dh, n * d * sizeof(float), cudaMemcpyDeviceToDevice, st));
  }

 private:
  using layer_offsets = transformer::model::layer_offsets;
  float* w(std::size_t offset) const { return w_.get() + offset; }
  float* dw(std::size_t offset) const { return grad_.get() + offset; }
  routing route_buffers() const {
    return {.probs = probs_.get(),
            .expert = expert_.get(),
            .weight = weight_.get(),
            .row = row_.get(),
            .token = token_.get(),
            .offset = offset_.get(),
            .sorted_expert = sorted_expert_.get(),
            .pair_in = pair_in_.get(),
            .pair_out = pair_out_.get(),
            .sort_temp = sort_temp_.get(),
            .sort_temp_bytes = sort_temp_.size()};
  }
  static tensor_set input_set() { return tensor_set{}.set(tensor_index(tensor::decoder_layer_input)); }

  void run_forward(std::size_t l, float const* x, saved const& sv, tensor_set want, float* output, tensor_set available,
                   cudaStream_t st) {
    using enum tensor;
    g_.bind(st);
    auto const lk = kind(l);
    tensor_set const need = forward_needs(lk, want, output != nullptr, available);
    auto is = [&](tensor t) { return need.test(tensor_index(t)); };
    auto has = [&](tensor t) { return available.test(tensor_index(t)) && !want.test(tensor_index(t)); };
    auto dst = [&](tensor t) {
      if (!want.test(tensor_index(t)))
        throw std::invalid_argument("gpu_model: computing the wanted tensors needs " + std::string(name(t)) +
                                    ", which is neither wanted nor available");
      return sv[tensor_index(t)];
    };
    auto src = [&](tensor t) { return sv[tensor_index(t)]; };
    auto const& p = layers_[l];
    std::size_t const n = s_.tokens(), d = c_.width, hd = c_.head_dim(), qw = c_.heads * hd, kvw = c_.kv_heads * hd;
    float* r1 = is(attention_norm_inv_rms) ? dst(attention_norm_inv_rms) : has(attention_norm_inv_rms) ? src(attention_norm_inv_rms) : nullptr;
    if (is(attention_norm_inv_rms)) rms_inv(x, n, d, c_.norm_eps, r1, st);
    float *q = nullptr, *k = nullptr, *v = nullptr;
    if (is(query_proj) || is(key_proj) || is(value_proj)) {
      rms_apply(x, r1, w(p.attention_norm), n, d, xn_.get(), st);
      if (is(query_proj)) {
        g_.nn(n, qw, d, xn_.get(), w(p.wq), 0.0f, q = dst(query_proj));
        rope_apply(q, n, s_.seq, c_.heads, hd, c_.rope_theta, false, st);
      }
      if (is(key_proj)) {
        g_.nn(n, kvw, d, xn_.get(), w(p.wk), 0.0f, k = dst(key_proj));
        rope_apply(k, n, s_.seq, c_.kv_heads, hd, c_.rope_theta, false, st);
      }
      if (is(value_proj)) g_.nn(n, kvw, d, xn_.get(), w(p.wv), 0.0f, v = dst(value_proj));
    }
    if (!q && has(query_proj)) q = src(query_proj);
    if (!k && has(key_proj)) k = src(key_proj);
    if (!v && has(value_proj)) v = src(value_proj);
    attention_dims const ad{s_.batch, s_.seq, c_.heads, c_.kv_heads, hd};
    float* o = nullptr;
    // One kernel writes both of the pair: the one not wanted lands in the model's own scratch.
    auto pair = [&](tensor t) { return want.test(tensor_index(t)) ? sv[tensor_index(t)] : pair_scratch_[t == attention_out ? 0 : 1].get(); };
    if (is(attention_out) || is(attention_lse)) attention_forward(ad, q, k, v, o = pair(attention_out), pair(attention_lse), st);
    else if (has(attention_out)) o = src(attention_out);
    float* a = nullptr;
    if (is(out_proj)) g_.nn(n, d, qw, o, w(p.wo), 0.0f, a = dst(out_proj));
    else if (has(out_proj)) a = src(out_proj);

    bool const beyond = output || (need & ~tensors_through(mlp_norm_inv_rms)).any();
    if (!is(mlp_norm_inv_rms) && !beyond) return;
    bool const uses_hn = output || is(mlpwi_0) || is(mlpwi_1) || is(router_logits) || is(moe_mlpwi_0) ||
                         is(moe_mlpwi_1) || is(shared_mlpwi_0) || is(shared_mlpwi_1);
    if (is(mlp_norm_inv_rms) || uses_hn) {
      add(x, a, n * d, h_.get(), st);
      float* r2 = is(mlp_norm_inv_rms) ? dst(mlp_norm_inv_rms) : src(mlp_norm_inv_rms);
      if (is(mlp_norm_inv_rms)) rms_inv(h_.get(), n, d, c_.norm_eps, r2, st);
      if (uses_hn) rms_apply(h_.get(), r2, w(p.mlp_norm), n, d, hn_.get(), st);
    }
    if (!beyond) return;
    float* hn = hn_.get();
    if (lk == layer_kind::dense) {
      std::size_t const f = c_.mlp_hidden;
      float *gate = nullptr, *up = nullptr;
      if (is(mlpwi_0)) g_.nn(n, f, d, hn, w(p.w_gate), 0.0f, gate = dst(mlpwi_0));
      if (is(mlpwi_1)) g_.nn(n, f, d, hn, w(p.w_up), 0.0f, up = dst(mlpwi_1));
      if (!output) return;
      swiglu(gate, up, n * f, act_.get(), st);
      g_.nn(n, d, f, act_.get(), w(p.w_down), 0.0f, output);  // mlpwo
      add(h_.get(), output, n * d, output, st);
      return;
    }
    std::size_t const E = c_.experts, K = c_.top_k, he = c_.expert_hidden, hs = c_.shared_hidden;
    float* logits = nullptr;
    if (is(router_logits)) g_.nn(n, E, d, hn, w(p.router), 0.0f, logits = dst(router_logits));
    else if (has(router_logits)) logits = src(router_logits);
    float *eg = nullptr, *eu = nullptr, *eo = nullptr;
    if (is(moe_mlpwi_0) || is(moe_mlpwi_1) || is(moe_mlpwo)) {
      route(logits, n, E, K, c_.renormalize_top_k, route_buffers(), st);
      if (is(moe_mlpwi_0) || is(moe_mlpwi_1)) gather_rows(hn, token_.get(), n * K, d, xg_.get(), st);
      eg = is(moe_mlpwi_0) ? dst(moe_mlpwi_0) : has(moe_mlpwi_0) ? src(moe_mlpwi_0) : nullptr;
      eu = is(moe_mlpwi_1) ? dst(moe_mlpwi_1) : has(moe_mlpwi_1) ? src(moe_mlpwi_1) : nullptr;
      std::uint32_t const* off = offset_.get();  // per expert, on its rows (at most n an expert)
      if (is(moe_mlpwi_0)) experts_nn(off, E, n, he, d, xg_.get(), w(p.expert_gate), d * he, 0.0f, eg, st);
      if (is(moe_mlpwi_1)) experts_nn(off, E, n, he, d, xg_.get(), w(p.expert_up), d * he, 0.0f, eu, st);
      if (is(moe_mlpwo)) {
        eo = dst(moe_mlpwo);
        swiglu(eg, eu, n * K * he, act_.get(), st);
        experts_nn(off, E, n, d, he, act_.get(), w(p.expert_down), he * d, 0.0f, eo, st);
      }
    }
    float *sg = nullptr, *su = nullptr;
    if (is(shared_mlpwi_0)) g_.nn(n, hs, d, hn, w(p.shared_gate), 0.0f, sg = dst(shared_mlpwi_0));
    if (is(shared_mlpwi_1)) g_.nn(n, hs, d, hn, w(p.shared_up), 0.0f, su = dst(shared_mlpwi_1));
    if (!output) return;
    swiglu(sg, su, n * hs, act_.get(), st);
    g_.nn(n, d, hs, act_.get(), w(p.shared_down), 0.0f, output);  // the shared expert's mlpwo
    moe_combine(h_.get(), weight_.get(), row_.get(), eo, n, K, d, output, st);
  }

  //! A SwiGLU block's backward (model.hpp's member of the same name).
  void swiglu_block_backward(float const* xin, float const* gate, float const* up, float const* dy, std::size_t n,
                             std::size_t f, std::size_t w_gate, std::size_t w_up, std::size_t w_down, float* dx, float beta,
                             cudaStream_t st) {
    std::size_t const d = c_.width;
    swiglu(gate, up, n * f, act_.get(), st);
    g_.tn(f, d, n, act_.get(), dy, 1.0f, dw(w_down));
    g_.nt(n, f, d, dy, w(w_down), 0.0f, dact_.get());
    swiglu_backward(gate, up, dact_.get(), n * f, dg_.get(), du_.get(), st);
    g_.tn(d, f, n, xin, dg_.get(), 1.0f, dw(w_gate));
    g_.tn(d, f, n, xin, du_.get(), 1.0f, dw(w_up));
    g_.nt(n, d, f, dg_.get(), w(w_gate), beta, dx);
    g_.nt(n, d, f, du_.get(), w(w_up), 1.0f, dx);
  }


  // cuBLAS's workspace: 32 MiB, the size the cuBLAS documentation recommends for Hopper
  // (cublasSetWorkspace); enough for the others.
  static constexpr std::size_t workspace_bytes = std::size_t{32} << 20;
  device_array<float> workspace_;
  std::array<device_array<float>, 2> pair_scratch_;  // attention_out, attention_lse (see run_forward)
  config c_;
  shape s_;
  gemms g_;
  std::vector<parameter_tensor> params_;
  std::vector<layer_offsets> layers_;
  std::size_t embedding_ = 0, final_norm_ = 0;
  device_array<float> w_, grad_, m_, v_;
  device_array<std::uint8_t> decay_;
  device_array<float> xn_, h_, hn_, dhn_, gy_, dxn_, tmp_, act_, dact_, dg_, du_, dq_, dk_, dv_, do_, xg_, dxg_, dyg_, logits_;
  device_array<double> probs_, dweight_, loss_, reduce_work_;
  device_array<std::uint32_t> expert_, row_, token_, offset_, sorted_expert_, pair_in_, pair_out_;
  device_array<std::byte> sort_temp_;
  device_array<float> weight_, dlogits_;
  std::size_t steps_ = 0;
};

}  // namespace transformer::cuda
