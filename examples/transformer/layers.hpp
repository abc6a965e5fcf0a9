#pragma once
// The pieces of a small decoder-only transformer: its configuration, the tensors each decoder
// layer saves for backward (named as MaxText's remat policies name them), and the kernels that
// are not matrix products (RMSNorm, rotary embeddings, causal grouped-query attention, SwiGLU,
// top-k routing), each with its backward.
//
// Every reduction runs in a fixed order and accumulates in double, so a kernel gives bitwise the
// same result for the same inputs, whatever buffer it writes to, and loses little to rounding.

#include "blas.hpp"

#include <algorithm>
#include <array>
#include <bitset>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace transformer {

//! The model's dimensions. Layers [0, dense_layers) are dense, the others mixture-of-experts.
struct config {
  std::size_t vocab = 32;
  std::size_t width = 32;         //!< d, the residual stream's width
  std::size_t heads = 4;          //!< H query heads, each of width d / H
  std::size_t kv_heads = 2;       //!< K key/value heads, each shared by H / K query heads
  std::size_t layers = 2;
  std::size_t dense_layers = 1;
  std::size_t mlp_hidden = 64;    //!< the dense SwiGLU's hidden width
  std::size_t experts = 4;        //!< E routed experts per MoE layer
  std::size_t top_k = 2;          //!< experts each token is routed to
  std::size_t expert_hidden = 16; //!< h_e, each routed expert's hidden width
  std::size_t shared_hidden = 16; //!< the always-on shared expert's hidden width
  bool renormalize_top_k = true;  //!< the top-k weights sum to one (DeepSeek's norm_topk_prob)
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;

  std::size_t head_dim() const { return width / heads; }
  std::size_t moe_layers() const { return layers - dense_layers; }
};

namespace detail {
[[noreturn]] inline void config_error(std::string const& what) {
  throw std::invalid_argument("transformer::config: " + what);
}
inline std::string num(std::size_t v) { return std::to_string(v); }
}  // namespace detail

//! Throws std::invalid_argument, naming the first dimension that does not fit.
inline void validate(config const& c) {
  using detail::config_error;
  using detail::num;
  auto positive = [](std::size_t v, char const* name) {
    if (v == 0) config_error(std::string(name) + " must be positive");
  };
  positive(c.vocab, "vocab");
  positive(c.width, "width");
  positive(c.heads, "heads");
  positive(c.kv_heads, "kv_heads");
  positive(c.layers, "layers");
  if (c.width % c.heads != 0) config_error("heads (" + num(c.heads) + ") must divide width (" + num(c.width) + ")");
  if (c.heads % c.kv_heads != 0)
    config_error("kv_heads (" + num(c.kv_heads) + ") must divide heads (" + num(c.heads) + ")");
  if (c.head_dim() % 2 != 0)
    config_error("the head width (" + num(c.head_dim()) + ") must be even: rotary embeddings rotate pairs");
  if (c.dense_layers > c.layers)
    config_error("dense_layers (" + num(c.dense_layers) + ") exceeds layers (" + num(c.layers) + ")");
  if (c.dense_layers > 0) positive(c.mlp_hidden, "mlp_hidden");
  if (c.moe_layers() > 0) {
    positive(c.experts, "experts");
    positive(c.top_k, "top_k");
    positive(c.expert_hidden, "expert_hidden");
    positive(c.shared_hidden, "shared_hidden");
    if (c.top_k > c.experts)
      config_error("top_k (" + num(c.top_k) + ") exceeds experts (" + num(c.experts) + ")");
  }
  if (!(c.rope_theta > 0.0)) config_error("rope_theta must be positive");
  if (!(c.norm_eps > 0.0)) config_error("norm_eps must be positive");
}

//! One batch's extent: `batch` sequences of `seq` tokens, token t = b * seq + s.
struct shape {
  std::size_t batch = 0;
  std::size_t seq = 0;
  std::size_t tokens() const { return batch * seq; }
};

//! Throws std::invalid_argument for an empty batch, std::length_error for one too large.
inline void validate(shape s) {
  if (s.batch == 0 || s.seq == 0) throw std::invalid_argument("transformer::shape: batch and seq must be positive");
  if (s.seq > std::numeric_limits<std::size_t>::max() / s.batch)
    throw std::length_error("transformer::shape: batch * seq overflows");
}

enum class layer_kind : std::uint8_t { dense, moe };

