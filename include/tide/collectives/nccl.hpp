#pragma once
//! \file
//! The NCCL adapter for the executor's collective hooks: per layer, the NCCL calls to run
//! before its forward (`op_kind::gather`, e.g. all-gather of sharded weights) and after its
//! backward (`op_kind::reduce`, e.g. all-reduce or reduce-scatter of its gradients). The
//! calls are enqueued on the hook's stream, the backend's communication stream, which the
//! schedule orders after the layer's backward (and before the next forward that needs a gather)
//! with events. Calls registered for one hook run as one NCCL group.
//!
//! Registration allocates; running a hook does not.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/backends/cuda/detail/device_guard.hpp>
#include <tide/backends/cuda/detail/sync_wait.hpp>
#include <tide/core/op.hpp>
#include <tide/executor/context.hpp>

namespace tide {

//! An NCCL call failed; `result` is NCCL's code.
struct nccl_error : collective_error {
  ncclResult_t result{};  //!< NCCL's code, e.g. `ncclUnhandledCudaError`
  std::string call{};     //!< the call as written, e.g. `ncclAllReduce(...)`
  std::string where{};    //!< file:line of the call, or the adapter that made it
  //! Error `r` of the call `call_text`, made at `location` (file:line, or the adapter's name).
  nccl_error(ncclResult_t r, std::string const& call_text, std::string const& location)
      : collective_error(cuda_error::message(result_name(r), ncclGetErrorString(r), call_text, location, false)),
        result(r),
        call(call_text),
        where(location) {}

 private:
  static char const* result_name(ncclResult_t r) noexcept {
    switch (r) {
      case ncclSuccess: return "ncclSuccess";
      case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
      case ncclSystemError: return "ncclSystemError";
      case ncclInternalError: return "ncclInternalError";
      case ncclInvalidArgument: return "ncclInvalidArgument";
      case ncclInvalidUsage: return "ncclInvalidUsage";
      case ncclRemoteError: return "ncclRemoteError";
      case ncclInProgress: return "ncclInProgress";
      default: return "ncclResult";
    }
  }
};

namespace detail {
inline void check_nccl(ncclResult_t r, char const* call, char const* file, int line) {
  if (r != ncclSuccess) [[unlikely]]
    throw nccl_error(r, call, std::string(file) + ":" + std::to_string(line));
}
}  // namespace detail

}  // namespace tide

//! Checks an NCCL call; throws `tide::nccl_error` (a `tide::collective_error`) naming the call, the
//! error and file:line.
#define TIDE_NCCL_CHECK(...) ::tide::detail::check_nccl((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

