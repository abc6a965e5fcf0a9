// GPUDirect Storage on the GPU, in a test program of its own: cuFile's driver open has been seen
// never to return on a machine without nvidia-fs, and here it is bounded (a named storage_error
// after cuda_backend_options::gpu_direct_open_timeout) without taking the rest of the CUDA suite
// with it. Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include "model.hpp"

#include <cstdio>
#include <string>

#include <stdlib.h>
#include <unistd.h>

using cuda_stack::bitwise_equal;

namespace {
cuda_stack::dims const small{4, 64, 48};
}  // namespace

// GPUDirect Storage: the spill ring in device memory, cuFile writes and reads on the storage
// stream (in cuFile's compatibility mode where the machine has no nvidia-fs). Bitwise equal to
// keep-all; `required` in a build without cuFile is an error naming why; `automatic` always runs
// and says which path it took.
TEST(GpuDirect, SpillIsBitwiseEqualToKeepAll) {
  cuda_stack::model const m(small);
  auto const cases = cuda_stack::policy_cases(small);
  cuda_stack::run_options o;
  o.exec.debug_checks = true;
  auto const keep = cuda_stack::run(m, cuda_stack::build(small, cases[0]), o);
  char dir[] = "/var/tmp/tide-cuda-gds-XXXXXX";  // not tmpfs: O_DIRECT
  ASSERT_NE(::mkdtemp(dir), nullptr);
  o.backend.storage = {.directory = dir, .quiet = true};
  o.backend.gpu_direct = tide::gpu_direct_mode::required;
  o.backend.gpu_direct_open_timeout = std::chrono::seconds(30);
  cuda_stack::policy_case const spill{"spill, GPUDirect",
                                      {.policy = {tide::rule_spec{.where = tide::placement::spill, .slots = {"input", "pre"}}},
                                       .buffers = {.spill_buffers = 2},
                                       .pipeline = {.chunk_bytes = 4096 + 256}}};
  auto const sched = cuda_stack::build(small, spill);
  if (!tide::gpu_direct_built()) {
    try {
      (void)cuda_stack::run(m, sched, o);
      ADD_FAILURE() << "gpu_direct_mode::required ran in a build without cuFile";
    } catch (tide::storage_error const& e) {
      EXPECT_NE(std::string(e.what()).find("no cuFile"), std::string::npos) << e.what();
    }
  } else {
    auto const r = cuda_stack::run(m, sched, o);
    EXPECT_TRUE(bitwise_equal(r.grads, keep.grads));
    EXPECT_EQ(r.storage_path.rfind("GPUDirect Storage (cuFile", 0), 0u) << r.storage_path;
    EXPECT_EQ(r.gpu_direct_ring_bytes, sched.arena.spill_ring_bytes);
    std::printf("[ info     ] %s\n", r.storage_path.c_str());
  }
  // Automatic never fails for want of cuFile: it says which path it took.
  o.backend.gpu_direct = tide::gpu_direct_mode::automatic;
  auto const a = cuda_stack::run(m, sched, o);
  EXPECT_TRUE(bitwise_equal(a.grads, keep.grads));
  EXPECT_FALSE(a.storage_path.empty());
  ::rmdir(dir);
}

int main(int argc, char** argv) {
  if (auto const rc = example::without_device("gpu_direct_test")) return *rc;
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