//! The tensors a decoder layer saves for backward. Each is read by backward; ids are in forward
//! order (a tensor depends only on lower ids). Row-major, one row per token unless noted.
enum class tensor : std::uint8_t {
  decoder_layer_input,     //!< [T, d] the residual stream entering the layer
  attention_norm_inv_rms,  //!< [T] 1 / rms of the layer input
  query_proj,              //!< [T, H * hd] queries, after the rotary embedding
  key_proj,                //!< [T, K * hd] keys, after the rotary embedding
  value_proj,              //!< [T, K * hd]
  attention_out,           //!< [T, H * hd] attention's result, before the output projection
  attention_lse,           //!< [T, H] log-sum-exp of each query's scores (backward rebuilds the probabilities)
  out_proj,                //!< [T, d] the output projection (backward rebuilds the residual from it)
  mlp_norm_inv_rms,        //!< [T] 1 / rms of the residual after attention
  mlpwi_0,                 //!< [T, f] dense: gate pre-activation
  mlpwi_1,                 //!< [T, f] dense: up projection
  router_logits,           //!< [T, E] MoE: backward rebuilds the routing from them
  moe_mlpwi_0,             //!< [T * k, h_e] MoE: gate pre-activation of every (token, expert) slot
  moe_mlpwi_1,             //!< [T * k, h_e] MoE: up projection of every slot
  moe_mlpwo,               //!< [T * k, d] MoE: each slot's expert output (the router's gradient needs it)
  shared_mlpwi_0,          //!< [T, h_s] MoE: the shared expert's gate pre-activation
  shared_mlpwi_1,          //!< [T, h_s] MoE: the shared expert's up projection
};
inline constexpr std::size_t tensor_count = 17;
using tensor_set = std::bitset<tensor_count>;

//! The tensor's position in a layer's saved spans.
constexpr std::size_t tensor_index(tensor t) { return static_cast<std::size_t>(t); }

//! The tensor's name, as a stack declares it.
constexpr std::string_view name(tensor t) {
  constexpr std::array<std::string_view, tensor_count> names{
      "decoder_layer_input", "attention_norm_inv_rms", "query_proj",  "key_proj",    "value_proj",
      "attention_out",       "attention_lse",          "out_proj",    "mlp_norm_inv_rms", "mlpwi_0",
      "mlpwi_1",             "router_logits",          "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo",
      "shared_mlpwi_0",      "shared_mlpwi_1"};
  return names[tensor_index(t)];
}

//! The tensors a layer of this kind saves, in id order. (The dense down projection's output,
//! MaxText's `mlpwo`, and the shared expert's are not among them: backward never reads them,
//! since the down projection's gradients need only its input and the layer output's gradient.)
inline std::vector<tensor> layer_tensors(layer_kind kind) {
  using enum tensor;
  std::vector<tensor> common{decoder_layer_input, attention_norm_inv_rms, query_proj, key_proj, value_proj,
                             attention_out,       attention_lse,          out_proj,   mlp_norm_inv_rms};
  if (kind == layer_kind::dense) {
    common.insert(common.end(), {mlpwi_0, mlpwi_1});
  } else {
    common.insert(common.end(), {router_logits, moe_mlpwi_0, moe_mlpwi_1, moe_mlpwo, shared_mlpwi_0, shared_mlpwi_1});
  }
  return common;
}

//! layer_tensors(kind) as a set.
inline tensor_set layer_tensor_set(layer_kind kind) {
  tensor_set s;
  for (tensor t : layer_tensors(kind)) s.set(tensor_index(t));
  return s;
}

//! The set of tensors up to and including t (ids are in forward order).
inline tensor_set tensors_through(tensor t) {
  tensor_set s;
  for (std::size_t i = 0; i <= tensor_index(t); ++i) s.set(i);
  return s;
}

