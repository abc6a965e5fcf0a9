#pragma once
// Launchers of the layer stack's kernels (kernels.cu). Every kernel is deterministic (cuBLAS
// run to run on one GPU; ours with fixed summation orders and no atomics), so a layer computes bitwise the same result every time it runs
// on the same input, which is what lets gradients be compared bitwise between policies.
// Matrices are row-major float; every launcher enqueues on `s` and checks the launch.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace cuda_stack {

//! `n` pseudo-random values in [-scale, scale), a pure function of (seed, index).
void fill_random(float* p, std::size_t n, std::uint32_t seed, float scale, cudaStream_t s);

//! C (m x n) = A (m x k) * B (k x n), where A(i, l) = a[i * a_row + l * a_col] and
//! B(l, j) = b[l * b_row + j * b_col], so transposes are expressed by strides; one of each
//! operand's strides must be 1. Runs cublasSgemm (no TF32) on `s`.
void gemm(int m, int n, int k, float const* a, int a_row, int a_col, float const* b, int b_row, int b_col, float* c,
          cudaStream_t s);

//! y = max(x, 0) elementwise.
void relu_forward(float const* x, float* y, std::size_t n, cudaStream_t s);
//! dx = dy where x > 0, else 0 (in place allowed: dx == dy).
void relu_backward(float const* dy, float const* x, float* dx, std::size_t n, cudaStream_t s);

//! Per row of `cols`: y = x / sqrt(mean(x^2) + eps).
void rmsnorm_forward(float const* x, float* y, int rows, int cols, cudaStream_t s);
//! The gradient of rmsnorm_forward with respect to x, from dy and x (dx must not alias dy).
void rmsnorm_backward(float const* dy, float const* x, float* dx, int rows, int cols, cudaStream_t s);

}  // namespace cuda_stack
