// The transformer's kernels on the GPU: see kernels.hpp. Each mirrors the CPU kernel of
// ../layers.hpp of the same name: double accumulation in index order, one thread per output row
// or element, no atomics.
#include "kernels.hpp"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

namespace transformer::cuda {
namespace {

constexpr unsigned threads = 128;
//! Blocks for n items with a grid-stride loop: at least one (a zero-sized grid is a launch error),
//! at most 65,535 (the kernels stride over the rest).
unsigned blocks(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>((n + threads - 1) / threads, 1, 65535));
}
//! A launch fails only through the runtime's last error: checked after every one.
void check_launch(char const* kernel) {
  if (auto const e = cudaGetLastError(); e != cudaSuccess)
    throw std::runtime_error(std::string("transformer::cuda: launching ") + kernel + ": " + cudaGetErrorString(e));
}
#define LAUNCH(kernel, grid, block, stream, ...)            \
  do {                                                     \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__); \
    check_launch(#kernel);                                 \
  } while (0)
//! Each index in [0, n) once, over the whole grid.
#define GRID_STRIDE(i, n) \
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < (n); i += std::size_t{gridDim.x} * blockDim.x)

//! The sum of each thread's `v` over the block (blockDim.x a power of two, at most 1024), in a
//! fixed tree order: the same bits from run to run. Every thread of the block must call it.
__device__ double block_sum(double v) {
  __shared__ double part[1024];
  part[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  double const total = part[0];
  __syncthreads();  // part may be reused by a later call
  return total;
}
constexpr unsigned reduce_threads = 256;

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
  GRID_STRIDE(t, n) {
    double const ms = dot(x + t * d, x + t * d, d) / static_cast<double>(d);
    inv[t] = static_cast<float>(1.0 / sqrt(ms + eps));
  }
}

__global__ void rms_apply_kernel(float const* x, float const* inv, float const* g, std::size_t n, std::size_t d, float* y) {
  GRID_STRIDE(i, n * d) {
    y[i] = x[i] * inv[i / d] * g[i % d];
  }
}

__global__ void rms_backward_dx(float const* x, float const* inv, float const* g, float const* dy, std::size_t n,
                                std::size_t d, float* dx) {
  GRID_STRIDE(t, n) {
    float const* xr = x + t * d;
    float const* dyr = dy + t * d;
    double const r = inv[t];
    double gx = 0.0;
    for (std::size_t j = 0; j < d; ++j) gx += static_cast<double>(g[j]) * static_cast<double>(dyr[j]) * static_cast<double>(xr[j]);
    double const c = r * r * r * gx / static_cast<double>(d);
    for (std::size_t j = 0; j < d; ++j)
      dx[t * d + j] += static_cast<float>(r * static_cast<double>(g[j]) * static_cast<double>(dyr[j]) - static_cast<double>(xr[j]) * c);
  }
}

// The CPU kernel adds each row's float contribution to dg[j] in row order: so does this one.
__global__ void rms_backward_dg(float const* x, float const* inv, float const* dy, std::size_t n, std::size_t d, float* dg) {
  GRID_STRIDE(j, d) {
    float acc = dg[j];
    for (std::size_t t = 0; t < n; ++t)
      acc += static_cast<float>(static_cast<double>(dy[t * d + j]) * static_cast<double>(x[t * d + j]) * static_cast<double>(inv[t]));
    dg[j] = acc;
  }
}

