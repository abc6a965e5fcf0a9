#pragma once
//! \file
//! Pipelines (how copies are placed and overlapped) and collectives (which hooks the
//! schedule makes room for). The values `pipeline_spec` and `collective_spec` are what the core
//! works on; `tide::pipeline<knobs...>` and `tide::collectives<knobs...>` spell them as types,
//! each knob named and in any order. The collectives' part is in `core/collectives.hpp`, which
//! this header includes.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tide/core/collectives.hpp>
#include <tide/core/vocabulary.hpp>

namespace tide {

//! How copies are placed and overlapped with compute: streams, prefetch distance, chunking.
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
  friend constexpr bool operator==(pipeline_spec const&, pipeline_spec const&) = default;
};

// ---------------------------------------------------------------------------------------------
// Pipeline knobs

//! `pipeline_spec::latency_hiding`.
template <bool On>
struct latency_hiding : detail::field_knob<pipeline_spec, &pipeline_spec::latency_hiding, On, "latency_hiding"> {};
//! `pipeline_spec::prefetch_distance`.
template <std::uint32_t Layers>
struct prefetch_distance : detail::field_knob<pipeline_spec, &pipeline_spec::prefetch_distance, Layers, "prefetch_distance"> {};
//! `pipeline_spec::chunk_bytes`.
template <std::size_t Bytes>
struct chunk_bytes : detail::field_knob<pipeline_spec, &pipeline_spec::chunk_bytes, Bytes, "chunk_bytes"> {};
//! `pipeline_spec::max_offloads_in_flight`.
template <std::uint32_t N>
struct max_offloads_in_flight : detail::field_knob<pipeline_spec, &pipeline_spec::max_offloads_in_flight, N, "max_offloads_in_flight"> {
  static_assert(N >= 1, "tide::max_offloads_in_flight<N>: N must be at least 1 (each in-flight offload needs a "
                        "device source buffer)");
};

//! A pipeline from knobs in any order; an absent knob keeps `pipeline_spec`'s default:
//! `tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<(1 << 20)>>`.
template <class... Knobs>
struct pipeline {
  static_assert((detail::knob_for<Knobs, pipeline_spec> && ...),
                "tide::pipeline<...>: each argument must be a pipeline knob: tide::latency_hiding<bool>, "
                "tide::prefetch_distance<N>, tide::chunk_bytes<N> or tide::max_offloads_in_flight<N>");
  static_assert(detail::distinct_knobs<Knobs...>(), "tide::pipeline<...>: a knob is given twice: give each knob once");
  using tide_pipeline_tag = void;  //!< Marks this type as the pipeline part of `tide::strategy_of`.
  //! The `pipeline_spec` the knobs spell.
  static constexpr pipeline_spec spec() { return detail::apply_knobs<pipeline_spec, Knobs...>(); }
};

//! Copies on the compute stream, just in time: the baseline that latency hiding is measured against.
using naive_pipeline = pipeline<latency_hiding<false>, prefetch_distance<0>>;

}  // namespace tide
