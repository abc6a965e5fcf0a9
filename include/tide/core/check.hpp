#pragma once
//! \file The checker: verifies any op program against the properties tide promises.
//!
//! - structure: waits name earlier ops on other streams that record an event;
//! - no race: two ops that touch overlapping bytes (one of them writing) are ordered by stream
//!   order or an event chain, so no region is reused while an op that reads or writes it may run;
//! - data flow: every read (a backward, a recompute, a copy) sees the bytes written for that very
//!   (layer, slot), ordered before it, and not overwritten in between: reloads complete before
//!   their consumer, offloads complete before their source region is reused;
//! - peaks: replaying the ops' byte ranges reproduces the predicted device and host peaks.

#include <algorithm>
#include <utility>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>

namespace tide {

struct check_report {
  std::size_t replayed_device_bytes = 0;  //!< arena extent the ops actually touch
  std::size_t replayed_host_bytes = 0;
  std::size_t conflicting_pairs = 0;  //!< overlapping read/write pairs proven ordered
};

namespace detail {

struct access {
  std::uint32_t op;
  bool host;
  bool write;
  std::size_t begin, end;
  std::uint32_t layer;
  std::uint16_t slot;
  std::int64_t shift;  //!< slot-relative offset of a byte minus its address: equal shifts, same bytes
  bool same_data(access const& o) const noexcept { return layer == o.layer && slot == o.slot && shift == o.shift; }
};

//! Length of the union of `spans` clipped to [lo, hi).
inline std::size_t covered_length(std::vector<std::pair<std::size_t, std::size_t>>& spans, std::size_t lo,
                                  std::size_t hi) {
  std::sort(spans.begin(), spans.end());
  std::size_t total = 0, until = lo;
  for (auto [b, e] : spans) {
    b = std::max(b, until);
    e = std::min(e, hi);
    if (b < e) total += e - b, until = e;
  }
  return total;
}

inline std::string op_name(schedule_view const& s, std::uint32_t i) {
  auto const& o = s.ops[i];
  std::string r = "op #" + std::to_string(i) + " (" + std::string(to_string(o.kind)) + " layer " + std::to_string(o.layer);
  if (o.slot != no_slot) {
    r += " slot '" + std::string(s.slots_of(o.layer)[o.slot].name) + "'";
    if (o.chunks > 1) r += " chunk " + std::to_string(o.chunk) + "/" + std::to_string(o.chunks);
  }
  return r + " on " + std::string(to_string(o.stream)) + ")";
}

inline void collect_accesses(schedule_view const& s, std::vector<access>& out) {
  auto sh = [](std::size_t data, std::size_t addr) { return static_cast<std::int64_t>(data) - static_cast<std::int64_t>(addr); };
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    auto slots = [&] { return s.slots_of(o.layer); };
    auto const n = [&] { return static_cast<std::uint16_t>(slots().size()); };
    // A copy chunk's first byte is this far into its slot.
    auto const chunk_start = o.chunks > 1 ? std::size_t{o.chunk} * s.pipeline.chunk_bytes : 0;
    switch (o.kind) {
      case op_kind::forward:
        for (std::uint16_t k = 0; k < n(); ++k) {
          auto const& b = slots()[k];
          out.push_back({i, false, true, b.forward_offset, b.forward_offset + b.bytes, o.layer, k, sh(0, b.forward_offset)});
        }
        break;
      case op_kind::recompute:
        for (std::uint16_t k = 0; k < n(); ++k) {
          auto const& b = slots()[k];
          out.push_back({i, false, b.where == placement::remat, b.backward_offset, b.backward_offset + b.bytes, o.layer, k,
                         sh(0, b.backward_offset)});
        }
        break;
      case op_kind::backward:
        for (std::uint16_t k = 0; k < n(); ++k) {
          auto const& b = slots()[k];
          out.push_back({i, false, false, b.backward_offset, b.backward_offset + b.bytes, o.layer, k, sh(0, b.backward_offset)});
        }
        break;
      case op_kind::offload:
        out.push_back({i, false, false, o.device_offset, o.device_offset + o.bytes, o.layer, o.slot, sh(chunk_start, o.device_offset)});
        out.push_back({i, true, true, o.host_offset, o.host_offset + o.bytes, o.layer, o.slot, sh(chunk_start, o.host_offset)});
        break;
      case op_kind::prefetch:
        out.push_back({i, true, false, o.host_offset, o.host_offset + o.bytes, o.layer, o.slot, sh(chunk_start, o.host_offset)});
        out.push_back({i, false, true, o.device_offset, o.device_offset + o.bytes, o.layer, o.slot, sh(chunk_start, o.device_offset)});
        break;
      case op_kind::gather:
      case op_kind::collective: break;
    }
  }
}

}  // namespace detail

