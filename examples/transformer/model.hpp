#pragma once
// A small decoder-only transformer on the host: token embedding, L decoder layers (RMSNorm,
// causal grouped-query attention with rotary embeddings, output projection, residual; RMSNorm,
// a SwiGLU MLP or a DeepSeek-style mixture of experts, residual), a final RMSNorm, the output
// projection tied to the embedding, cross-entropy, AdamW.
//
// Each decoder layer is driven in three calls, so that an activation scheduler can own what the
// layer saves for backward (see `tensor` in layers.hpp):
//   - layer_forward(input -> output): writes every saved tensor into caller-provided spans;
//   - layer_recompute: rebuilds any subset of them from the saved `decoder_layer_input` alone,
//     writing only that subset, with the very same code, hence bitwise equal;
//   - layer_backward(grad_output -> grad_input): reads only the saved tensors and the parameters,
//     and accumulates the parameter gradients.
// The model is float32 (basic_model<double> serves the gradient check), single-threaded (one
// model is used from one thread at a time: it keeps work buffers), and bitwise reproducible from
// run to run: reductions have fixed orders, BLAS runs on one thread.

#include "blas.hpp"
#include "layers.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace transformer {

//! AdamW's hyperparameters. Weight decay applies to every matrix, not to the norms' gains.
struct adamw {
  double learning_rate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;  //!< clip the global gradient norm to this; 0: no clipping
};

//! One named parameter tensor, a range of the flat parameter (and gradient) array.
struct parameter_tensor {
  std::string name;
  std::size_t offset = 0;
  std::size_t size = 0;
  bool decay = false;
};

//! Deterministic pseudo-random numbers (SplitMix64).
struct rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  //! Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  //! Uniform in [0, n).
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(uniform() * static_cast<double>(n)); }
};

template <class Real>
class basic_model {
 public:
  using real = Real;
  //! A layer's saved tensors, indexed by `tensor_index(tensor)`; those its kind does not save are empty.
  using saved_spans = std::array<std::span<Real>, tensor_count>;
  //! The same, read-only: what a backward reads.
  using saved_views = std::array<std::span<Real const>, tensor_count>;

