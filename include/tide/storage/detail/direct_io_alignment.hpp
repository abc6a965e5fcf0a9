#pragma once
//! \file
//! What direct I/O on an open file needs: the alignment of file offsets and lengths, and of buffer
//! addresses. The kernel says it with `statx`'s `STATX_DIOALIGN` (Linux 6.1, where the file system
//! reports it); otherwise the backing block device's logical block size, from sysfs, is what
//! `O_DIRECT` moves. A 4Kn drive (4096-byte sectors, as many NVMe drives are formatted) refuses
//! transfers aligned to 512 with a bare `EINVAL`: `spill_file` asks here when it opens the file
//! and refuses a smaller storage alignment by name.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <tide/core/config.hpp>
#if TIDE_DEFINITIONS
#include <fstream>
#endif

namespace tide::detail {

//! A file's direct-I/O alignment and where it was learned.
struct direct_io_alignment {
  std::size_t offset = 0;  //!< file offsets and lengths are multiples of it
  std::size_t memory = 0;  //!< buffer addresses are multiples of it
  std::string source{};    //!< how it was learned: "statx STATX_DIOALIGN" or the sysfs file read

  //! The alignment a transfer needs for both: the larger of the two.
  [[nodiscard]] std::size_t required() const noexcept { return std::max(offset, memory); }
};

//! `fd`'s alignment as `statx` reports it, or nothing where the kernel, the C library's headers or
//! the file system do not report it (`STATX_DIOALIGN` unset, or 0: no direct I/O on the file).
[[nodiscard]] inline std::optional<direct_io_alignment> direct_io_alignment_from_statx([[maybe_unused]] int fd) {
#if defined(STATX_DIOALIGN)
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0) return std::nullopt;
  if ((sx.stx_mask & STATX_DIOALIGN) == 0 || sx.stx_dio_offset_align == 0) return std::nullopt;
  return direct_io_alignment{sx.stx_dio_offset_align, std::max<std::size_t>(sx.stx_dio_mem_align, 1), "statx STATX_DIOALIGN"};
#else
  return std::nullopt;
#endif
}

//! The logical block size of the block device under `fd`'s file system, read from
//! `<sysfs>/dev/block/MAJ:MIN/queue/logical_block_size` (a partition's from its disk's, one level
//! up), or nothing for a file system without one block device (tmpfs, overlay, btrfs's anonymous
//! devices) or a sysfs that does not say. `sysfs` is "/sys" but for tests.
[[nodiscard]] TIDE_INLINE std::optional<direct_io_alignment> direct_io_alignment_from_sysfs(int fd, std::string const& sysfs = "/sys");

//! `fd`'s direct-I/O alignment: `statx`'s where it reports one, else the block device's logical
//! block size, else nothing (the caller keeps its own floor).
[[nodiscard]] inline std::optional<direct_io_alignment> probe_direct_io_alignment(int fd, std::string const& sysfs = "/sys") {
  if (auto a = direct_io_alignment_from_statx(fd)) return a;
  return direct_io_alignment_from_sysfs(fd, sysfs);
}

#if TIDE_DEFINITIONS
TIDE_INLINE std::optional<direct_io_alignment> direct_io_alignment_from_sysfs(int fd, std::string const& sysfs) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  auto const dev = sysfs + "/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  for (auto const& path : {dev + "/queue/logical_block_size", dev + "/../queue/logical_block_size"}) {
    std::ifstream in(path);
    unsigned long long n = 0;
    // A power of two of at least 512 (what Linux takes as a logical block); anything else is not
    // a figure to trust.
    // The whole file is the number: "4096abc" is not 4096.
    if (in >> n && (in >> std::ws).peek() == std::ifstream::traits_type::eof() && n >= 512 && n <= (1u << 20) && (n & (n - 1)) == 0)
      return direct_io_alignment{static_cast<std::size_t>(n), static_cast<std::size_t>(n), "logical block size in " + path};
  }
  return std::nullopt;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide::detail
