// The layer stack's kernels. Simple and deterministic rather than fast: a tiled GEMM with a
// fixed k order, and one block per row for the normalization with a fixed reduction tree.
#include "kernels.hpp"

#include <tide/backends/cuda/cuda_error.hpp>

namespace cuda_stack {
namespace {

constexpr int tile = 16;
constexpr int row_threads = 256;
constexpr float eps = 1e-5f;

__device__ std::uint32_t hash(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

__global__ void fill_random_kernel(float* p, std::size_t n, std::uint32_t seed, float scale) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    auto const h = hash(static_cast<std::uint32_t>(i) ^ hash(seed + static_cast<std::uint32_t>(i >> 32)));
    p[i] = (static_cast<float>(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
  }
}

__global__ void gemm_kernel(int m, int n, int k, float const* a, int a_row, int a_col, float const* b, int b_row,
                            int b_col, float* c) {
  __shared__ float as[tile][tile];
  __shared__ float bs[tile][tile];
  int const i = blockIdx.y * tile + threadIdx.y;
  int const j = blockIdx.x * tile + threadIdx.x;
  float acc = 0.0f;
  for (int l0 = 0; l0 < k; l0 += tile) {
    int const la = l0 + threadIdx.x, lb = l0 + threadIdx.y;
    as[threadIdx.y][threadIdx.x] = i < m && la < k ? a[std::size_t(i) * a_row + std::size_t(la) * a_col] : 0.0f;
    bs[threadIdx.y][threadIdx.x] = lb < k && j < n ? b[std::size_t(lb) * b_row + std::size_t(j) * b_col] : 0.0f;
    __syncthreads();
    for (int l = 0; l < tile; ++l) acc = fmaf(as[threadIdx.y][l], bs[l][threadIdx.x], acc);
    __syncthreads();
  }
  if (i < m && j < n) c[std::size_t(i) * n + j] = acc;
}

__global__ void relu_forward_kernel(float const* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = fmaxf(x[i], 0.0f);
}

__global__ void relu_backward_kernel(float const* dy, float const* x, float* dx, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

//! Sum over the block in a fixed tree order; every thread gets the result.
__device__ float block_sum(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int w = row_threads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) shared[threadIdx.x] += shared[threadIdx.x + w];
    __syncthreads();
  }
  float const r = shared[0];
  __syncthreads();  // shared is reused by the next call
  return r;
}

__global__ void rmsnorm_forward_kernel(float const* x, float* y, int cols) {
  __shared__ float shared[row_threads];
  auto const* row = x + std::size_t(blockIdx.x) * cols;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < cols; c += row_threads) ss = fmaf(row[c], row[c], ss);
  float const r = rsqrtf(block_sum(ss, shared) / static_cast<float>(cols) + eps);
  auto* out = y + std::size_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += row_threads) out[c] = row[c] * r;
}

// y = x r with r = (mean(x^2) + eps)^-1/2: dx = r dy - r^3 x (dy . x) / cols.
__global__ void rmsnorm_backward_kernel(float const* dy, float const* x, float* dx, int cols) {
  __shared__ float shared[row_threads];
  auto const off = std::size_t(blockIdx.x) * cols;
  float ss = 0.0f, dot = 0.0f;
  for (int c = threadIdx.x; c < cols; c += row_threads) {
    ss = fmaf(x[off + c], x[off + c], ss);
    dot = fmaf(dy[off + c], x[off + c], dot);
  }
  float const r = rsqrtf(block_sum(ss, shared) / static_cast<float>(cols) + eps);
  float const d = block_sum(dot, shared) / static_cast<float>(cols);
  for (int c = threadIdx.x; c < cols; c += row_threads) dx[off + c] = r * dy[off + c] - r * r * r * x[off + c] * d;
}

unsigned blocks_for(std::size_t n) {
  auto const b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

}  // namespace

// A launch error (bad configuration, no kernel image for this GPU) is reported by
// cudaGetLastError right after the launch; check it there, so it names the kernel.
void fill_random(float* p, std::size_t n, std::uint32_t seed, float scale, cudaStream_t s) {
  fill_random_kernel<<<blocks_for(n), 256, 0, s>>>(p, n, seed, scale);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

void gemm(int m, int n, int k, float const* a, int a_row, int a_col, float const* b, int b_row, int b_col, float* c,
          cudaStream_t s) {
  dim3 const block(tile, tile);
  dim3 const grid(static_cast<unsigned>((n + tile - 1) / tile), static_cast<unsigned>((m + tile - 1) / tile));
  gemm_kernel<<<grid, block, 0, s>>>(m, n, k, a, a_row, a_col, b, b_row, b_col, c);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

void relu_forward(float const* x, float* y, std::size_t n, cudaStream_t s) {
  relu_forward_kernel<<<blocks_for(n), 256, 0, s>>>(x, y, n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

void relu_backward(float const* dy, float const* x, float* dx, std::size_t n, cudaStream_t s) {
  relu_backward_kernel<<<blocks_for(n), 256, 0, s>>>(dy, x, dx, n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_forward(float const* x, float* y, int rows, int cols, cudaStream_t s) {
  rmsnorm_forward_kernel<<<static_cast<unsigned>(rows), row_threads, 0, s>>>(x, y, cols);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(float const* dy, float const* x, float* dx, int rows, int cols, cudaStream_t s) {
  rmsnorm_backward_kernel<<<static_cast<unsigned>(rows), row_threads, 0, s>>>(dy, x, dx, cols);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda_stack
