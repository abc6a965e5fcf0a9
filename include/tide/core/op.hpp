#pragma once
//! \file The op program: what each stream runs, in host issue order, with cross-stream waits.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <tide/core/config.hpp>

namespace tide {

enum class op_kind : std::uint8_t {
  forward,     //!< the user's forward lambda of a layer (compute stream)
  recompute,   //!< the forward lambda again, producing only the layer's remat slots
  backward,    //!< the user's backward lambda of a layer (compute stream)
  offload,     //!< device-to-host copy of (a chunk of) a slot
  prefetch,    //!< host-to-device copy of (a chunk of) a slot into a staging buffer
  gather,      //!< collective hook before a layer's forward (communication stream)
  collective,  //!< collective hook after a layer's backward (communication stream)
};

constexpr std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::forward: return "forward";
    case op_kind::recompute: return "recompute";
    case op_kind::backward: return "backward";
    case op_kind::offload: return "offload";
    case op_kind::prefetch: return "prefetch";
    case op_kind::gather: return "gather";
    case op_kind::collective: return "collective";
  }
  return "?";
}

constexpr bool is_copy(op_kind k) noexcept { return k == op_kind::offload || k == op_kind::prefetch; }

inline constexpr std::uint16_t no_slot = 0xffff;

//! One op. Ops are stored in host issue order; ops on one stream run in that order; an op also
//! waits for the ops listed in `schedule::waits[wait_begin, wait_begin + wait_count)` (on other
//! streams), each of which records event `event` when it completes.
struct op {
  op_kind kind = op_kind::forward;
  stream_role stream = stream_role::compute;
  std::uint16_t slot = no_slot;  //!< layer-local slot index (copies only)
  std::uint32_t layer = 0;
  std::uint32_t chunk = 0;   //!< chunk index of a copy
  std::uint32_t chunks = 1;  //!< chunks the slot's copy is split into
  std::size_t device_offset = 0;  //!< copies: device arena offset of this chunk
  std::size_t host_offset = 0;    //!< copies: host arena offset of this chunk
  std::size_t bytes = 0;          //!< copies: bytes in this chunk
  std::uint32_t wait_begin = 0;
  std::uint32_t wait_count = 0;
  std::int32_t event = -1;  //!< event recorded after this op, or -1 when nothing waits on it

  friend constexpr bool operator==(op const&, op const&) = default;
};

//! Where one slot of one layer lives.
struct slot_binding {
  std::string_view name;
  placement where = placement::keep;
  std::size_t bytes = 0;
  std::size_t forward_offset = 0;   //!< device offset the forward lambda writes
  std::size_t backward_offset = 0;  //!< device offset recompute/backward read
  std::size_t host_offset = 0;      //!< pinned host offset (offload only)
  friend constexpr bool operator==(slot_binding const&, slot_binding const&) = default;
};

struct layer_binding {
  std::string_view type_name;
  std::uint32_t first_slot = 0;  //!< index into the schedule's slot bindings
  std::uint32_t slot_count = 0;
  std::size_t offloaded_bytes = 0;  //!< region bytes of its offloaded slots
  std::size_t remat_bytes = 0;      //!< region bytes of its remat slots
  friend constexpr bool operator==(layer_binding const&, layer_binding const&) = default;
};

//! The static buffer assignment.
struct arena_layout {
  std::size_t device_bytes = 0;      //!< the whole device arena: the predicted device peak
  std::size_t host_bytes = 0;        //!< the whole pinned host arena: the predicted host peak
  std::size_t kept_bytes = 0;        //!< kept slots, at offset 0
  std::size_t forward_area = 0;      //!< offset of offload sources then forward remat scratch
  std::size_t backward_area = 0;     //!< offset of the staging ring then recompute scratch
  std::size_t offload_ring_bytes = 0; //!< all offload source buffers (each sized for its layers)
  std::size_t staging_ring_bytes = 0; //!< all staging buffers (each sized for its layers)
  std::uint32_t offload_buffers = 0;  //!< offload source buffers in the ring
  std::uint32_t staging_buffers = 0;  //!< staging buffers in the ring
  std::size_t remat_scratch_bytes = 0;
  friend constexpr bool operator==(arena_layout const&, arena_layout const&) = default;
};

}  // namespace tide
