#pragma once
//! \file
//! Exception types thrown by tide. Every message names what was wrong.

#include <cstddef>
#include <stdexcept>
#include <string>

namespace tide {

//! Base of every error tide throws.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! A stack and strategy that cannot form a valid schedule, or an op program that fails the
//! checker.
struct schedule_error : error {
  using error::error;
};

//! A cost table, calibration request or machine model that is invalid or does not describe the
//! schedule it is used with.
struct cost_model_error : error {
  using error::error;
};

//! An arena request exceeds the budget the backend was given (the bytes it may hold at once).
struct out_of_memory : error {
  std::size_t requested{};  //!< Bytes the failing request needed.
  std::size_t budget{};     //!< Bytes the backend may hold at once.
  //! `what`, followed by the bytes needed (`req`) and the budget (`cap`).
  out_of_memory(std::string const& what, std::size_t req, std::size_t cap)
      : error(what + ": needs " + std::to_string(req) + " bytes, budget is " + std::to_string(cap) +
              " bytes"),
        requested(req),
        budget(cap) {}
  //! The same failure with `context` appended (what in the arena takes the memory).
  out_of_memory(out_of_memory const& e, std::string const& context)
      : error(std::string(e.what()) + context), requested(e.requested), budget(e.budget) {}
};

//! A storage transfer or the storage file's setup failed: the message names the file (its
//! directory: the file itself is unlinked), the bytes and the system's reason.
struct storage_error : error {
  int code = 0;  //!< the `errno` value (0: not a system error)
  //! `what` as the message, `err` the `errno` value.
  storage_error(std::string const& what, int err) : error(what), code(err) {}
};

//! A user lambda asked for a slot that the layer does not save, or misused one it does.
struct slot_error : error {
  using error::error;
};

//! A debug check caught a write past a slot, or a read of a slot whose prefetch had not completed.
struct debug_check_error : error {
  using error::error;
};

//! A collective adapter failed (MPI; NCCL's `nccl_error` derives from it).
struct collective_error : error {
  using error::error;
};

}  // namespace tide
