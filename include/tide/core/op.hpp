#pragma once
//! \file
//! The op program: what each stream runs, in host issue order, with cross-stream waits.

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <span>
#include <string_view>

#include <tide/core/vocabulary.hpp>

namespace tide {

//! What an op does: run a user lambda, copy between arenas, move bytes to or from storage, or call
//! a collective hook.
enum class op_kind : std::uint8_t {
  forward,     //!< the user's forward lambda of a layer (compute stream)
  recompute,   //!< the forward lambda again, producing only the layer's remat slots
  backward,    //!< the user's backward lambda of a layer (compute stream)
  offload,     //!< device-to-host copy of (a chunk of) a slot
  prefetch,    //!< host-to-device copy of (a chunk of) a slot into a staging buffer
  gather,      //!< the before-forward collective hook of a layer (communication stream)
  reduce,      //!< the after-backward collective hook of a layer (communication stream)
  advance,     //!< the forward lambda again, producing only the layer's carry out (a segment recomputation)
  regather,    //!< the before-backward collective hook of a layer (communication stream)
  store,       //!< a spilled slot's bytes from the pinned spill ring to its storage file region
  load,        //!< a spilled slot's bytes from its storage file region back to the spill ring
  //! A stage's boundary tensor or its gradient to the neighbouring stage (or, at the pipeline's
  //! ends, to the user): through the step's transport, on the communication stream
  send,
  //! A stage's boundary tensor or its gradient from the neighbouring stage (or, at the pipeline's
  //! ends, from the user): through the step's transport, on the communication stream
  receive,
};
//! The number of op kinds (the last one's value plus one).
inline constexpr std::size_t op_kind_count = static_cast<std::size_t>(op_kind::receive) + 1;

//! The kind's name, as `describe`, traces and checker messages print it.
constexpr std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::forward: return "forward";
    case op_kind::recompute: return "recompute";
    case op_kind::backward: return "backward";
    case op_kind::offload: return "offload";
    case op_kind::prefetch: return "prefetch";
    case op_kind::gather: return "gather";
    case op_kind::reduce: return "reduce";
    case op_kind::advance: return "advance";
    case op_kind::regather: return "regather";
    case op_kind::store: return "store";
    case op_kind::load: return "load";
    case op_kind::send: return "send";
    case op_kind::receive: return "receive";
  }
  return "?";
}

//! A copy between the device and host arenas: offload or prefetch.
constexpr bool is_copy(op_kind k) noexcept { return k == op_kind::offload || k == op_kind::prefetch; }
//! A transfer between the host arena and the storage file: store or load.
constexpr bool is_storage(op_kind k) noexcept { return k == op_kind::store || k == op_kind::load; }
//! A collective hook's op: gather, regather or reduce (on the communication stream).
constexpr bool is_collective(op_kind k) noexcept {
  return k == op_kind::gather || k == op_kind::regather || k == op_kind::reduce;
}

//! A stage's boundary transfer: send or receive (stage schedules only, core/stage_schedule.hpp).
constexpr bool is_boundary(op_kind k) noexcept { return k == op_kind::send || k == op_kind::receive; }

//! `op::slot` of an op that copies no slot (compute and collective ops).
inline constexpr std::uint16_t no_slot = 0xffff;
//! `op::slot` of a copy of the carry (`op::layer` is then the carry's index: the input of that layer).
inline constexpr std::uint16_t carry_slot = 0xfffe;
//! `op::slot` of a send or receive of a boundary tensor's gradient (stage schedules: the gradient
//! of the stage's input goes back, that of its output comes in).
inline constexpr std::uint16_t gradient_slot = 0xfffd;
//! `op::carry_in` / `op::carry_out` of an op that reads or writes no carry.
inline constexpr std::size_t no_carry = static_cast<std::size_t>(-1);

//! One op. Ops are stored in host issue order; ops on one stream run in that order; an op also
//! waits for the ops listed in `schedule::waits[wait_begin, wait_begin + wait_count)` (on other
//! streams), each of which records event `event` when it completes.
struct op {
  op_kind kind = op_kind::forward;            //!< what the op does
  stream_role stream = stream_role::compute;  //!< the stream it is issued on
  std::uint16_t slot = no_slot;  //!< layer-local slot index (copies only)
  std::uint32_t layer = 0;       //!< layer the op works for (a carry copy: the carry's index)
  std::uint32_t chunk = 0;   //!< chunk index of a copy; send, receive: its place in a pair (below)
  //! Chunks the slot's copy is split into. Send, receive: 2 for a send and the receive right
  //! after it on the same stream, posted together (the send's `chunk` is 0, the receive's 1):
  //! the transport posts the send and returns, and completes both in the receive, so that two
  //! neighbouring stages that send to each other cannot deadlock; nothing waits on such a send.
  std::uint32_t chunks = 1;
  std::size_t device_offset = 0;  //!< copies: device arena offset of this chunk
  std::size_t host_offset = 0;    //!< copies: host arena offset of this chunk
  std::size_t bytes = 0;          //!< copies: bytes in this chunk; store, load: the slot's bytes
  //! forward, advance, recompute, backward: device offset of the carry the layer reads (its
  //! input), or `no_carry`.
  std::size_t carry_in = no_carry;
  //! forward, advance, recompute: where the layer writes its carry out; backward of the last layer:
  //! the stack's output (for the loss); otherwise `no_carry`.
  std::size_t carry_out = no_carry;
  std::uint32_t wait_begin = 0;  //!< first entry of this op's waits in `schedule::waits`
  std::uint32_t wait_count = 0;  //!< number of ops on other streams it waits for
  std::int32_t event = -1;  //!< event recorded after this op, or -1 when nothing waits on it
  //! store, load: the slot's region in the storage file (the transfer covers `bytes` rounded up to
  //! `buffer_spec::storage_alignment`, as direct I/O needs; the padding is the region's own)
  std::size_t file_offset = 0;

  //! Field-wise equality.
  friend constexpr bool operator==(op const&, op const&) = default;
};

//! The one name an op has everywhere (checker messages, `describe`, traces, NVTX ranges):
//! "forward L3", "offload L3 q_proj", "prefetch L3 q_proj 2/4" (chunks counted from 1, shown when
//! a slot is split). Written into `buf` (truncated to fit, always terminated), so the NVTX path
//! allocates nothing; `slot_name` may be empty, then the slot's index is used.
inline void write_op_label(std::span<char> buf, op const& o, std::string_view slot_name) noexcept {
  if (buf.empty()) return;
  auto const kind = to_string(o.kind);
  int const k = static_cast<int>(kind.size());
  int n = std::snprintf(buf.data(), buf.size(), "%.*s L%u", k, kind.data(), static_cast<unsigned>(o.layer));
  auto rest = [&] { return n < 0 || static_cast<std::size_t>(n) >= buf.size() ? std::span<char>{} : buf.subspan(static_cast<std::size_t>(n)); };
  if (o.slot == no_slot) return;
  if (o.slot == gradient_slot) slot_name = "gradient";
  if (auto r = rest(); !r.empty()) {
    int const m = slot_name.empty()
                      ? std::snprintf(r.data(), r.size(), " slot %u", static_cast<unsigned>(o.slot))
                      : std::snprintf(r.data(), r.size(), " %.*s", static_cast<int>(slot_name.size()), slot_name.data());
    n = m < 0 ? -1 : n + m;
  }
  if (o.chunks <= 1) return;
  if (auto r = rest(); !r.empty())
    std::snprintf(r.data(), r.size(), " %u/%u", static_cast<unsigned>(o.chunk + 1), static_cast<unsigned>(o.chunks));
}

}  // namespace tide
