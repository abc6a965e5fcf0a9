// The transformer's kernels on the GPU: see kernels.hpp. Each mirrors the CPU kernel of
// ../layers.hpp of the same name: double accumulation in index order, one thread per output row
// or element, no atomics.
#include "kernels.hpp"

#include <cmath>

namespace transformer::cuda {
namespace {

constexpr unsigned threads = 128;
unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ double dot(float const* a, float const* b, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

__device__ double sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  double const e = exp(x);
  return e / (1.0 + e);
}

__global__ void rms_inv_kernel(float const* x, std::size_t n, std::size_t d, double eps, float* inv) {
  std::size_t const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  double const ms = dot(x + t * d, x + t * d, d) / static_cast<double>(d);
  inv[t] = static_cast<float>(1.0 / sqrt(ms + eps));
}

__global__ void rms_apply_kernel(float const* x, float const* inv, float const* g, std::size_t n, std::size_t d, float* y) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * d) return;
  y[i] = x[i] * inv[i / d] * g[i % d];
}

__global__ void rms_backward_dx(float const* x, float const* inv, float const* g, float const* dy, std::size_t n,
                                std::size_t d, float* dx) {
  std::size_t const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float const* xr = x + t * d;
  float const* dyr = dy + t * d;
  double const r = inv[t];
  double gx = 0.0;
  for (std::size_t j = 0; j < d; ++j) gx += static_cast<double>(g[j]) * static_cast<double>(dyr[j]) * static_cast<double>(xr[j]);
  double const c = r * r * r * gx / static_cast<double>(d);
  for (std::size_t j = 0; j < d; ++j)
    dx[t * d + j] += static_cast<float>(r * static_cast<double>(g[j]) * static_cast<double>(dyr[j]) - static_cast<double>(xr[j]) * c);
}

// The CPU kernel adds each row's float contribution to dg[j] in row order: so does this one.
__global__ void rms_backward_dg(float const* x, float const* inv, float const* dy, std::size_t n, std::size_t d, float* dg) {
  std::size_t const j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = dg[j];
  for (std::size_t t = 0; t < n; ++t)
    acc += static_cast<float>(static_cast<double>(dy[t * d + j]) * static_cast<double>(x[t * d + j]) * static_cast<double>(inv[t]));
  dg[j] = acc;
}

__global__ void rope_kernel(float* x, std::size_t n, std::size_t seq, std::size_t heads, std::size_t hd, double theta,
                            bool inverse) {
  std::size_t const half = hd / 2;
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;  // (token, head, pair)
  if (i >= n * heads * half) return;
  std::size_t const t = i / (heads * half), h = (i / half) % heads, p = i % half;
  // As layers.hpp's rope_table: the angle in double, then cos and sin rounded to float.
  double const freq = pow(theta, -2.0 * static_cast<double>(p) / static_cast<double>(2 * half));
  double const angle = static_cast<double>(t % seq) * freq;
  float const c = static_cast<float>(cos(angle)), sn0 = static_cast<float>(sin(angle));
  float const sn = inverse ? -sn0 : sn0;
  float* v = x + (t * heads + h) * hd;
  float const a = v[p], b = v[p + half];
  v[p] = a * c - b * sn;
  v[p + half] = b * c + a * sn;
}

