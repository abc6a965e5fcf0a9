#pragma once
//! \file Buffer types: how storage is provided. A device arena holds kept activations and the
//! transient regions; a ring of staging buffers receives prefetches; a pinned host arena holds
//! offloaded data.

#include <cstddef>
#include <cstdint>

namespace tide {

struct buffer_spec {
  std::uint32_t staging_buffers = 2;   //!< device buffers that receive prefetched layers
  std::size_t device_alignment = 256;  //!< every device region starts on this boundary
  std::size_t host_alignment = 64;     //!< every pinned host region starts on this boundary
  std::size_t guard_bytes = 0;         //!< bytes after each device slot checked by debug runs
  //! Forward-only regions (offload sources, forward remat scratch) and backward-only regions
  //! (staging ring, recompute scratch) share addresses; backward's first use waits for forward's
  //! last copy. Saves memory, may expose the tail of the last offload.
  bool share_phase_regions = true;
};

//! A ring of `N` device staging buffers, each sized for one layer's offloaded slots.
template <std::uint32_t N>
struct staging_ring {
  static constexpr std::uint32_t buffers = N;
};

//! The device arena: region alignment, guard bytes after each slot, and phase sharing.
template <std::size_t Alignment = 256, std::size_t GuardBytes = 0, bool SharePhases = true>
struct device_arena {
  static_assert(Alignment > 0 && (Alignment & (Alignment - 1)) == 0,
                "tide::device_arena<Alignment>: the alignment must be a power of two");
  static constexpr std::size_t alignment = Alignment;
  static constexpr std::size_t guard_bytes = GuardBytes;
  static constexpr bool share_phase_regions = SharePhases;
};

//! The pinned host arena that receives offloaded slots.
template <std::size_t Alignment = 64>
struct pinned_arena {
  static_assert(Alignment > 0 && (Alignment & (Alignment - 1)) == 0,
                "tide::pinned_arena<Alignment>: the alignment must be a power of two");
  static constexpr std::size_t alignment = Alignment;
};

template <class Staging = staging_ring<2>, class Device = device_arena<>, class Host = pinned_arena<>>
struct buffers {
  using tide_buffers_tag = void;
  static constexpr buffer_spec spec() {
    return {Staging::buffers, Device::alignment, Host::alignment, Device::guard_bytes,
            Device::share_phase_regions};
  }
};

//! Buffers with 64 guard bytes after every slot, for debug runs.
using debug_buffers = buffers<staging_ring<2>, device_arena<256, 64>>;

}  // namespace tide
