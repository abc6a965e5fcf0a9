// tide::basic_nccl_hooks against a fake NCCL (issue 27, items 5 and 6), without a GPU: an aborted
// communicator is never touched again, an abort waits for the hooks' own group to close, a call
// that stays "in progress" is bounded by the hooks' timeout, and failures are agreed once per
// step at its end (a hook's group holds only its own calls).
#include <gtest/gtest.h>

#include <tide/collectives/nccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace std::chrono_literals;

namespace {

//! NCCL and CUDA as far as the hooks use them: state in statics, reset by each test.
struct fake {
  static inline ncclResult_t async = ncclSuccess;    // what ncclCommGetAsyncError reports
  static inline ncclResult_t calls = ncclSuccess;    // what the collectives return
  static inline int aborts = 0, aborts_in_group = 0, queries = 0, queries_after_abort = 0, collectives = 0, copies = 0;
  static inline int peer_flag = 0;  // what the other ranks contribute to the failure all-reduce (max)
  static inline bool group_open = false, freed = false;
  static void reset() {
    async = calls = ncclSuccess;
    aborts = aborts_in_group = queries = queries_after_abort = collectives = copies = peer_flag = 0;
    group_open = freed = false;
  }
  static ncclResult_t user_rank(ncclComm_t, int* r) { return *r = 3, ncclSuccess; }
  static ncclResult_t cu_device(ncclComm_t, int* d) { return *d = 0, ncclSuccess; }
  struct scope {};
  static scope device_scope(int) { return {}; }
  static ncclResult_t group_start() { return group_open = true, ncclSuccess; }
  static ncclResult_t group_end() { return group_open = false, ncclSuccess; }
  static ncclResult_t collective() {
    ++collectives;
    return freed ? ncclInvalidArgument : calls;
  }
  static ncclResult_t all_reduce(void const* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t,
                                 cudaStream_t) {
    if (t == ncclInt32 && op == ncclMax && n == 1 && s == r && !freed)  // the failure agreement
      *static_cast<int*>(r) = std::max(*static_cast<int*>(r), peer_flag);
    return collective();
  }
  static ncclResult_t reduce_scatter(void const*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return collective();
  }
  static ncclResult_t all_gather(void const*, void*, std::size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    return collective();
  }
  static ncclResult_t async_error(ncclComm_t, ncclResult_t* e) {
    ++queries;
    queries_after_abort += freed;
    *e = async;
    return ncclSuccess;
  }
  static ncclResult_t abort(ncclComm_t) {
    ++aborts;
    aborts_in_group += group_open;
    freed = true;  // ncclCommAbort frees the communicator
    return ncclSuccess;
  }
  static cudaError_t device_alloc(void** p, std::size_t n) { return *p = std::calloc(1, n), cudaSuccess; }
  static cudaError_t host_alloc(void** p, std::size_t n) { return *p = std::calloc(1, n), cudaSuccess; }
  static void device_free(void* p) noexcept { std::free(p); }
  static void host_free(void* p) noexcept { std::free(p); }
  static cudaError_t copy_async(void* d, void const* s, std::size_t n, cudaMemcpyKind, cudaStream_t) {
    ++copies;
    return std::memcpy(d, s, n), cudaSuccess;
  }
};
using hooks_t = tide::basic_nccl_hooks<fake>;
ncclComm_t const comm = reinterpret_cast<ncclComm_t>(0x1);
float buffer[4];

bool says(std::exception const& e, char const* what) { return std::string(e.what()).find(what) != std::string::npos; }

}  // namespace