__global__ void attention_forward_kernel(attention_dims a, float const* q, float const* k, float const* v, float* o,
                                         float* lse) {
  std::size_t const idx = blockIdx.x * blockDim.x + threadIdx.x;  // (token, head)
  if (idx >= a.batch * a.seq * a.heads) return;
  std::size_t const t = idx / a.heads, h = idx % a.heads, b = t / a.seq, i = t % a.seq;
  std::size_t const hd = a.head_dim, qs = a.heads * hd, ks = a.kv_heads * hd, g = h / (a.heads / a.kv_heads);
  double const scale = 1.0 / sqrt(static_cast<double>(hd));
  float const* qi = q + t * qs + h * hd;
  double m = -INFINITY;
  for (std::size_t j = 0; j <= i; ++j) m = fmax(m, dot(qi, k + (b * a.seq + j) * ks + g * hd, hd) * scale);
  double l = 0.0;
  float* oi = o + t * qs + h * hd;
  // The CPU kernel accumulates acc[c] over j for every c; one pass per c here, in the same order.
  for (std::size_t j = 0; j <= i; ++j) l += exp(dot(qi, k + (b * a.seq + j) * ks + g * hd, hd) * scale - m);
  for (std::size_t c = 0; c < hd; ++c) {
    double acc = 0.0;
    for (std::size_t j = 0; j <= i; ++j) {
      double const p = exp(dot(qi, k + (b * a.seq + j) * ks + g * hd, hd) * scale - m);
      acc += p * static_cast<double>(v[(b * a.seq + j) * ks + g * hd + c]);
    }
    oi[c] = static_cast<float>(acc / l);
  }
  lse[t * a.heads + h] = static_cast<float>(m + log(l));
}

__global__ void attention_dq_kernel(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                                    float const* lse, float const* d_o, float* dq) {
  std::size_t const idx = blockIdx.x * blockDim.x + threadIdx.x;  // (token, head)
  if (idx >= a.batch * a.seq * a.heads) return;
  std::size_t const t = idx / a.heads, h = idx % a.heads, b = t / a.seq, i = t % a.seq;
  std::size_t const hd = a.head_dim, qs = a.heads * hd, ks = a.kv_heads * hd, g = h / (a.heads / a.kv_heads);
  double const scale = 1.0 / sqrt(static_cast<double>(hd));
  float const* qi = q + t * qs + h * hd;
  float const* doi = d_o + t * qs + h * hd;
  double const row = dot(doi, o + t * qs + h * hd, hd), l = lse[t * a.heads + h];
  for (std::size_t c = 0; c < hd; ++c) {
    double acc = 0.0;
    for (std::size_t j = 0; j <= i; ++j) {
      std::size_t const kv = (b * a.seq + j) * ks + g * hd;
      double const p = exp(dot(qi, k + kv, hd) * scale - l);
      double const ds = p * (dot(doi, v + kv, hd) - row) * scale;
      acc += ds * static_cast<double>(k[kv + c]);
    }
    dq[t * qs + h * hd + c] = static_cast<float>(acc);
  }
}

// dk and dv of key row (b, j) and key/value head g: the CPU kernel adds the contributions of the
// queries (b, i >= j) in order of i, then of the heads of the group: the same order here.
__global__ void attention_dkv_kernel(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                                     float const* lse, float const* d_o, float* dk, float* dv) {
  std::size_t const idx = blockIdx.x * blockDim.x + threadIdx.x;  // (key token, kv head)
  if (idx >= a.batch * a.seq * a.kv_heads) return;
  std::size_t const tk = idx / a.kv_heads, g = idx % a.kv_heads, b = tk / a.seq, j = tk % a.seq;
  std::size_t const hd = a.head_dim, qs = a.heads * hd, ks = a.kv_heads * hd, group = a.heads / a.kv_heads;
  double const scale = 1.0 / sqrt(static_cast<double>(hd));
  std::size_t const kv = tk * ks + g * hd;
  for (std::size_t c = 0; c < hd; ++c) {
    double dk_acc = 0.0, dv_acc = 0.0;
    for (std::size_t i = j; i < a.seq; ++i)
      for (std::size_t h = g * group; h < (g + 1) * group; ++h) {
        std::size_t const t = b * a.seq + i;
        float const* qi = q + t * qs + h * hd;
        float const* doi = d_o + t * qs + h * hd;
        double const row = dot(doi, o + t * qs + h * hd, hd);
        double const p = exp(dot(qi, k + kv, hd) * scale - static_cast<double>(lse[t * a.heads + h]));
        double const ds = p * (dot(doi, v + kv, hd) - row) * scale;
        dk_acc += ds * static_cast<double>(qi[c]);
        dv_acc += p * static_cast<double>(doi[c]);
      }
    dk[kv + c] = static_cast<float>(dk_acc);
    dv[kv + c] = static_cast<float>(dv_acc);
  }
}

