#pragma once
// The pipeline CUDA twin's kernel of its own (kernels.cu); deterministic, as the layer's are.
#include <cuda_runtime_api.h>

#include <cstddef>

namespace pipeline_cuda {

//! acc += x elementwise, on `s`: the weight gradients summed over micro-batches in their order.
void accumulate(float* acc, float const* x, std::size_t n, cudaStream_t s);

}  // namespace pipeline_cuda
