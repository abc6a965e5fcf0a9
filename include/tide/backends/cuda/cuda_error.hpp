#pragma once
//! \file
//! CUDA failures as exceptions: `tide::cuda_error` names the call, the error and where it
//! happened. Every CUDA runtime call tide makes goes through `TIDE_CUDA_CHECK`.

#include <cuda_runtime_api.h>

#include <string>

#include <tide/core/error.hpp>

namespace tide {

//! True for errors that leave the CUDA context unusable: every later call in the process fails
//! with the same error, so the process has to restart. They are reported as such, never cleared.
constexpr bool is_sticky(cudaError_t e) noexcept {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    // Documented in driver_types.h as "the process must be terminated and relaunched"; the test
    // tests/cuda/sticky_errors.py keeps this list in step with the toolkit's header.
    case cudaErrorContained:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorExternalDevice:
    case cudaErrorMpsClientTerminated: return true;
    default: return false;
  }
}

//! A CUDA runtime call failed.
struct cuda_error : error {
  cudaError_t code = cudaSuccess;  //!< what the call returned
  std::string call{};              //!< the call as written, e.g. `cudaMemcpyAsync(dst, src, n, kind, s)`
  std::string where{};             //!< file:line of the call
  bool sticky = false;             //!< the context is unusable (see `is_sticky`)

  //! The failure of `call_text` at `location` with `e`; `sticky` is set from `is_sticky(e)`.
  cuda_error(cudaError_t e, std::string const& call_text, std::string const& location)
      : error(message(cudaGetErrorName(e), cudaGetErrorString(e), call_text, location, is_sticky(e))),
        code(e),
        call(call_text),
        where(location),
        sticky(is_sticky(e)) {}

  //! "tide: <call> failed with <name> (<description>) at <location>" (NCCL's errors say the same).
  static std::string message(char const* name, char const* description, std::string const& call_text,
                             std::string const& location, bool sticky_error) {
    std::string m = "tide: " + call_text + " failed with " + name + " (" + description + ") at " + location;
    if (sticky_error) m += "; this error is sticky: the CUDA context is unusable and the process must restart";
    return m;
  }
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, char const* call, char const* file, int line) {
  // A non-sticky error is also the runtime's "last error"; clear it so that a later, unrelated
  // cudaGetLastError() does not report it again. A sticky one cannot be cleared (and stays).
  if (!is_sticky(e)) static_cast<void>(cudaGetLastError());
  throw cuda_error(e, call, std::string(file) + ":" + std::to_string(line));
}

inline void check_cuda(cudaError_t e, char const* call, char const* file, int line) {
  if (e != cudaSuccess) [[unlikely]]
    throw_cuda_error(e, call, file, line);
}

}  // namespace detail
namespace detail {
//! Remembers the first failure among calls that must all be made (teardown of a step or capture).
struct first_failure {
  cudaError_t code = cudaSuccess;
  char const* call = nullptr;
  int line = 0;
  void note(cudaError_t e, char const* c, int l) noexcept {
    if (e != cudaSuccess && code == cudaSuccess) code = e, call = c, line = l;
  }
  void raise() const {
    if (code != cudaSuccess) throw_cuda_error(code, call, __FILE__, line);
  }
};
//! Internal: notes the failure of a call into the `first_failure` `f` instead of throwing.
#define TIDE_CUDA_NOTE(f, ...) (f).note((__VA_ARGS__), #__VA_ARGS__, __LINE__)
}  // namespace detail

}  // namespace tide

//! Checks a CUDA runtime call; throws `tide::cuda_error` naming the call, the error and file:line.
#define TIDE_CUDA_CHECK(...) ::tide::detail::check_cuda((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)
