#pragma once
//! \file
//! The storage tier's file: where spilled slots live between their store in forward and their load
//! in backward. One file per backend, created in a directory the user names and unlinked at once
//! (`O_TMPFILE` where the file system has it), so that nothing is left behind, even after a crash;
//! preallocated, so that a full disk is found when the executor is built, not in the middle of a
//! step. Transfers go through io_uring (liburing) with `O_DIRECT` and registered buffers where the
//! kernel, the sandbox and the file system allow, and through `pread`/`pwrite` otherwise; which path
//! is used is in `description()`, and a fallback is said once on stderr (`storage_options::quiet`).
//! A failed transfer throws `storage_error` naming the directory, the offset, the bytes and the
//! system's reason. Transfers run one at a time (a lock): a backend runs them in its storage
//! stream's order.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
#include <liburing.h>
#endif

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/vocabulary.hpp>
#include <tide/storage/detail/direct_io_alignment.hpp>

namespace tide {

//! How a spill file moves bytes.
enum class storage_io : std::uint8_t {
  automatic,  //!< io_uring when the build, the kernel and the sandbox allow it, else `pread`/`pwrite`
  io_uring,   //!< io_uring or an error saying why not
  posix,      //!< `pread`/`pwrite` on the storage stream's thread
};

//! The path's name: "automatic", "io_uring" or "posix".
constexpr std::string_view to_string(storage_io i) noexcept {
  switch (i) {
    case storage_io::automatic: return "automatic";
    case storage_io::io_uring: return "io_uring";
    case storage_io::posix: return "posix";
  }
  return "?";
}

//! Where and how a backend keeps its storage tier.
struct storage_options {
  //! The directory the spill file is created in (on the storage device); empty: the backend has
  //! no storage tier, and a schedule that stores bytes is refused when the executor is built.
  std::string directory{};
  storage_io io = storage_io::automatic;  //!< which path moves the bytes
  //! Open with `O_DIRECT` (the page cache would hold a second copy of what the ring just held);
  //! a file system that refuses it (tmpfs, some overlays) gets buffered I/O, said in `description()`.
  bool direct = true;
  std::size_t request_bytes = std::size_t{1} << 20;  //!< a transfer goes as requests of this size, in flight together
  //! io_uring: requests in flight at once, 1 to `spill_file::max_queue_depth` (any other value is
  //! refused by name when the file is set up, whichever `io`: a bad option is not a kernel's refusal)
  std::uint32_t queue_depth = 32;
  bool quiet = false;  //!< take a fallback without a line on stderr (`description()` still says it)
  //! The direct-I/O alignment of the device under `directory`, where the kernel does not report it
  //! (or to require more than it reports): the file takes the larger of this and what `statx`
  //! (`STATX_DIOALIGN`) or the device's logical block size says, and refuses a smaller storage
  //! alignment when it is opened. Not given: what the kernel reports.
  std::optional<std::size_t> direct_io_alignment{};
};

//! A preallocated, unlinked file the storage stream writes spilled slots to and reads them from.
class spill_file {
 public:
  //! The least alignment a backend's file takes: direct I/O moves whole logical blocks, 512 bytes
  //! on every Linux block device (4096 on many; a schedule's `buffer_spec::storage_alignment`,
  //! 4096 by default, pads each region to its own).
  static constexpr std::size_t least_alignment = 512;
  //! The deepest io_uring queue a file takes (`storage_options::queue_depth`): the kernel's
  //! IORING_MAX_ENTRIES.
  static constexpr std::uint32_t max_queue_depth = 32768;

  //! Creates the file in `opt.directory` and reserves `bytes` of it (throws `storage_error` naming
  //! the directory and the bytes when it cannot). With `O_DIRECT`, an `alignment` below the file's
  //! direct-I/O alignment (see `direct_io_alignment()`) is refused, naming both. `alignment`: every transfer's offset and
  //! buffer address and length are multiples of it (direct I/O moves whole logical blocks; a
  //! transfer that is not is refused, never rounded up past the caller's buffer).
  spill_file(storage_options opt, std::size_t bytes, std::size_t alignment);
  spill_file(spill_file const&) = delete;
  spill_file& operator=(spill_file const&) = delete;
  ~spill_file();

