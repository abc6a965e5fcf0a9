// Built only when tide::cuda exists: the CUDA backend's headers compile with the host compiler
// from tide::cuda's include folders (CUDA runtime, CCCL) alone. Runs nothing on a GPU.
#include <tide/backends/cuda/cuda_backend.hpp>

#include <cstdio>

int main() {
  static_assert(tide::backend<tide::cuda_backend>);
  std::printf("consumer_cuda: tide::cuda_backend satisfies tide::backend\n");
  return 0;
}
