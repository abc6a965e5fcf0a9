// The layer stack's kernels: GEMMs through cuBLAS (bitwise reproducible run to run on one GPU
// for a given toolkit, per NVIDIA's cuBLAS documentation, "Results reproducibility"), and simple
// deterministic elementwise and normalization kernels (one block per row, a fixed reduction tree).
#include "kernels.hpp"

#include <cublas_v2.h>

#include <string>

#include <tide/backends/cuda/cuda_error.hpp>

namespace cuda_stack {
namespace {

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

namespace {
void check_cublas(cublasStatus_t st, char const* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw tide::error(std::string("cuda_stack: ") + call + " failed with " + cublasGetStatusName(st) + " (" +
                      cublasGetStatusString(st) + ")");
}
// cuBLAS's workspace: 32 MiB, the size the cuBLAS documentation recommends for Hopper
// (cublasSetWorkspace); enough for the others.
constexpr std::size_t workspace_bytes = std::size_t{32} << 20;
struct cublas_owner {
  cublasHandle_t h = nullptr;
  int device = -1;
  void* workspace = nullptr;  // cuBLAS's, fixed: see gemm
  ~cublas_owner() { release(); }
  void release() noexcept {
    if (h) static_cast<void>(cublasDestroy(h));
    if (workspace) static_cast<void>(cudaFree(workspace));
    h = nullptr;
    workspace = nullptr;
  }
};
//! One handle per device and host thread (cuBLAS handles are not thread-safe), created on first
//! use with its workspace; the stream is set per call, since forward, recompute and backward share it.
cublas_owner const& handle() {
  thread_local cublas_owner o;
  int device = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  if (o.h && o.device != device) o.release();
  if (!o.h) {
    if (!o.workspace) TIDE_CUDA_CHECK(cudaMalloc(&o.workspace, workspace_bytes));
    check_cublas(cublasCreate(&o.h), "cublasCreate");
    o.device = device;
    // FP32 products stay FP32 (no TF32), so the example's numbers do not depend on a math mode.
    check_cublas(cublasSetMathMode(o.h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  }
  return o;
}
}  // namespace

// Row-major C = A B is column-major C^T = B^T A^T. A row-major operand with unit column stride is,
// read column-major, its own transpose (op N); one with unit row stride is the matrix itself (op T).
void gemm(int m, int n, int k, float const* a, int a_row, int a_col, float const* b, int b_row, int b_col, float* c,
          cudaStream_t s) {
  auto const& o = handle();
  auto const h = o.h;
  check_cublas(cublasSetStream(h, s), "cublasSetStream");
  // cublasSetStream drops a user workspace: bound again, so that a GEMM captured into a graph
  // picks the same algorithm as when it runs eagerly, and the graph holds no memory nodes.
  check_cublas(cublasSetWorkspace(h, o.workspace, workspace_bytes), "cublasSetWorkspace");
  auto const op_b = b_col == 1 ? CUBLAS_OP_N : CUBLAS_OP_T;
  auto const op_a = a_col == 1 ? CUBLAS_OP_N : CUBLAS_OP_T;
  int const ld_b = b_col == 1 ? b_row : b_col, ld_a = a_col == 1 ? a_row : a_col;
  float const one = 1.0f, zero = 0.0f;
  check_cublas(cublasSgemm(h, op_b, op_a, n, m, k, &one, b, ld_b, a, ld_a, &zero, c, n), "cublasSgemm");
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