  //! Grows the file to hold `bytes` (a no-op when it does); throws `storage_error` on a full disk.
  void reserve(std::size_t bytes);

  //! The pinned host memory transfers use: registered with io_uring where it allows (fixed
  //! buffers skip the per-request page pinning); transfers from elsewhere still work, unregistered.
  void register_memory(std::span<std::byte> host) noexcept {
#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
    if (!uring_) return;
    // Always again, even at the same address: a block freed and allocated anew there has other
    // pages, and a registration pins the pages it was given.
    if (!registered_.empty()) io_uring_unregister_buffers(&ring_);
    registered_ = {};
    if (host.empty()) return;
    try {
      std::vector<iovec> iov;
      for (std::size_t at = 0; at < host.size(); at += register_piece)
        iov.push_back({host.data() + at, std::min(register_piece, host.size() - at)});
      int const r = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
      if (r == 0) registered_ = host;
      register_note_ = r == 0 ? "" : std::string(", unregistered buffers (") + std::strerror(-r) + ")";
    } catch (...) {  // no memory for the list: transfers go unregistered
      registered_ = {};
    }
    describe_noexcept();
#else
    (void)host;
#endif
  }

  //! Writes all of `src` to the file at `offset`. Its length, its address and `offset` are
  //! multiples of `alignment()` (direct I/O moves whole blocks between aligned addresses); anything
  //! else is a `storage_error` naming what to write instead, and nothing moves. The file never
  //! reads a byte outside `src`.
  void write(std::span<std::byte const> src, std::size_t offset) {
    transfer(true, const_cast<std::byte*>(src.data()), offset, src.size());
  }
  //! Reads `dst.size()` bytes from the file at `offset` into `dst`, on the terms `write` states.
  //! The file never writes a byte outside `dst`.
  void read(std::span<std::byte> dst, std::size_t offset) { transfer(false, dst.data(), offset, dst.size()); }
  //! Writes `bytes` from `src` to the file at `offset`: `src` holds at least `bytes`, and `bytes`,
  //! `src` and `offset` are multiples of `alignment()` (refused by name otherwise; a length is
  //! never rounded up, which would read past the caller's buffer).
  void write(void const* src, std::size_t offset, std::size_t bytes) {
    transfer(true, static_cast<std::byte*>(const_cast<void*>(src)), offset, bytes);
  }
  //! Reads `bytes` from the file at `offset` into `dst`, on the terms the pointer `write` states.
  void read(void* dst, std::size_t offset, std::size_t bytes) { transfer(false, static_cast<std::byte*>(dst), offset, bytes); }

  //! Bytes reserved.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! What every transfer's length, buffer address and file offset are multiples of.
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  //! With `O_DIRECT`, what direct I/O on the file needs (`statx` `STATX_DIOALIGN`, else the
  //! device's logical block size, raised to `storage_options::direct_io_alignment`); nothing when
  //! the file is buffered or neither the kernel nor the options say.
  [[nodiscard]] std::optional<std::size_t> direct_io_alignment() const noexcept { return dio_required_; }
  //! Takes transfers aligned to `alignment` from now on, when it is below `alignment()` (a schedule
  //! of a smaller storage alignment set up on a backend whose file was opened for a larger one);
  //! throws `storage_error` as the constructor does when direct I/O needs more.
  void lower_alignment(std::size_t alignment);
  //! The path in use: `io_uring` or `posix` (never `automatic`).
  [[nodiscard]] storage_io io() const noexcept { return uring_ ? storage_io::io_uring : storage_io::posix; }
  //! True when the file is open with `O_DIRECT`.
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  //! True when transfers from the registered memory use io_uring's fixed buffers.
  [[nodiscard]] bool registered() const noexcept { return !registered_.empty(); }
  //! The directory the (unlinked) file is in.
  [[nodiscard]] std::string const& directory() const noexcept { return opt_.directory; }
  //! The file's descriptor (GPUDirect Storage registers it with cuFile); the file owns it.
  [[nodiscard]] int native_handle() const noexcept { return fd_; }
  //! Which path moves the bytes and why: "io_uring, O_DIRECT, registered buffers: spill file in /x (unlinked), 4096 bytes".
  [[nodiscard]] std::string const& description() const noexcept { return description_; }

