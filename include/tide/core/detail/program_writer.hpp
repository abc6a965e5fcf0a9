#pragma once
//! \file
//! The op program's writer: emits ops in issue order with the minimal set of cross-stream waits.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <tide/core/schedule.hpp>

namespace tide::detail {

//! Emits ops in issue order and keeps only the cross-stream waits that are not already implied
//! (per-stream vector clocks), so the program carries the minimal set of events.
struct program_writer {
  schedule& out;
  std::vector<std::array<std::int32_t, stream_count>> clocks;  // per op: latest op per stream that precedes it
  std::array<std::array<std::int32_t, stream_count>, stream_count> tail{};  // per stream: its tail's clock
  std::vector<std::uint32_t> pending;

  constexpr explicit program_writer(schedule& s) : out(s) {
    for (auto& t : tail) t.fill(-1);
  }
  constexpr void wait(std::int64_t op_index) {
    if (op_index >= 0) pending.push_back(static_cast<std::uint32_t>(op_index));
  }
  constexpr std::uint32_t emit(op o) {
    auto const s = static_cast<std::size_t>(o.stream);
    auto& mine = tail[s];
    o.wait_begin = static_cast<std::uint32_t>(out.waits.size());
    // Latest first, so an earlier wait implied by a later one is dropped (an op has few waits:
    // insertion sort).
    for (std::size_t i = 1; i < pending.size(); ++i)
      for (std::size_t j = i; j > 0 && pending[j] > pending[j - 1]; --j) std::swap(pending[j], pending[j - 1]);
    for (auto w : pending) {
      auto const ws = static_cast<std::size_t>(out.ops[w].stream);
      if (mine[ws] >= static_cast<std::int32_t>(w)) continue;  // same stream, or already ordered
      out.waits.push_back(w);
      if (out.ops[w].event < 0) out.ops[w].event = static_cast<std::int32_t>(out.event_count++);
      for (std::size_t t = 0; t < stream_count; ++t) mine[t] = std::max(mine[t], clocks[w][t]);
    }
    pending.clear();
    o.wait_count = static_cast<std::uint32_t>(out.waits.size()) - o.wait_begin;
    auto const idx = static_cast<std::uint32_t>(out.ops.size());
    mine[s] = static_cast<std::int32_t>(idx);
    out.ops.push_back(o);
    clocks.push_back(mine);
    return idx;
  }
  //! Emits `o` after `after` alone, leaving the waits gathered for the next op pending.
  constexpr std::uint32_t emit_aside(op o, std::int64_t after) {
    auto held = std::move(pending);
    pending.clear();
    wait(after);
    auto const idx = emit(o);
    pending = std::move(held);
    return idx;
  }
};

}  // namespace tide::detail
