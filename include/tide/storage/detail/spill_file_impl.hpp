#pragma once
// spill_file's longer member functions (opening the file, the io_uring and pread/pwrite paths,
// the transfers' checks), out of the class so that <tide/storage/spill_file.hpp> reads as API.
// Included at its end; not to be included on its own.

#include <tide/storage/spill_file.hpp>

namespace tide {

TIDE_INLINE spill_file::spill_file(storage_options opt, std::size_t bytes, std::size_t alignment)
    : opt_(std::move(opt)), alignment_(alignment) {
  if (opt_.directory.empty())
    throw storage_error("tide: a spill file needs a directory (storage_options::directory) on the storage device", EINVAL);
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
    throw storage_error("tide: the storage alignment " + std::to_string(alignment_) + " is not a power of two", EINVAL);
  if (opt_.request_bytes < alignment_ || opt_.request_bytes % alignment_ != 0 || opt_.request_bytes > register_piece)
    throw storage_error("tide: storage_options::request_bytes (" + std::to_string(opt_.request_bytes) +
                            ") must be a positive multiple of the storage alignment (" + std::to_string(alignment_) +
                            ") of at most 1 GiB",
                        EINVAL);
  // Checked here, not left to io_uring_queue_init: its EINVAL read "io_uring is not available:
  // Invalid argument", and `automatic` then fell back to pread/pwrite without saying the option was wrong.
  if (opt_.queue_depth < 1 || opt_.queue_depth > max_queue_depth)
    throw storage_error("tide: storage_options::queue_depth (" + std::to_string(opt_.queue_depth) + ") must be between 1 and " +
                            std::to_string(max_queue_depth) + " (tide::spill_file::max_queue_depth; the default is 32)",
                        EINVAL);
  if (opt_.direct_io_alignment && (*opt_.direct_io_alignment == 0 || (*opt_.direct_io_alignment & (*opt_.direct_io_alignment - 1)) != 0 ||
                                   *opt_.direct_io_alignment > register_piece))
    throw storage_error("tide: storage_options::direct_io_alignment (" + std::to_string(*opt_.direct_io_alignment) +
                            ") must be a power of two of at most 1 GiB (a device's logical block size, e.g. 512 or 4096)",
                        EINVAL);
  open_file();
  try {
    check_direct_io_alignment();
    reserve(bytes);
    start_io();
  } catch (...) {
    close_all();
    throw;
  }
}

TIDE_INLINE spill_file::~spill_file() { close_all(); }

TIDE_INLINE void spill_file::reserve(std::size_t bytes) {
  if (bytes <= size_) return;
  std::size_t want = 0;
  if (!checked_align_up(bytes, alignment_, want) || want > static_cast<std::size_t>(std::numeric_limits<off_t>::max()))
    throw storage_error(where() + ": " + std::to_string(bytes) + " bytes do not fit in a file offset", EFBIG);
  // The free space first: fallocate of more than is free can take all of it before it fails,
  // and other writers on the disk then fail too (and the message read "0 bytes free").
  std::string free_text;
  if (struct statvfs v; ::fstatvfs(fd_, &v) == 0) {
    auto const free = static_cast<unsigned long long>(v.f_bavail) * v.f_frsize;
    free_text = " (" + std::to_string(free) + " bytes free)";
    if (want - size_ > free)
      throw storage_error(where() + ": cannot reserve " + std::to_string(want) + " bytes" + free_text + ": " + std::strerror(ENOSPC) +
                              ": free space on that device or name another directory",
                          ENOSPC);
  }
  int err = ::fallocate(fd_, 0, 0, static_cast<off_t>(want)) == 0 ? 0 : errno;
  if (err == EOPNOTSUPP) err = ::posix_fallocate(fd_, 0, static_cast<off_t>(want));  // writes zeros where it must
  if (err != 0)
    throw storage_error(where() + ": cannot reserve " + std::to_string(want) + " bytes" + free_text + ": " +
                            std::strerror(err) + (err == ENOSPC ? ": free space on that device or name another directory" : ""),
                        err);
  size_ = want;
}

TIDE_INLINE void spill_file::lower_alignment(std::size_t alignment) {
  std::lock_guard lock(transfer_mutex_);
  if (alignment >= alignment_) return;
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw storage_error("tide: the storage alignment " + std::to_string(alignment) + " is not a power of two", EINVAL);
  refuse_below_direct_io(alignment);
  alignment_ = alignment;
}

TIDE_INLINE void spill_file::open_file() {
  direct_ = opt_.direct;
  auto const flags = O_RDWR | O_CLOEXEC;
  auto const dir = opt_.directory.c_str();
  fd_ = ::open(dir, O_TMPFILE | flags | (direct_ ? O_DIRECT : 0), 0600);
  if (fd_ < 0 && direct_ && errno == EINVAL) {  // the file system refuses O_DIRECT (tmpfs before 6.6, some overlays)
    fd_ = ::open(dir, O_TMPFILE | flags, 0600);
    if (fd_ >= 0) {
      direct_ = false;
      open_note_ = ", buffered (the file system refuses O_DIRECT)";
    }
  }
  if (fd_ < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE here: a named file, unlinked as soon as it is open.
    std::string path = opt_.directory + "/.tide-spill-XXXXXX";
    fd_ = ::mkostemp(path.data(), O_CLOEXEC | (direct_ ? O_DIRECT : 0));
    if (fd_ < 0 && direct_ && errno == EINVAL) {
      direct_ = false;
      open_note_ = ", buffered (the file system refuses O_DIRECT)";
      path = opt_.directory + "/.tide-spill-XXXXXX";
      fd_ = ::mkostemp(path.data(), O_CLOEXEC);
    }
    if (fd_ >= 0) ::unlink(path.c_str());
  }
  if (fd_ < 0) {
    int const err = errno;
    throw storage_error(where() + ": cannot create it: " + std::strerror(err) +
                            (err == ENOENT ? " (no such directory)" : err == ENOTDIR ? " (not a directory)" : ""),
                        err);
  }
}

TIDE_INLINE void spill_file::check_direct_io_alignment() {
  if (!direct_) return;
  dio_ = detail::probe_direct_io_alignment(fd_);
  std::size_t need = dio_ ? dio_->required() : 0;
  if (opt_.direct_io_alignment && *opt_.direct_io_alignment > need) {
    need = *opt_.direct_io_alignment;
    dio_ = detail::direct_io_alignment{need, need, "storage_options::direct_io_alignment"};
  }
  if (need > 0) dio_required_ = need;
  refuse_below_direct_io(alignment_);
}

TIDE_INLINE void spill_file::start_io() {
  std::string why;
  if (opt_.io != storage_io::posix) {
#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
    int const r = io_uring_queue_init(std::max<std::uint32_t>(opt_.queue_depth, 1), &ring_, 0);
    if (r == 0) uring_ = true;
    else why = std::string("not available at run time: io_uring_queue_init failed: ") + std::strerror(-r);
    if (r == -ENOSYS || r == -EPERM) why += " (the kernel or a sandbox forbids io_uring)";
#else
    // Not the same as "not installed": liburing may well be installed, and this translation
    // unit compiled without the macro (a plain compiler line, a build without tide's Meson/CMake).
    why = "not compiled in: this code was compiled without TIDE_HAVE_LIBURING (define TIDE_HAVE_LIBURING=1 and link "
          "liburing, -luring; tide's Meson dependency, CMake target and pkg-config file do both where liburing is found)";
#endif
    if (!uring_ && opt_.io == storage_io::io_uring)
      throw storage_error(where() + ": io_uring (storage_io::io_uring) is " + why, ENOSYS);
  }
  describe();
  if (!uring_ && opt_.io == storage_io::automatic) say(description_ + " (io_uring " + why + ")");
  if (!direct_ && opt_.direct) say(description_);
}

TIDE_INLINE void spill_file::close_all() noexcept {
#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
  if (uring_) io_uring_queue_exit(&ring_);
  uring_ = false;
#endif
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

TIDE_INLINE void spill_file::check_transfer(bool write, std::byte const* buf, std::size_t offset, std::size_t bytes) const {
  auto const what = std::string(write ? "writing " : "reading ") + std::to_string(bytes) + " bytes at offset " + std::to_string(offset);
  auto const a = std::to_string(alignment_);
  if (bytes % alignment_ != 0) {
    std::size_t padded = 0;
    auto const pad = checked_align_up(bytes, alignment_, padded) ? std::to_string(padded) : std::string("a multiple of ") + a;
    throw storage_error(where() + ": " + what + ": the length is not a multiple of the alignment " + a +
                            " (direct I/O moves whole blocks, and the file moves only the caller's bytes): pad the buffer and the length to " +
                            pad + " bytes",
                        EINVAL);
  }
  if (offset % alignment_ != 0)
    throw storage_error(where() + ": " + what + ": the offset does not lie on the alignment " + a +
                            ": use an offset that is a multiple of " + a,
                        EINVAL);
  if (bytes > size_ || offset > size_ - bytes)
    throw storage_error(where() + ": " + what + " does not lie within the file's " + std::to_string(size_) +
                            " bytes: reserve() more first",
                        EINVAL);
  if (bytes > 0 && reinterpret_cast<std::uintptr_t>(buf) % alignment_ != 0)
    throw storage_error(where() + ": " + what + ": the buffer's address is not a multiple of the alignment " + a +
                            (direct_ ? " (O_DIRECT refuses it)" : " (O_DIRECT would refuse it)") +
                            ": allocate it aligned, e.g. ::operator new(bytes, std::align_val_t{" + a + "})",
                        EINVAL);
}

TIDE_INLINE void spill_file::transfer(bool write, std::byte* buf, std::size_t offset, std::size_t bytes) {
  // One transfer at a time (the ring and its request list are one): backends issue them in one
  // stream's order, but a hand-written program may not.
  std::lock_guard lock(transfer_mutex_);
  check_transfer(write, buf, offset, bytes);
  std::size_t const len = bytes;
  if (len == 0) return;
#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
  if (uring_) return uring_transfer(write, buf, offset, len);
#endif
  for (std::size_t done = 0; done < len;) {
    auto const n = write ? ::pwrite(fd_, buf + done, len - done, static_cast<off_t>(offset + done))
                         : ::pread(fd_, buf + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(write, offset, len, errno);
    if (n == 0) fail(write, offset, len, write ? ENOSPC : EIO);  // the file was reserved: an end here is the device's
    done += static_cast<std::size_t>(n);
  }
}

#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
TIDE_INLINE void spill_file::uring_transfer(bool write, std::byte* buf, std::size_t offset, std::size_t len) {
  pending_.clear();
  auto const base = registered_.data();
  bool const fixed = !registered_.empty() && buf >= base && buf + len <= base + registered_.size();
  for (std::size_t at = 0; at < len;) {
    auto n = std::min(opt_.request_bytes, len - at);
    if (fixed) n = std::min(n, register_piece - static_cast<std::size_t>(buf + at - base) % register_piece);  // one iovec each
    pending_.push_back({buf + at, offset + at, n});
    at += n;
  }
  std::size_t next = 0;      // the next request to prepare
  std::size_t in_kernel = 0;  // accepted by the kernel, not yet reaped
  std::size_t retries = 0;    // EAGAIN and EINTR, from the submission or a request: bounded
  constexpr std::size_t most_retries = 1000;
  int err = 0;
  auto const depth = std::max<std::uint32_t>(opt_.queue_depth, 1);
  while ((err == 0 && next < pending_.size()) || in_kernel > 0) {
    while (err == 0 && next < pending_.size() && in_kernel + io_uring_sq_ready(&ring_) < depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      auto const& p = pending_[next];
      auto const idx = fixed ? static_cast<int>(static_cast<std::size_t>(p.buf - base) / register_piece) : -1;
      auto const n = static_cast<unsigned>(p.len);  // at most request_bytes: below 4 GiB (constructor)
      if (write && fixed) io_uring_prep_write_fixed(sqe, fd_, p.buf, n, p.offset, idx);
      else if (write) io_uring_prep_write(sqe, fd_, p.buf, n, p.offset);
      else if (fixed) io_uring_prep_read_fixed(sqe, fd_, p.buf, n, p.offset, idx);
      else io_uring_prep_read(sqe, fd_, p.buf, n, p.offset);
      sqe->user_data = next++;
    }
    if (err == 0 && io_uring_sq_ready(&ring_) > 0) {
      int const r = io_uring_submit(&ring_);
      if (r > 0) {
        in_kernel += static_cast<std::size_t>(r);
      } else if ((r == -EINTR || r == -EAGAIN || r == -EBUSY) && ++retries <= most_retries) {
        if (in_kernel == 0) continue;  // else reap one first: it frees what the kernel lacked
      } else if (r < 0) {
        err = -r;
      }
    }
    if (in_kernel == 0) break;  // an error with nothing accepted: nothing to reap
    io_uring_cqe* cqe = nullptr;
    int const w = io_uring_wait_cqe(&ring_, &cqe);
    if (w == -EINTR) continue;
    if (w < 0 || !cqe) {  // the ring itself failed: nothing more can be reaped safely
      if (err == 0) err = -w;
      break;
    }
    auto const i = static_cast<std::size_t>(cqe->user_data);
    int const res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    --in_kernel;
    auto const p = pending_[i];  // a copy: the pushes below may move the vector
    if ((res == -EINTR || res == -EAGAIN) && ++retries <= most_retries) {
      pending_.push_back(p);  // again, at the back
    } else if (res < 0) {
      if (err == 0) err = -res;
    } else if (res == 0) {
      if (err == 0) err = write ? ENOSPC : EIO;
    } else if (static_cast<std::size_t>(res) < p.len) {
      pending_.push_back({p.buf + res, p.offset + static_cast<std::size_t>(res), p.len - static_cast<std::size_t>(res)});
    }
  }
  if (err != 0) {
    if (io_uring_sq_ready(&ring_) > 0 || in_kernel > 0) restart_ring();  // never submit a failed transfer's leftovers
    fail(write, offset, len, err);
  }
}

TIDE_INLINE void spill_file::restart_ring() noexcept {
  io_uring_queue_exit(&ring_);
  uring_ = io_uring_queue_init(std::max<std::uint32_t>(opt_.queue_depth, 1), &ring_, 0) == 0;
  auto const host = std::exchange(registered_, {});
  if (uring_) register_memory(host);
  describe_noexcept();
}
#endif

namespace detail {
TIDE_INLINE void prepare_spill_file(std::optional<spill_file>& file, storage_options const& opt, std::size_t bytes,
                                    std::size_t alignment, std::string_view backend) {
  if (opt.directory.empty())
    throw error("tide::" + std::string(backend) + ": the schedule stores " + std::to_string(bytes) +
                " bytes of spilled slots or disk snapshots but the backend has no storage tier: set " + std::string(backend) +
                "_options::storage.directory to a directory on the storage device");
  if (alignment < spill_file::least_alignment)
    throw error("tide::" + std::string(backend) + ": the schedule's storage alignment (" + std::to_string(alignment) +
                ") is below the " + std::to_string(spill_file::least_alignment) +
                " bytes direct I/O moves at least: use buffer_spec::storage_alignment of 512 or more (the default is 4096)");
  if (!file) {
    file.emplace(opt, bytes, alignment);
  } else {
    file->lower_alignment(alignment);
    file->reserve(bytes);
  }
}
}  // namespace detail

}  // namespace tide
