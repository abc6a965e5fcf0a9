#pragma once
// A small GPT-2-style model and its kernels, written as a hand-written C trainer writes them:
// the parameters in one struct of flat arrays, plain loops over float pointers, one function per
// block forward and backward. Both trainers use this file unchanged: the original
// (original.hpp), which keeps every layer's activations in one struct, and its tide port
// (ported.cpp), where tide owns them.
//
// The block: y = x + W2 gelu(W1 layernorm(x) + b1) + b2 (the residual stream, 4x MLP), then a
// linear head with softmax cross-entropy over `classes`.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace porting {

struct config {
  int layers = 6;
  int batch = 8;       //!< rows (tokens) per step
  int channels = 32;   //!< C; the MLP is 4C wide
  int classes = 16;    //!< the head's outputs
  int steps = 3;
  float learning_rate = 0.05f;
};

//! Every parameter (or every gradient), per layer strided, as one struct of flat arrays.
struct parameters {
  std::vector<float> ln_w, ln_b, w1, b1, w2, b2;  // L*C, L*C, L*C*4C, L*4C, L*4C*C, L*C
  std::vector<float> wh, bh;                      // C*V, V
  explicit parameters(config const& c, bool zero = false) {
    std::size_t const L = c.layers, C = c.channels, H = 4 * C, V = c.classes;
    ln_w.assign(L * C, 1.0f), ln_b.assign(L * C, 0.0f), w1.assign(L * C * H, 0.0f), b1.assign(L * H, 0.0f);
    w2.assign(L * H * C, 0.0f), b2.assign(L * C, 0.0f), wh.assign(C * V, 0.0f), bh.assign(V, 0.0f);
    if (zero) {
      for (auto* v : all()) std::fill(v->begin(), v->end(), 0.0f);
      return;
    }
    std::uint64_t s = 42;
    auto uniform = [&] {  // SplitMix64: the same weights on every run
      std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return static_cast<float>((z ^ (z >> 31)) >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    };
    for (auto* v : {&w1, &w2, &wh})
      for (auto& x : *v) x = 0.2f * uniform();
  }
  std::vector<std::vector<float>*> all() { return {&ln_w, &ln_b, &w1, &b1, &w2, &b2, &wh, &bh}; }
};

//! One layer's saved activations, as pointers: into the original's big arrays, or into tide's slots.
template <class T>
struct block_acts_of {
  T* ln;       // B*C, layernorm output
  T* ln_mean;  // B
  T* ln_rstd;  // B
  T* fc;       // B*4C, before gelu
  T* fc_gelu;  // B*4C
};
using block_acts = block_acts_of<float>;
using block_saved = block_acts_of<float const>;

// ---- kernels ----------------------------------------------------------------------------------

inline void layernorm_forward(float* out, float* mean, float* rstd, float const* inp, float const* w, float const* b, int B, int C) {
  for (int i = 0; i < B; ++i) {
    float const* x = inp + i * C;
    float m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    float const s = 1.0f / std::sqrt(v / static_cast<float>(C) + 1e-5f);
    for (int c = 0; c < C; ++c) out[i * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[i] = m, rstd[i] = s;
  }
}

inline void layernorm_backward(float* dinp, float* dw, float* db, float const* dout, float const* inp, float const* w,
                               float const* mean, float const* rstd, int B, int C) {
  for (int i = 0; i < B; ++i) {
    float const* x = inp + i * C;
    float const* d = dout + i * C;
    float dmean = 0, dnorm_mean = 0;
    for (int c = 0; c < C; ++c) {
      float const norm = (x[c] - mean[i]) * rstd[i], dn = w[c] * d[c];
      dmean += dn, dnorm_mean += dn * norm;
    }
    dmean /= static_cast<float>(C), dnorm_mean /= static_cast<float>(C);
    for (int c = 0; c < C; ++c) {
      float const norm = (x[c] - mean[i]) * rstd[i], dn = w[c] * d[c];
      db[c] += d[c], dw[c] += norm * d[c];
      dinp[i * C + c] += (dn - dmean - norm * dnorm_mean) * rstd[i];
    }
  }
}

// out[B, OC] = inp[B, C] w[C, OC] + bias
inline void matmul_forward(float* out, float const* inp, float const* w, float const* bias, int B, int C, int OC) {
  for (int i = 0; i < B; ++i)
    for (int o = 0; o < OC; ++o) {
      float s = bias[o];
      for (int c = 0; c < C; ++c) s += inp[i * C + c] * w[c * OC + o];
      out[i * OC + o] = s;
    }
}

// dinp += dout w^T, dw += inp^T dout, dbias += sum of dout's rows
inline void matmul_backward(float* dinp, float* dw, float* dbias, float const* dout, float const* inp, float const* w, int B, int C, int OC) {
  for (int i = 0; i < B; ++i)
    for (int c = 0; c < C; ++c) {
      float s = 0;
      for (int o = 0; o < OC; ++o) s += dout[i * OC + o] * w[c * OC + o], dw[c * OC + o] += inp[i * C + c] * dout[i * OC + o];
      dinp[i * C + c] += s;
    }
  for (int i = 0; i < B; ++i)
    for (int o = 0; o < OC; ++o) dbias[o] += dout[i * OC + o];
}

inline float gelu(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
inline void gelu_forward(float* out, float const* inp, int N) {
  for (int i = 0; i < N; ++i) out[i] = gelu(inp[i]);
}
inline void gelu_backward(float* dinp, float const* inp, float const* dout, int N) {
  for (int i = 0; i < N; ++i) {
    float const x = inp[i], u = 0.7978845608f * (x + 0.044715f * x * x * x), t = std::tanh(u);
    float const du = 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
}

inline void residual_forward(float* out, float const* a, float const* b, int N) {
  for (int i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

// ---- one block, forward and backward ----------------------------------------------------------

//! Layer `l`: reads its input `x` (B*C), writes its activations `a` and its output `y` (B*C).
inline void block_forward(config const& c, parameters const& p, int l, float const* x, block_acts a, float* y) {
  int const B = c.batch, C = c.channels, H = 4 * C;
  layernorm_forward(a.ln, a.ln_mean, a.ln_rstd, x, &p.ln_w[l * C], &p.ln_b[l * C], B, C);
  matmul_forward(a.fc, a.ln, &p.w1[l * C * H], &p.b1[l * H], B, C, H);
  gelu_forward(a.fc_gelu, a.fc, B * H);
  matmul_forward(y, a.fc_gelu, &p.w2[l * H * C], &p.b2[l * C], B, H, C);
  residual_forward(y, x, y, B * C);
}

//! Work buffers of the backward (gradients of one block's activations), reused by every layer.
struct backward_scratch {
  std::vector<float> dfc_gelu, dfc, dln;
  explicit backward_scratch(config const& c)
      : dfc_gelu(std::size_t(c.batch) * 4 * c.channels), dfc(dfc_gelu.size()), dln(std::size_t(c.batch) * c.channels) {}
};

//! Layer `l`'s backward: `dy` holds the gradient of its output and becomes that of its input `x`.
inline void block_backward(config const& c, parameters const& p, parameters& g, int l, float const* x, block_saved a, float* dy,
                           backward_scratch& s) {
  int const B = c.batch, C = c.channels, H = 4 * C;
  std::fill(s.dfc_gelu.begin(), s.dfc_gelu.end(), 0.0f);
  std::fill(s.dln.begin(), s.dln.end(), 0.0f);
  matmul_backward(s.dfc_gelu.data(), &g.w2[l * H * C], &g.b2[l * C], dy, a.fc_gelu, &p.w2[l * H * C], B, H, C);
  gelu_backward(s.dfc.data(), a.fc, s.dfc_gelu.data(), B * H);
  matmul_backward(s.dln.data(), &g.w1[l * C * H], &g.b1[l * H], s.dfc.data(), a.ln, &p.w1[l * C * H], B, C, H);
  layernorm_backward(dy, &g.ln_w[l * C], &g.ln_b[l * C], s.dln.data(), x, &p.ln_w[l * C], a.ln_mean, a.ln_rstd, B, C);
}

//! The head: logits = x wh + bh, softmax cross-entropy against `targets`; returns the mean loss,
//! accumulates the head's gradients and writes the gradient of `x` into `dx` (the seed).
[[nodiscard]] inline float head_loss(config const& c, parameters const& p, parameters& g, float const* x, int const* targets, float* dx) {
  int const B = c.batch, C = c.channels, V = c.classes;
  std::vector<float> logits(std::size_t(B) * V);
  matmul_forward(logits.data(), x, p.wh.data(), p.bh.data(), B, C, V);
  float loss = 0;
  for (int i = 0; i < B; ++i) {  // logits become dlogits: softmax minus one-hot, over B
    float* z = &logits[std::size_t(i) * V];
    float mx = z[0], sum = 0;
    for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    for (int v = 0; v < V; ++v) sum += (z[v] = std::exp(z[v] - mx));
    loss -= std::log(z[targets[i]] / sum) / static_cast<float>(B);
    for (int v = 0; v < V; ++v) z[v] = (z[v] / sum - (v == targets[i] ? 1.0f : 0.0f)) / static_cast<float>(B);
  }
  std::fill(dx, dx + std::size_t(B) * C, 0.0f);
  matmul_backward(dx, g.wh.data(), g.bh.data(), logits.data(), x, p.wh.data(), B, C, V);
  return loss;
}

//! One step's data: the inputs (B*C) and a class per row, the same on every run.
struct batch {
  std::vector<float> x;
  std::vector<int> targets;
  batch(config const& c, int step) : x(std::size_t(c.batch) * c.channels), targets(c.batch) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(step));
    for (int i = 0; i < c.batch; ++i) targets[i] = (i * 7 + step) % c.classes;
  }
};

//! FNV-1a of every gradient's bits, then SGD, then the gradients cleared: what each step reports.
inline std::uint64_t checksum_and_update(config const& c, parameters& p, parameters& g) {
  std::uint64_t h = 1469598103934665603ull;
  auto ps = p.all(), gs = g.all();
  for (std::size_t k = 0; k < ps.size(); ++k)
    for (std::size_t i = 0; i < gs[k]->size(); ++i) {
      std::uint32_t u;
      std::memcpy(&u, &(*gs[k])[i], 4);
      h = (h ^ u) * 1099511628211ull;
      (*ps[k])[i] -= c.learning_rate * (*gs[k])[i];
      (*gs[k])[i] = 0;
    }
  return h;
}

}  // namespace porting