  //! Draws the weights from `seed`: uniform with standard deviation 1/sqrt(fan-in), the
  //! residual branches' last projections further scaled by 1/sqrt(2 L); norm gains start at 1
  //! (listed with standard deviation 0).
  explicit basic_model(config c, std::uint64_t seed = 1) : c_(c) {
    validate(c_);
    blas::use_one_thread();
    std::size_t const d = c_.width, hd = c_.head_dim(), q = c_.heads * hd, kv = c_.kv_heads * hd;
    double const branch = 1.0 / std::sqrt(2.0 * static_cast<double>(c_.layers));
    std::vector<double> stddev;
    auto add = [&](std::string name, std::size_t size, double sd, bool decay) {
      params_.push_back({std::move(name), total_, size, decay});
      stddev.push_back(sd);
      total_ += size;
      return params_.back().offset;
    };
    auto inv_sqrt = [](std::size_t n) { return 1.0 / std::sqrt(static_cast<double>(n)); };
    embedding_ = add("embedding", c_.vocab * d, 0.02, true);
    layers_.resize(c_.layers);
    for (std::size_t l = 0; l < c_.layers; ++l) {
      auto& p = layers_[l];
      std::string const pre = "layers." + std::to_string(l) + ".";
      p.attention_norm = add(pre + "attention_norm", d, 0.0, false);
      p.wq = add(pre + "attention.wq", d * q, inv_sqrt(d), true);
      p.wk = add(pre + "attention.wk", d * kv, inv_sqrt(d), true);
      p.wv = add(pre + "attention.wv", d * kv, inv_sqrt(d), true);
      p.wo = add(pre + "attention.wo", q * d, inv_sqrt(q) * branch, true);
      p.mlp_norm = add(pre + "mlp_norm", d, 0.0, false);
      if (kind(l) == layer_kind::dense) {
        std::size_t const f = c_.mlp_hidden;
        p.w_gate = add(pre + "mlp.w_gate", d * f, inv_sqrt(d), true);
        p.w_up = add(pre + "mlp.w_up", d * f, inv_sqrt(d), true);
        p.w_down = add(pre + "mlp.w_down", f * d, inv_sqrt(f) * branch, true);
      } else {
        std::size_t const E = c_.experts, he = c_.expert_hidden, hs = c_.shared_hidden;
        p.router = add(pre + "moe.router", d * E, inv_sqrt(d), true);
        p.expert_gate = add(pre + "moe.expert_gate", E * d * he, inv_sqrt(d), true);
        p.expert_up = add(pre + "moe.expert_up", E * d * he, inv_sqrt(d), true);
        p.expert_down = add(pre + "moe.expert_down", E * he * d, inv_sqrt(he) * branch, true);
        p.shared_gate = add(pre + "moe.shared_gate", d * hs, inv_sqrt(d), true);
        p.shared_up = add(pre + "moe.shared_up", d * hs, inv_sqrt(d), true);
        p.shared_down = add(pre + "moe.shared_down", hs * d, inv_sqrt(hs) * branch, true);
      }
    }
    final_norm_ = add("final_norm", d, 0.0, false);

    w_.resize(total_);
    rng r{seed};
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto const& t = params_[i];
      double const a = std::sqrt(3.0) * stddev[i];  // uniform(-a, a) has standard deviation sd
      for (std::size_t j = 0; j < t.size; ++j)
        w_[t.offset + j] = a == 0.0 ? Real{1} : static_cast<Real>((2.0 * r.uniform() - 1.0) * a);
    }
    g_.assign(total_, Real{0});
    adam_m_.assign(total_, Real{0});
    adam_v_.assign(total_, Real{0});
  }

  config const& cfg() const { return c_; }
  layer_kind kind(std::size_t l) const { return l < c_.dense_layers ? layer_kind::dense : layer_kind::moe; }

  //! Every parameter, flat; `parameter_tensors` names its ranges. Gradients have the same layout.
  std::span<Real> parameters() { return w_; }
  std::span<Real const> parameters() const { return w_; }
  std::span<Real> gradients() { return g_; }
  std::span<Real const> gradients() const { return g_; }
  std::vector<parameter_tensor> const& parameter_tensors() const { return params_; }
  std::size_t steps() const { return steps_; }

  void zero_gradients() { std::fill(g_.begin(), g_.end(), Real{0}); }

  // ---- the pieces outside the decoder layers -------------------------------------------------

  //! carry[t] = embedding[tokens[t]].
  void embed(std::span<std::int32_t const> tokens, shape s, std::span<Real> carry) const {
    check_shape(s);
    check_size(tokens.size(), s.tokens(), "tokens");
    check_size(carry.size(), s.tokens() * c_.width, "carry");
    std::size_t const d = c_.width;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      Real const* e = w_.data() + embedding_ + token_index(tokens[t]) * d;
      std::copy(e, e + d, carry.begin() + static_cast<std::ptrdiff_t>(t * d));
    }
  }

  //! Accumulates the embedding's gradient from the gradient of the first layer's input.
  void embed_backward(std::span<std::int32_t const> tokens, shape s, std::span<Real const> grad_carry) {
    check_shape(s);
    check_size(tokens.size(), s.tokens(), "tokens");
    check_size(grad_carry.size(), s.tokens() * c_.width, "grad_carry");
    std::size_t const d = c_.width;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      Real* ge = g_.data() + embedding_ + token_index(tokens[t]) * d;
      for (std::size_t j = 0; j < d; ++j) ge[j] += grad_carry[t * d + j];
    }
  }

  //! Final RMSNorm, logits = h E^T, mean cross-entropy over the targets that are >= 0 (a
  //! negative target masks its position). With a non-empty grad_carry, also backward: writes
  //! the gradient of the last layer's output and accumulates the embedding's and final norm's.
  //! `loss_scale` scales the loss whose gradient is taken (1/M averages M micro-batches); a
  //! non-empty `embedding_grad` (the embedding's size) takes the head's share of the tied
  //! embedding's gradient instead of the model's gradients (a pipeline's last stage keeps it apart
  //! until it is reduced with the first stage's).
  double head(std::span<Real const> carry, std::span<std::int32_t const> targets, shape s,
              std::span<Real> grad_carry, double loss_scale = 1.0, std::span<Real> embedding_grad = {}) {
    check_shape(s);
    std::size_t const n = s.tokens(), d = c_.width, V = c_.vocab;
    check_size(carry.size(), n * d, "carry");
    check_size(targets.size(), n, "targets");
    bool const backward = !grad_carry.empty();
    if (backward) check_size(grad_carry.size(), n * d, "grad_carry");
    Real const* gain = w_.data() + final_norm_;
    Real const* emb = w_.data() + embedding_;
    Real* inv = work(w_inv_, n);
    Real* hf = work(w_hn_, n * d);
    kernels::rms_inv(carry.data(), n, d, c_.norm_eps, inv);
    kernels::rms_apply(carry.data(), inv, gain, n, d, hf);
    Real* logits = work(w_logits_, n * V);
    blas::gemm_nt(n, V, d, hf, emb, Real{0}, logits);
    std::size_t count = 0;
    for (std::int32_t y : targets) {
      if (y >= 0) token_index(y);
      count += y >= 0;
    }
    if (count == 0) throw std::invalid_argument("transformer: every target is masked; the loss is undefined");
    double loss = 0.0;
    for (std::size_t t = 0; t < n; ++t) {
      Real* z = logits + t * V;
      if (targets[t] < 0) {
        std::fill(z, z + V, Real{0});  // no gradient from a masked position
        continue;
      }
      double m = z[0];
      for (std::size_t v = 1; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
      double sum = 0.0;
      for (std::size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - m);
      double const lse = m + std::log(sum);
      std::size_t const y = static_cast<std::size_t>(targets[t]);
      loss += lse - static_cast<double>(z[y]);
      for (std::size_t v = 0; v < V; ++v)  // z becomes dloss/dz
        z[v] = static_cast<Real>((std::exp(static_cast<double>(z[v]) - lse) - (v == y ? 1.0 : 0.0)) /
                                 static_cast<double>(count) * loss_scale);
    }
    if (backward) {
      Real* dhf = work(w_dhn_, n * d);
      blas::gemm_nn(n, d, V, logits, emb, Real{0}, dhf);
      if (!embedding_grad.empty()) check_size(embedding_grad.size(), V * d, "embedding_grad");
      blas::gemm_tn(V, d, n, logits, hf, Real{1}, embedding_grad.empty() ? g_.data() + embedding_ : embedding_grad.data());
      Real* dx = work(w_dx_, n * d);  // grad_carry may alias carry
      std::fill(dx, dx + n * d, Real{0});
      kernels::rms_backward(carry.data(), inv, gain, dhf, n, d, dx, g_.data() + final_norm_);
      std::copy(dx, dx + n * d, grad_carry.begin());
    }
    return loss / static_cast<double>(count);
  }

  // ---- one decoder layer ---------------------------------------------------------------------

  //! Forward of layer l: copies `input` into saved[decoder_layer_input] (unless that span is
  //! empty: a caller that keeps the input elsewhere), writes every other tensor the layer saves,
  //! and the layer's output (which may alias the input; the saved spans must not overlap each
  //! other or the output).
  void layer_forward(std::size_t l, shape s, std::span<Real const> input, saved_spans const& saved,
                     std::span<Real> output) {
    check_spans(s, saved, layer_tensor_set(kind(l)) & ~input_set());
    check_layer_index(l, s);
    check_size(input.size(), s.tokens() * c_.width, "input");
    check_size(output.size(), s.tokens() * c_.width, "output");
    auto x = saved[tensor_index(tensor::decoder_layer_input)];
    if (!x.empty()) check_size(x.size(), input.size(), "saved decoder_layer_input");
    if (!x.empty() && x.data() != input.data()) std::memmove(x.data(), input.data(), x.size_bytes());
    run_forward(l, s, input.data(), saved, layer_tensor_set(kind(l)) & ~input_set(), output.data());
  }

  //! Recompute mode: rebuilds the tensors in `which` from saved[decoder_layer_input] and the
  //! tensors in `available` (saved tensors that still hold their data: kept, or prefetched back),
  //! and writes nothing else; they equal layer_forward's bitwise. A tensor in `available` is read,
  //! never recomputed, and neither is what only it needs. Only the spans of `which`, `available`
  //! and the layer input need to be provided.
  void layer_recompute(std::size_t l, shape s, saved_spans const& saved, tensor_set which, tensor_set available = {}) {
    check_spans(s, saved, input_set());
    layer_recompute(l, s, saved[tensor_index(tensor::decoder_layer_input)], saved, which, available);
  }
  //! The same with the layer's input given apart (saved[decoder_layer_input] is not read).
  void layer_recompute(std::size_t l, shape s, std::span<Real const> input, saved_spans const& saved, tensor_set which,
                       tensor_set available = {}) {
    check_layer_index(l, s);
    check_size(input.size(), s.tokens() * c_.width, "input");
    if (which.test(tensor_index(tensor::decoder_layer_input)))
      throw std::invalid_argument("transformer: decoder_layer_input is what recompute starts from, not a result");
    tensor_set const foreign = which & ~layer_tensor_set(kind(l));
    for (std::size_t i = 0; i < tensor_count; ++i)
      if (foreign.test(i))
        throw std::invalid_argument("transformer: layer " + std::to_string(l) + " saves no " +
                                    std::string(name(static_cast<tensor>(i))));
    available &= layer_tensor_set(kind(l)) & ~which & ~input_set();
    check_spans(s, saved, which | available);
    run_forward(l, s, input.data(), saved, which, nullptr, available);
  }

  //! Backward of layer l: reads the saved tensors, the parameters and grad_output; writes
  //! grad_input (which may alias grad_output) and accumulates the parameter gradients.
  void layer_backward(std::size_t l, shape s, saved_spans const& saved, std::span<Real const> grad_output,
                      std::span<Real> grad_input) {
    saved_views v{};
    std::copy(saved.begin(), saved.end(), v.begin());
    check_spans(s, v, input_set());
    layer_backward(l, s, v[tensor_index(tensor::decoder_layer_input)], v, grad_output, grad_input);
  }
  //! The same with the layer's input given apart, from read-only views.
  void layer_backward(std::size_t l, shape s, std::span<Real const> input, saved_views const& saved,
                      std::span<Real const> grad_output, std::span<Real> grad_input) {
    check_layer_index(l, s);
    check_spans(s, saved, layer_tensor_set(kind(l)) & ~input_set());
    check_size(input.size(), s.tokens() * c_.width, "input");
    check_size(grad_output.size(), s.tokens() * c_.width, "grad_output");
    check_size(grad_input.size(), s.tokens() * c_.width, "grad_input");
    run_backward(l, s, input.data(), saved, grad_output.data(), grad_input.data());
  }

  // ---- the whole model, with the saved tensors in the model's own store ----------------------

  //! Zeroes the gradients, runs forward and backward, and returns the mean loss.
  double compute_gradients(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, shape s) {
    zero_gradients();
    forward_all(tokens, s);
    std::span<Real> grad(w_grad_carry_);
    double const loss = head(carry_, targets, s, grad);
    for (std::size_t l = c_.layers; l-- > 0;) layer_backward(l, s, store_[l], grad, grad);
    embed_backward(tokens, s, grad);
    return loss;
  }

  //! One micro-batch of a pipeline's step, whole, in one process: forward, the head (its loss
  //! scaled by `loss_scale`, its share of the embedding's gradient into `embedding_grad`), backward
  //! and the embedding's backward, accumulating into the gradients (not zeroed): the same
  //! accumulation order as the pipeline's stages. Returns the micro-batch's mean loss.
  double accumulate_micro_batch(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, shape s,
                                double loss_scale, std::span<Real> embedding_grad) {
    forward_all(tokens, s);
    std::span<Real> grad(w_grad_carry_);
    double const loss = head(carry_, targets, s, grad, loss_scale, embedding_grad);
    for (std::size_t l = c_.layers; l-- > 0;) layer_backward(l, s, store_[l], grad, grad);
    embed_backward(tokens, s, grad);
    return loss;
  }
  //! The embedding's range of the parameters (and gradients).
  [[nodiscard]] parameter_tensor const& embedding_tensor() const { return params_.front(); }

  //! The mean loss, forward only (the store then holds this batch's saved tensors).
  double evaluate(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets, shape s) {
    forward_all(tokens, s);
    return head(carry_, targets, s, {});
  }

  //! Layer l's saved tensors from the last compute_gradients or evaluate.
  saved_spans const& stored(std::size_t l) const {
    check_index(l);
    return store_.at(l);
  }

  //! One AdamW step with the accumulated gradients (clipped to max_grad_norm, and left as they
  //! are); returns the gradients' global norm before clipping.
  double adamw_step(adamw const& h) {
    double sq = 0.0;
    for (Real g : g_) sq += static_cast<double>(g) * static_cast<double>(g);
    double const norm = std::sqrt(sq);
    double const clip = h.max_grad_norm > 0.0 && norm > h.max_grad_norm ? h.max_grad_norm / norm : 1.0;
    ++steps_;
    double const c1 = 1.0 - std::pow(h.beta1, static_cast<double>(steps_));
    double const c2 = 1.0 - std::pow(h.beta2, static_cast<double>(steps_));
    for (auto const& t : params_) {
      double const decay = t.decay ? h.weight_decay : 0.0;
      for (std::size_t i = t.offset; i < t.offset + t.size; ++i) {
        double const g = static_cast<double>(g_[i]) * clip;
        double const m = h.beta1 * static_cast<double>(adam_m_[i]) + (1.0 - h.beta1) * g;
        double const v = h.beta2 * static_cast<double>(adam_v_[i]) + (1.0 - h.beta2) * g * g;
        adam_m_[i] = static_cast<Real>(m);
        adam_v_[i] = static_cast<Real>(v);
        double const p = w_[i];
        w_[i] = static_cast<Real>(p - h.learning_rate * ((m / c1) / (std::sqrt(v / c2) + h.epsilon) + decay * p));
      }
    }
    return norm;
  }

  //! Where a layer's tensors start in `parameters()` (those of the other kind stay 0).
  struct layer_offsets {
    std::size_t attention_norm = 0, wq = 0, wk = 0, wv = 0, wo = 0, mlp_norm = 0;
    std::size_t w_gate = 0, w_up = 0, w_down = 0;
    std::size_t router = 0, expert_gate = 0, expert_up = 0, expert_down = 0;
    std::size_t shared_gate = 0, shared_up = 0, shared_down = 0;
  };
  //! Layer `l`'s tensors in `parameters()`, for a twin of the model with the same layout (the GPU's).
  layer_offsets const& offsets(std::size_t l) const { return layers_[l]; }
  std::size_t embedding_offset() const { return embedding_; }
  std::size_t final_norm_offset() const { return final_norm_; }

 private:

  std::size_t token_index(std::int32_t token) const {
    if (token < 0 || static_cast<std::size_t>(token) >= c_.vocab)
      throw std::out_of_range("transformer: token " + std::to_string(token) + " is outside the vocabulary of " +
                              std::to_string(c_.vocab));
    return static_cast<std::size_t>(token);
  }

  static void check_size(std::size_t got, std::size_t want, char const* what) {
    if (got != want)
      throw std::invalid_argument(std::string("transformer: ") + what + " has " + std::to_string(got) +
                                  " elements, expected " + std::to_string(want));
  }
  void check_shape(shape s) const {
    validate(s);
    detail::checked_mul(s.tokens(), std::max({c_.width, c_.vocab, c_.top_k * c_.width}));
  }
  void check_index(std::size_t l) const {
    if (l >= c_.layers)
      throw std::out_of_range("transformer: layer " + std::to_string(l) + " of " + std::to_string(c_.layers));
  }
  static tensor_set input_set() { return tensor_set{}.set(tensor_index(tensor::decoder_layer_input)); }
  template <class Spans>
  void check_spans(shape s, Spans const& saved, tensor_set which) const {
    for (std::size_t i = 0; i < tensor_count; ++i)
      if (which.test(i)) {
        auto const t = static_cast<tensor>(i);
        if (saved[i].size() != tensor_elements(c_, t, s))
          throw std::invalid_argument("transformer: saved tensor " + std::string(name(t)) + " has " +
                                      std::to_string(saved[i].size()) + " elements, expected " +
                                      std::to_string(tensor_elements(c_, t, s)));
      }
  }
  void check_layer_index(std::size_t l, shape s) const {
    check_shape(s);
    check_index(l);
  }

  //! Grows a work buffer to n elements (never read before it is written).
  static Real* work(std::vector<Real>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }

  Real const* w(std::size_t offset) const { return w_.data() + offset; }
  Real* dw(std::size_t offset) { return g_.data() + offset; }

  void run_forward(std::size_t l, shape s, Real const* x, saved_spans const& saved, tensor_set want, Real* output,
                   tensor_set available = {}) {
    using enum tensor;
    layer_kind const lk = kind(l);
    tensor_set const need = forward_needs(lk, want, output != nullptr, available);
    auto is = [&](tensor t) { return need.test(tensor_index(t)); };  // computed here
    // Read from the saved spans instead (available, not wanted).
    auto has = [&](tensor t) { return available.test(tensor_index(t)) && !want.test(tensor_index(t)); };
    auto src = [&](tensor t) -> Real* { return saved[tensor_index(t)].data(); };
    // A tensor goes where the caller wants it, or to scratch when it is only a means.
    auto dst = [&](tensor t) -> Real* {
      if (want.test(tensor_index(t))) return saved[tensor_index(t)].data();
      return work(scratch_[tensor_index(t)], tensor_elements(c_, t, s));
    };
    auto const& p = layers_[l];
    std::size_t const n = s.tokens(), d = c_.width, hd = c_.head_dim(), qw = c_.heads * hd,
                      kvw = c_.kv_heads * hd;

    // Attention block.
    Real* r1 = is(attention_norm_inv_rms) ? dst(attention_norm_inv_rms)
               : has(attention_norm_inv_rms) ? src(attention_norm_inv_rms)
                                              : nullptr;
    if (is(attention_norm_inv_rms)) kernels::rms_inv(x, n, d, c_.norm_eps, r1);
    Real *q = nullptr, *k = nullptr, *v = nullptr;
    if (is(query_proj) || is(key_proj) || is(value_proj)) {
      Real* xn = work(w_xn_, n * d);
      kernels::rms_apply(x, r1, w(p.attention_norm), n, d, xn);
      rope_.build(s.seq, hd, c_.rope_theta);
      if (is(query_proj)) {
        blas::gemm_nn(n, qw, d, xn, w(p.wq), Real{0}, q = dst(query_proj));
        kernels::rope_apply(rope_, q, n, c_.heads, false);
      }
      if (is(key_proj)) {
        blas::gemm_nn(n, kvw, d, xn, w(p.wk), Real{0}, k = dst(key_proj));
        kernels::rope_apply(rope_, k, n, c_.kv_heads, false);
      }
      if (is(value_proj)) blas::gemm_nn(n, kvw, d, xn, w(p.wv), Real{0}, v = dst(value_proj));
    }
    if (!q && has(query_proj)) q = src(query_proj);
    if (!k && has(key_proj)) k = src(key_proj);
    if (!v && has(value_proj)) v = src(value_proj);
    Real* o = nullptr;
    if (is(attention_out) || is(attention_lse)) {
      o = dst(attention_out);
      kernels::attention_forward(dims(s), q, k, v, o, dst(attention_lse));
    } else if (has(attention_out)) {
      o = src(attention_out);
    }
    Real* a = nullptr;
    if (is(out_proj)) blas::gemm_nn(n, d, qw, o, w(p.wo), Real{0}, a = dst(out_proj));
    else if (has(out_proj)) a = src(out_proj);

    // MLP block, on h = x + attention; hn, its normalization, feeds the MLP's projections.
    bool const beyond = output || (need & ~tensors_through(mlp_norm_inv_rms)).any();
    if (!is(mlp_norm_inv_rms) && !beyond) return;
    bool const uses_hn = output || is(mlpwi_0) || is(mlpwi_1) || is(router_logits) || is(moe_mlpwi_0) ||
                         is(moe_mlpwi_1) || is(shared_mlpwi_0) || is(shared_mlpwi_1);
    Real *h = nullptr, *hn = nullptr;
    if (is(mlp_norm_inv_rms) || uses_hn) {
      h = residual(x, a, n * d);
      Real* r2 = is(mlp_norm_inv_rms) ? dst(mlp_norm_inv_rms) : src(mlp_norm_inv_rms);
      if (is(mlp_norm_inv_rms)) kernels::rms_inv(h, n, d, c_.norm_eps, r2);
      if (uses_hn) {
        hn = work(w_hn_, n * d);
        kernels::rms_apply(h, r2, w(p.mlp_norm), n, d, hn);
      }
    }
    if (!beyond) return;

    if (lk == layer_kind::dense) {
      std::size_t const f = c_.mlp_hidden;
      Real *gate = nullptr, *up = nullptr;
      if (is(mlpwi_0)) blas::gemm_nn(n, f, d, hn, w(p.w_gate), Real{0}, gate = dst(mlpwi_0));
      if (is(mlpwi_1)) blas::gemm_nn(n, f, d, hn, w(p.w_up), Real{0}, up = dst(mlpwi_1));
      if (!output) return;
      Real* act = work(w_act_, n * f);
      kernels::swiglu(gate, up, n * f, act);
      blas::gemm_nn(n, d, f, act, w(p.w_down), Real{0}, output);  // mlpwo
      for (std::size_t i = 0; i < n * d; ++i) output[i] = h[i] + output[i];
      return;
    }

    std::size_t const E = c_.experts, K = c_.top_k, he = c_.expert_hidden, hs = c_.shared_hidden;
    Real* logits = nullptr;
    if (is(router_logits)) blas::gemm_nn(n, E, d, hn, w(p.router), Real{0}, logits = dst(router_logits));
    else if (has(router_logits)) logits = src(router_logits);
    Real *eg = nullptr, *eu = nullptr, *eo = nullptr;
    if (is(moe_mlpwi_0) || is(moe_mlpwi_1) || is(moe_mlpwo)) {
      kernels::route(logits, n, E, K, c_.renormalize_top_k, routing_);
      Real* xg = is(moe_mlpwi_0) || is(moe_mlpwi_1) ? gather(hn, n) : nullptr;
      eg = is(moe_mlpwi_0) ? dst(moe_mlpwi_0) : has(moe_mlpwi_0) ? src(moe_mlpwi_0) : nullptr;
      eu = is(moe_mlpwi_1) ? dst(moe_mlpwi_1) : has(moe_mlpwi_1) ? src(moe_mlpwi_1) : nullptr;
      for (std::size_t e = 0; e < E; ++e) {
        std::size_t const r0 = routing_.offset[e], rows = routing_.offset[e + 1] - r0;
        if (is(moe_mlpwi_0)) blas::gemm_nn(rows, he, d, xg + r0 * d, w(p.expert_gate) + e * d * he, Real{0}, eg + r0 * he);
        if (is(moe_mlpwi_1)) blas::gemm_nn(rows, he, d, xg + r0 * d, w(p.expert_up) + e * d * he, Real{0}, eu + r0 * he);
      }
      if (is(moe_mlpwo)) {
        eo = dst(moe_mlpwo);
        Real* act = work(w_act_, n * K * he);
        kernels::swiglu(eg, eu, n * K * he, act);
        for (std::size_t e = 0; e < E; ++e) {
          std::size_t const r0 = routing_.offset[e], rows = routing_.offset[e + 1] - r0;
          blas::gemm_nn(rows, d, he, act + r0 * he, w(p.expert_down) + e * he * d, Real{0}, eo + r0 * d);
        }
      }
    }
    Real *sg = nullptr, *su = nullptr;
    if (is(shared_mlpwi_0)) blas::gemm_nn(n, hs, d, hn, w(p.shared_gate), Real{0}, sg = dst(shared_mlpwi_0));
    if (is(shared_mlpwi_1)) blas::gemm_nn(n, hs, d, hn, w(p.shared_up), Real{0}, su = dst(shared_mlpwi_1));
    if (!output) return;
    Real* act = work(w_act_, n * hs);
    kernels::swiglu(sg, su, n * hs, act);
    blas::gemm_nn(n, d, hs, act, w(p.shared_down), Real{0}, output);  // the shared expert's mlpwo
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < d; ++i) {
        Real y = h[t * d + i] + output[t * d + i];
        for (std::size_t j = 0; j < K; ++j)
          y += routing_.weight[t * K + j] * eo[routing_.row[t * K + j] * d + i];
        output[t * d + i] = y;
      }
  }

  void run_backward(std::size_t l, shape s, Real const* x, saved_views const& saved, Real const* grad_output,
                    Real* grad_input) {
    using enum tensor;
    auto const& p = layers_[l];
    auto in = [&](tensor t) -> Real const* { return saved[tensor_index(t)].data(); };
    std::size_t const n = s.tokens(), d = c_.width, hd = c_.head_dim(), qw = c_.heads * hd,
                      kvw = c_.kv_heads * hd;
    Real* gy = work(w_gy_, n * d);  // grad_input may alias grad_output
    std::copy(grad_output, grad_output + n * d, gy);

    // MLP block: rebuild h = x + attention and its normalization.
    Real* h = residual(x, in(out_proj), n * d);
    Real const* r2 = in(mlp_norm_inv_rms);
    Real* hn = work(w_hn_, n * d);
    kernels::rms_apply(h, r2, w(p.mlp_norm), n, d, hn);
    Real* dhn = work(w_dhn_, n * d);
    if (kind(l) == layer_kind::dense) {
      std::size_t const f = c_.mlp_hidden;
      swiglu_backward(hn, in(mlpwi_0), in(mlpwi_1), gy, n, f, p.w_gate, p.w_up, p.w_down, dhn, Real{0});
    } else {
      std::size_t const E = c_.experts, K = c_.top_k, he = c_.expert_hidden, hs = c_.shared_hidden;
      swiglu_backward(hn, in(shared_mlpwi_0), in(shared_mlpwi_1), gy, n, hs, p.shared_gate, p.shared_up,
                      p.shared_down, dhn, Real{0});
      kernels::route(in(router_logits), n, E, K, c_.renormalize_top_k, routing_);
      Real const* eg = in(moe_mlpwi_0);
      Real const* eu = in(moe_mlpwi_1);
      Real const* eo = in(moe_mlpwo);
      // Each dispatched row's output gradient is its weight times the token's; each weight's
      // gradient is the token's output gradient dotted with the row's expert output.
      Real* dyg = work(w_dyg_, n * K * d);
      std::vector<double>& dweight = w_dweight_;
      dweight.resize(n * K);
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t j = 0; j < K; ++j) {
          std::size_t const r = routing_.row[t * K + j];
          Real const wt = routing_.weight[t * K + j];
          for (std::size_t i = 0; i < d; ++i) dyg[r * d + i] = wt * gy[t * d + i];
          dweight[t * K + j] = kernels::dot(gy + t * d, eo + r * d, d);
        }
      Real* xg = gather(hn, n);
      Real* act = work(w_act_, n * K * he);
      Real* dact = work(w_dact_, n * K * he);
      Real* dg = work(w_dgate_, n * K * he);
      Real* du = work(w_dup_, n * K * he);
      Real* dxg = work(w_dxg_, n * K * d);
      kernels::swiglu(eg, eu, n * K * he, act);
      for (std::size_t e = 0; e < E; ++e) {
        std::size_t const r0 = routing_.offset[e], rows = routing_.offset[e + 1] - r0;
        blas::gemm_tn(he, d, rows, act + r0 * he, dyg + r0 * d, Real{1}, dw(p.expert_down) + e * he * d);
        blas::gemm_nt(rows, he, d, dyg + r0 * d, w(p.expert_down) + e * he * d, Real{0}, dact + r0 * he);
      }
      kernels::swiglu_backward(eg, eu, dact, n * K * he, dg, du);
      for (std::size_t e = 0; e < E; ++e) {
        std::size_t const r0 = routing_.offset[e], rows = routing_.offset[e + 1] - r0;
        blas::gemm_tn(d, he, rows, xg + r0 * d, dg + r0 * he, Real{1}, dw(p.expert_gate) + e * d * he);
        blas::gemm_tn(d, he, rows, xg + r0 * d, du + r0 * he, Real{1}, dw(p.expert_up) + e * d * he);
        blas::gemm_nt(rows, d, he, dg + r0 * he, w(p.expert_gate) + e * d * he, Real{0}, dxg + r0 * d);
        blas::gemm_nt(rows, d, he, du + r0 * he, w(p.expert_up) + e * d * he, Real{1}, dxg + r0 * d);
      }
      for (std::size_t t = 0; t < n; ++t)  // scatter back, in token then choice order
        for (std::size_t j = 0; j < K; ++j) {
          Real const* src = dxg + routing_.row[t * K + j] * d;
          for (std::size_t i = 0; i < d; ++i) dhn[t * d + i] += src[i];
        }
      Real* dlogits = work(w_dlogits_, n * E);
      kernels::route_backward(routing_, c_.renormalize_top_k, dweight.data(), dlogits);
      blas::gemm_tn(d, E, n, hn, dlogits, Real{1}, dw(p.router));
      blas::gemm_nt(n, d, E, dlogits, w(p.router), Real{1}, dhn);
    }
    Real* dh = gy;  // the residual's gradient, plus the MLP block's through its norm
    kernels::rms_backward(h, r2, w(p.mlp_norm), dhn, n, d, dh, dw(p.mlp_norm));

    // Attention block.
    Real const* o = in(attention_out);
    blas::gemm_tn(qw, d, n, o, dh, Real{1}, dw(p.wo));
    Real* d_o = work(w_do_, n * qw);
    blas::gemm_nt(n, qw, d, dh, w(p.wo), Real{0}, d_o);
    Real* dq = work(w_dq_, n * qw);
    Real* dk = work(w_dk_, n * kvw);
    Real* dv = work(w_dv_, n * kvw);
    kernels::attention_backward(dims(s), in(query_proj), in(key_proj), in(value_proj), o, in(attention_lse), d_o, dq,
                                dk, dv);
    rope_.build(s.seq, hd, c_.rope_theta);
    kernels::rope_apply(rope_, dq, n, c_.heads, true);
    kernels::rope_apply(rope_, dk, n, c_.kv_heads, true);
    Real const* r1 = in(attention_norm_inv_rms);
    Real* xn = work(w_xn_, n * d);
    kernels::rms_apply(x, r1, w(p.attention_norm), n, d, xn);
    blas::gemm_tn(d, qw, n, xn, dq, Real{1}, dw(p.wq));
    blas::gemm_tn(d, kvw, n, xn, dk, Real{1}, dw(p.wk));
    blas::gemm_tn(d, kvw, n, xn, dv, Real{1}, dw(p.wv));
    Real* dxn = work(w_dxn_, n * d);
    blas::gemm_nt(n, d, qw, dq, w(p.wq), Real{0}, dxn);
    blas::gemm_nt(n, d, kvw, dk, w(p.wk), Real{1}, dxn);
    blas::gemm_nt(n, d, kvw, dv, w(p.wv), Real{1}, dxn);
    kernels::rms_backward(x, r1, w(p.attention_norm), dxn, n, d, dh, dw(p.attention_norm));
    std::copy(dh, dh + n * d, grad_input);
  }

  //! A SwiGLU block's backward from its output gradient dy [n, d]: accumulates the three weights'
  //! gradients and writes (beta 0) or adds (beta 1) the input gradient into dx.
  void swiglu_backward(Real const* xin, Real const* gate, Real const* up, Real const* dy, std::size_t n,
                       std::size_t f, std::size_t w_gate, std::size_t w_up, std::size_t w_down, Real* dx, Real beta) {
    std::size_t const d = c_.width;
    Real* act = work(w_act_, n * f);
    Real* dact = work(w_dact_, n * f);
    Real* dg = work(w_dgate_, n * f);
    Real* du = work(w_dup_, n * f);
    kernels::swiglu(gate, up, n * f, act);
    blas::gemm_tn(f, d, n, act, dy, Real{1}, dw(w_down));
    blas::gemm_nt(n, f, d, dy, w(w_down), Real{0}, dact);
    kernels::swiglu_backward(gate, up, dact, n * f, dg, du);
    blas::gemm_tn(d, f, n, xin, dg, Real{1}, dw(w_gate));
    blas::gemm_tn(d, f, n, xin, du, Real{1}, dw(w_up));
    blas::gemm_nt(n, d, f, dg, w(w_gate), beta, dx);
    blas::gemm_nt(n, d, f, du, w(w_up), Real{1}, dx);
  }


  kernels::attention_dims dims(shape s) const { return {s.batch, s.seq, c_.heads, c_.kv_heads, c_.head_dim()}; }

  Real* residual(Real const* x, Real const* a, std::size_t count) {
    Real* h = work(w_h_, count);
    for (std::size_t i = 0; i < count; ++i) h[i] = x[i] + a[i];
    return h;
  }

  // The MoE's input rows in dispatch order (routing_ must be current).
  Real* gather(Real const* hn, std::size_t n) {
    std::size_t const d = c_.width, rows = n * c_.top_k;
    Real* xg = work(w_xg_, rows * d);
    for (std::size_t r = 0; r < rows; ++r) {
      Real const* src = hn + routing_.token[r] * d;
      std::copy(src, src + d, xg + r * d);
    }
    return xg;
  }

  void forward_all(std::span<std::int32_t const> tokens, shape s) {
    check_shape(s);
    std::size_t const n = s.tokens() * c_.width;
    carry_.resize(n);
    w_grad_carry_.resize(n);
    if (store_shape_.batch != s.batch || store_shape_.seq != s.seq) {
      store_.assign(c_.layers, {});
      store_data_.assign(c_.layers, {});
      for (std::size_t l = 0; l < c_.layers; ++l) {
        std::size_t total = 0;
        for (auto const& t : saved_tensors<Real>(c_, kind(l), s)) total += t.elements;
        store_data_[l].assign(total, Real{0});
        std::size_t at = 0;
        for (auto const& t : saved_tensors<Real>(c_, kind(l), s)) {
          store_[l][tensor_index(t.id)] = std::span<Real>(store_data_[l].data() + at, t.elements);
          at += t.elements;
        }
      }
      store_shape_ = s;
    }
    embed(tokens, s, carry_);
    for (std::size_t l = 0; l < c_.layers; ++l) layer_forward(l, s, carry_, store_[l], carry_);
  }

  config c_;
  std::size_t total_ = 0;
  std::vector<parameter_tensor> params_;
  std::size_t embedding_ = 0, final_norm_ = 0;
  std::vector<layer_offsets> layers_;
  std::vector<Real> w_, g_, adam_m_, adam_v_;
  std::size_t steps_ = 0;

  // The model's own store of saved tensors, for compute_gradients and evaluate.
  std::vector<std::vector<Real>> store_data_;
  std::vector<saved_spans> store_;
  shape store_shape_{};
  std::vector<Real> carry_, w_grad_carry_;

  // Scratch: tensors a recompute needs but was not asked for, and work buffers.
  std::array<std::vector<Real>, tensor_count> scratch_;
  std::vector<Real> w_inv_, w_xn_, w_h_, w_hn_, w_act_, w_logits_, w_gy_, w_dhn_, w_dx_, w_dyg_, w_xg_, w_dact_,
      w_dgate_, w_dup_, w_dxg_, w_dlogits_, w_do_, w_dq_, w_dk_, w_dv_, w_dxn_;
  std::vector<double> w_dweight_;
  kernels::rope_table<Real> rope_;
  kernels::routing<Real> routing_;
};

using model = basic_model<float>;

}  // namespace transformer