__global__ void rope_kernel(float* x, std::size_t n, std::size_t seq, std::size_t heads, std::size_t hd, double theta,
                            bool inverse) {
  std::size_t const half = hd / 2;
  GRID_STRIDE(i, n * heads * half) {  // (token, head, pair)
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
}

__global__ void attention_forward_kernel(attention_dims a, float const* q, float const* k, float const* v, float* o,
                                         float* lse) {
  GRID_STRIDE(idx, a.batch * a.seq * a.heads) {  // (token, head)
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
}

__global__ void attention_dq_kernel(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                                    float const* lse, float const* d_o, float* dq) {
  GRID_STRIDE(idx, a.batch * a.seq * a.heads) {  // (token, head)
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
}

// dk and dv of key row (b, j) and key/value head g: the CPU kernel adds the contributions of the
// queries (b, i >= j) in order of i, then of the heads of the group: the same order here.
__global__ void attention_dkv_kernel(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                                     float const* lse, float const* d_o, float* dk, float* dv) {
  GRID_STRIDE(idx, a.batch * a.seq * a.kv_heads) {  // (key token, kv head)
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
}

__global__ void swiglu_kernel(float const* gate, float const* up, std::size_t n, float* act) {
  GRID_STRIDE(i, n) {
    double const g = gate[i];
    act[i] = static_cast<float>(g * sigmoid(g) * static_cast<double>(up[i]));
  }
}

__global__ void swiglu_backward_kernel(float const* gate, float const* up, float const* dact, std::size_t n, float* dgate,
                                       float* dup) {
  GRID_STRIDE(i, n) {
    double const g = gate[i], sg = sigmoid(g), da = dact[i];
    dgate[i] = static_cast<float>(da * static_cast<double>(up[i]) * sg * (1.0 + g * (1.0 - sg)));
    dup[i] = static_cast<float>(da * g * sg);
  }
}

__global__ void route_select(float const* logits, std::size_t n, std::size_t E, std::size_t K, bool renormalize, routing r) {
  GRID_STRIDE(t, n) {
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
}

// The dispatch, after the stable sort of the (token, slot) pairs by expert: the pair of row r is
// pair_out[r], so row[pair] = r and token[r] = pair / K; expert e's rows begin at the first sorted
// key >= e (a binary search per expert).
__global__ void route_iota(std::size_t count, std::uint32_t* pair) {
  GRID_STRIDE(i, count) { pair[i] = static_cast<std::uint32_t>(i); }
}
__global__ void route_rows(std::size_t count, std::size_t K, routing r) {
  GRID_STRIDE(i, count) {
    std::uint32_t const pair = r.pair_out[i];
    r.row[pair] = static_cast<std::uint32_t>(i);
    r.token[i] = static_cast<std::uint32_t>(pair / K);
  }
}
__global__ void route_offsets(std::size_t count, std::size_t E, routing r) {
  GRID_STRIDE(e, E + 1) {
    std::size_t lo = 0, hi = count;
    while (lo < hi) {
      std::size_t const mid = lo + (hi - lo) / 2;
      if (r.sorted_expert[mid] < e) lo = mid + 1;
      else hi = mid;
    }
    r.offset[e] = static_cast<std::uint32_t>(lo);
  }
}

//! The experts' GEMMs (kernels.hpp): expert e = blockIdx.z, 16 x 16 output tiles through shared
//! memory; the expert's row count (m, or k for weight gradients) is read on the device, and
//! blocks past it return at once (the grid covers the worst case). A(i, p) = a[i ai + p ap] and
//! B(p, j) = b[p bp + j bj] from each operand's per-row (row offset r0) and per-expert bases.
struct expert_gemm {
  std::uint32_t const* offset;
  bool rows_are_k;     // the expert's rows are the reduction (weight gradients), else the output rows
  std::size_t m, n, k;  // the fixed sizes; the variable one is the expert's row count
  float const* a;
  std::size_t a_row, a_expert, ai, ap;
  float const* b;
  std::size_t b_row, b_expert, bp, bj;
  float* c;
  std::size_t c_row, c_expert, ldc;
  float beta;
};
constexpr unsigned tile = 16;
__global__ void expert_gemm_kernel(expert_gemm g) {
  std::size_t const e = blockIdx.z;
  std::size_t const r0 = g.offset[e], rows = g.offset[e + 1] - r0;
  std::size_t const m = g.rows_are_k ? g.m : rows, k = g.rows_are_k ? rows : g.k;
  std::size_t const i0 = std::size_t{blockIdx.y} * tile, j0 = std::size_t{blockIdx.x} * tile;
  if (i0 >= m) return;  // uniform over the block: before any barrier
  float const* a = g.a + r0 * g.a_row + e * g.a_expert;
  float const* b = g.b + r0 * g.b_row + e * g.b_expert;
  float* c = g.c + r0 * g.c_row + e * g.c_expert;
  __shared__ float as[tile][tile + 1], bs[tile][tile + 1];
  unsigned const ty = threadIdx.y, tx = threadIdx.x;
  float acc = 0.0f;
  for (std::size_t p0 = 0; p0 < k; p0 += tile) {
    as[ty][tx] = i0 + ty < m && p0 + tx < k ? a[(i0 + ty) * g.ai + (p0 + tx) * g.ap] : 0.0f;
    bs[ty][tx] = p0 + ty < k && j0 + tx < g.n ? b[(p0 + ty) * g.bp + (j0 + tx) * g.bj] : 0.0f;
    __syncthreads();
    for (unsigned q = 0; q < tile; ++q) acc += as[ty][q] * bs[q][tx];
    __syncthreads();
  }
  std::size_t const i = i0 + ty, j = j0 + tx;
  if (i < m && j < g.n) {
    float& out = c[i * g.ldc + j];
    out = g.beta == 0.0f ? acc : acc + g.beta * out;  // beta 0 ignores C, as cuBLAS does
  }
}

__global__ void route_backward_kernel(routing r, std::size_t n, std::size_t E, std::size_t K, bool renormalize,
                                      double const* dweight, float* dlogits) {
  GRID_STRIDE(t, n) {
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
}

__global__ void gather_rows_kernel(float const* x, std::uint32_t const* index, std::size_t rows, std::size_t d, float* y) {
  GRID_STRIDE(i, rows * d) {
    y[i] = x[static_cast<std::size_t>(index[i / d]) * d + i % d];
  }
}

__global__ void moe_combine_kernel(float const* h, float const* weight, std::uint32_t const* row, float const* eo,
                                   std::size_t n, std::size_t K, std::size_t d, float* out) {
  GRID_STRIDE(i, n * d) {  // (t, c)
    std::size_t const t = i / d, c = i % d;
    float y = h[i] + out[i];
    for (std::size_t j = 0; j < K; ++j) y += weight[t * K + j] * eo[static_cast<std::size_t>(row[t * K + j]) * d + c];
    out[i] = y;
  }
}

__global__ void moe_combine_backward_kernel(float const* gy, float const* weight, std::uint32_t const* row,
                                            float const* eo, std::size_t n, std::size_t K, std::size_t d, float* dyg,
                                            double* dweight) {
  GRID_STRIDE(i, n * K) {  // (t, j)
    std::size_t const t = i / K, r = row[i];
    float const wt = weight[i];
    for (std::size_t c = 0; c < d; ++c) dyg[r * d + c] = wt * gy[t * d + c];
    dweight[i] = dot(gy + t * d, eo + r * d, d);
  }
}

__global__ void scatter_rows_add_kernel(float const* rows, std::uint32_t const* row, std::size_t n, std::size_t K,
                                        std::size_t d, float* dx) {
  GRID_STRIDE(i, n * d) {  // (t, c)
    std::size_t const t = i / d, c = i % d;
    float acc = dx[i];
    for (std::size_t j = 0; j < K; ++j) acc += rows[static_cast<std::size_t>(row[t * K + j]) * d + c];
    dx[i] = acc;
  }
}

__global__ void add_kernel(float const* x, float const* a, std::size_t n, float* h) {
  std::size_t const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) h[i] = x[i] + a[i];
}

__global__ void embed_kernel(std::int32_t const* tokens, float const* table, std::size_t n, std::size_t d, float* out) {
  GRID_STRIDE(i, n * d) {
    out[i] = table[static_cast<std::size_t>(tokens[i / d]) * d + i % d];
  }
}

__global__ void embed_backward_kernel(std::int32_t const* tokens, float const* grad, std::size_t n, std::size_t vocab,
                                      std::size_t d, float* dtable) {
  GRID_STRIDE(i, vocab * d) {  // (v, j)
    std::size_t const v = i / d, j = i % d;
    float acc = dtable[i];
    for (std::size_t t = 0; t < n; ++t)
      if (static_cast<std::size_t>(tokens[t]) == v) acc += grad[t * d + j];
    dtable[i] = acc;
  }
}

// Each token's loss (0 when masked) by its own thread; then one block sums the losses and the
// count in a fixed order (block_sum), and each row's gradient by its own thread (below).
__global__ void cross_entropy_token(float const* logits, std::int32_t const* targets, std::size_t n, std::size_t V,
                                    double* work) {
  GRID_STRIDE(t, n) {
    if (targets[t] < 0) {
      work[t] = 0.0;
      continue;
    }
    float const* z = logits + t * V;
    double m = z[0];
    for (std::size_t v = 1; v < V; ++v) m = fmax(m, static_cast<double>(z[v]));
    double sum = 0.0;
    for (std::size_t v = 0; v < V; ++v) sum += exp(static_cast<double>(z[v]) - m);
    work[t] = m + log(sum) - static_cast<double>(z[targets[t]]);
  }
}
__global__ void cross_entropy_total(std::int32_t const* targets, std::size_t n, double const* work, double* loss) {
  double total = 0.0, count = 0.0;
  for (std::size_t t = threadIdx.x; t < n; t += blockDim.x) {
    total += work[t];
    count += targets[t] >= 0 ? 1.0 : 0.0;
  }
  total = block_sum(total);
  count = block_sum(count);
  if (threadIdx.x == 0) {
    loss[0] = count > 0.0 ? total / count : NAN;
    loss[1] = count;
  }
}

__global__ void cross_entropy_grad(float* logits, std::int32_t const* targets, std::size_t n, std::size_t V,
                                   double const* loss) {
  GRID_STRIDE(t, n) {
    float* z = logits + t * V;
    if (targets[t] < 0) {
      for (std::size_t v = 0; v < V; ++v) z[v] = 0.0f;
      continue;
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
}

__global__ void adamw_kernel(float* w, float const* g, float* m, float* v, std::uint8_t const* decay, std::size_t count,
                             double lr, double beta1, double beta2, double eps, double weight_decay, double max_norm,
                             double const* squared, double c1, double c2) {
  double const norm = sqrt(*squared);
  double const clip = max_norm > 0.0 && norm > max_norm ? max_norm / norm : 1.0;
  GRID_STRIDE(i, count) {
    double const gi = static_cast<double>(g[i]) * clip;
    double const mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * gi;
    double const vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    double const p = w[i];
    w[i] = static_cast<float>(p - lr * ((mi / c1) / (sqrt(vi / c2) + eps) + (decay[i] ? weight_decay : 0.0) * p));
  }
}

// Block b sums elements b * threads + t, then every norm_blocks * threads further, in order; one
// block then sums the blocks' partials. The grid is fixed (norm_blocks), so the order is too.
__global__ void squared_norm_partial(float const* g, std::size_t count, double* work) {
  double s = 0.0;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += std::size_t{gridDim.x} * blockDim.x)
    s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) work[blockIdx.x] = s;
}
__global__ void squared_norm_total(double const* work, std::size_t parts, double* out) {
  double s = 0.0;
  for (std::size_t i = threadIdx.x; i < parts; i += blockDim.x) s += work[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void rms_inv(float const* x, std::size_t n, std::size_t d, double eps, float* inv, cudaStream_t s) {
  LAUNCH(rms_inv_kernel, blocks(n), threads, s, x, n, d, eps, inv);
}
void rms_apply(float const* x, float const* inv, float const* g, std::size_t n, std::size_t d, float* y, cudaStream_t s) {
  LAUNCH(rms_apply_kernel, blocks(n * d), threads, s, x, inv, g, n, d, y);
}
void rms_backward(float const* x, float const* inv, float const* g, float const* dy, std::size_t n, std::size_t d,
                  float* dx, float* dg, cudaStream_t s) {
  LAUNCH(rms_backward_dx, blocks(n), threads, s, x, inv, g, dy, n, d, dx);
  LAUNCH(rms_backward_dg, blocks(d), threads, s, x, inv, dy, n, d, dg);
}
void rope_apply(float* x, std::size_t n, std::size_t seq, std::size_t heads, std::size_t hd, double theta, bool inverse,
                cudaStream_t s) {
  LAUNCH(rope_kernel, blocks(n * heads * (hd / 2)), threads, s, x, n, seq, heads, hd, theta, inverse);
}
void attention_forward(attention_dims a, float const* q, float const* k, float const* v, float* o, float* lse, cudaStream_t s) {
  LAUNCH(attention_forward_kernel, blocks(a.batch * a.seq * a.heads), threads, s, a, q, k, v, o, lse);
}
void attention_backward(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                        float const* lse, float const* d_o, float* dq, float* dk, float* dv, cudaStream_t s) {
  LAUNCH(attention_dq_kernel, blocks(a.batch * a.seq * a.heads), threads, s, a, q, k, v, o, lse, d_o, dq);
  LAUNCH(attention_dkv_kernel, blocks(a.batch * a.seq * a.kv_heads), threads, s, a, q, k, v, o, lse, d_o, dk, dv);
}
void swiglu(float const* gate, float const* up, std::size_t n, float* act, cudaStream_t s) {
  LAUNCH(swiglu_kernel, blocks(n), threads, s, gate, up, n, act);
}
void swiglu_backward(float const* gate, float const* up, float const* dact, std::size_t n, float* dgate, float* dup,
                     cudaStream_t s) {
  LAUNCH(swiglu_backward_kernel, blocks(n), threads, s, gate, up, dact, n, dgate, dup);
}
namespace {
//! Key bits the sort looks at: enough for expert indices 0 to E - 1.
int expert_bits(std::size_t experts) { return std::max(1, static_cast<int>(std::bit_width(experts > 1 ? experts - 1 : 1))); }
void check_cub(cudaError_t e, char const* call) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("transformer::cuda: ") + call + ": " + cudaGetErrorString(e));
}
}  // namespace
std::size_t route_sort_bytes(std::size_t n, std::size_t experts, std::size_t top_k) {
  std::size_t bytes = 0;
  check_cub(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<std::uint32_t const*>(nullptr),
                                            static_cast<std::uint32_t*>(nullptr), static_cast<std::uint32_t const*>(nullptr),
                                            static_cast<std::uint32_t*>(nullptr), n * top_k, 0, expert_bits(experts)),
            "cub::DeviceRadixSort::SortPairs (temporary storage size)");
  return bytes;
}
void route(float const* logits, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize, routing r,
           cudaStream_t s) {
  std::size_t const count = n * top_k;
  LAUNCH(route_select, blocks(n), threads, s, logits, n, experts, top_k, renormalize, r);
  LAUNCH(route_iota, blocks(count), threads, s, count, r.pair_in);
  // Stable: pairs routed to one expert keep their (token, slot) order, as the CPU's dispatch.
  std::size_t bytes = r.sort_temp_bytes;
  check_cub(cub::DeviceRadixSort::SortPairs(r.sort_temp, bytes, r.expert, r.sorted_expert, r.pair_in, r.pair_out, count, 0,
                                            expert_bits(experts), s),
            "cub::DeviceRadixSort::SortPairs(expert, pair)");
  LAUNCH(route_rows, blocks(count), threads, s, count, top_k, r);
  LAUNCH(route_offsets, blocks(experts + 1), threads, s, count, experts, r);
}
void route_backward(routing r, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize,
                    double const* dweight, float* dlogits, cudaStream_t s) {
  LAUNCH(route_backward_kernel, blocks(n), threads, s, r, n, experts, top_k, renormalize, dweight, dlogits);
}
namespace {
void launch_experts(expert_gemm const& g, std::size_t experts, std::size_t max_m, cudaStream_t s) {
  if (experts == 0 || g.n == 0 || max_m == 0) return;
  if (experts > 65535 || (max_m + tile - 1) / tile > 65535)
    throw std::runtime_error("transformer::cuda: experts_*: " + std::to_string(experts) + " experts of up to " +
                             std::to_string(max_m) + " rows exceed the grid's y and z limits (65,535)");
  dim3 const grid(static_cast<unsigned>((g.n + tile - 1) / tile), static_cast<unsigned>((max_m + tile - 1) / tile),
                  static_cast<unsigned>(experts));
  LAUNCH(expert_gemm_kernel, grid, dim3(tile, tile), s, g);
}
}  // namespace
void experts_nn(std::uint32_t const* offset, std::size_t experts, std::size_t max_rows, std::size_t n, std::size_t k,
                float const* a, float const* w, std::size_t w_stride, float beta, float* c, cudaStream_t s) {
  // C(i, j) = sum_p A[r0 + i, p] W_e[p, j]
  launch_experts({.offset = offset, .rows_are_k = false, .m = 0, .n = n, .k = k,
                  .a = a, .a_row = k, .a_expert = 0, .ai = k, .ap = 1,
                  .b = w, .b_row = 0, .b_expert = w_stride, .bp = n, .bj = 1,
                  .c = c, .c_row = n, .c_expert = 0, .ldc = n, .beta = beta},
                 experts, max_rows, s);
}
void experts_nt(std::uint32_t const* offset, std::size_t experts, std::size_t max_rows, std::size_t n, std::size_t k,
                float const* a, float const* w, std::size_t w_stride, float beta, float* c, cudaStream_t s) {
  // C(i, j) = sum_p A[r0 + i, p] W_e[j, p]
  launch_experts({.offset = offset, .rows_are_k = false, .m = 0, .n = n, .k = k,
                  .a = a, .a_row = k, .a_expert = 0, .ai = k, .ap = 1,
                  .b = w, .b_row = 0, .b_expert = w_stride, .bp = 1, .bj = k,
                  .c = c, .c_row = n, .c_expert = 0, .ldc = n, .beta = beta},
                 experts, max_rows, s);
}
void experts_tn(std::uint32_t const* offset, std::size_t experts, std::size_t m, std::size_t n, float const* a,
                float const* b, float beta, float* c, std::size_t c_stride, cudaStream_t s) {
  // W_e(i, j) = sum_p A[r0 + p, i] B[r0 + p, j]
  launch_experts({.offset = offset, .rows_are_k = true, .m = m, .n = n, .k = 0,
                  .a = a, .a_row = m, .a_expert = 0, .ai = 1, .ap = m,
                  .b = b, .b_row = n, .b_expert = 0, .bp = n, .bj = 1,
                  .c = c, .c_row = 0, .c_expert = c_stride, .ldc = n, .beta = beta},
                 experts, m, s);
}
void gather_rows(float const* x, std::uint32_t const* index, std::size_t rows, std::size_t d, float* y, cudaStream_t s) {
  LAUNCH(gather_rows_kernel, blocks(rows * d), threads, s, x, index, rows, d, y);
}
void moe_combine(float const* h, float const* weight, std::uint32_t const* row, float const* eo, std::size_t n,
                 std::size_t top_k, std::size_t d, float* out, cudaStream_t s) {
  LAUNCH(moe_combine_kernel, blocks(n * d), threads, s, h, weight, row, eo, n, top_k, d, out);
}
void moe_combine_backward(float const* gy, float const* weight, std::uint32_t const* row, float const* eo, std::size_t n,
                          std::size_t top_k, std::size_t d, float* dyg, double* dweight, cudaStream_t s) {
  LAUNCH(moe_combine_backward_kernel, blocks(n * top_k), threads, s, gy, weight, row, eo, n, top_k, d, dyg, dweight);
}
void scatter_rows_add(float const* rows, std::uint32_t const* row, std::size_t n, std::size_t top_k, std::size_t d,
                      float* dx, cudaStream_t s) {
  LAUNCH(scatter_rows_add_kernel, blocks(n * d), threads, s, rows, row, n, top_k, d, dx);
}
void add(float const* x, float const* a, std::size_t n, float* h, cudaStream_t s) {
  LAUNCH(add_kernel, blocks(n), threads, s, x, a, n, h);
}
void embed(std::int32_t const* tokens, float const* table, std::size_t n, std::size_t d, float* out, cudaStream_t s) {
  LAUNCH(embed_kernel, blocks(n * d), threads, s, tokens, table, n, d, out);
}
void embed_backward(std::int32_t const* tokens, float const* grad, std::size_t n, std::size_t vocab, std::size_t d,
                    float* dtable, cudaStream_t s) {
  LAUNCH(embed_backward_kernel, blocks(vocab * d), threads, s, tokens, grad, n, vocab, d, dtable);
}
void cross_entropy(float* logits, std::int32_t const* targets, std::size_t n, std::size_t vocab, double* loss,
                   double* work, cudaStream_t s) {
  LAUNCH(cross_entropy_token, blocks(n), threads, s, logits, targets, n, vocab, work);
  LAUNCH(cross_entropy_total, 1, reduce_threads, s, targets, n, work, loss);
  LAUNCH(cross_entropy_grad, blocks(n), threads, s, logits, targets, n, vocab, loss);
}
void adamw(float* w, float const* g, float* m, float* v, std::uint8_t const* decay, std::size_t count, double lr,
           double beta1, double beta2, double eps, double weight_decay, double max_norm, double const* squared,
           std::size_t step, cudaStream_t s) {
  double const c1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  double const c2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  LAUNCH(adamw_kernel, blocks(count), threads, s, w, g, m, v, decay, count, lr, beta1, beta2, eps, weight_decay, max_norm,
         squared, c1, c2);
}
void squared_norm(float const* g, std::size_t count, double* out, double* work, cudaStream_t s) {
  LAUNCH(squared_norm_partial, static_cast<unsigned>(norm_blocks), reduce_threads, s, g, count, work);
  LAUNCH(squared_norm_total, 1, reduce_threads, s, work, norm_blocks, out);
}

}  // namespace transformer::cuda