__global__ void swiglu_kernel(float const* gate, float const* up, std::size_t n, float* act) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double const g = gate[i];
  act[i] = static_cast<float>(g * sigmoid(g) * static_cast<double>(up[i]));
}

__global__ void swiglu_backward_kernel(float const* gate, float const* up, float const* dact, std::size_t n, float* dgate,
                                       float* dup) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double const g = gate[i], sg = sigmoid(g), da = dact[i];
  dgate[i] = static_cast<float>(da * static_cast<double>(up[i]) * sg * (1.0 + g * (1.0 - sg)));
  dup[i] = static_cast<float>(da * g * sg);
}

__global__ void route_select(float const* logits, std::size_t n, std::size_t E, std::size_t K, bool renormalize, routing r) {
  std::size_t const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float const* z = logits + t * E;
  double* p = r.probs + t * E;
  double m = -INFINITY;
  for (std::size_t e = 0; e < E; ++e) m = fmax(m, static_cast<double>(z[e]));
  double sum = 0.0;
  for (std::size_t e = 0; e < E; ++e) sum += (p[e] = exp(static_cast<double>(z[e]) - m));
  for (std::size_t e = 0; e < E; ++e) p[e] /= sum;
  double selected = 0.0;
  for (std::size_t j = 0; j < K; ++j) {
    std::size_t best = E;
    for (std::size_t e = 0; e < E; ++e) {
      bool taken = false;
      for (std::size_t i = 0; i < j; ++i) taken |= r.expert[t * K + i] == e;
      if (!taken && (best == E || p[e] > p[best])) best = e;
    }
    r.expert[t * K + j] = static_cast<std::uint32_t>(best);
    selected += p[best];
  }
  for (std::size_t j = 0; j < K; ++j) {
    double const pj = p[r.expert[t * K + j]];
    r.weight[t * K + j] = static_cast<float>(renormalize ? pj / selected : pj);
  }
}

// The dispatch order (rows by expert, then token): one thread, as the CPU does it.
__global__ void route_dispatch(std::size_t n, std::size_t E, std::size_t K, routing r) {
  for (std::size_t e = 0; e <= E; ++e) r.offset[e] = 0;
  for (std::size_t i = 0; i < n * K; ++i) ++r.offset[r.expert[i] + 1];
  for (std::size_t e = 0; e < E; ++e) r.offset[e + 1] += r.offset[e];
  // Row of (t, j): its expert's offset plus the earlier (token, slot) pairs routed there.
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < K; ++j) {
      std::uint32_t const e = r.expert[t * K + j];
      std::uint32_t at = r.offset[e];
      for (std::size_t u = 0; u < t * K + j; ++u) at += r.expert[u] == e;  // rows of e before this one
      r.row[t * K + j] = at;
      r.token[at] = static_cast<std::uint32_t>(t);
    }
}

__global__ void route_backward_kernel(routing r, std::size_t n, std::size_t E, std::size_t K, bool renormalize,
                                      double const* dweight, float* dlogits) {
  std::size_t const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  double const* p = r.probs + t * E;
  std::uint32_t const* sel = r.expert + t * K;
  double const* dw = dweight + t * K;
  auto dp = [&](std::size_t e) {
    for (std::size_t j = 0; j < K; ++j)
      if (sel[j] == e) {
        if (!renormalize) return dw[j];
        double selected = 0.0, wdw = 0.0;
        for (std::size_t i = 0; i < K; ++i) selected += p[sel[i]];
        for (std::size_t i = 0; i < K; ++i) wdw += p[sel[i]] / selected * dw[i];
        return (dw[j] - wdw) / selected;
      }
    return 0.0;
  };
  double pdp = 0.0;
  for (std::size_t e = 0; e < E; ++e) pdp += p[e] * dp(e);
  for (std::size_t e = 0; e < E; ++e) dlogits[t * E + e] = static_cast<float>(p[e] * (dp(e) - pdp));
}

