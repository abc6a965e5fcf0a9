#pragma once
//! \file
//! What the checker (`check_schedule`, core/check.hpp) reports about a program it proved. A header
//! of its own so that the checker's passes in core/detail/ can fill it; core/check.hpp includes it.

#include <cstddef>

namespace tide {

//! What `check_schedule` measured while proving a program: the replayed peaks and the work done.
struct check_report {
  std::size_t replayed_device_bytes = 0;  //!< arena extent the ops actually touch
  std::size_t replayed_host_bytes = 0;    //!< pinned host extent the ops actually touch
  std::size_t replayed_storage_bytes = 0; //!< storage file extent the ops actually touch
  //! Ordering obligations proven: each access against the latest conflicting access per stream
  //! (every other overlapping read/write pair follows from these by transitivity).
  std::size_t conflicting_pairs = 0;
};

}  // namespace tide