//! What a layer's forward computes to produce `want` (and, with `output`, the layer's output):
//! each tensor is computed from saved tensors of lower ids, and a tensor in `available` that is
//! not wanted is read from its saved span, so neither it nor what only it needs is computed.
//! Shared by the CPU model and its CUDA twin, so both recompute exactly the same subset.
inline tensor_set forward_needs(layer_kind kind, tensor_set want, bool output, tensor_set available = {}) {
  using enum tensor;
  auto set = [](std::initializer_list<tensor> ts) {
    tensor_set s;
    for (tensor t : ts) s.set(tensor_index(t));
    return s;
  };
  tensor_set const normed = set({decoder_layer_input, out_proj, mlp_norm_inv_rms});  // the MLP's input
  std::array<tensor_set, tensor_count> deps{};
  auto depends = [&](std::initializer_list<tensor> ts, tensor_set on) {
    for (tensor t : ts) deps[tensor_index(t)] = on;
  };
  depends({attention_norm_inv_rms}, set({decoder_layer_input}));
  depends({query_proj, key_proj, value_proj}, set({decoder_layer_input, attention_norm_inv_rms}));
  depends({attention_out, attention_lse}, set({query_proj, key_proj, value_proj}));
  depends({out_proj}, set({attention_out}));
  depends({mlp_norm_inv_rms}, set({decoder_layer_input, out_proj}));
  depends({mlpwi_0, mlpwi_1, router_logits, shared_mlpwi_0, shared_mlpwi_1}, normed);
  depends({moe_mlpwi_0, moe_mlpwi_1}, normed | set({router_logits}));
  depends({moe_mlpwo}, set({router_logits, moe_mlpwi_0, moe_mlpwi_1}));
  tensor_set need = want;
  if (output)
    need |= normed | (kind == layer_kind::dense ? set({mlpwi_0, mlpwi_1})
                                                : set({router_logits, moe_mlpwo, shared_mlpwi_0, shared_mlpwi_1}));
  tensor_set const provided = available & ~want;  // read from the saved spans, not computed
  for (std::size_t i = tensor_count; i-- > 0;)
    if (need.test(i) && !provided.test(i)) need |= deps[i];
  return need & ~provided;
}

//! FNV-1a over bytes: the gradient checksum that must agree bitwise across policies.
inline std::uint64_t fnv1a(std::span<std::byte const> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto b : bytes) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
  return h;
}

namespace detail {
inline std::size_t checked_mul(std::size_t a, std::size_t b) {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a)
    throw std::length_error("transformer: a tensor's size overflows");
  return a * b;
}
}  // namespace detail

//! A saved tensor's element count for this configuration and batch shape.
inline std::size_t tensor_elements(config const& c, tensor t, shape s) {
  using detail::checked_mul;
  std::size_t const n = s.tokens();
  switch (t) {
    case tensor::decoder_layer_input:
    case tensor::query_proj:
    case tensor::attention_out:
    case tensor::out_proj: return checked_mul(n, c.width);
    case tensor::attention_norm_inv_rms:
    case tensor::mlp_norm_inv_rms: return n;
    case tensor::key_proj:
    case tensor::value_proj: return checked_mul(n, c.kv_heads * c.head_dim());
    case tensor::attention_lse: return checked_mul(n, c.heads);
    case tensor::mlpwi_0:
    case tensor::mlpwi_1: return checked_mul(n, c.mlp_hidden);
    case tensor::router_logits: return checked_mul(n, c.experts);
    case tensor::moe_mlpwi_0:
    case tensor::moe_mlpwi_1: return checked_mul(checked_mul(n, c.top_k), c.expert_hidden);
    case tensor::moe_mlpwo: return checked_mul(checked_mul(n, c.top_k), c.width);
    case tensor::shared_mlpwi_0:
    case tensor::shared_mlpwi_1: return checked_mul(n, c.shared_hidden);
  }
  return 0;
}

//! A saved tensor as a stack declares it: its name and its size.
struct tensor_spec {
  tensor id;
  std::string_view name;
  std::size_t elements;
  std::size_t bytes;
};

//! The tensors a layer of this kind saves, with their sizes for batch shape `s` (elements of
//! `Real`: float for the model, double for the gradient check).
template <class Real = float>
std::vector<tensor_spec> saved_tensors(config const& c, layer_kind kind, shape s) {
  validate(c);
  validate(s);
  std::vector<tensor_spec> out;
  for (tensor t : layer_tensors(kind)) {
    std::size_t const n = tensor_elements(c, t, s);
    out.push_back({t, name(t), n, detail::checked_mul(n, sizeof(Real))});
  }
  return out;
}

