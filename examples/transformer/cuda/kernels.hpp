#pragma once
// The transformer's kernels on the GPU (the CUDA twin of the demo): one launcher per CPU kernel of
// ../layers.hpp with the same arithmetic (double accumulation in index order, one thread per
// output row or element, no atomics), so results are bitwise reproducible from run to run and
// across tide's policies on one GPU. Reductions over many elements (the loss, the gradient norm)
// are block-level, in a fixed order; the MoE routing and the experts' GEMMs read the per-expert
// row offsets on the device, with the worst case (every token at an expert) as their bound, so
// nothing synchronizes and a whole step can be captured into a CUDA graph. Kernels loop with a
// grid stride; every launch is checked (std::runtime_error naming the kernel). Simple, not fast.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace transformer::cuda {

struct attention_dims {
  std::size_t batch, seq, heads, kv_heads, head_dim;
};

// RMSNorm
void rms_inv(float const* x, std::size_t n, std::size_t d, double eps, float* inv, cudaStream_t s);
void rms_apply(float const* x, float const* inv, float const* g, std::size_t n, std::size_t d, float* y, cudaStream_t s);
//! dx += ..., dg += ... (dg by column: each thread sums its column over the rows in order).
void rms_backward(float const* x, float const* inv, float const* g, float const* dy, std::size_t n, std::size_t d,
                  float* dx, float* dg, cudaStream_t s);

// Rotary embeddings: x [n, heads * hd] rotated in place by position t % seq; `inverse` rotates back.
void rope_apply(float* x, std::size_t n, std::size_t seq, std::size_t heads, std::size_t hd, double theta, bool inverse,
                cudaStream_t s);

// Causal grouped-query attention (one thread per query row and head; dk, dv one thread per key
// row and key/value head, looping over the queries of its group in order).
void attention_forward(attention_dims a, float const* q, float const* k, float const* v, float* o, float* lse,
                       cudaStream_t s);
void attention_backward(attention_dims a, float const* q, float const* k, float const* v, float const* o,
                        float const* lse, float const* d_o, float* dq, float* dk, float* dv, cudaStream_t s);

// SwiGLU
void swiglu(float const* gate, float const* up, std::size_t n, float* act, cudaStream_t s);
void swiglu_backward(float const* gate, float const* up, float const* dact, std::size_t n, float* dgate, float* dup,
                     cudaStream_t s);

//! The routing of n tokens, on the device: probabilities [n, E] (double), the selected experts
//! and weights [n, k], the dispatched row of each (token, j) and the token of each row, expert
//! offsets [E + 1], as layers.hpp's `routing` computes them. The dispatch (rows by expert, then
//! by token and slot) is a stable radix sort of the (token, slot) pairs by expert (CUB), into
//! `sorted_expert`, `pair_in` and `pair_out` [n k] and `sort_temp` (`route_sort_bytes`).
struct routing {
  double* probs = nullptr;
  std::uint32_t* expert = nullptr;
  float* weight = nullptr;
  std::uint32_t* row = nullptr;
  std::uint32_t* token = nullptr;
  std::uint32_t* offset = nullptr;
  std::uint32_t* sorted_expert = nullptr;
  std::uint32_t* pair_in = nullptr;
  std::uint32_t* pair_out = nullptr;
  void* sort_temp = nullptr;
  std::size_t sort_temp_bytes = 0;
};
//! The bytes of `routing::sort_temp` for n tokens, E experts, top-k (no launch).
std::size_t route_sort_bytes(std::size_t n, std::size_t experts, std::size_t top_k);
void route(float const* logits, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize, routing r,
           cudaStream_t s);
void route_backward(routing r, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize,
                    double const* dweight, float* dlogits, cudaStream_t s);

