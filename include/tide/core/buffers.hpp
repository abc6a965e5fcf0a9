#pragma once
//! \file
//! Buffers: how storage is provided. A device arena holds kept activations and the
//! transient regions; a ring of staging buffers receives prefetches; a pinned host arena holds
//! offloaded data and the spill ring that spilled data passes through to and from storage. `buffer_spec` is the value; `tide::buffers<knobs...>` spells it as a type.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tide/core/vocabulary.hpp>

namespace tide {

//! How storage is provided: staging ring size, region alignments, guard bytes and phase sharing.
struct buffer_spec {
  std::uint32_t staging_buffers = 2;   //!< device buffers that receive prefetched layers
  std::size_t device_alignment = 256;  //!< every device region starts on this boundary
  std::size_t host_alignment = 64;     //!< every pinned host region starts on this boundary
  std::size_t guard_bytes = 0;         //!< bytes after each device slot checked by debug runs
  //! Forward-only regions (offload sources, forward remat scratch) and backward-only regions
  //! (staging ring, recompute scratch) share addresses; backward's first use waits for forward's
  //! last copy. Saves memory, may expose the tail of the last offload.
  bool share_phase_regions = true;
  //! Pinned host buffers that spilled layers pass through on their way to and from storage: the
  //! last this many spilled layers stay in them, the others are written out and read back
  std::uint32_t spill_buffers = 2;
  //! Every storage file region, and every spill ring region, starts on this boundary and is
  //! padded to it: direct I/O (`O_DIRECT`, GPUDirect Storage) moves whole logical blocks
  std::size_t storage_alignment = 4096;
  //! A recompute is lent scratch (counted in the peak) for the slots it does not rebuild and for
  //! its carry out, so that a layer's unchanged forward runs as its recompute. Off: no such
  //! scratch (the peak of a layer's region less), and a recompute that writes what it does not
  //! rebuild is refused by name: for selective recomputes, which write only `produces()` slots and
  //! read the rest through `saved()` (the planner's per-slot recompute costs model these).
  bool lend_recompute_scratch = true;
  friend constexpr bool operator==(buffer_spec const&, buffer_spec const&) = default;
};

//! `buffer_spec::staging_buffers`: a ring of `N` device buffers, each sized for the largest
//! layer that uses it.
template <std::uint32_t N>
struct staging_buffers : detail::field_knob<buffer_spec, &buffer_spec::staging_buffers, N, "staging_buffers"> {};
//! `buffer_spec::device_alignment`.
template <std::size_t Bytes>
struct device_alignment : detail::field_knob<buffer_spec, &buffer_spec::device_alignment, Bytes, "device_alignment"> {
  static_assert(Bytes > 0 && (Bytes & (Bytes - 1)) == 0, "tide::device_alignment<Bytes>: the alignment must be a power of two");
};
//! `buffer_spec::host_alignment`.
template <std::size_t Bytes>
struct host_alignment : detail::field_knob<buffer_spec, &buffer_spec::host_alignment, Bytes, "host_alignment"> {
  static_assert(Bytes > 0 && (Bytes & (Bytes - 1)) == 0, "tide::host_alignment<Bytes>: the alignment must be a power of two");
};
//! `buffer_spec::guard_bytes`.
template <std::size_t Bytes>
struct guard_bytes : detail::field_knob<buffer_spec, &buffer_spec::guard_bytes, Bytes, "guard_bytes"> {};
//! `buffer_spec::share_phase_regions`.
template <bool On>
struct share_phase_regions : detail::field_knob<buffer_spec, &buffer_spec::share_phase_regions, On, "share_phase_regions"> {};

//! `buffer_spec::spill_buffers`.
template <std::uint32_t N>
struct spill_buffers : detail::field_knob<buffer_spec, &buffer_spec::spill_buffers, N, "spill_buffers"> {};
//! `buffer_spec::storage_alignment`.
template <std::size_t Bytes>
struct storage_alignment : detail::field_knob<buffer_spec, &buffer_spec::storage_alignment, Bytes, "storage_alignment"> {
  static_assert(Bytes > 0 && (Bytes & (Bytes - 1)) == 0, "tide::storage_alignment<Bytes>: the alignment must be a power of two");
};

//! `buffer_spec::lend_recompute_scratch`.
template <bool On>
struct lend_recompute_scratch
    : detail::field_knob<buffer_spec, &buffer_spec::lend_recompute_scratch, On, "lend_recompute_scratch"> {};

//! Buffers from knobs in any order; an absent knob keeps `buffer_spec`'s default:
//! `tide::buffers<tide::staging_buffers<3>, tide::guard_bytes<64>>`.
template <class... Knobs>
struct buffers {
  static_assert((detail::knob_for<Knobs, buffer_spec> && ...),
                "tide::buffers<...>: each argument must be a buffer knob: tide::staging_buffers<N>, "
                "tide::device_alignment<N>, tide::host_alignment<N>, tide::guard_bytes<N>, "
                "tide::share_phase_regions<bool>, tide::spill_buffers<N>, tide::storage_alignment<N> or "
                "tide::lend_recompute_scratch<bool>");
  static_assert(detail::distinct_knobs<Knobs...>(), "tide::buffers<...>: a knob is given twice: give each knob once");
  using tide_buffers_tag = void;  //!< Marks this type as the buffers part of `tide::strategy_of`.
  //! The `buffer_spec` the knobs spell.
  static constexpr buffer_spec spec() { return detail::apply_knobs<buffer_spec, Knobs...>(); }
};

//! Buffers with 64 guard bytes after every slot, for debug runs.
using debug_buffers = buffers<guard_bytes<64>>;

}  // namespace tide
