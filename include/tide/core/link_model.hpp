#pragma once
//! \file
//! A link between host and device memory, one direction: latency plus bytes over bandwidth.
//! The host backend paces copies with it; the sim backend and the planner cost copies with it.

#include <cstddef>

namespace tide {

//! One direction of a host-device link; `seconds(bytes)` is the time one copy takes.
struct link_model {
  double bytes_per_second = 0;  //!< 0: unpaced (as fast as memcpy)
  double latency_s = 0;         //!< fixed cost of every copy, in seconds
  //! Time to copy `bytes`: `latency_s + bytes / bytes_per_second` (just `latency_s` when unpaced).
  constexpr double seconds(std::size_t bytes) const noexcept {
    return bytes_per_second > 0 ? latency_s + static_cast<double>(bytes) / bytes_per_second : latency_s;
  }
};

}  // namespace tide