namespace tide {

//! One NCCL collective on device buffers. In-place calls pass the same pointer twice.
struct nccl_call {
  //! The collective: `all_reduce`, `reduce_scatter` or `all_gather`.
  enum kind_t : std::uint8_t { all_reduce, reduce_scatter, all_gather } kind = all_reduce;  //!< which collective
  void const* send = nullptr;  //!< the send buffer, on the device
  void* recv = nullptr;        //!< the receive buffer, on the device (`send` again when in place)
  std::size_t count = 0;  //!< elements: all-reduce: of each buffer; reduce-scatter: received; all-gather: sent
  ncclDataType_t type = ncclFloat32;  //!< the element type
  ncclRedOp_t op = ncclSum;  //!< ignored by all-gather
};

namespace detail {
//! The NCCL and CUDA calls `basic_nccl_hooks` makes, in one place, so that a test can run the
//! hooks' logic (aborts, timeouts, groups) against a fake without a GPU.
struct nccl_api {
  static ncclResult_t user_rank(ncclComm_t c, int* rank) { return ncclCommUserRank(c, rank); }
  static ncclResult_t cu_device(ncclComm_t c, int* device) { return ncclCommCuDevice(c, device); }
  //! The communicator's device is current for the scope (flags are allocated on it).
  static device_guard device_scope(int device) { return device_guard(device); }
  static ncclResult_t group_start() { return ncclGroupStart(); }
  static ncclResult_t group_end() { return ncclGroupEnd(); }
  static ncclResult_t all_reduce(void const* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                 cudaStream_t st) {
    return ncclAllReduce(s, r, n, t, op, c, st);
  }
  static ncclResult_t reduce_scatter(void const* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                     cudaStream_t st) {
    return ncclReduceScatter(s, r, n, t, op, c, st);
  }
  static ncclResult_t all_gather(void const* s, void* r, std::size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    return ncclAllGather(s, r, n, t, c, st);
  }
  static ncclResult_t send(void const* s, std::size_t n, int peer, ncclComm_t c, cudaStream_t st) {
    return ncclSend(s, n, ncclUint8, peer, c, st);
  }
  static ncclResult_t recv(void* r, std::size_t n, int peer, ncclComm_t c, cudaStream_t st) { return ncclRecv(r, n, ncclUint8, peer, c, st); }
  static ncclResult_t count(ncclComm_t c, int* n) { return ncclCommCount(c, n); }
  static ncclResult_t async_error(ncclComm_t c, ncclResult_t* e) { return ncclCommGetAsyncError(c, e); }
  static ncclResult_t abort(ncclComm_t c) { return ncclCommAbort(c); }
  static cudaError_t device_alloc(void** p, std::size_t n) { return cudaMalloc(p, n); }
  static cudaError_t host_alloc(void** p, std::size_t n) { return cudaHostAlloc(p, n, cudaHostAllocPortable); }
  static void device_free(void* p) noexcept { static_cast<void>(cudaFree(p)); }
  static void host_free(void* p) noexcept { static_cast<void>(cudaFreeHost(p)); }
  static cudaError_t copy_async(void* d, void const* s, std::size_t n, cudaMemcpyKind k, cudaStream_t st) {
    return cudaMemcpyAsync(d, s, n, k, st);
  }
};
}  // namespace detail

namespace detail {

//! What NCCL's collective hooks and its pipeline transport share on one communicator: the
//! step-end failure agreement, aborts, progress polling and bounded waits for `ncclInProgress`,
//! and the NCCL group they open (see `basic_nccl_hooks` for the contract; `name` is the adapter's
//! name in messages).
template <class Api>
class basic_nccl_agreement {
 public:
  //! `comm` must outlive the adapter. Allocates the failure flag (device and pinned host) on the
  //! communicator's device. `progress_timeout` bounds the wait for a call that returned
  //! `ncclInProgress` (then the communicator is aborted).
  basic_nccl_agreement(ncclComm_t comm, std::chrono::milliseconds progress_timeout, char const* name)
      : comm_(comm), progress_timeout_(progress_timeout), name_(name) {
    TIDE_NCCL_CHECK(Api::user_rank(comm_, &rank_));
    int device = 0;
    TIDE_NCCL_CHECK(Api::cu_device(comm_, &device));
    [[maybe_unused]] auto const on = Api::device_scope(device);
    void* d = nullptr;
    TIDE_CUDA_CHECK(Api::device_alloc(&d, sizeof(int)));
    device_flag_ = static_cast<int*>(d);
    void* h = nullptr;
    if (auto const e = Api::host_alloc(&h, 2 * sizeof(int)); e != cudaSuccess) {
      Api::device_free(device_flag_);
      detail::throw_cuda_error(e, "cudaHostAlloc(&host_flags_, 2 * sizeof(int), cudaHostAllocPortable)", __FILE__,
                               __LINE__);
    }
    host_flags_ = static_cast<int*>(h);
    host_flags_[0] = host_flags_[1] = 0;
  }
  basic_nccl_agreement(basic_nccl_agreement const&) = delete;
  basic_nccl_agreement& operator=(basic_nccl_agreement const&) = delete;
  ~basic_nccl_agreement() {
    Api::device_free(device_flag_);
    Api::host_free(host_flags_);
  }

  //! The communicator the calls run on.
  ncclComm_t comm() const noexcept { return comm_; }
  //! This process's rank in the communicator.
  int rank() const noexcept { return rank_; }
  //! True once the adapter aborted the communicator: it is freed; do not destroy it.
  [[nodiscard]] bool aborted() const noexcept { return aborted_; }
  //! Aborts the communicator now (after the adapter's group, when one is open); once only.
  void abort() noexcept {
    if (aborted_) return;
    if (in_group_) {
      abort_pending_ = true;
      return;
    }
    static_cast<void>(Api::abort(comm_));
    aborted_ = true;
  }