__global__ void gather_rows_kernel(float const* x, std::uint32_t const* index, std::size_t rows, std::size_t d, float* y) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * d) return;
  y[i] = x[static_cast<std::size_t>(index[i / d]) * d + i % d];
}

__global__ void moe_combine_kernel(float const* h, float const* weight, std::uint32_t const* row, float const* eo,
                                   std::size_t n, std::size_t K, std::size_t d, float* out) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;  // (t, c)
  if (i >= n * d) return;
  std::size_t const t = i / d, c = i % d;
  float y = h[i] + out[i];
  for (std::size_t j = 0; j < K; ++j) y += weight[t * K + j] * eo[static_cast<std::size_t>(row[t * K + j]) * d + c];
  out[i] = y;
}

__global__ void moe_combine_backward_kernel(float const* gy, float const* weight, std::uint32_t const* row,
                                            float const* eo, std::size_t n, std::size_t K, std::size_t d, float* dyg,
                                            double* dweight) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;  // (t, j)
  if (i >= n * K) return;
  std::size_t const t = i / K, r = row[i];
  float const wt = weight[i];
  for (std::size_t c = 0; c < d; ++c) dyg[r * d + c] = wt * gy[t * d + c];
  dweight[i] = dot(gy + t * d, eo + r * d, d);
}

__global__ void scatter_rows_add_kernel(float const* rows, std::uint32_t const* row, std::size_t n, std::size_t K,
                                        std::size_t d, float* dx) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;  // (t, c)
  if (i >= n * d) return;
  std::size_t const t = i / d, c = i % d;
  float acc = dx[i];
  for (std::size_t j = 0; j < K; ++j) acc += rows[static_cast<std::size_t>(row[t * K + j]) * d + c];
  dx[i] = acc;
}

__global__ void add_kernel(float const* x, float const* a, std::size_t n, float* h) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) h[i] = x[i] + a[i];
}

__global__ void embed_kernel(std::int32_t const* tokens, float const* table, std::size_t n, std::size_t d, float* out) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * d) return;
  out[i] = table[static_cast<std::size_t>(tokens[i / d]) * d + i % d];
}

__global__ void embed_backward_kernel(std::int32_t const* tokens, float const* grad, std::size_t n, std::size_t vocab,
                                      std::size_t d, float* dtable) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;  // (v, j)
  if (i >= vocab * d) return;
  std::size_t const v = i / d, j = i % d;
  float acc = dtable[i];
  for (std::size_t t = 0; t < n; ++t)
    if (static_cast<std::size_t>(tokens[t]) == v) acc += grad[t * d + j];
  dtable[i] = acc;
}

// One thread: the count of unmasked targets and the loss in token order, as the CPU does; then
// each row's gradient by its own thread (kernel below).
__global__ void cross_entropy_loss(float const* logits, std::int32_t const* targets, std::size_t n, std::size_t V,
                                   double* loss) {
  std::size_t count = 0;
  for (std::size_t t = 0; t < n; ++t) count += targets[t] >= 0;
  double total = 0.0;
  for (std::size_t t = 0; t < n; ++t) {
    if (targets[t] < 0) continue;
    float const* z = logits + t * V;
    double m = z[0];
    for (std::size_t v = 1; v < V; ++v) m = fmax(m, static_cast<double>(z[v]));
    double sum = 0.0;
    for (std::size_t v = 0; v < V; ++v) sum += exp(static_cast<double>(z[v]) - m);
    total += m + log(sum) - static_cast<double>(z[targets[t]]);
  }
  loss[0] = count ? total / static_cast<double>(count) : NAN;
  loss[1] = static_cast<double>(count);
}