namespace kernels {

//! sum_i a[i] b[i], in index order, in double.
template <class Real>
double dot(Real const* a, Real const* b, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// ---- RMSNorm: y = x * inv_rms(x) * g --------------------------------------------------------

//! inv[t] = 1 / sqrt(mean(x[t]^2) + eps) for each of the n rows of width d.
template <class Real>
void rms_inv(Real const* x, std::size_t n, std::size_t d, double eps, Real* inv) {
  for (std::size_t t = 0; t < n; ++t) {
    double const ms = dot(x + t * d, x + t * d, d) / static_cast<double>(d);
    inv[t] = static_cast<Real>(1.0 / std::sqrt(ms + eps));
  }
}

//! y = x * inv * g, with the rounded inv that is saved, so backward rebuilds y bitwise.
template <class Real>
void rms_apply(Real const* x, Real const* inv, Real const* g, std::size_t n, std::size_t d, Real* y) {
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < d; ++j) y[t * d + j] = x[t * d + j] * inv[t] * g[j];
}

//! dx += d(x * inv * g)/dx^T dy and dg += sum_t dy * x * inv.
template <class Real>
void rms_backward(Real const* x, Real const* inv, Real const* g, Real const* dy, std::size_t n, std::size_t d,
                  Real* dx, Real* dg) {
  for (std::size_t t = 0; t < n; ++t) {
    Real const* xr = x + t * d;
    Real const* dyr = dy + t * d;
    double const r = inv[t];
    double gx = 0.0;  // sum_j g_j dy_j x_j
    for (std::size_t j = 0; j < d; ++j)
      gx += static_cast<double>(g[j]) * static_cast<double>(dyr[j]) * static_cast<double>(xr[j]);
    double const c = r * r * r * gx / static_cast<double>(d);
    for (std::size_t j = 0; j < d; ++j) {
      dx[t * d + j] += static_cast<Real>(r * static_cast<double>(g[j]) * static_cast<double>(dyr[j]) -
                                         static_cast<double>(xr[j]) * c);
      dg[j] += static_cast<Real>(static_cast<double>(dyr[j]) * static_cast<double>(xr[j]) * r);
    }
  }
}

// ---- rotary position embeddings ------------------------------------------------------------

//! cos and sin of position s times frequency theta^(-2i/hd), i < hd / 2 ("rotate half" pairs).
template <class Real>
struct rope_table {
  std::size_t seq = 0, half = 0;
  double theta = 0.0;
  std::vector<Real> cos, sin;

  void build(std::size_t seq_len, std::size_t head_dim, double rope_theta) {
    if (seq == seq_len && half == head_dim / 2 && theta == rope_theta) return;
    seq = seq_len;
    half = head_dim / 2;
    theta = rope_theta;
    cos.resize(seq * half);
    sin.resize(seq * half);
    for (std::size_t s = 0; s < seq; ++s)
      for (std::size_t i = 0; i < half; ++i) {
        double const freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
        double const angle = static_cast<double>(s) * freq;
        cos[s * half + i] = static_cast<Real>(std::cos(angle));
        sin[s * half + i] = static_cast<Real>(std::sin(angle));
      }
  }
};

//! Rotates each head of x [n tokens, heads * hd] in place by its token's position (token t is at
//! position t % seq); `inverse` rotates back, which is the rotation's backward.
template <class Real>
void rope_apply(rope_table<Real> const& r, Real* x, std::size_t n, std::size_t heads, bool inverse) {
  std::size_t const half = r.half, hd = 2 * half;
  for (std::size_t t = 0; t < n; ++t) {
    Real const* c = r.cos.data() + (t % r.seq) * half;
    Real const* s = r.sin.data() + (t % r.seq) * half;
    for (std::size_t h = 0; h < heads; ++h) {
      Real* v = x + (t * heads + h) * hd;
      for (std::size_t i = 0; i < half; ++i) {
        Real const a = v[i], b = v[i + half];
        Real const sn = inverse ? -s[i] : s[i];
        v[i] = a * c[i] - b * sn;
        v[i + half] = b * c[i] + a * sn;
      }
    }
  }
}

// ---- causal grouped-query attention --------------------------------------------------------

struct attention_dims {
  std::size_t batch, seq, heads, kv_heads, head_dim;
};

//! o = softmax(q k^T / sqrt(hd), causal) v per head; query head h reads key/value head
//! h / (H / K). Saves each query's log-sum-exp so that backward can rebuild the probabilities
//! without storing them (as FlashAttention does).
template <class Real>
void attention_forward(attention_dims const& a, Real const* q, Real const* k, Real const* v, Real* o, Real* lse) {
  std::size_t const hd = a.head_dim, qs = a.heads * hd, ks = a.kv_heads * hd, group = a.heads / a.kv_heads;
  double const scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(a.seq), acc(hd);
  for (std::size_t b = 0; b < a.batch; ++b)
    for (std::size_t i = 0; i < a.seq; ++i)
      for (std::size_t h = 0; h < a.heads; ++h) {
        std::size_t const t = b * a.seq + i, g = h / group;
        Real const* qi = q + t * qs + h * hd;
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j <= i; ++j) {
          s[j] = dot(qi, k + (b * a.seq + j) * ks + g * hd, hd) * scale;
          m = std::max(m, s[j]);
        }
        double l = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::size_t j = 0; j <= i; ++j) {
          double const p = std::exp(s[j] - m);
          l += p;
          Real const* vj = v + (b * a.seq + j) * ks + g * hd;
          for (std::size_t c = 0; c < hd; ++c) acc[c] += p * static_cast<double>(vj[c]);
        }
        for (std::size_t c = 0; c < hd; ++c) o[t * qs + h * hd + c] = static_cast<Real>(acc[c] / l);
        lse[t * a.heads + h] = static_cast<Real>(m + std::log(l));
      }
}

