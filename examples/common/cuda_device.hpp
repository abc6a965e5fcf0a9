#pragma once
// How the CUDA examples, tests and benchmarks start: they run on a usable device, skip (exit 77,
// which Meson counts as skipped) on a machine without a GPU, and fail on a GPU the runtime
// cannot use (a driver older than the runtime), which must never pass as "skipped".

#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/backends/cuda/device_probe.hpp>

#include <chrono>
#include <cstdio>
#include <optional>

namespace example {

//! Meson's exit code for a skipped test.
inline constexpr int skip_exit_code = 77;

//! Empty when a device is usable; otherwise the exit code to return (77: no GPU; 1: a GPU the
//! runtime cannot use), after saying why on stdout (skip) or stderr (failure).
[[nodiscard]] inline std::optional<int> without_device(char const* program) {
  auto const p = tide::probe_devices();
  if (p.state == tide::device_probe::status::usable) return std::nullopt;
  if (p.state == tide::device_probe::status::no_device) {
    std::printf("%s: %s; skipping\n", program, p.describe().c_str());
    return skip_exit_code;
  }
  std::fprintf(stderr, "%s: %s: the GPU cannot be used (update the driver, or check the installation)\n", program,
               p.describe().c_str());
  return 1;
}

//! The backend options of the examples and tests: a 60 s `sync_timeout`, under Meson's 300 s
//! test timeout, so that a hang ends in tide's diagnostic (which stream, which watcher) rather
//! than in the harness killing the process.
[[nodiscard]] inline tide::cuda_backend_options backend_options() {
  tide::cuda_backend_options o;
  o.sync_timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace example
