#pragma once
//! \file Pipeline types: how copies are placed and overlapped.

#include <cstddef>
#include <cstdint>

namespace tide {

struct pipeline_spec {
  //! Copies on dedicated d2h/h2d streams ordered by events (true), or on the compute stream (the
  //! naive baseline, false).
  bool latency_hiding = true;
  //! A layer's prefetch is issued this many layers before its backward (0: just in time).
  std::uint32_t prefetch_distance = 1;
  //! Copies are split into chunks of this many bytes (0: one copy per slot).
  std::size_t chunk_bytes = 0;
  //! Layers whose offload may be in flight at once; each needs one device source buffer.
  std::uint32_t max_offloads_in_flight = 2;
};

//! Collective hooks the schedule makes room for, on the communication stream.
struct collective_spec {
  bool before_forward = false;  //!< e.g. gather a layer's weights; issued one layer ahead
  bool after_backward = false;  //!< e.g. all-reduce a layer's gradients
};

template <bool LatencyHiding = true, std::uint32_t PrefetchDistance = 1, std::size_t ChunkBytes = 0,
          std::uint32_t MaxOffloadsInFlight = 2>
struct pipeline {
  static_assert(MaxOffloadsInFlight >= 1,
                "tide::pipeline: MaxOffloadsInFlight must be at least 1 (each in-flight offload needs a source buffer)");
  using tide_pipeline_tag = void;
  static constexpr pipeline_spec spec() {
    return {LatencyHiding, PrefetchDistance, ChunkBytes, MaxOffloadsInFlight};
  }
};

//! Copies on the compute stream: the baseline that latency hiding is measured against.
using naive_pipeline = pipeline<false, 0>;

template <bool BeforeForward, bool AfterBackward>
struct collectives {
  using tide_collectives_tag = void;
  static constexpr collective_spec spec() { return {BeforeForward, AfterBackward}; }
};
using no_collectives = collectives<false, false>;

}  // namespace tide
