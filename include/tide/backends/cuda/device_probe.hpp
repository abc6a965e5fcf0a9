#pragma once
//! \file
//! Whether this process can use a CUDA device, and if not, why. A machine without a GPU (no
//! device, or no CUDA driver installed at all) is a reason to skip GPU work; a driver older than
//! the runtime, or a device the runtime cannot open, is an error to report: tests that treated
//! both as "no GPU" would pass on a GPU machine without running anything.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace tide {

//! What `probe_devices` found.
struct device_probe {
  //! `usable`: at least one device; `no_device`: the runtime finds none, or no CUDA driver is
  //! installed (a machine without a GPU: skip); `unusable`: anything else, e.g. a driver older
  //! than the runtime (`cudaErrorInsufficientDriver` with a driver present): an error.
  enum class status : std::uint8_t { usable, no_device, unusable };
  status state = status::no_device;  //!< see `status`
  int device_count = 0;              //!< `cudaGetDeviceCount`'s, when it succeeded
  cudaError_t error = cudaSuccess;   //!< `cudaGetDeviceCount`'s result
  int driver_version = 0;            //!< `cudaDriverGetVersion`: 0 when no driver is installed
  int runtime_version = 0;           //!< `cudaRuntimeGetVersion`, e.g. 13000

  //! One line: the state, the count or error, the driver's and the runtime's versions.
  [[nodiscard]] std::string describe() const {
    auto version = [](int v) { return v == 0 ? std::string("none") : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    std::string s = state == status::usable      ? std::to_string(device_count) + " CUDA device(s)"
                    : state == status::no_device ? std::string("no CUDA device")
                                                 : std::string("CUDA devices unusable");
    if (error != cudaSuccess)
      s += std::string(": cudaGetDeviceCount returned ") + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
    return s + "; driver " + version(driver_version) + ", runtime " + version(runtime_version);
  }
};

//! The decision `probe_devices` makes from `cudaGetDeviceCount`'s result `e` and `count`, and
//! `cudaDriverGetVersion`'s `driver_version` (0: no driver installed).
[[nodiscard]] constexpr device_probe::status classify_device_probe(cudaError_t e, int count, int driver_version) noexcept {
  if (e == cudaSuccess) return count > 0 ? device_probe::status::usable : device_probe::status::no_device;
  if (e == cudaErrorNoDevice) return device_probe::status::no_device;
  if (e == cudaErrorInsufficientDriver && driver_version == 0) return device_probe::status::no_device;
  return device_probe::status::unusable;
}

//! Asks the runtime (`cudaGetDeviceCount`, `cudaDriverGetVersion`, `cudaRuntimeGetVersion`)
//! and clears the error it leaves behind, so that later calls do not report it.
[[nodiscard]] inline device_probe probe_devices() noexcept {
  device_probe p;
  p.error = cudaGetDeviceCount(&p.device_count);
  if (p.error != cudaSuccess) {
    p.device_count = 0;
    static_cast<void>(cudaGetLastError());
  }
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  if (cudaRuntimeGetVersion(&p.runtime_version) != cudaSuccess) p.runtime_version = 0;
  static_cast<void>(cudaGetLastError());
  p.state = classify_device_probe(p.error, p.device_count, p.driver_version);
  return p;
}

}  // namespace tide