  //! The step-end agreement (the executor calls it once per step, after all of the step's work):
  //! all-reduces (max) whether this rank's step failed, on `ctx.stream`; `finish_step()` reads
  //! the result once the step has synchronized.
  void agree(step_end_context<cudaStream_t> const& ctx) {
    throw_if_aborted();
    int* const sent = host_flags_;  // [sent, received]: pinned, stable until the step syncs
    sent[0] = ctx.step_failed ? rank_ + 1 : 0;
    sent[1] = 0;
    agreed_ = false;  // set once the whole agreement is enqueued: a partial one is not read
    TIDE_CUDA_CHECK(Api::copy_async(device_flag_, sent, sizeof(int), cudaMemcpyHostToDevice, ctx.stream));
    check_nccl_call(Api::all_reduce(device_flag_, device_flag_, 1, ncclInt32, ncclMax, comm_, ctx.stream),
                    "ncclAllReduce (step-end failure agreement)");
    TIDE_CUDA_CHECK(Api::copy_async(sent + 1, device_flag_, sizeof(int), cudaMemcpyDeviceToHost, ctx.stream));
    agreed_ = true;
  }

  //! After the step's synchronization: throws `collective_error` when the step-end agreement says
  //! a rank failed (every rank then throws, none reports success), or when the communicator was
  //! aborted. Also after a graph replay of a step: its agreement was captured with it.
  void finish_step() {
    throw_if_aborted();
    if (!agreed_) return;
    if (int const worst = host_flags_[1]; worst > 0)
      throw collective_error("tide: " + std::string(name_) + ": rank " + std::to_string(worst - 1) + " failed during this step; rank " +
                             std::to_string(rank_) + " completed its collectives but their results are not to be used");
  }

  //! A `cuda_backend::watcher`: `backend.watch([&a](bool t) { a.poll(t); })`. Polls the
  //! communicator while the backend waits; once the wait has timed out, aborts the communicator
  //! (its kernels stop, the streams drain) and throws `collective_error`.
  void poll(bool timed_out) {
    throw_if_aborted();
    if (!timed_out) {
      check_progress();
      return;
    }
    abort();
    throw collective_error("tide: " + std::string(name_) + ": rank " + std::to_string(rank_) +
                           " timed out waiting for its collectives (a peer may have died); the communicator was "
                           "aborted and must be recreated");
  }

  //! Polls the communicator's asynchronous error: on an error, aborts the communicator and throws
  //! `nccl_error`. Returns false while a non-blocking operation is still in progress.
  bool check_progress() {
    throw_if_aborted();
    ncclResult_t async = ncclSuccess;
    TIDE_NCCL_CHECK(Api::async_error(comm_, &async));
    if (async == ncclSuccess) return true;
    if (async == ncclInProgress) return false;
    abort();  // stops this rank's NCCL kernels, so streams drain
    throw nccl_error(async, "ncclCommGetAsyncError(comm) (the communicator was aborted)", std::string("tide::") + name_);
  }

 protected:
  void throw_if_aborted() const {
    if (aborted_)
      throw collective_error("tide: " + std::string(name_) + ": rank " + std::to_string(rank_) +
                             ": the communicator was aborted (after an NCCL error or a timeout); recreate it and the "
                             "tide::" + name_ + " (and do not ncclCommDestroy the aborted one)");
  }
  //! Opens the adapter's NCCL group.
  void open_group() {
    check_nccl_call(Api::group_start(), "ncclGroupStart()");
    in_group_ = true;
  }
  //! Closes it; an abort asked for meanwhile runs once it is closed.
  void end_group() {
    in_group_ = false;
    auto const r = Api::group_end();
    if (std::exchange(abort_pending_, false)) abort();
    check_nccl_call(r, "ncclGroupEnd()");
  }
  //! Closes the adapter's group after a failure inside it, then runs an abort asked for meanwhile.
  void close_group() noexcept {
    if (!in_group_) return;
    in_group_ = false;
    static_cast<void>(Api::group_end());
    if (std::exchange(abort_pending_, false)) abort();
  }
  //! ncclInProgress is success-in-waiting on a non-blocking communicator: poll until it settles,
  //! for at most `progress_timeout` (then abort, and throw).
  void check_nccl_call(ncclResult_t r, char const* call) {
    if (r == ncclInProgress) {
      using clock = std::chrono::steady_clock;
      auto const begin = clock::now();
      auto const deadline = detail::deadline_after<clock>(begin, progress_timeout_);
      while (!check_progress()) {
        auto const now = clock::now();
        if (now > deadline) {
          abort();
          throw collective_error("tide: " + std::string(name_) + ": rank " + std::to_string(rank_) + ": " + call +
                                 " was still in progress after " + std::to_string(progress_timeout_.count()) +
                                 " ms (a peer may have died); the communicator was aborted and must be recreated");
        }
        detail::pause_while_waiting(std::chrono::duration_cast<std::chrono::microseconds>(now - begin));
      }
      return;
    }
    if (r != ncclSuccess) throw nccl_error(r, call, std::string("tide::") + name_);
  }
  [[nodiscard]] bool in_group() const noexcept { return in_group_; }

