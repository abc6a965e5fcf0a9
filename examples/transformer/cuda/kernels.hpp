#pragma once
// The transformer's kernels on the GPU (the CUDA twin of the demo): one launcher per CPU kernel of
// ../layers.hpp with the same arithmetic (double accumulation in index order, one thread per
// output row or element, no atomics), so results are bitwise reproducible from run to run and
// across tide's policies on one GPU. Simple, not fast: the demo's sizes are small.

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
//! offsets [E + 1], as layers.hpp's `routing` computes them.
struct routing {
  double* probs = nullptr;
  std::uint32_t* expert = nullptr;
  float* weight = nullptr;
  std::uint32_t* row = nullptr;
  std::uint32_t* token = nullptr;
  std::uint32_t* offset = nullptr;
};
void route(float const* logits, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize, routing r,
           cudaStream_t s);
void route_backward(routing r, std::size_t n, std::size_t experts, std::size_t top_k, bool renormalize,
                    double const* dweight, float* dlogits, cudaStream_t s);

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
//! their gradient and writes the loss (double) to `loss`.
void cross_entropy(float* logits, std::int32_t const* targets, std::size_t n, std::size_t vocab, double* loss,
                   cudaStream_t s);

//! AdamW over `count` parameters (decay where `decay` is non-zero), with the gradients clipped by
//! `clip` (computed on the host from the norm).
void adamw(float* w, float const* g, float* m, float* v, std::uint8_t const* decay, std::size_t count, double lr,
           double beta1, double beta2, double eps, double weight_decay, double clip, std::size_t step, cudaStream_t s);
//! sum of g^2 in index order (one thread: deterministic; for the demo's sizes).
void squared_norm(float const* g, std::size_t count, double* out, cudaStream_t s);

}  // namespace transformer::cuda