 private:
  static constexpr std::size_t register_piece = std::size_t{1} << 30;  // io_uring's largest registered buffer

  std::string where() const { return "tide: spill file in '" + opt_.directory + "'"; }

  void say(std::string const& line) const {
    if (!opt_.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  }

  void open_file();

  // With O_DIRECT, the device's alignment: a smaller one fails every transfer with EINVAL, so it is
  // refused here, when the backend is set up, not at the first store.
  void check_direct_io_alignment();
  void refuse_below_direct_io(std::size_t alignment) const {
    if (!dio_required_ || alignment >= *dio_required_) return;
    auto const need = std::to_string(*dio_required_);
    throw storage_error(where() + ": direct I/O on this file moves blocks of " + need + " bytes (" + dio_->source +
                            ") and the storage alignment is " + std::to_string(alignment) +
                            ": use buffer_spec::storage_alignment of " + need + " or more (tide::storage_alignment<" + need +
                            ">), or storage_options::direct = false",
                        EINVAL);
  }

  void start_io();

  void describe_noexcept() noexcept {
    try {
      describe();
    } catch (...) {
    }
  }
  void describe() {
    description_ = std::string(uring_ ? "io_uring" : "pread/pwrite") + (direct_ ? ", O_DIRECT" : "") +
                   (registered() ? ", registered buffers" : "") + register_note_ + open_note_ + ": spill file in '" +
                   opt_.directory + "' (unlinked), " + std::to_string(size_) + " bytes" +
                   (dio_required_ ? "; direct I/O in blocks of " + std::to_string(*dio_required_) + " bytes (" + dio_->source + ")"
                                  : std::string());
  }

  void close_all() noexcept;

  [[noreturn]] void fail(bool write, std::size_t offset, std::size_t bytes, int err) const {
    throw storage_error(where() + ": " + (write ? "writing " : "reading ") + std::to_string(bytes) + " bytes at offset " +
                            std::to_string(offset) + " failed: " + std::strerror(err),
                        err);
  }

  // Every refusal before anything moves. The length is never rounded up: the caller's buffer may
  // end at `bytes`, and moving a whole block past it would read or overwrite someone else's memory.
  void check_transfer(bool write, std::byte const* buf, std::size_t offset, std::size_t bytes) const;

  void transfer(bool write, std::byte* buf, std::size_t offset, std::size_t bytes);

#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
  // Requests of `request_bytes` in flight together, up to the queue depth; a short one is
  // resubmitted for its rest. Every request the kernel accepted is reaped before an error is
  // thrown (it must not touch the buffer once the caller has it back); requests prepared but never
  // accepted are discarded with the ring, which is set up again.
  void uring_transfer(bool write, std::byte* buf, std::size_t offset, std::size_t len);
  // The ring again, empty (registered buffers too), or pread/pwrite when it cannot be set up.
  void restart_ring() noexcept;
  struct request {
    std::byte* buf;
    std::size_t offset, len;
  };
  std::vector<request> pending_;
  io_uring ring_{};
#endif

  storage_options opt_;
  std::size_t alignment_ = 4096;
  std::optional<detail::direct_io_alignment> dio_;  // what direct I/O needs and where it was learned
  std::optional<std::size_t> dio_required_;
  int fd_ = -1;
  std::size_t size_ = 0;
  bool uring_ = false;
  bool direct_ = false;
  std::span<std::byte> registered_{};
  std::mutex transfer_mutex_;
  std::string open_note_, register_note_, description_;
};

namespace detail {
//! A backend's setup of its storage tier for a schedule that stores `bytes` with regions aligned
//! to `alignment`: refuses a backend without a directory (naming `backend`'s option) and an
//! alignment below what direct I/O moves, then opens `file` or grows it. One file serves every
//! schedule set up on the backend: it takes the smallest alignment asked, and refuses one below its
//! device's direct-I/O alignment (`spill_file::direct_io_alignment()`), naming both.
TIDE_INLINE void prepare_spill_file(std::optional<spill_file>& file, storage_options const& opt, std::size_t bytes,
                                    std::size_t alignment, std::string_view backend);
}  // namespace detail

}  // namespace tide

#if TIDE_DEFINITIONS
#include <tide/storage/detail/spill_file_impl.hpp>  // the longer member functions
#endif
