#pragma once
//! \file
//! GPUDirect Storage for the CUDA backend's storage tier: a spill file registered with cuFile, and
//! reads and writes enqueued on a CUDA stream (`cuFileWriteAsync`, `cuFileReadAsync`), so that a
//! spilled slot moves between device memory and the file without a host bounce, in the storage
//! stream's order like every other op. Built when the build finds cuFile (`TIDE_HAVE_CUFILE`: the
//! toolkit's or the `nvidia-cufile` wheel's, see meson.build); without it, `gpu_direct_mode::
//! automatic` stages through the pinned ring and `required` is an error saying so. Where the file
//! system or the driver cannot do GPUDirect, cuFile's own compatibility mode moves the bytes
//! (through its bounce buffers); `gds_file::description()` says which.

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cufile.h>
#endif

#include <tide/backends/cuda/detail/call_within.hpp>
#include <tide/core/error.hpp>

namespace tide {

//! Whether the CUDA backend's storage tier uses GPUDirect Storage.
enum class gpu_direct_mode : std::uint8_t {
  automatic,  //!< cuFile when the build has it and the spill file is open with O_DIRECT; else staged through the pinned ring
  off,        //!< always staged through the pinned ring (the host path: io_uring or pread/pwrite)
  required,   //!< cuFile or an error saying why not
};

//! The mode's name: "automatic", "off" or "required".
constexpr std::string_view to_string(gpu_direct_mode m) noexcept {
  switch (m) {
    case gpu_direct_mode::automatic: return "automatic";
    case gpu_direct_mode::off: return "off";
    case gpu_direct_mode::required: return "required";
  }
  return "?";
}

//! True when this build can use GPUDirect Storage (it found cuFile).
constexpr bool gpu_direct_built() noexcept {
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  return true;
#else
  return false;
#endif
}

#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE

namespace detail {
//! Throws `storage_error` naming the cuFile call, what it was for and cuFile's reason.
inline void check_cufile(CUfileError_t e, char const* call, std::string const& what) {
  if (e.err == CU_FILE_SUCCESS) return;
  std::string why = CUFILE_ERRSTR(e.err);
  if (IS_CUDA_ERR(e)) why += " (CUDA driver error " + std::to_string(static_cast<int>(e.cu_err)) + ")";
  throw storage_error("tide: " + std::string(call) + " failed for " + what + ": " + why, static_cast<int>(e.err));
}

//! Opens the cuFile driver once per process (it stays open: closing it races CUDA's own teardown),
//! waiting at most `limit`: without the nvidia-fs module cuFileDriverOpen has been seen never to
//! return. A call that timed out is not started again; every later open fails at once.
inline void open_cufile_driver(std::chrono::milliseconds limit, std::string const& what) {
  static std::mutex m;
  static std::optional<CUfileError_t> opened;
  static bool timed_out = false;
  std::lock_guard lock(m);
  if (!opened && !timed_out) {
    opened = call_within(limit, [] { return cuFileDriverOpen(); });
    timed_out = !opened;
  }
  if (timed_out)
    throw storage_error("tide: cuFileDriverOpen did not return within " + std::to_string(limit.count()) + " ms for " + what +
                            " (is the nvidia-fs driver loaded? GPUDirect Storage needs it; gpu_direct_mode::off stages through "
                            "the pinned ring instead, and cuda_backend_options::gpu_direct_open_timeout sets the wait)",
                        ETIMEDOUT);
  check_cufile(*opened, "cuFileDriverOpen", what);
}
}  // namespace detail

//! A spill file's descriptor registered with cuFile, the device buffers it moves bytes to and
//! from, and the parameters of the step's asynchronous transfers (cuFile reads them when the
//! stream reaches each transfer, so they live here, one record per op, until the step is waited).
class gds_file {
 public:
  //! Opens the cuFile driver (once per process, waiting at most `open_timeout`; it stays open)
  //! and registers `fd` (the spill file, opened with O_DIRECT). `where` names the file in errors.
  gds_file(int fd, std::string where, std::chrono::milliseconds open_timeout = std::chrono::seconds(20))
      : where_(std::move(where)) {
    detail::open_cufile_driver(open_timeout, where_);
    CUfileDescr_t d{};
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    detail::check_cufile(cuFileHandleRegister(&handle_, &d), "cuFileHandleRegister", where_);
    description_ = "GPUDirect Storage (cuFile " + std::to_string(version()) + ")";
  }
  gds_file(gds_file const&) = delete;
  gds_file& operator=(gds_file const&) = delete;
  ~gds_file() {
    for (auto* p : buffers_) (void)cuFileBufDeregister(p);  // nothing to report from a destructor
    for (auto s : streams_) (void)cuFileStreamDeregister(s);
    cuFileHandleDeregister(handle_);
  }

