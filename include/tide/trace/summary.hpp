#pragma once
//! \file
//! Step summaries from a timeline: step time, exposed transfer time, overlap, and the
//! device and host occupancy over time (predicted peaks against measured live bytes).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/schedule.hpp>
#include <tide/trace/timeline.hpp>
#include <tide/trace/occupancy.hpp>
#include <tide/trace/detail/sweep.hpp>
#if TIDE_DEFINITIONS
#include <map>
#endif

namespace tide {

//! What one recorded step cost: where its time went, and its peak memory measured against the
//! schedule's prediction.
struct step_summary {
  double step_us = 0;                //!< from the step's start to the end of its last op
  double compute_us = 0;             //!< forward, recompute, backward and turn time on the compute stream
  double forward_us = 0;             //!< of which forward
  double recompute_us = 0;           //!< of which recompute (segment recomputations included)
  double backward_us = 0;            //!< of which backward
  double turn_us = 0;                //!< of which the turn, where the timeline has it (`timeline::turn`)
  double copy_us = 0;                //!< time any copy was running (union of intervals)
  double exposed_transfer_us = 0;    //!< compute-stream time spent on copies or waiting for them
  double exposed_collective_us = 0;  //!< compute-stream time spent on collectives or waiting for them
  //! Share of copy time hidden behind compute, `1 - exposed_transfer_us / copy_us` in [0, 1];
  //! 1 when nothing was copied, where it means nothing: print it with `overlap_text` ("-" then)
  double overlap_fraction = 1;
  std::size_t predicted_device_bytes = 0;  //!< the schedule's device arena
  std::size_t predicted_host_bytes = 0;    //!< the schedule's pinned host arena
  std::size_t measured_device_bytes = 0;   //!< peak of device bytes live at once, from the timeline
  std::size_t measured_host_bytes = 0;     //!< peak of host bytes live at once, from the timeline
  double storage_us = 0;                   //!< time any store or load was running (union of intervals)
  std::size_t predicted_storage_bytes = 0; //!< the schedule's storage file

