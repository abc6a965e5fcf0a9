// The pipeline CUDA twin's one kernel of its own; the layer's (GEMM, ReLU, RMSNorm, random fill)
// are examples/cuda_stack's.
#include "kernels.hpp"

#include <tide/backends/cuda/cuda_error.hpp>

namespace pipeline_cuda {

namespace {
__global__ void accumulate_kernel(float* acc, float const* x, std::size_t n) {
  auto const i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += x[i];  // one thread per element: the same sum order on every run
}
}  // namespace

void accumulate(float* acc, float const* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  accumulate_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(acc, x, n);
  TIDE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace pipeline_cuda
