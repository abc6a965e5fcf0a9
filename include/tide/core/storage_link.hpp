#pragma once
//! \file
//! `tide::storage_link`: the path between pinned host memory and the storage tier's file (an NVMe
//! drive through io_uring, or GPUDirect Storage). The sim backend and the planner cost stores and
//! loads with it; each direction is a latency plus bytes over bandwidth, as `host_link`'s.

#include <cstddef>

#include <tide/core/host_link.hpp>

namespace tide {

//! The storage path: one `link_direction` each way, and whether a write and a read run at once
//! at full speed each (an NVMe drive shares its flash between them: by default they serialize).
struct storage_link {
  link_direction write{};    //!< host to file (stores)
  link_direction read{};     //!< file to host (loads)
  bool full_duplex = false;  //!< true: a store and a load proceed at once at full speed each
  //! True when neither direction has a bandwidth (transfers cost only their latency).
  [[nodiscard]] constexpr bool unpaced() const noexcept { return write.bytes_per_second <= 0 && read.bytes_per_second <= 0; }
};

}  // namespace tide