//! Gradients of q, k, v from do, with p = exp(score - lse) rebuilt and
//! dscore = p (dp - rowsum(do * o)) (FlashAttention's backward). Writes dq, dk, dv.
template <class Real>
void attention_backward(attention_dims const& a, Real const* q, Real const* k, Real const* v, Real const* o,
                        Real const* lse, Real const* d_o, Real* dq, Real* dk, Real* dv) {
  std::size_t const hd = a.head_dim, qs = a.heads * hd, ks = a.kv_heads * hd, group = a.heads / a.kv_heads;
  std::size_t const n = a.batch * a.seq;
  double const scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> dk_acc(n * ks, 0.0), dv_acc(n * ks, 0.0), dq_acc(hd);
  for (std::size_t b = 0; b < a.batch; ++b)
    for (std::size_t i = 0; i < a.seq; ++i)
      for (std::size_t h = 0; h < a.heads; ++h) {
        std::size_t const t = b * a.seq + i, g = h / group;
        Real const* qi = q + t * qs + h * hd;
        Real const* doi = d_o + t * qs + h * hd;
        double const row = dot(doi, o + t * qs + h * hd, hd);
        double const l = lse[t * a.heads + h];
        std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
        for (std::size_t j = 0; j <= i; ++j) {
          std::size_t const kv = (b * a.seq + j) * ks + g * hd;
          double const p = std::exp(dot(qi, k + kv, hd) * scale - l);
          double const ds = p * (dot(doi, v + kv, hd) - row) * scale;
          for (std::size_t c = 0; c < hd; ++c) {
            dq_acc[c] += ds * static_cast<double>(k[kv + c]);
            dk_acc[kv + c] += ds * static_cast<double>(qi[c]);
            dv_acc[kv + c] += p * static_cast<double>(doi[c]);
          }
        }
        for (std::size_t c = 0; c < hd; ++c) dq[t * qs + h * hd + c] = static_cast<Real>(dq_acc[c]);
      }
  for (std::size_t i = 0; i < n * ks; ++i) {
    dk[i] = static_cast<Real>(dk_acc[i]);
    dv[i] = static_cast<Real>(dv_acc[i]);
  }
}

// ---- SwiGLU: act = silu(gate) * up ---------------------------------------------------------

//! 1 / (1 + exp(-x)), without overflow for either sign.
inline double sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + std::exp(-x));
  double const e = std::exp(x);
  return e / (1.0 + e);
}

//! act = silu(gate) * up, elementwise.
template <class Real>
void swiglu(Real const* gate, Real const* up, std::size_t n, Real* act) {
  for (std::size_t i = 0; i < n; ++i) {
    double const g = gate[i];
    act[i] = static_cast<Real>(g * sigmoid(g) * static_cast<double>(up[i]));
  }
}

//! dgate = dact * up * silu'(gate), dup = dact * silu(gate).
template <class Real>
void swiglu_backward(Real const* gate, Real const* up, Real const* dact, std::size_t n, Real* dgate, Real* dup) {
  for (std::size_t i = 0; i < n; ++i) {
    double const g = gate[i], sg = sigmoid(g), da = dact[i];
    dgate[i] = static_cast<Real>(da * static_cast<double>(up[i]) * sg * (1.0 + g * (1.0 - sg)));
    dup[i] = static_cast<Real>(da * g * sg);
  }
}