  //! True when the step copied anything between device and host (or storage): only then does
  //! `overlap_fraction` say something.
  [[nodiscard]] constexpr bool copied() const noexcept { return copy_us > 0 || storage_us > 0; }
};

//! `s.overlap_fraction` as a whole percentage ("97%"), or "-" when the step copied nothing (a
//! keep-all or remat-only step: there was nothing to hide, and "100%" would say it was hidden).
[[nodiscard]] inline std::string overlap_text(step_summary const& s) {
  if (!s.copied()) return "-";
  return std::to_string(static_cast<int>(s.overlap_fraction * 100 + 0.5)) + "%";
}

//! Every field of `s`, one per line, named as in `step_summary` (times in ms, bytes as bytes), the
//! overlap as `overlap_text` gives it.
[[nodiscard]] TIDE_INLINE std::string describe(step_summary const& s);

//! Device and host bytes live over time. A region is live from the start of the op that first
//! writes it to the end of the op that last reads it: kept slots from their forward to their
//! backward, offload sources until their last chunk is copied out, staging buffers from the
//! first prefetched chunk to the backward, remat slots during their forward and from their
//! recompute to their backward, host copies from the first offloaded chunk to the last prefetch
//! (a stored spilled slot's until its store, and again from its load).
TIDE_INLINE occupancy measure_occupancy(timeline const& t, schedule_view const& s);

//! Summarizes one recorded step of schedule `s`. Exposed time is what the compute stream spent
//! running copies (without latency hiding) or blocked on events recorded by copies or
//! collectives: every backend records its blocking waits, so host issue gaps and debug tasks are
//! not mistaken for transfers.
TIDE_INLINE step_summary summarize(timeline const& t, schedule_view const& s);

#if TIDE_DEFINITIONS
namespace detail {
struct op_times {
  std::vector<double> begin, end;
  explicit op_times(timeline const& t, std::size_t n) : begin(n, -1), end(n, -1) {
    for (auto const& s : t.ops)
      if (s.op < n) begin[s.op] = s.begin_us, end[s.op] = s.end_us;
  }
  bool has(std::size_t i) const { return begin[i] >= 0; }
};

}  // namespace detail

TIDE_INLINE occupancy measure_occupancy(timeline const& t, schedule_view const& s) {
  detail::op_times ot(t, s.ops.size());
  auto const L = s.layer_count();
  std::vector<std::int64_t> fwd(L, -1), bwd(L, -1), rec(L, -1);
  std::vector<std::int64_t> first_off(s.slots.size(), -1), last_off(s.slots.size(), -1),
      first_pre(s.slots.size(), -1), last_pre(s.slots.size(), -1), stored(s.slots.size(), -1), loaded(s.slots.size(), -1);
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    if (o.slot == carry_slot || o.slot == gradient_slot) continue;  // the carry's copies: below; boundaries hold no slot
    auto const b = s.layers[o.layer].first_slot + (o.slot == no_slot ? 0 : o.slot);
    switch (o.kind) {
      case op_kind::forward: fwd[o.layer] = i; break;
      case op_kind::backward: bwd[o.layer] = i; break;
      case op_kind::recompute: rec[o.layer] = i; break;
      case op_kind::offload:
        if (first_off[b] < 0) first_off[b] = i;
        last_off[b] = i;
        break;
      case op_kind::prefetch:
        if (first_pre[b] < 0) first_pre[b] = i;
        last_pre[b] = i;
        break;
      case op_kind::store: stored[b] = i; break;
      case op_kind::load: loaded[b] = i; break;
      default: break;
    }
  }
  // Allocations and frees apart, each summed with the one before it at the same time (a layer's
  // slots start and end together): the sort below then takes a few deltas a layer, not two a
  // slot. The sweep records each time's sum, so merging equal times changes nothing.
  struct deltas {
    std::vector<std::pair<double, std::ptrdiff_t>> plus, minus;
    static void add(std::vector<std::pair<double, std::ptrdiff_t>>& v, double t, std::ptrdiff_t d) {
      if (!v.empty() && v.back().first == t) v.back().second += d;
      else v.push_back({t, d});
    }
    std::vector<occupancy_point> curve() {
      auto r = detail::sweep(plus, minus);
      plus = {}, minus = {};  // freed before the next curve's sweep
      return r;
    }
  } dev, host;
  auto live = [&](deltas& v, std::int64_t from, bool from_begin, std::int64_t to, std::size_t bytes) {
    if (from < 0 || to < 0 || !ot.has(static_cast<std::size_t>(from)) || !ot.has(static_cast<std::size_t>(to))) return;
    deltas::add(v.plus, from_begin ? ot.begin[from] : ot.end[from], static_cast<std::ptrdiff_t>(bytes));
    deltas::add(v.minus, ot.end[to], -static_cast<std::ptrdiff_t>(bytes));
  };
  for (std::uint32_t l = 0; l < L; ++l)
    for (std::uint32_t k = 0; k < s.layers[l].slot_count; ++k) {
      auto const bi = s.layers[l].first_slot + k;
      auto const& b = s.slots[bi];
      switch (b.where) {
        case placement::keep: live(dev, fwd[l], true, bwd[l], b.bytes); break;
        case placement::offload:
          live(dev, fwd[l], true, last_off[bi], b.bytes);
          live(dev, first_pre[bi], true, bwd[l], b.bytes);
          live(host, first_off[bi], true, last_pre[bi], b.bytes);
          break;
        case placement::remat:
          live(dev, fwd[l], true, fwd[l], b.bytes);
          live(dev, rec[l], true, bwd[l], b.bytes);
          break;
        case placement::spill:  // in the ring until stored, and again from its load
          live(dev, fwd[l], true, last_off[bi], b.bytes);
          live(dev, first_pre[bi], true, bwd[l], b.bytes);
          if (b.stored()) {
            live(host, first_off[bi], true, stored[bi], b.bytes);
            live(host, loaded[bi], true, last_pre[bi], b.bytes);
          } else {
            live(host, first_off[bi], true, last_pre[bi], b.bytes);
          }
          break;
      }
    }
  // The carry's buffers and host snapshots: each live from the first op that touches it to the
  // last (they are reused in place, so this bounds what each holds).
  if (s.carry.present()) {
    std::map<std::pair<bool, std::size_t>, std::pair<std::int64_t, std::int64_t>> span;  // (host, offset) -> ops
    auto touch = [&](bool host, std::size_t at, std::uint32_t i) {
      auto [it, fresh] = span.try_emplace({host, at}, std::pair<std::int64_t, std::int64_t>{i, i});
      if (!fresh) it->second.second = i;
    };
    for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
      auto const& o = s.ops[i];
      if (o.carry_in != no_carry) touch(false, o.carry_in, i);
      if (o.carry_out != no_carry) touch(false, o.carry_out, i);
      if (o.slot == carry_slot) {
        touch(false, o.device_offset, i);
        touch(true, o.host_offset, i);
      }
    }
    for (auto const& [where, ops] : span) live(where.first ? host : dev, ops.first, true, ops.second, s.carry.bytes);
  }
  occupancy r;
  r.device = dev.curve();
  r.host = host.curve();
  return r;
}