  ncclComm_t comm_;
  std::chrono::milliseconds progress_timeout_;
  char const* name_;
  int rank_ = 0;

 private:
  int* device_flag_ = nullptr;   // the step-end agreement's flag
  int* host_flags_ = nullptr;    // sent, received (pinned)
  bool agreed_ = false;          // an agreement was enqueued (or captured): finish_step reads it
  bool aborted_ = false;         // the communicator was aborted (and freed)
  bool in_group_ = false;        // between the adapter's ncclGroupStart and ncclGroupEnd
  bool abort_pending_ = false;   // an abort asked for inside the group
};

}  // namespace detail

//! The hooks: pass the same object as both hooks, by reference,
//! `tide::hooks{.before_forward = std::ref(h), .before_backward = std::ref(h), .after_backward = std::ref(h)}`
//! (or only those the schedule makes room for); it dispatches on `ctx.kind` (`gather`, `regather`
//! or `reduce`). `tide::nccl_hooks` is `basic_nccl_hooks<>`; `Api` is for tests.
//!
//! Failure agreement: a rank whose lambda threw still makes the same NCCL calls as its peers (the
//! executor calls the hooks told `ctx.step_failed`), so nobody hangs. Once per step, after all of
//! the step's work, the executor calls `agree(ctx)` on the communication stream: one all-reduce
//! (max) of an int saying whether this rank's step failed, so a failure after the step's last
//! collective (a schedule with gathers only, a fault in the last hook) is agreed too. After the
//! step has synchronized, the executor calls `finish_step()`, which throws `collective_error` on
//! every rank when any rank failed: the step's collective results are then not to be used. A step
//! replayed from a CUDA graph replays its agreement: synchronize, then call `finish_step()`.
//!
//! Dead peers: `check_progress()` polls the communicator's asynchronous error; on an error it
//! aborts the communicator (so the NCCL kernels stop spinning) and throws `nccl_error`. Register
//! it with the CUDA backend (`cuda_backend::watch`), whose synchronization polls it while it
//! waits, with a timeout. Non-blocking communicators are supported: `ncclInProgress` from a call
//! is waited out with the same polling, for at most the hooks' `progress_timeout`.
//!
//! Aborted: once the hooks abort the communicator (`ncclCommAbort` frees it), every later call
//! (a hook, `finish_step`, `poll`, `check_progress`) throws `collective_error` without touching
//! it; `aborted()` says so, and the owner must not `ncclCommDestroy` it. An abort requested while
//! the hooks' own NCCL group is open waits until the group is closed.
template <class Api = detail::nccl_api>
class basic_nccl_hooks : public detail::basic_nccl_agreement<Api> {
  using base = detail::basic_nccl_agreement<Api>;

 public:
  //! `comm` must outlive the hooks; `layer_count` is the stack's. Allocates the failure flag
  //! (device and pinned host) on the communicator's device. `progress_timeout` bounds the wait
  //! for a call that returned `ncclInProgress` (then the communicator is aborted).
  basic_nccl_hooks(ncclComm_t comm, std::uint32_t layer_count,
                   std::chrono::milliseconds progress_timeout = std::chrono::minutes(5))
      : base(comm, progress_timeout, "nccl_hooks"), before_(layer_count), before_backward_(layer_count), after_(layer_count) {}

