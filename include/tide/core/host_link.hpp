#pragma once
//! \file
//! `tide::host_link`: the link between host and device memory, the one link type of tide: the
//! host backend paces copies with it, the sim backend and the planner cost copies with it. Each
//! direction (`tide::link_direction`) is a latency plus bytes over bandwidth; a full-duplex link
//! (PCIe, NVLink-C2C) runs an offload and a prefetch at once at full speed each.

#include <cstddef>

namespace tide {

//! One direction of the host link; `time_us(bytes)` is what one copy takes.
struct link_direction {
  double bytes_per_second = 0;  //!< 0: unpaced (as fast as memcpy)
  double latency_us = 0;        //!< fixed cost of every copy, in microseconds
  //! Microseconds to copy `bytes`: `latency_us + bytes / bytes_per_second` (just `latency_us` when unpaced).
  [[nodiscard]] constexpr double time_us(std::size_t bytes) const noexcept {
    return bytes_per_second > 0 ? latency_us + 1e6 * static_cast<double>(bytes) / bytes_per_second : latency_us;
  }
};

//! The host link: one `link_direction` each way.
struct host_link {
  link_direction d2h{};     //!< device to host (offloads)
  link_direction h2d{};     //!< host to device (prefetches)
  bool full_duplex = true;  //!< false: both directions share one link, so copies serialize
  //! Both directions at `bytes_per_second` with `latency_us`.
  [[nodiscard]] static constexpr host_link symmetric(double bytes_per_second, double latency_us = 0, bool duplex = true) noexcept {
    return {{bytes_per_second, latency_us}, {bytes_per_second, latency_us}, duplex};
  }
};

}  // namespace tide