TIDE_INLINE step_summary summarize(timeline const& t, schedule_view const& s) {
  step_summary r;
  r.predicted_device_bytes = s.arena.device_bytes;
  r.predicted_host_bytes = s.arena.host_bytes;
  r.predicted_storage_bytes = s.arena.storage_bytes;
  detail::op_times ot(t, s.ops.size());
  std::vector<std::pair<double, double>> copies, transfers;
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    if (!ot.has(i)) continue;
    auto const& o = s.ops[i];
    auto const dur = ot.end[i] - ot.begin[i];
    r.step_us = std::max(r.step_us, ot.end[i]);
    if (is_copy(o.kind)) copies.push_back({ot.begin[i], ot.end[i]});
    if (is_storage(o.kind)) transfers.push_back({ot.begin[i], ot.end[i]});
    if (o.stream != stream_role::compute) continue;
    if (is_copy(o.kind) || is_storage(o.kind)) {
      r.exposed_transfer_us += dur;  // a copy (or storage transfer) on the compute stream is never hidden
    } else if (is_collective(o.kind)) {
      r.exposed_collective_us += dur;  // nor a collective (`collective_spec::overlap` false)
    } else if (o.kind == op_kind::forward || o.kind == op_kind::recompute || o.kind == op_kind::advance ||
               o.kind == op_kind::backward) {
      r.compute_us += dur;
      if (o.kind == op_kind::forward) r.forward_us += dur;
      if (o.kind == op_kind::recompute || o.kind == op_kind::advance) r.recompute_us += dur;
      if (o.kind == op_kind::backward) r.backward_us += dur;
    }
  }
  if (t.turn) {  // compute on the compute stream, recorded apart from the last forward
    r.turn_us = t.turn->end_us - t.turn->begin_us;
    r.compute_us += r.turn_us;
    r.step_us = std::max(r.step_us, t.turn->end_us);
  }
  std::vector<std::int64_t> recorder(s.event_count, -1);  // event -> the op that records it
  for (std::uint32_t i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].event >= 0 && static_cast<std::uint32_t>(s.ops[i].event) < s.event_count) recorder[s.ops[i].event] = i;
  for (auto const& w : t.waits) {
    if (w.stream != stream_role::compute || w.event >= s.event_count || recorder[w.event] < 0) continue;
    auto const& by = s.ops[static_cast<std::size_t>(recorder[w.event])];
    if (is_copy(by.kind) || is_storage(by.kind))
      r.exposed_transfer_us += w.end_us - w.begin_us;
    else if (by.stream == stream_role::comm)
      r.exposed_collective_us += w.end_us - w.begin_us;
  }
  auto const union_us = [](std::vector<std::pair<double, double>>& v) {
    std::sort(v.begin(), v.end());
    double until = -1, sum = 0;
    for (auto const& [b, e] : v) {
      if (b >= until) sum += e - b, until = e;
      else if (e > until) sum += e - until, until = e;
    }
    return sum;
  };
  r.copy_us = union_us(copies);
  r.storage_us = union_us(transfers);
  r.overlap_fraction = r.copy_us > 0 ? std::clamp(1.0 - r.exposed_transfer_us / r.copy_us, 0.0, 1.0) : 1.0;
  auto occ = measure_occupancy(t, s);
  for (auto const& p : occ.device) r.measured_device_bytes = std::max(r.measured_device_bytes, p.bytes);
  for (auto const& p : occ.host) r.measured_host_bytes = std::max(r.measured_host_bytes, p.bytes);
  return r;
}

TIDE_INLINE std::string describe(step_summary const& s) {
  auto const ms = [](double us) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f ms", us / 1000);
    return std::string(b);
  };
  auto const bytes = [](std::size_t n) { return std::to_string(n) + " B"; };
  return "step " + ms(s.step_us) + "\n  compute " + ms(s.compute_us) + " (forward " + ms(s.forward_us) + ", recompute " +
         ms(s.recompute_us) + ", backward " + ms(s.backward_us) + ")\n  copies running " + ms(s.copy_us) + ", exposed " +
         ms(s.exposed_transfer_us) + ", overlap " + overlap_text(s) + "\n  collectives exposed " + ms(s.exposed_collective_us) +
         "\n  storage transfers running " + ms(s.storage_us) + "\n  device predicted " + bytes(s.predicted_device_bytes) +
         ", measured " + bytes(s.measured_device_bytes) + "\n  host predicted " + bytes(s.predicted_host_bytes) + ", measured " +
         bytes(s.measured_host_bytes) + "\n  storage predicted " + bytes(s.predicted_storage_bytes);
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide
