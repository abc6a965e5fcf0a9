#pragma once
//! \file
//! The spill ring's second home. With GPUDirect Storage the CUDA backend keeps the ring in device
//! memory: the schedule still names the ring by its host arena addresses (the checker proved the
//! schedule with them), and the backend redirects every copy, store and load that touches the
//! ring to the same offset of a device buffer. No CUDA here, so the host tests check it.

#include <cstddef>
#include <cstdint>
#include <string>

#include <tide/core/error.hpp>

namespace tide::detail {

//! Maps the host range [host, host + bytes) onto [device, device + bytes).
struct ring_redirect {
  std::byte const* host = nullptr;  //!< the ring as the schedule names it (in the host arena)
  std::byte* device = nullptr;      //!< the ring in device memory (nullptr: no redirect)
  std::size_t bytes = 0;            //!< the ring's size

  //! True when the ring lives in device memory.
  [[nodiscard]] bool active() const noexcept { return device != nullptr && bytes > 0; }

  //! The offset of `p` in the ring, or -1 when `p` is outside it (or nothing is redirected).
  [[nodiscard]] std::ptrdiff_t offset_of(void const* p) const noexcept {
    if (!active()) return -1;
    auto const a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(host);
    return a >= b && a - b < bytes ? static_cast<std::ptrdiff_t>(a - b) : -1;
  }

  //! The device address of a transfer of `n` bytes at `p` when `p` is in the ring, `p` itself
  //! when it is not; a transfer that starts in the ring and runs past its end is a
  //! `schedule_error` (the builder lays every region inside the ring: a layout bug, never silence).
  [[nodiscard]] void* operator()(void const* p, std::size_t n) const {
    auto const at = offset_of(p);
    if (at < 0) return const_cast<void*>(p);
    if (n > bytes - static_cast<std::size_t>(at))
      throw schedule_error("tide::cuda_backend: a transfer of " + std::to_string(n) + " bytes at offset " + std::to_string(at) +
                           " of the spill ring runs past its end (" + std::to_string(bytes) + " bytes)");
    return device + at;
  }
};

}  // namespace tide::detail
