#pragma once
//! \file
//! Timelines: each op's start and end per stream, as recorded by any backend.

#include <cstddef>
#include <cstdint>
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

//! What a backend records during one step. Capacity is reserved at setup; recording allocates
//! nothing in steady state.
struct timeline {
  std::vector<op_span> ops{};      //!< one interval per op run
  std::vector<wait_span> waits{};  //!< the blocking waits
  //! Empties it for the next step, keeping its capacity.
  void clear() noexcept {
    ops.clear();
    waits.clear();
  }
  //! Room for `n` op intervals and `n` waits, so that recording does not allocate.
  void reserve(std::size_t n) {
    ops.reserve(n);
    waits.reserve(n);
  }
};

}  // namespace tide