__global__ void cross_entropy_grad(float* logits, std::int32_t const* targets, std::size_t n, std::size_t V,
                                   double const* loss) {
  std::size_t const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float* z = logits + t * V;
  if (targets[t] < 0) {
    for (std::size_t v = 0; v < V; ++v) z[v] = 0.0f;
    return;
  }
  double m = z[0];
  for (std::size_t v = 1; v < V; ++v) m = fmax(m, static_cast<double>(z[v]));
  double sum = 0.0;
  for (std::size_t v = 0; v < V; ++v) sum += exp(static_cast<double>(z[v]) - m);
  double const lse = m + log(sum), count = loss[1];
  std::size_t const y = static_cast<std::size_t>(targets[t]);
  for (std::size_t v = 0; v < V; ++v)
    z[v] = static_cast<float>((exp(static_cast<double>(z[v]) - lse) - (v == y ? 1.0 : 0.0)) / count);
}

__global__ void adamw_kernel(float* w, float const* g, float* m, float* v, std::uint8_t const* decay, std::size_t count,
                             double lr, double beta1, double beta2, double eps, double weight_decay, double clip, double c1,
                             double c2) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  double const gi = static_cast<double>(g[i]) * clip;
  double const mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * gi;
  double const vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * gi * gi;
  m[i] = static_cast<float>(mi);
  v[i] = static_cast<float>(vi);
  double const p = w[i];
  w[i] = static_cast<float>(p - lr * ((mi / c1) / (sqrt(vi / c2) + eps) + (decay[i] ? weight_decay : 0.0) * p));
}

__global__ void squared_norm_kernel(float const* g, std::size_t count, double* out) {
  double s = 0.0;
  for (std::size_t i = 0; i < count; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  *out = s;
}

}  // namespace

