#pragma once
//! \file
//! Timelines: each op's start and end per stream, as recorded by any backend.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <tide/core/op.hpp>

namespace tide {

//! One op's execution interval, in microseconds from the step's start.
struct op_span {
  std::uint32_t op = 0;                       //!< the op's index in the schedule's program
  stream_role stream = stream_role::compute;  //!< the stream it ran on
  double begin_us = 0;                        //!< when it started
  double end_us = 0;                          //!< when it ended
};

//! Time a stream spent blocked on an event recorded by another stream.
struct wait_span {
  stream_role stream = stream_role::compute;  //!< the stream that waited
  std::uint32_t event = 0;                    //!< the event it waited for
  double begin_us = 0;                        //!< when the wait began
  double end_us = 0;                          //!< when the event had been reached
};

//! When the turn (`tide::turn`: head, loss, seed) ran, in microseconds from the step's start.
struct turn_span {
  double begin_us = 0;  //!< when it started (the last forward's interval ends here)
  double end_us = 0;    //!< when it ended
};

//! What a backend records during one step. Capacity is reserved at setup; recording allocates
//! nothing in steady state.
struct timeline {
  std::vector<op_span> ops{};      //!< one interval per op run
  std::vector<wait_span> waits{};  //!< the blocking waits
  //! The turn, on the compute stream, where the backend has a step clock the executor reads
  //! (the host backend); none when the step had no turn, or on other backends (CUDA: its time is
  //! then in the last forward's interval).
  std::optional<turn_span> turn{};
  //! Empties it for the next step, keeping its capacity.
  void clear() noexcept {
    ops.clear();
    waits.clear();
    turn.reset();
  }
  //! Room for `n` op intervals and `n` waits, so that recording does not allocate.
  void reserve(std::size_t n) {
    ops.reserve(n);
    waits.reserve(n);
  }
};

}  // namespace tide