  //! Registers `bytes` of device memory at `base` (BAR1 mappings made once, not per transfer).
  void register_buffer(void* base, std::size_t bytes) {
    detail::check_cufile(cuFileBufRegister(base, bytes, 0), "cuFileBufRegister", where_ + " (" + std::to_string(bytes) + " bytes of device memory)");
    buffers_.push_back(base);
  }
  //! Registers `s` for asynchronous transfers (cuFile then sets each one up with less work).
  void register_stream(cudaStream_t s) {
    detail::check_cufile(cuFileStreamRegister(reinterpret_cast<CUstream>(s), 0), "cuFileStreamRegister", where_);
    streams_.push_back(s);
  }

  //! One record per op of the step (call before the step; the records must not move during it).
  void prepare(std::size_t ops) {
    if (records_.size() < ops) records_.resize(ops);
    for (auto& r : records_) r.used = false;
  }

  //! Enqueues on `s` a write of `bytes` from `base + buffer_offset` (device memory) to the file at
  //! `file_offset`, as op `i`.
  void write_async(std::size_t i, void* base, std::size_t buffer_offset, std::size_t file_offset, std::size_t bytes, cudaStream_t s) {
    auto& r = record(i, true, buffer_offset, file_offset, bytes);
    detail::check_cufile(cuFileWriteAsync(handle_, base, &r.size, &r.file_offset, &r.buffer_offset, &r.done, reinterpret_cast<CUstream>(s)),
                         "cuFileWriteAsync", at(r));
  }
  //! Enqueues on `s` a read of `bytes` from the file at `file_offset` to `base + buffer_offset`.
  void read_async(std::size_t i, void* base, std::size_t buffer_offset, std::size_t file_offset, std::size_t bytes, cudaStream_t s) {
    auto& r = record(i, false, buffer_offset, file_offset, bytes);
    detail::check_cufile(cuFileReadAsync(handle_, base, &r.size, &r.file_offset, &r.buffer_offset, &r.done, reinterpret_cast<CUstream>(s)),
                         "cuFileReadAsync", at(r));
  }

  //! After the streams were synchronized: throws `storage_error` for the first transfer that
  //! moved fewer bytes than it was given (a negative count is cuFile's error code).
  void check_step() const {
    for (auto const& r : records_) {
      if (!r.used || r.done == static_cast<ssize_t>(r.size)) continue;
      std::string const why = r.done < 0 ? (r.done == -1 ? std::string("a file system error") : std::string(CUFILE_ERRSTR(r.done)))
                                         : std::to_string(r.done) + " bytes moved";
      throw storage_error("tide: " + std::string(r.write ? "cuFileWriteAsync" : "cuFileReadAsync") + " of " + at(r) + ": " + why,
                          r.done < 0 ? static_cast<int>(-r.done) : 5 /* EIO */);
    }
  }

  //! "GPUDirect Storage (cuFile 1200)".
  [[nodiscard]] std::string const& description() const noexcept { return description_; }
  //! cuFile's version (`cuFileGetVersion`), 0 when it cannot say.
  [[nodiscard]] static int version() noexcept {
    int v = 0;
    return cuFileGetVersion(&v).err == CU_FILE_SUCCESS ? v : 0;
  }

 private:
  struct transfer {
    std::size_t size = 0;
    off_t file_offset = 0, buffer_offset = 0;
    ssize_t done = 0;
    bool used = false, write = false;
  };
  transfer& record(std::size_t i, bool write, std::size_t buffer_offset, std::size_t file_offset, std::size_t bytes) {
    if (i >= records_.size()) throw error("tide::gds_file: op " + std::to_string(i) + " has no transfer record (prepare() was not called for the step)");
    auto& r = records_[i];
    r = {bytes, static_cast<off_t>(file_offset), static_cast<off_t>(buffer_offset), -1, true, write};
    return r;
  }
  std::string at(transfer const& r) const {
    return where_ + " at offset " + std::to_string(r.file_offset) + ", " + std::to_string(r.size) + " bytes";
  }

  std::string where_, description_;
  CUfileHandle_t handle_{};
  std::vector<void*> buffers_;
  std::vector<cudaStream_t> streams_;
  std::vector<transfer> records_;
};

#endif  // TIDE_HAVE_CUFILE

}  // namespace tide