// ---- top-k routing -------------------------------------------------------------------------

//! Where each token goes: softmax over the router logits, the top-k experts (ties to the lower
//! index), their weights (renormalized to sum to one, or the plain probabilities), and the
//! dispatch order: rows sorted by expert, then by token, so expert e's rows are contiguous.
template <class Real>
struct routing {
  std::size_t tokens = 0, experts = 0, top_k = 0;
  std::vector<double> probs;          //!< [T, E]
  std::vector<std::uint32_t> expert;  //!< [T, k] in descending probability
  std::vector<Real> weight;           //!< [T, k]
  std::vector<std::size_t> row;       //!< [T, k] the dispatched row of (token, j)
  std::vector<std::size_t> token;     //!< [T * k] the token of each dispatched row
  std::vector<std::size_t> offset;    //!< [E + 1] expert e has rows [offset[e], offset[e + 1])
};

//! Routes n tokens from their router logits [n, E] (see `routing`).
template <class Real>
void route(Real const* logits, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize,
           routing<Real>& r) {
  r.tokens = n;
  r.experts = experts;
  r.top_k = top_k;
  r.probs.resize(n * experts);
  r.expert.resize(n * top_k);
  r.weight.resize(n * top_k);
  r.row.resize(n * top_k);
  r.token.resize(n * top_k);
  r.offset.assign(experts + 1, 0);
  std::vector<char> taken(experts);
  for (std::size_t t = 0; t < n; ++t) {
    Real const* z = logits + t * experts;
    double* p = r.probs.data() + t * experts;
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t e = 0; e < experts; ++e) m = std::max(m, static_cast<double>(z[e]));
    double sum = 0.0;
    for (std::size_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(static_cast<double>(z[e]) - m));
    for (std::size_t e = 0; e < experts; ++e) p[e] /= sum;
    std::fill(taken.begin(), taken.end(), char{0});
    double selected = 0.0;
    for (std::size_t j = 0; j < top_k; ++j) {
      std::size_t best = experts;
      for (std::size_t e = 0; e < experts; ++e)
        if (!taken[e] && (best == experts || p[e] > p[best])) best = e;
      taken[best] = 1;
      r.expert[t * top_k + j] = static_cast<std::uint32_t>(best);
      selected += p[best];
      ++r.offset[best + 1];
    }
    for (std::size_t j = 0; j < top_k; ++j) {
      double const pj = p[r.expert[t * top_k + j]];
      r.weight[t * top_k + j] = static_cast<Real>(renormalize ? pj / selected : pj);
    }
  }
  for (std::size_t e = 0; e < experts; ++e) r.offset[e + 1] += r.offset[e];
  std::vector<std::size_t> fill(r.offset.begin(), r.offset.end() - 1);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < top_k; ++j) {
      std::size_t const at = fill[r.expert[t * top_k + j]]++;
      r.row[t * top_k + j] = at;
      r.token[at] = t;
    }
}

//! The router logits' gradient [T, E] from the gradient of each combine weight [T, k]: through
//! the renormalization, then the softmax.
template <class Real>
void route_backward(routing<Real> const& r, bool renormalize, double const* dweight, Real* dlogits) {
  std::size_t const E = r.experts, k = r.top_k;
  std::vector<double> dp(E);
  for (std::size_t t = 0; t < r.tokens; ++t) {
    double const* p = r.probs.data() + t * E;
    std::uint32_t const* sel = r.expert.data() + t * k;
    double const* dw = dweight + t * k;
    std::fill(dp.begin(), dp.end(), 0.0);
    if (renormalize) {
      double selected = 0.0, wdw = 0.0;
      for (std::size_t j = 0; j < k; ++j) selected += p[sel[j]];
      for (std::size_t j = 0; j < k; ++j) wdw += p[sel[j]] / selected * dw[j];
      for (std::size_t j = 0; j < k; ++j) dp[sel[j]] = (dw[j] - wdw) / selected;
    } else {
      for (std::size_t j = 0; j < k; ++j) dp[sel[j]] = dw[j];
    }
    double pdp = 0.0;
    for (std::size_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
    for (std::size_t e = 0; e < E; ++e) dlogits[t * E + e] = static_cast<Real>(p[e] * (dp[e] - pdp));
  }
}

}  // namespace kernels
}  // namespace transformer
