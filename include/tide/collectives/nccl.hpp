#pragma once
//! \file The NCCL adapter for the executor's collective hooks: per layer, the NCCL calls to run
//! before its forward (`op_kind::gather`, e.g. all-gather of sharded weights) and after its
//! backward (`op_kind::collective`, e.g. all-reduce or reduce-scatter of its gradients). The
//! calls are enqueued on the hook's stream, the backend's communication stream, which the
//! schedule orders after the layer's backward (and before the next forward that needs a gather)
//! with events. Calls registered for one hook run as one NCCL group.
//!
//! Registration allocates; running a hook does not.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/core/op.hpp>
#include <tide/executor/context.hpp>

namespace tide {

//! An NCCL call failed; `result` is NCCL's code (`code`, the CUDA one, is cudaSuccess).
struct nccl_error : cuda_error {
  ncclResult_t result;
  nccl_error(ncclResult_t r, std::string const& call_text, std::string const& location)
      : cuda_error(result_name(r), ncclGetErrorString(r), call_text, location), result(r) {}

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

//! Checks an NCCL call; throws `tide::nccl_error` (a `tide::cuda_error`) naming the call, the
//! error and file:line.
#define TIDE_NCCL_CHECK(...) ::tide::detail::check_nccl((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

namespace tide {

//! One NCCL collective on device buffers. In-place calls pass the same pointer twice.
struct nccl_call {
  enum kind_t : std::uint8_t { all_reduce, reduce_scatter, all_gather } kind = all_reduce;
  void const* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  //!< elements: all-reduce: of each buffer; reduce-scatter: received; all-gather: sent
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;  //!< ignored by all-gather
};

//! The hooks: pass the same object as both the gather and the collective hook of
//! `executor::step`; it dispatches on `ctx.kind`.
class nccl_hooks {
 public:
  //! `comm` must outlive the hooks; `layers` is the stack's layer count.
  nccl_hooks(ncclComm_t comm, std::uint32_t layers) : comm_(comm), before_(layers), after_(layers) {}

  ncclComm_t comm() const noexcept { return comm_; }

  //! After layer `layer`'s backward: all-reduce `count` elements of `buffer` in place.
  nccl_hooks& all_reduce(std::uint32_t layer, void* buffer, std::size_t count, ncclDataType_t type = ncclFloat32,
                         ncclRedOp_t op = ncclSum) {
    return add(after_, layer, {nccl_call::all_reduce, buffer, buffer, count, type, op});
  }
  //! After layer `layer`'s backward: reduce `send` (ranks x `recv_count` elements) and keep this
  //! rank's `recv_count` elements in `recv`.
  nccl_hooks& reduce_scatter(std::uint32_t layer, void const* send, void* recv, std::size_t recv_count,
                             ncclDataType_t type = ncclFloat32, ncclRedOp_t op = ncclSum) {
    return add(after_, layer, {nccl_call::reduce_scatter, send, recv, recv_count, type, op});
  }
  //! Before layer `layer`'s forward: gather every rank's `send_count` elements into `recv`.
  nccl_hooks& all_gather(std::uint32_t layer, void const* send, void* recv, std::size_t send_count,
                         ncclDataType_t type = ncclFloat32) {
    return add(before_, layer, {nccl_call::all_gather, send, recv, send_count, type, ncclSum});
  }

  //! Enqueues the calls registered for `ctx.layer` and `ctx.kind` on `ctx.stream`.
  void operator()(collective_context<cudaStream_t> const& ctx) const {
    auto const& calls = (ctx.kind == op_kind::gather ? before_ : after_).at(ctx.layer);
    if (calls.empty()) return;
    TIDE_NCCL_CHECK(ncclGroupStart());
    // The group must be closed even when a call fails, or NCCL's group state leaks into the
    // next collective.
    try {
      for (auto const& c : calls) enqueue(c, ctx.stream);
    } catch (...) {
      static_cast<void>(ncclGroupEnd());
      throw;
    }
    TIDE_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  using list = std::vector<nccl_call>;
  nccl_hooks& add(std::vector<list>& where, std::uint32_t layer, nccl_call c) {
    if (layer >= where.size())
      throw collective_error("tide: nccl_hooks: layer " + std::to_string(layer) + " is beyond a stack of " +
                             std::to_string(where.size()) + " layers");
    where[layer].push_back(c);
    return *this;
  }
  void enqueue(nccl_call const& c, cudaStream_t s) const {
    switch (c.kind) {
      case nccl_call::all_reduce:
        TIDE_NCCL_CHECK(ncclAllReduce(c.send, c.recv, c.count, c.type, c.op, comm_, s));
        break;
      case nccl_call::reduce_scatter:
        TIDE_NCCL_CHECK(ncclReduceScatter(c.send, c.recv, c.count, c.type, c.op, comm_, s));
        break;
      case nccl_call::all_gather: TIDE_NCCL_CHECK(ncclAllGather(c.send, c.recv, c.count, c.type, comm_, s)); break;
    }
  }

  ncclComm_t comm_;
  std::vector<list> before_, after_;
};

}  // namespace tide
