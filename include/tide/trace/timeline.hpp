#pragma once
//! \file Timelines: each op's start and end per stream, as recorded by any backend.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <tide/core/op.hpp>

namespace tide {

//! One op's execution interval, in microseconds from the step's start.
struct op_span {
  std::uint32_t op = 0;
  stream_role stream = stream_role::compute;
  double begin_us = 0;
  double end_us = 0;
};

//! Time a stream spent blocked on an event recorded by another stream.
struct wait_span {
  stream_role stream = stream_role::compute;
  std::uint32_t event = 0;
  double begin_us = 0;
  double end_us = 0;
};

//! What a backend records during one step. Capacity is reserved at setup; recording allocates
//! nothing in steady state.
struct timeline {
  std::vector<op_span> ops;
  std::vector<wait_span> waits;
  void clear() noexcept {
    ops.clear();
    waits.clear();
  }
  void reserve(std::size_t n) {
    ops.reserve(n);
    waits.reserve(n);
  }
};

}  // namespace tide
