#pragma once
//! \file
//! Collectives across processes through MPI, for the host backend's communication stream.
//!
//! Every call checks its return code (the communicator is switched to MPI_ERRORS_RETURN) and
//! throws `tide::collective_error` naming the call, the rank and MPI's error string. Before
//! each reduction the ranks agree on whether any of them failed in this step, so a rank whose
//! step failed tells its peers instead of leaving them blocked in MPI_Allreduce.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <tide/core/error.hpp>
#include <tide/core/op.hpp>

namespace tide::mpi {

namespace detail {
inline std::string error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}
}  // namespace detail

//! Throws `collective_error` when an MPI call failed.
inline void check(int code, char const* call, int rank) {
  if (code != MPI_SUCCESS)
    throw collective_error(std::string("tide::mpi: ") + call + " failed on rank " + std::to_string(rank) + ": " +
                           detail::error_string(code));
}

//! Initializes MPI with the thread level tide needs (the communication stream's worker thread
//! makes the calls while the main thread waits) and finalizes it on destruction.
class environment {
 public:
  //! Initializes MPI with `MPI_THREAD_SERIALIZED` and has `MPI_COMM_WORLD` return errors, so that they throw.
  environment(int& argc, char**& argv) {
    int provided = 0;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread", -1);
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw collective_error("tide::mpi: the MPI library does not provide MPI_THREAD_SERIALIZED");
    }
    if (int const rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN); rc != MPI_SUCCESS) {
      MPI_Finalize();
      check(rc, "MPI_Comm_set_errhandler", -1);
    }
  }
  environment(environment const&) = delete;
  environment& operator=(environment const&) = delete;
  ~environment() { MPI_Finalize(); }
};

//! The MPI datatype of `T` (`float`, `double`, `int` or `unsigned long long`).
template <class T>
MPI_Datatype datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, int>) return MPI_INT;
  else if constexpr (std::is_same_v<T, unsigned long long>) return MPI_UNSIGNED_LONG_LONG;
  else static_assert(sizeof(T) == 0, "tide::mpi: no MPI datatype for this element type");
}

//! Checked collectives on an MPI communicator, with a failure agreement before each reduction.
class communicator {
 public:
  //! Wraps `comm` (not owned); its errors throw only if it returns them (`MPI_ERRORS_RETURN`).
  explicit communicator(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1);
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", rank_);
  }
  //! This process's rank in the communicator.
  int rank() const noexcept { return rank_; }
  //! How many ranks the communicator has (what `allreduce` divides by).
  int size() const noexcept { return size_; }
  //! The MPI handle, for calls not wrapped here.
  MPI_Comm native() const noexcept { return comm_; }

  //! Agrees on whether any rank failed: returns the highest failed rank, or -1.
  int agree_on_failure(bool failed) const {
    int mine = failed ? rank_ : -1, worst = -1;
    check(MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, comm_), "MPI_Allreduce (failure agreement)", rank_);
    return worst;
  }

  //! In-place sum across ranks, divided by the number of ranks when `average` (floating point
  //! only). `step_failed`
  //! comes from the hook's context: a failed rank still takes part in the agreement, and every
  //! rank then throws rather than reducing half a step's data.
  template <class T>
  void allreduce(std::span<T> data, bool step_failed, std::uint32_t layer, bool average = true) const {
    if (int const failed = agree_on_failure(step_failed); failed >= 0)
      throw collective_error("tide::mpi: rank " + std::to_string(failed) + " failed during this step; rank " +
                             std::to_string(rank_) + " abandons the all-reduce of layer " + std::to_string(layer));
    if (data.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw collective_error("tide::mpi: the all-reduce of layer " + std::to_string(layer) + " has " +
                             std::to_string(data.size()) + " elements, more than MPI's int count allows: split it");
    check(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), datatype<T>(), MPI_SUM, comm_),
          "MPI_Allreduce", rank_);
    if constexpr (std::is_floating_point_v<T>) {  // an integer mean would truncate: integers are summed
      if (average)
        for (auto& x : data) x /= static_cast<T>(size_);
    }
  }

  //! The after-backward hook of a data-parallel step (`tide::hooks{.after_backward = ...}`):
  //! all-reduces what `grads(layer)` returns (a span, or a range of spans), and agrees with the peers at the step's end (see
  //! `gradient_hook_t`).
  template <class Grads>
  auto gradient_hook(Grads grads) const;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

//! What `communicator::gradient_hook` returns: the reduce hook, plus the step-end agreement (the
//! executor calls `agree` once per step after all of its work, `finish_step` after the
//! synchronization), so a failure after the last all-reduce is agreed too and every rank throws.
template <class Grads>
struct gradient_hook_t {
  communicator const* comm = nullptr;  //!< the communicator (outlives the hook)
  Grads grads{};                       //!< `grads(layer)`: the span to all-reduce after its backward
  int failed_rank = -1;                //!< the step-end agreement's result: the highest failed rank, or -1

  //! On `op_kind::reduce`: all-reduces `grads(ctx.layer)`, a `std::span` or a range of them.
  template <class Ctx>
  void operator()(Ctx const& ctx) const {
    if (ctx.kind != op_kind::reduce) return;
    auto&& g = grads(ctx.layer);
    if constexpr (requires { std::remove_cvref_t<decltype(g)>::extent; }) {
      comm->allreduce(g, ctx.step_failed, ctx.layer);
    } else {
      for (auto part : g) comm->allreduce(part, ctx.step_failed, ctx.layer);
    }
  }
  //! The step-end agreement, on the communication stream: has any rank's step failed?
  template <class Ctx>
  void agree(Ctx const& ctx) {
    failed_rank = comm->agree_on_failure(ctx.step_failed);
  }
  //! After the synchronization: throws `collective_error` on every rank when one failed.
  void finish_step() {
    if (auto const r = std::exchange(failed_rank, -1); r >= 0)
      throw collective_error("tide::mpi: rank " + std::to_string(r) + " failed during this step; rank " +
                             std::to_string(comm->rank()) + "'s gradients are not to be used");
  }
};

template <class Grads>
auto communicator::gradient_hook(Grads grads) const {
  return gradient_hook_t<Grads>{this, std::move(grads)};
}

}  // namespace tide::mpi