void rms_inv(float const* x, std::size_t n, std::size_t d, double eps, float* inv, cudaStream_t s) {
  rms_inv_kernel<<<blocks(n), threads, 0, s>>>(x, n, d, eps, inv);
}
void rms_apply(float const* x, float const* inv, float const* g, std::size_t n, std::size_t d, float* y, cudaStream_t s) {
  rms_apply_kernel<<<blocks(n * d), threads, 0, s>>>(x, inv, g, n, d, y);
}
void rms_backward(float const* x, float const* inv, float const* g, float const* dy, std::size_t n, std::size_t d,
                  float* dx, float* dg, cudaStream_t s) {
  rms_backward_dx<<<blocks(n), threads, 0, s>>>(x, inv, g, dy, n, d, dx);
  rms_backward_dg<<<blocks(d), threads, 0, s>>>(x, inv, dy, n, d, dg);
}
void rope_apply(float* x, std::size_t n, std::size_t seq, std::size_t heads, std::size_t hd, double theta, bool inverse,
                cudaStream_t s) {
  rope_kernel<<<blocks(n * heads * (hd / 2)), threads, 0, s>>>(x, n, seq, heads, hd, theta, inverse);
}
void attention_forward(attention_dims a, float const* q, float const* k, float const* v, float* o, float* lse, cudaStream_t s) {
  attention_forward_kernel<<<blocks(a.batch * a.seq * a.heads), threads, 0, s>>>(a, q, k, v, o, lse);
}
void attention_backward(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                        float const* lse, float const* d_o, float* dq, float* dk, float* dv, cudaStream_t s) {
  attention_dq_kernel<<<blocks(a.batch * a.seq * a.heads), threads, 0, s>>>(a, q, k, v, o, lse, d_o, dq);
  attention_dkv_kernel<<<blocks(a.batch * a.seq * a.kv_heads), threads, 0, s>>>(a, q, k, v, o, lse, d_o, dk, dv);
}
void swiglu(float const* gate, float const* up, std::size_t n, float* act, cudaStream_t s) {
  swiglu_kernel<<<blocks(n), threads, 0, s>>>(gate, up, n, act);
}
void swiglu_backward(float const* gate, float const* up, float const* dact, std::size_t n, float* dgate, float* dup,
                     cudaStream_t s) {
  swiglu_backward_kernel<<<blocks(n), threads, 0, s>>>(gate, up, dact, n, dgate, dup);
}
void route(float const* logits, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize, routing r,
           cudaStream_t s) {
  route_select<<<blocks(n), threads, 0, s>>>(logits, n, experts, top_k, renormalize, r);
  route_dispatch<<<1, 1, 0, s>>>(n, experts, top_k, r);
}
void route_backward(routing r, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize,
                    double const* dweight, float* dlogits, cudaStream_t s) {
  route_backward_kernel<<<blocks(n), threads, 0, s>>>(r, n, experts, top_k, renormalize, dweight, dlogits);
}
void gather_rows(float const* x, std::uint32_t const* index, std::size_t rows, std::size_t d, float* y, cudaStream_t s) {
  gather_rows_kernel<<<blocks(rows * d), threads, 0, s>>>(x, index, rows, d, y);
}
void moe_combine(float const* h, float const* weight, std::uint32_t const* row, float const* eo, std::size_t n,
                 std::size_t top_k, std::size_t d, float* out, cudaStream_t s) {
  moe_combine_kernel<<<blocks(n * d), threads, 0, s>>>(h, weight, row, eo, n, top_k, d, out);
}
void moe_combine_backward(float const* gy, float const* weight, std::uint32_t const* row, float const* eo, std::size_t n,
                          std::size_t top_k, std::size_t d, float* dyg, double* dweight, cudaStream_t s) {
  moe_combine_backward_kernel<<<blocks(n * top_k), threads, 0, s>>>(gy, weight, row, eo, n, top_k, d, dyg, dweight);
}
void scatter_rows_add(float const* rows, std::uint32_t const* row, std::size_t n, std::size_t top_k, std::size_t d,
                      float* dx, cudaStream_t s) {
  scatter_rows_add_kernel<<<blocks(n * d), threads, 0, s>>>(rows, row, n, top_k, d, dx);
}
void add(float const* x, float const* a, std::size_t n, float* h, cudaStream_t s) {
  add_kernel<<<blocks(n), threads, 0, s>>>(x, a, n, h);
}
void embed(std::int32_t const* tokens, float const* table, std::size_t n, std::size_t d, float* out, cudaStream_t s) {
  embed_kernel<<<blocks(n * d), threads, 0, s>>>(tokens, table, n, d, out);
}
void embed_backward(std::int32_t const* tokens, float const* grad, std::size_t n, std::size_t vocab, std::size_t d,
                    float* dtable, cudaStream_t s) {
  embed_backward_kernel<<<blocks(vocab * d), threads, 0, s>>>(tokens, grad, n, vocab, d, dtable);
}
void cross_entropy(float* logits, std::int32_t const* targets, std::size_t n, std::size_t vocab, double* loss,
                   cudaStream_t s) {
  cross_entropy_loss<<<1, 1, 0, s>>>(logits, targets, n, vocab, loss);
  cross_entropy_grad<<<blocks(n), threads, 0, s>>>(logits, targets, n, vocab, loss);
}
void adamw(float* w, float const* g, float* m, float* v, std::uint8_t const* decay, std::size_t count, double lr,
           double beta1, double beta2, double eps, double weight_decay, double clip, std::size_t step, cudaStream_t s) {
  double const c1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  double const c2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  adamw_kernel<<<blocks(count), threads, 0, s>>>(w, g, m, v, decay, count, lr, beta1, beta2, eps, weight_decay, clip, c1, c2);
}
void squared_norm(float const* g, std::size_t count, double* out, cudaStream_t s) {
  squared_norm_kernel<<<1, 1, 0, s>>>(g, count, out);
}

}  // namespace transformer::cuda