//! The experts' GEMMs, for each expert e over its dispatched rows [offset[e], offset[e + 1]) (the
//! offsets on the device; at most `max_rows` rows an expert), row-major as gpu_model's `gemms`,
//! one thread per output element summing in index order (deterministic):
//! nn: C[rows x n] = A[rows x k] W_e[k x n] + beta C, W_e at w + e w_stride;
//! nt: C[rows x n] = A[rows x k] W_e[n x k]^T + beta C;
//! tn: W_e[m x n] = A[rows x m]^T B[rows x n] + beta W_e (the weight gradients), W_e at c + e c_stride.
void experts_nn(std::uint32_t const* offset, std::size_t experts, std::size_t max_rows, std::size_t n, std::size_t k,
                float const* a, float const* w, std::size_t w_stride, float beta, float* c, cudaStream_t s);
void experts_nt(std::uint32_t const* offset, std::size_t experts, std::size_t max_rows, std::size_t n, std::size_t k,
                float const* a, float const* w, std::size_t w_stride, float beta, float* c, cudaStream_t s);
void experts_tn(std::uint32_t const* offset, std::size_t experts, std::size_t m, std::size_t n, float const* a,
                float const* b, float beta, float* c, std::size_t c_stride, cudaStream_t s);

// Rows: y[r] = x[index[r]] (gather), y[index[r]] (+)= x[r] is left to the callers' own kernels.
void gather_rows(float const* x, std::uint32_t const* index, std::size_t rows, std::size_t d, float* y, cudaStream_t s);
//! out[t] = h[t] + out[t] + sum_j weight[t, j] eo[row[t, j]], in j order (model.hpp's combine).
void moe_combine(float const* h, float const* weight, std::uint32_t const* row, float const* eo, std::size_t n,
                 std::size_t top_k, std::size_t d, float* out, cudaStream_t s);
//! The combine's backward: dyg[row[t, j]] = weight[t, j] gy[t] and dweight[t, j] = gy[t] . eo[row[t, j]].
void moe_combine_backward(float const* gy, float const* weight, std::uint32_t const* row, float const* eo, std::size_t n,
                          std::size_t top_k, std::size_t d, float* dyg, double* dweight, cudaStream_t s);
//! dx[t] += sum_j rows[row[t, j]], in j order (the dispatch's backward).
void scatter_rows_add(float const* rows, std::uint32_t const* row, std::size_t n, std::size_t top_k, std::size_t d,
                      float* dx, cudaStream_t s);
//! h = x + a, elementwise.
void add(float const* x, float const* a, std::size_t n, float* h, cudaStream_t s);

// Embedding and head
void embed(std::int32_t const* tokens, float const* table, std::size_t n, std::size_t d, float* out, cudaStream_t s);
//! dtable[v] += sum over tokens t with tokens[t] == v, in token order (one thread per (v, j)).
void embed_backward(std::int32_t const* tokens, float const* grad, std::size_t n, std::size_t vocab, std::size_t d,
                    float* dtable, cudaStream_t s);
//! Mean cross-entropy of logits [n, V] against targets (< 0: masked); overwrites the logits with
//! their gradient and writes the loss (double) to `loss[0]`, the count to `loss[1]`. `work`: n
//! doubles (each token's loss, summed by one block in a fixed order).
void cross_entropy(float* logits, std::int32_t const* targets, std::size_t n, std::size_t vocab, double* loss,
                   double* work, cudaStream_t s);

//! AdamW over `count` parameters (decay where `decay` is non-zero), with the gradients clipped to
//! the global norm `max_norm` (<= 0: no clipping) from their squared norm `*squared` on the
//! device (nothing is read back).
void adamw(float* w, float const* g, float* m, float* v, std::uint8_t const* decay, std::size_t count, double lr,
           double beta1, double beta2, double eps, double weight_decay, double max_norm, double const* squared,
           std::size_t step, cudaStream_t s);
//! The blocks (and `work` doubles) squared_norm uses.
inline constexpr std::size_t norm_blocks = 256;
//! The sum of g^2: each of `norm_blocks` blocks sums a fixed share in a fixed order into `work`,
//! then one block sums those (deterministic).
void squared_norm(float const* g, std::size_t count, double* out, double* work, cudaStream_t s);

}  // namespace transformer::cuda