// After an asynchronous error the hooks abort once; every later call throws "aborted" without
// querying, aborting or calling into the freed communicator.
TEST(NcclHooks, AnAbortedCommunicatorIsNeverTouchedAgain) {
  fake::reset();
  hooks_t h(comm, 2);
  h.all_reduce(1, buffer, 4);
  EXPECT_TRUE(h.check_progress());
  fake::async = ncclRemoteError;  // a peer died
  EXPECT_THROW(h.check_progress(), tide::nccl_error);
  EXPECT_TRUE(h.aborted());
  EXPECT_EQ(fake::aborts, 1);
  auto const collectives = fake::collectives;
  for (int i = 0; i < 3; ++i) {
    try {
      h.poll(false);
      FAIL() << "poll on an aborted communicator";
    } catch (tide::collective_error const& e) {
      EXPECT_TRUE(says(e, "the communicator was aborted")) << e.what();
    }
    EXPECT_THROW(h.poll(true), tide::collective_error);
    EXPECT_THROW(h.check_progress(), tide::collective_error);
    EXPECT_THROW(h({1, nullptr, tide::op_kind::reduce, false}), tide::collective_error);
    EXPECT_THROW(h.finish_step(), tide::collective_error);
    EXPECT_THROW(h.agree({nullptr, false}), tide::collective_error);
  }
  EXPECT_EQ(fake::aborts, 1);
  EXPECT_EQ(fake::queries_after_abort, 0);
  EXPECT_EQ(fake::collectives, collectives);
  h.abort();  // idempotent
  EXPECT_EQ(fake::aborts, 1);
}

// A call that stays ncclInProgress (a non-blocking communicator whose peer died) ends after the
// hooks' timeout; the abort comes after the hooks' group is closed, never inside it.
TEST(NcclHooks, InProgressIsBoundedAndTheAbortWaitsForTheGroup) {
  fake::reset();
  hooks_t h(comm, 2, 20ms);
  h.all_reduce(0, buffer, 4);
  fake::calls = ncclInProgress;
  fake::async = ncclInProgress;
  auto const begin = std::chrono::steady_clock::now();
  try {
    h({0, nullptr, tide::op_kind::reduce, false});
    FAIL() << "an endless ncclInProgress did not end";
  } catch (tide::collective_error const& e) {
    EXPECT_TRUE(says(e, "still in progress after 20 ms")) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 10s);
  EXPECT_TRUE(h.aborted());
  EXPECT_EQ(fake::aborts, 1);
  EXPECT_EQ(fake::aborts_in_group, 0);
  EXPECT_FALSE(fake::group_open);
}

// An asynchronous error found while the group is open: the group is closed first, then aborted.
TEST(NcclHooks, AnErrorInsideTheGroupClosesItBeforeTheAbort) {
  fake::reset();
  hooks_t h(comm, 1);
  h.all_gather(0, buffer, buffer, 1);
  fake::calls = ncclInProgress;
  fake::async = ncclSystemError;
  EXPECT_THROW(h({0, nullptr, tide::op_kind::gather, false}), tide::nccl_error);
  EXPECT_EQ(fake::aborts, 1);
  EXPECT_EQ(fake::aborts_in_group, 0);
  EXPECT_TRUE(h.aborted());
}

// Healthy: a failed step is agreed at its end (this rank's own flag comes back), a peer's failure
// too, and nothing is aborted. A hook makes only its registered calls: no flag traffic per hook.
TEST(NcclHooks, FailuresAreAgreedOnceAtTheStepsEnd) {
  fake::reset();
  hooks_t h(comm, 2);
  h.all_gather(0, buffer, buffer, 1).all_gather(1, buffer, buffer, 1);
  h({0, nullptr, tide::op_kind::gather, false});
  h({1, nullptr, tide::op_kind::gather, false});
  EXPECT_EQ(fake::collectives, 2);
  EXPECT_EQ(fake::copies, 0);
  // This rank failed after its last gather (in its backward): agreed at the end.
  h.agree({nullptr, true});
  EXPECT_EQ(fake::collectives, 3);
  try {
    h.finish_step();
    FAIL() << "a failed step was not reported";
  } catch (tide::collective_error const& e) {
    EXPECT_TRUE(says(e, "rank 3 failed during this step")) << e.what();
  }
  // A healthy step.
  h.agree({nullptr, false});
  EXPECT_NO_THROW(h.finish_step());
  // A peer (rank 5) failed: this healthy rank learns of it.
  fake::peer_flag = 6;
  h.agree({nullptr, false});
  try {
    h.finish_step();
    FAIL() << "a peer's failure was not reported";
  } catch (tide::collective_error const& e) {
    EXPECT_TRUE(says(e, "rank 5 failed during this step")) << e.what();
  }
  // Told again without a new agreement (a graph replay's captured agreement wrote the flag): read again.
  EXPECT_THROW(h.finish_step(), tide::collective_error);
  EXPECT_FALSE(h.aborted());
  EXPECT_EQ(fake::aborts, 0);
}