  //! After layer `layer`'s backward: all-reduce `count` elements of `buffer` in place.
  basic_nccl_hooks& all_reduce(std::uint32_t layer, void* buffer, std::size_t count, ncclDataType_t type = ncclFloat32,
                               ncclRedOp_t op = ncclSum) {
    return add(after_, layer, {nccl_call::all_reduce, buffer, buffer, count, type, op});
  }
  //! After layer `layer`'s backward: reduce `send` (ranks x `recv_count` elements) and keep this
  //! rank's `recv_count` elements in `recv`.
  basic_nccl_hooks& reduce_scatter(std::uint32_t layer, void const* send, void* recv, std::size_t recv_count,
                                   ncclDataType_t type = ncclFloat32, ncclRedOp_t op = ncclSum) {
    return add(after_, layer, {nccl_call::reduce_scatter, send, recv, recv_count, type, op});
  }
  //! Before layer `layer`'s forward: gather every rank's `send_count` elements into `recv`.
  basic_nccl_hooks& all_gather(std::uint32_t layer, void const* send, void* recv, std::size_t send_count,
                               ncclDataType_t type = ncclFloat32) {
    return add(before_, layer, {nccl_call::all_gather, send, recv, send_count, type, ncclSum});
  }
  //! Before layer `layer`'s recompute and backward: gather every rank's `send_count` elements into
  //! `recv` again (FSDP and ZeRO-3 free the gathered weights after the forward). Two receive
  //! buffers serve gathers and regathers alike: the gather of layer l may use buffer l mod 2 and
  //! its regather buffer (l + 1) mod 2 (without gathers before forward: (L - 1 - l) mod 2), since
  //! each collective of the sequence waits for the last user of the one two before it.
  basic_nccl_hooks& all_gather_before_backward(std::uint32_t layer, void const* send, void* recv, std::size_t send_count,
                                               ncclDataType_t type = ncclFloat32) {
    return add(before_backward_, layer, {nccl_call::all_gather, send, recv, send_count, type, ncclSum});
  }

  //! Enqueues the calls registered for `ctx.layer` and `ctx.kind` on `ctx.stream` as one group.
  //! Called even after this rank's step failed (`ctx.step_failed`), so that its peers are not
  //! left waiting; the step-end agreement tells them.
  void operator()(collective_context<cudaStream_t> const& ctx) {
    auto const& calls = (ctx.kind == op_kind::gather ? before_ : ctx.kind == op_kind::regather ? before_backward_ : after_).at(ctx.layer);
    if (calls.empty()) return;
    this->throw_if_aborted();
    // The group must be closed even when a call fails, or NCCL's group state leaks into the
    // next collective; an abort asked for meanwhile runs once it is closed.
    this->open_group();
    try {
      for (auto const& c : calls) enqueue(c, ctx.stream);
    } catch (...) {
      this->close_group();
      throw;
    }
    this->end_group();
  }

 private:
  using list = std::vector<nccl_call>;
  basic_nccl_hooks& add(std::vector<list>& where, std::uint32_t layer, nccl_call c) {
    if (layer >= where.size())
      throw collective_error("tide: nccl_hooks: layer " + std::to_string(layer) + " is beyond a stack of " +
                             std::to_string(where.size()) + " layers");
    where[layer].push_back(c);
    return *this;
  }
  void enqueue(nccl_call const& c, cudaStream_t s) {
    auto const comm = this->comm_;
    switch (c.kind) {
      case nccl_call::all_reduce:
        this->check_nccl_call(Api::all_reduce(c.send, c.recv, c.count, c.type, c.op, comm, s), "ncclAllReduce");
        break;
      case nccl_call::reduce_scatter:
        this->check_nccl_call(Api::reduce_scatter(c.send, c.recv, c.count, c.type, c.op, comm, s), "ncclReduceScatter");
        break;
      case nccl_call::all_gather:
        this->check_nccl_call(Api::all_gather(c.send, c.recv, c.count, c.type, comm, s), "ncclAllGather");
        break;
    }
  }

  std::vector<list> before_, before_backward_, after_;
};

//! The NCCL hooks on the real NCCL and CUDA runtime.
using nccl_hooks = basic_nccl_hooks<>;

}  // namespace tide