//! Verifies `s`; throws `schedule_error` naming the first violation and the ops involved.
inline check_report check_schedule(schedule_view const& s) {
  auto fail = [](std::string const& m) { throw schedule_error("tide::check_schedule: " + m); };
  auto const n = static_cast<std::uint32_t>(s.ops.size());

  // Structure and vector clocks.
  std::vector<std::array<std::int64_t, stream_count>> clock(n);
  std::array<std::int64_t, stream_count> none{};
  none.fill(-1);
  std::array<std::array<std::int64_t, stream_count>, stream_count> tail{};
  tail.fill(none);
  std::vector<bool> event_seen(s.event_count, false);
  for (std::uint32_t i = 0; i < n; ++i) {
    auto const& o = s.ops[i];
    auto const st = static_cast<std::size_t>(o.stream);
    if (o.layer >= s.layers.size()) fail("op #" + std::to_string(i) + " names layer " + std::to_string(o.layer) + " beyond the stack");
    if (o.slot != no_slot && o.slot >= s.layers[o.layer].slot_count)
      fail("op #" + std::to_string(i) + " names slot " + std::to_string(o.slot) + " which layer " + std::to_string(o.layer) + " does not have");
    if (is_copy(o.kind) && o.slot == no_slot) fail("op #" + std::to_string(i) + " is a copy of no slot");
    if (st >= stream_count) fail(detail::op_name(s, i) + " names no valid stream");
    if (o.event >= 0) {
      if (static_cast<std::uint32_t>(o.event) >= s.event_count || event_seen[o.event])
        fail(detail::op_name(s, i) + " records event " + std::to_string(o.event) + " which is out of range or used twice");
      event_seen[o.event] = true;
    }
    if (std::uint64_t{o.wait_begin} + o.wait_count > s.waits.size()) fail(detail::op_name(s, i) + " has waits out of range");
    auto c = tail[st];
    for (auto w : s.waits_of(o)) {
      if (w >= i) fail(detail::op_name(s, i) + " waits on op #" + std::to_string(w) + " which is not issued before it");
      if (s.ops[w].event < 0) fail(detail::op_name(s, i) + " waits on " + detail::op_name(s, w) + " which records no event");
      for (std::size_t t = 0; t < stream_count; ++t) c[t] = std::max(c[t], clock[w][t]);
    }
    c[st] = i;
    clock[i] = c;
    tail[st] = c;
  }
  auto before = [&](std::uint32_t a, std::uint32_t b) {  // a happens before b
    return a != b && clock[b][static_cast<std::size_t>(s.ops[a].stream)] >= static_cast<std::int64_t>(a);
  };

  std::vector<detail::access> acc;
  detail::collect_accesses(s, acc);
  check_report report;
  auto const guard = s.buffers.guard_bytes;
  for (auto const& a : acc) {
    if (a.host) {
      report.replayed_host_bytes = std::max(report.replayed_host_bytes, align_up(a.end, s.buffers.host_alignment));
    } else {
      report.replayed_device_bytes =
          std::max(report.replayed_device_bytes, align_up(a.end + guard, s.buffers.device_alignment));
    }
  }
  if (report.replayed_device_bytes != s.arena.device_bytes)
    fail("replaying the ops touches " + std::to_string(report.replayed_device_bytes) +
         " device bytes but the predicted peak is " + std::to_string(s.arena.device_bytes));
  if (report.replayed_host_bytes != s.arena.host_bytes)
    fail("replaying the ops touches " + std::to_string(report.replayed_host_bytes) +
         " host bytes but the predicted peak is " + std::to_string(s.arena.host_bytes));

  // Races: sweep accesses sorted by address.
  std::sort(acc.begin(), acc.end(), [](auto const& x, auto const& y) {
    return x.host != y.host ? x.host < y.host : x.begin < y.begin;
  });
  auto space = [](bool h) { return h ? std::string("host") : std::string("device"); };
  for (std::size_t i = 0; i < acc.size(); ++i)
    for (std::size_t j = i + 1; j < acc.size() && acc[j].host == acc[i].host && acc[j].begin < acc[i].end; ++j) {
      auto const& x = acc[i];
      auto const& y = acc[j];
      if (x.op == y.op || !(x.write || y.write)) continue;
      ++report.conflicting_pairs;
      if (!before(x.op, y.op) && !before(y.op, x.op))
        fail(detail::op_name(s, x.op) + " and " + detail::op_name(s, y.op) + " touch " + space(x.host) + " bytes [" +
             std::to_string(std::max(x.begin, y.begin)) + ", " + std::to_string(std::min(x.end, y.end)) +
             ") and nothing orders them");
    }

  // Data flow: each read sees the bytes written for its own (layer, slot).
  std::vector<detail::access const*> writers;
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  for (auto const& r : acc) {
    if (r.write) continue;
    writers.clear();
    spans.clear();
    for (auto const& w : acc)
      if (w.write && w.host == r.host && w.begin < r.end && r.begin < w.end && w.same_data(r)) {
        if (before(r.op, w.op)) continue;  // a later rewrite of the same data
        if (!before(w.op, r.op))
          fail(detail::op_name(s, r.op) + " reads data that " + detail::op_name(s, w.op) + " has not finished writing");
        writers.push_back(&w);
        spans.push_back({w.begin, w.end});
      }
    if (detail::covered_length(spans, r.begin, r.end) < r.end - r.begin)
      fail(detail::op_name(s, r.op) + " reads " + space(r.host) + " bytes [" + std::to_string(r.begin) + ", " +
           std::to_string(r.end) + ") that no earlier op wrote with this slot's data");
    for (auto const& x : acc) {
      if (!x.write || x.host != r.host || !(x.begin < r.end && r.begin < x.end)) continue;
      if (x.same_data(r)) continue;
      if (before(r.op, x.op)) continue;
      // x precedes the read: writes of the read's own data must come after x and cover the
      // bytes x clobbered, or the read sees x's bytes.
      auto const lo = std::max(x.begin, r.begin), hi = std::min(x.end, r.end);
      spans.clear();
      for (auto const* w : writers)
        if (before(x.op, w->op)) spans.push_back({w->begin, w->end});
      if (detail::covered_length(spans, lo, hi) < hi - lo)
          fail(detail::op_name(s, x.op) + " overwrites bytes that " + detail::op_name(s, r.op) +
               " reads before that read is done");
    }
  }
  return report;
}

}  // namespace tide
