#pragma once
//! \file
//! A scope in which a given device is current: events, memory and streams are created on the
//! current device, and a backend or communicator may belong to another than the caller's.

#include <cuda_runtime_api.h>

#include <tide/backends/cuda/cuda_error.hpp>

namespace tide::detail {

//! Makes `device` current until the end of the scope, then restores the caller's device.
class device_guard {
 public:
  explicit device_guard(int device) {
    TIDE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ == device) previous_ = -1;
    else TIDE_CUDA_CHECK(cudaSetDevice(device));
  }
  device_guard(device_guard const&) = delete;
  device_guard& operator=(device_guard const&) = delete;
  ~device_guard() {
    if (previous_ >= 0) static_cast<void>(cudaSetDevice(previous_));
  }

 private:
  int previous_ = -1;  // -1: the device was already current
};

}  // namespace tide::detail
