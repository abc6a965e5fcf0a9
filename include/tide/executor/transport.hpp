#pragma once
//! \file
//! `tide::transport_context`: what a pipeline stage's transport is given (`tide::hooks::transport`)
//! for each boundary transfer of a stage schedule (core/stage_schedule.hpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

#include <tide/core/op.hpp>

namespace tide {

//! Given to a transport's `send` and `receive` (`tide::hooks::transport`): one boundary of one
//! micro-batch in a stage schedule, on the communication stream. Forward (`gradient` false): the
//! stage receives the micro-batch's input from stage `stage - 1` and sends its output to
//! `stage + 1`; backward: it receives its output's gradient from `stage + 1` and sends its input's
//! gradient to `stage - 1`. At the pipeline's ends (`peer()` empty: the first stage's input and
//! its gradient) the transport is the user's way in and out: it writes the input (the embedding's
//! output) and takes the input's gradient (the embedding's backward).
template <class Stream>
struct transport_context {
  Stream stream{};                 //!< the communication stream
  op_kind kind = op_kind::send;    //!< `send` or `receive`
  bool gradient = false;           //!< the boundary tensor's gradient (backward), not the tensor (forward)
  std::uint32_t micro_batch = 0;   //!< whose boundary
  std::uint32_t stage = 0;         //!< this stage
  std::uint32_t stages = 1;        //!< stages in the pipeline
  std::byte* data = nullptr;       //!< the bytes to send, or where the received ones go
  std::size_t bytes = 0;           //!< their size: the stack's carry's
  //! 0: a transfer alone (complete it before returning); 1: a transfer posted with the ones that
  //! follow (post it and return); 2: the last of such a group (complete them all before
  //! returning). Stage schedules post a send with the next receive, and interleaved ones a round's
  //! sends with the next round's receives, so that neighbours cannot deadlock.
  std::uint8_t pair = 0;
  bool step_failed = false;  //!< an op of this step failed on this rank: tell the peers rather than move data
  //! Becomes true while the op runs if another op of the step fails (a transport polls it while it
  //! waits for a peer, so that a rank whose step failed is not left waiting)
  std::atomic<bool> const* failing = nullptr;
  std::uint32_t chunk = 0;           //!< whose chunk (0 but interleaved)
  std::uint32_t virtual_stages = 1;  //!< chunks per stage

  //! The neighbour this transfer goes to or comes from, or -1 at the pipeline's ends.
  [[nodiscard]] constexpr std::int64_t peer() const noexcept {
    bool const down = (kind == op_kind::send) != gradient;  // toward the last stage
    if (down) return stage + 1 < stages ? std::int64_t{stage} + 1 : chunk + 1 < virtual_stages ? 0 : -1;
    return stage > 0 ? std::int64_t{stage} - 1 : chunk > 0 ? std::int64_t{stages} - 1 : -1;
  }
  //! The bytes, writable (a receive writes them; a send reads them).
  [[nodiscard]] std::span<std::byte> span() const noexcept { return {data, bytes}; }
};

}  // namespace tide
