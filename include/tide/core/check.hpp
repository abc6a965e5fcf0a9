#pragma once
//! \file
//! The checker: proves any op program (built, edited, hand-written or hostile) against the
//! properties tide promises, in O(n log n) for n ops and byte accesses.
//!
//! - bindings: every layer's slot range lies inside the slot table and belongs to that layer
//!   alone; every slot has bytes, a placement, offsets whose ends fit in `size_t`, and the slots
//!   of one layer do not overlap;
//! - structure: every op names a layer, stream and (copies) slot in range; a copy's byte range
//!   lies inside its slot and its arena ranges do not wrap; waits name earlier ops that record
//!   an event; events are in range and recorded once;
//! - completeness: exactly one forward and one backward per layer, forwards in layer order and
//!   backwards in reverse; a recompute exactly for the layers with a remat slot, after the
//!   forward and before the backward; every offloaded slot offloaded and prefetched, each chunk
//!   exactly once; gathers, regathers and reduces exactly where `collective_spec` asks, gathers
//!   before their forward, regathers before their recompute and backward, reduces after their
//!   backward;
//! - copy geometry: copies are exactly where the bindings say. Chunk c of slot b covers bytes
//!   [c * chunk_bytes, c * chunk_bytes + n) of the slot, n = min(chunk_bytes, b.bytes - c *
//!   chunk_bytes) (all of it when the slot goes in one chunk), between device b.forward_offset
//!   (an offload's source) or b.backward_offset (a prefetch's target) and host b.host_offset,
//!   each plus c * chunk_bytes: the chunks tile the slot. The executor's debug checks poison each
//!   offload chunk's source once copied, which only a tiling makes harmless;
//! - guards: with `buffers.guard_bytes` > 0 the executor's debug checks write guard bytes after
//!   every slot before a forward (at forward_offset + bytes) and after every remat slot before a
//!   recompute (at backward_offset + bytes), and check them after the op. Within one layer, the
//!   regions [offset, offset + bytes + guard) a forward writes do not overlap, nor do those a
//!   recompute or backward touches at backward offsets (the guard for remat slots only); and the
//!   guard writes are byte accesses of their op (writes with an identity of their own, never read
//!   as slot data) in the race and data-flow sweep;
//! - peaks: replaying the ops' byte ranges reproduces the predicted device and host peaks;
//! - no race: two ops that touch overlapping bytes (one of them writing) are ordered by stream
//!   order or an event chain, so no region is reused while an op that reads or writes it may run;
//! - data flow: every read (a backward, a recompute, a copy) sees the bytes written for that very
//!   (layer, slot), ordered before it, and not overwritten in between: prefetches complete before
//!   their consumer, offloads complete before their source region is reused.
//!
//! Race and data flow are one sweep in issue order (happens-before implies issue order) over the
//! elementary byte intervals of each arena, kept in a segment tree. For a byte, ordering each
//! access after the last write, and each write after the reads since the last write, orders every
//! conflicting pair by transitivity; per stream only the latest such op matters (stream order),
//! which is what the tree's range maximum yields. Once accesses are race free, a read sees its
//! own data exactly when the last write before it to each of its bytes wrote that data.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>

namespace tide {

//! What `check_schedule` measured while proving a program: the replayed peaks and the work done.
struct check_report {
  std::size_t replayed_device_bytes = 0;  //!< arena extent the ops actually touch
  std::size_t replayed_host_bytes = 0;    //!< pinned host extent the ops actually touch
  //! Ordering obligations proven: each access against the latest conflicting access per stream
  //! (every other overlapping read/write pair follows from these by transitivity).
  std::size_t conflicting_pairs = 0;
};

namespace detail {

[[noreturn]] inline void check_fail(std::string const& m) { throw schedule_error("tide::check_schedule: " + m); }

//! `a + b`, or a failure: the checker takes hostile programs, whose offsets may sit near SIZE_MAX.
template <class Message>
std::size_t add_or_fail(std::size_t a, std::size_t b, Message const& what) {
  if (a > std::numeric_limits<std::size_t>::max() - b) check_fail(what() + " overflows size_t");
  return a + b;
}

struct access {
  std::uint32_t op;
  bool host;
  bool write;
  std::size_t begin, end;
  std::uint32_t layer;
  std::uint16_t slot;
  std::uint64_t shift{};  //!< slot-relative offset of a byte minus its address (mod 2^64): equal shifts, same bytes
  //! The guard bytes after `slot`, written by the executor's debug checks around the op: data of
  //! their own, never the slot's (no read has it).
  bool guard = false;
  bool same_data(access const& o) const noexcept {
    return layer == o.layer && slot == o.slot && shift == o.shift && guard == o.guard;
  }
};

//! What the structural pass proved and the later passes use.
struct checked_program {
  std::span<op const> ops;
  std::vector<std::array<std::int32_t, stream_count>> clock{};  //!< per op: latest op per stream ordered before it
  std::vector<access> accesses{};                               //!< in op order
  std::vector<std::uint32_t> first_access{};                    //!< per op (and one past): its accesses
  //! `a` happens before `b`.
  bool before(std::uint32_t a, std::uint32_t b) const noexcept {
    return a != b && clock[b][static_cast<std::size_t>(ops[a].stream)] >= static_cast<std::int64_t>(a);
  }
};

inline std::string slot_label(schedule_view const& s, std::uint32_t layer, std::size_t k) {
  if (k == carry_slot) return "carry " + std::to_string(layer) + " ('" + std::string(s.carry.name) + "', the input of layer " + std::to_string(layer) + ")";
  return "slot '" + std::string(s.slots[s.layers[layer].first_slot + k].name) + "' of layer " + std::to_string(layer);
}

//! Only for ops whose layer and slot are proven in range.
inline std::string op_name(schedule_view const& s, std::uint32_t i) {
  auto const& o = s.ops[i];
  return "op #" + std::to_string(i) + " (" + op_label(s, o) + " on " + std::string(to_string(o.stream)) + ")";
}

inline std::string space_name(bool host) { return host ? "host" : "device"; }
inline std::string bytes_text(std::size_t b, std::size_t e) {
  // Appended piecewise: "[" + std::to_string(b) trips GCC 12's -Wrestrict (PR 105651).
  std::string r(1, '[');
  r.append(std::to_string(b)).append(", ").append(std::to_string(e)).append(1, ')');
  return r;
}

//! Bindings: the slot table and every slot's ranges, before anything indexes through them.
inline void check_bindings(schedule_view const& s) {
  auto pow2 = [](std::size_t a) { return a > 0 && (a & (a - 1)) == 0; };
  if (!pow2(s.buffers.device_alignment) || !pow2(s.buffers.host_alignment))
    check_fail("buffers: the device alignment " + std::to_string(s.buffers.device_alignment) + " or host alignment " +
               std::to_string(s.buffers.host_alignment) + " is not a power of two");
  if (s.layers.size() > std::numeric_limits<std::uint32_t>::max())
    check_fail("binding: " + std::to_string(s.layers.size()) + " layers, more than 32-bit layer indices name");
  constexpr auto unowned = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> owner(s.slots.size(), unowned);
  std::vector<std::pair<std::size_t, std::size_t>> order;  // (offset, slot) of one layer
  auto const guard = s.buffers.guard_bytes;
  for (std::uint32_t l = 0; l < s.layers.size(); ++l) {
    auto const& lb = s.layers[l];
    if (std::uint64_t{lb.first_slot} + lb.slot_count > s.slots.size())
      check_fail("binding: layer " + std::to_string(l) + "'s slots " +
                 bytes_text(lb.first_slot, std::uint64_t{lb.first_slot} + lb.slot_count) + " lie outside the " +
                 std::to_string(s.slots.size()) + " slot bindings");
    if (lb.slot_count >= no_slot)
      check_fail("binding: layer " + std::to_string(l) + " has " + std::to_string(lb.slot_count) +
                 " slots, more than 16-bit slot indices name");
    for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
      auto const g = lb.first_slot + k;
      if (owner[g] != unowned)
        check_fail("binding: layers " + std::to_string(owner[g]) + " and " + std::to_string(l) +
                   " share slot binding " + std::to_string(g));
      owner[g] = l;
      auto const& b = s.slots[g];
      auto const what = [&] { return slot_label(s, l, k); };
      if (b.where != placement::keep && b.where != placement::offload && b.where != placement::remat)
        check_fail("binding: " + what() + " has no valid placement");
      if (b.bytes == 0) check_fail("binding: " + what() + " has zero bytes");
      // The executor writes guard bytes after forward and recompute regions; replay counts them.
      auto const with_guard = add_or_fail(b.bytes, guard, [&] { return "binding: the size plus guard of " + what(); });
      add_or_fail(b.forward_offset, with_guard, [&] { return "binding: the forward range of " + what(); });
      add_or_fail(b.backward_offset, with_guard, [&] { return "binding: the backward range of " + what(); });
      if (b.where == placement::offload)
        add_or_fail(b.host_offset, b.bytes, [&] { return "binding: the host range of " + what(); });
    }
    // One forward (or recompute, or backward) touches all of a layer's slots at once: they must
    // not alias.
    for (bool fwd : {true, false}) {
      order.clear();
      for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
        auto const& b = s.slots[lb.first_slot + k];
        order.push_back({fwd ? b.forward_offset : b.backward_offset, k});
      }
      std::sort(order.begin(), order.end());
      for (std::size_t j = 1; j < order.size(); ++j) {
        auto const& prev = s.slots[lb.first_slot + order[j - 1].second];
        if (order[j - 1].first + prev.bytes > order[j].first)
          check_fail("binding: " + slot_label(s, l, order[j - 1].second) + " and slot '" +
                     std::string(s.slots[lb.first_slot + order[j].second].name) + "' overlap in the device arena (" +
                     (fwd ? "forward" : "backward") + " offsets)");
      }
    }
  }
}

//! The carry fields of op `i` (layer and stream proven in range): present exactly where the
//! executor hands the lambdas a carry, at the fixed input and output buffers where the user
//! writes and reads them, and inside `size_t`.
inline void check_carry_fields(schedule_view const& s, std::uint32_t i) {
  auto const& o = s.ops[i];
  auto const& c = s.carry;
  auto const L = static_cast<std::uint32_t>(s.layers.size());
  auto const what = [&] { return "carry: op #" + std::to_string(i) + " (" + std::string(to_string(o.kind)) + " L" + std::to_string(o.layer) + ")"; };
  bool const copy = is_copy(o.kind) && o.slot == carry_slot;
  if (!c.present()) {
    if (o.carry_in != no_carry || o.carry_out != no_carry || o.kind == op_kind::advance || copy)
      check_fail(what() + " reads, writes or copies a carry, but the schedule has none");
    return;
  }
  auto const fits = [&](std::size_t at, char const* which) {
    add_or_fail(at, c.bytes, [&] { return what() + ": its " + which + " range"; });
  };
  if (copy) {
    if (o.chunks != 1 || o.chunk != 0 || o.bytes != c.bytes)
      check_fail(what() + " must copy the whole carry (" + std::to_string(c.bytes) + " bytes) in one chunk");
    if (o.layer >= L) check_fail(what() + " copies carry " + std::to_string(o.layer) + ", the output: no layer's input");
    fits(o.device_offset, "device");
    fits(o.host_offset, "host");
    return;
  }
  bool const layer_op = o.kind == op_kind::forward || o.kind == op_kind::advance || o.kind == op_kind::recompute ||
                        o.kind == op_kind::backward;
  if (!layer_op) {
    if (o.carry_in != no_carry || o.carry_out != no_carry) check_fail(what() + " is no layer op but names a carry");
    return;
  }
  bool const wants_out = o.kind == op_kind::forward || o.kind == op_kind::advance ||
                         (o.kind == op_kind::backward && o.layer == L - 1);
  if (o.carry_in == no_carry) check_fail(what() + " reads no carry: the layer's input would be missing");
  if (wants_out != (o.carry_out != no_carry))
    check_fail(what() + (wants_out ? " has no carry out"
                                   : " names a carry out, which only forwards and advances write and only the last "
                                     "layer's backward reads"));
  fits(o.carry_in, "carry in");
  if (wants_out) fits(o.carry_out, "carry out");
  if (o.kind == op_kind::forward && o.layer == 0 && o.carry_in != c.input_offset())
    check_fail(what() + " reads carry 0 at device offset " + std::to_string(o.carry_in) + ", not at the input buffer (" +
               std::to_string(c.input_offset()) + ") the user writes");
  bool const output = (o.kind == op_kind::forward || o.kind == op_kind::backward) && o.layer == L - 1;
  if (output && o.carry_out != c.output_offset())
    check_fail(what() + " writes or reads the stack's output at device offset " + std::to_string(o.carry_out) +
               ", not at the output buffer (" + std::to_string(c.output_offset()) + ") the user reads");
}

//! One op's device accesses do not overlap (its carries among its slots), no op writes the input
//! buffer, which is the user's, and only the last layer's forward writes the output buffer, which
//! the user reads after the step. Only for schedules with a carry (without one, check_bindings and
//! check_layout prove the first).
inline void check_disjoint_accesses(schedule_view const& s, checked_program const& p) {
  auto const in_begin = s.carry.input_offset(), in_end = in_begin + s.carry.bytes;  // no overflow: proven
  auto const out_begin = s.carry.output_offset(), out_end = out_begin + s.carry.bytes;
  auto const last = static_cast<std::uint32_t>(s.layers.size()) - 1;
  std::vector<access const*> mine;
  for (std::uint32_t i = 0; i + 1 < p.first_access.size(); ++i) {
    mine.clear();
    for (auto j = p.first_access[i]; j < p.first_access[i + 1]; ++j) {
      auto const& a = p.accesses[j];
      if (a.host) continue;
      if (a.write && a.begin < in_end && in_begin < a.end)
        check_fail("carry: " + op_name(s, i) + " writes device bytes " + bytes_text(std::max(a.begin, in_begin), std::min(a.end, in_end)) +
                   " of the input buffer, which holds the user's carry 0");
      if (a.write && a.begin < out_end && out_begin < a.end && !(s.ops[i].kind == op_kind::forward && s.ops[i].layer == last))
        check_fail("carry: " + op_name(s, i) + " writes device bytes " + bytes_text(std::max(a.begin, out_begin), std::min(a.end, out_end)) +
                   " of the output buffer, which only the last layer's forward writes (the user reads it after the step)");
      mine.push_back(&a);
    }
    std::sort(mine.begin(), mine.end(), [](auto x, auto y) { return x->begin < y->begin; });
    for (std::size_t k = 1; k < mine.size(); ++k)
      if (mine[k - 1]->end > mine[k]->begin)
        check_fail("carry: " + op_name(s, i) + " touches " + slot_label(s, mine[k - 1]->layer, mine[k - 1]->slot) + " and " +
                   slot_label(s, mine[k]->layer, mine[k]->slot) + " at overlapping device bytes " +
                   bytes_text(mine[k]->begin, std::min(mine[k - 1]->end, mine[k]->end)));
  }
}

//! Structure, vector clocks and completeness; collects every op's byte accesses.
inline checked_program check_program(schedule_view const& s) {
  check_bindings(s);
  checked_program p;
  p.ops = s.ops;
  auto const L = static_cast<std::uint32_t>(s.layers.size());
  if (s.ops.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    check_fail("structure: " + std::to_string(s.ops.size()) + " ops, more than 31-bit op indices name");
  auto const n = static_cast<std::uint32_t>(s.ops.size());
  auto const guard = s.buffers.guard_bytes;
  auto const chunk_bytes = s.pipeline.chunk_bytes;
  auto const str = [](auto v) { return std::to_string(v); };

  // Structure and vector clocks.
  p.clock.resize(n);
  std::array<std::int32_t, stream_count> none{};
  none.fill(-1);
  std::array<std::array<std::int32_t, stream_count>, stream_count> tail{};
  tail.fill(none);
  std::vector<std::pair<std::int32_t, std::uint32_t>> events;  // (event, op): recorded once each
  for (std::uint32_t i = 0; i < n; ++i) {
    auto const& o = s.ops[i];
    auto const st = static_cast<std::size_t>(o.stream);
    if (o.layer >= L) check_fail("structure: op #" + str(i) + " names layer " + str(o.layer) + " beyond the " + str(L) + "-layer stack");
    if (static_cast<std::size_t>(o.kind) >= op_kind_count)
      check_fail("structure: op #" + str(i) + " has no valid kind");
    bool const carry_copy = is_copy(o.kind) && o.slot == carry_slot;
    if (o.slot != no_slot && !carry_copy && o.slot >= s.layers[o.layer].slot_count)
      check_fail("structure: op #" + str(i) + " names slot " + str(o.slot) + " which layer " + str(o.layer) + " does not have");
    if (is_copy(o.kind) && o.slot == no_slot) check_fail("structure: op #" + str(i) + " is a copy of no slot");
    if (st >= stream_count) check_fail("structure: " + op_name(s, i) + " names no valid stream");
    check_carry_fields(s, i);
    if (is_copy(o.kind) && !carry_copy) {
      auto const& b = s.slots_of(o.layer)[o.slot];
      auto const what = [&] { return "structure: " + op_name(s, i); };
      if (b.where != placement::offload)
        check_fail(what() + " copies a slot that is not offloaded (" + std::string(to_string(b.where)) + ")");
      if (o.chunks == 0 || o.chunk >= o.chunks)
        check_fail(what() + " claims chunk " + str(o.chunk) + " of " + str(o.chunks));
      if (o.bytes == 0) check_fail(what() + " copies no bytes");
      std::size_t start = 0;  // the chunk's first byte within its slot
      if (o.chunks > 1) {
        if (chunk_bytes == 0) check_fail(what() + " is one of several chunks but the pipeline's chunk size is 0");
        if (o.chunk > std::numeric_limits<std::size_t>::max() / chunk_bytes)
          check_fail(what() + ": its chunk offset overflows size_t");
        start = std::size_t{o.chunk} * chunk_bytes;
      }
      auto const end = add_or_fail(start, o.bytes, [&] { return what() + ": its slot range"; });
      if (end > b.bytes)
        check_fail(what() + " copies bytes " + bytes_text(start, end) + " of a slot of " + str(b.bytes) + " bytes");
      auto const dev_end = add_or_fail(o.device_offset, o.bytes, [&] { return what() + ": its device range"; });
      add_or_fail(dev_end, guard, [&] { return what() + ": its device range plus guard"; });
      add_or_fail(o.host_offset, o.bytes, [&] { return what() + ": its host range"; });
    }
    if (o.event >= 0) {
      if (static_cast<std::uint32_t>(o.event) >= s.event_count)
        check_fail("structure: " + op_name(s, i) + " records event " + str(o.event) + " of only " + str(s.event_count));
      events.push_back({o.event, i});
    }
    if (std::uint64_t{o.wait_begin} + o.wait_count > s.waits.size())
      check_fail("structure: " + op_name(s, i) + " has waits " + bytes_text(o.wait_begin, std::uint64_t{o.wait_begin} + o.wait_count) +
                 " beyond the " + str(s.waits.size()) + " stored");
    auto c = tail[st];
    for (auto w : s.waits_of(o)) {
      if (w >= i) check_fail("structure: " + op_name(s, i) + " waits on op #" + str(w) + " which is not issued before it");
      if (s.ops[w].event < 0)
        check_fail("structure: " + op_name(s, i) + " waits on " + op_name(s, w) + " which records no event");
      for (std::size_t t = 0; t < stream_count; ++t) c[t] = std::max(c[t], p.clock[w][t]);
    }
    c[st] = static_cast<std::int32_t>(i);
    p.clock[i] = c;
    tail[st] = c;
  }
  std::sort(events.begin(), events.end());
  for (std::size_t j = 1; j < events.size(); ++j)
    if (events[j].first == events[j - 1].first)
      check_fail("structure: " + op_name(s, events[j - 1].second) + " and " + op_name(s, events[j].second) +
                 " both record event " + str(events[j].first));

  // Completeness: one forward, backward (and recompute where needed) per layer, in order.
  constexpr auto absent = std::numeric_limits<std::uint32_t>::max();
  std::array<std::vector<std::uint32_t>, op_kind_count> by_kind;  // per op_kind, per layer: its op
  for (auto& v : by_kind) v.assign(L, absent);
  for (std::uint32_t i = 0; i < n; ++i) {
    auto const& o = s.ops[i];
    if (is_copy(o.kind) || o.kind == op_kind::advance) continue;  // advances: as many as the reversal needs
    auto& at = by_kind[static_cast<std::size_t>(o.kind)][o.layer];
    if (at != absent)
      check_fail("completeness: layer " + str(o.layer) + " has two " + std::string(to_string(o.kind)) + " ops, " +
                 op_name(s, at) + " and " + op_name(s, i) + ": the executor would run it twice");
    at = i;
  }
  auto const& fwd = by_kind[static_cast<std::size_t>(op_kind::forward)];
  auto const& bwd = by_kind[static_cast<std::size_t>(op_kind::backward)];
  auto const& rec = by_kind[static_cast<std::size_t>(op_kind::recompute)];
  auto const& gat = by_kind[static_cast<std::size_t>(op_kind::gather)];
  auto const& col = by_kind[static_cast<std::size_t>(op_kind::reduce)];
  auto const& reg = by_kind[static_cast<std::size_t>(op_kind::regather)];
  auto ordered = [&](std::uint32_t a, std::uint32_t b, std::string const& what) {
    if (!p.before(a, b))
      check_fail("ordering: " + op_name(s, b) + " is not ordered after " + op_name(s, a) + " (" + what + ")");
  };
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const layer = "layer " + str(l);
    if (fwd[l] == absent) check_fail("completeness: " + layer + " has no forward op");
    if (bwd[l] == absent) check_fail("completeness: " + layer + " has no backward op: its gradient would never be computed");
    ordered(fwd[l], bwd[l], "a layer's backward follows its forward");
    if (l > 0) {
      ordered(fwd[l - 1], fwd[l], "forwards run in layer order");
      ordered(bwd[l], bwd[l - 1], "backwards run in reverse layer order");
    }
    auto const slots = s.slots_of(l);
    auto const remat = std::find_if(slots.begin(), slots.end(), [](auto const& b) { return b.where == placement::remat; });
    if (remat != slots.end() && rec[l] == absent)
      check_fail("completeness: " + layer + " has remat slot '" + std::string(remat->name) +
                 "' but no recompute op: its backward would read a slot nothing rebuilt");
    if (remat == slots.end() && rec[l] != absent)
      check_fail("completeness: " + op_name(s, rec[l]) + " recomputes a layer that has no remat slot");
    if (rec[l] != absent) {
      ordered(fwd[l], rec[l], "a recompute follows its layer's forward");
      ordered(rec[l], bwd[l], "a layer's backward follows its recompute");
    }
    if (s.collectives.before_forward && gat[l] == absent)
      check_fail("completeness: " + layer + " has no gather op though the schedule's collectives gather before forward");
    if (!s.collectives.before_forward && gat[l] != absent)
      check_fail("completeness: " + op_name(s, gat[l]) + " gathers though the schedule's collectives do not");
    if (gat[l] != absent) ordered(gat[l], fwd[l], "a layer's forward follows its gather");
    if (s.collectives.before_backward && reg[l] == absent)
      check_fail("completeness: " + layer + " has no regather op though the schedule's collectives regather before backward");
    if (!s.collectives.before_backward && reg[l] != absent)
      check_fail("completeness: " + op_name(s, reg[l]) + " regathers though the schedule's collectives do not");
    if (reg[l] != absent) {
      ordered(reg[l], bwd[l], "a layer's backward follows its regather");
      if (rec[l] != absent) ordered(reg[l], rec[l], "a layer's recompute follows its regather");
    }
    if (s.collectives.after_backward && col[l] == absent)
      check_fail("completeness: " + layer + " has no reduce op though the schedule's collectives reduce after backward");
    if (!s.collectives.after_backward && col[l] != absent)
      check_fail("completeness: " + op_name(s, col[l]) + " reduces though the schedule's collectives do not");
    if (col[l] != absent) ordered(bwd[l], col[l], "a layer's reduce follows its backward");
  }

  // Completeness of copies: every offloaded slot goes out and comes back, each chunk once.
  struct copy_key {
    std::uint32_t slot;  // global binding index
    bool prefetch;
    std::uint32_t chunk;
    std::uint32_t op;
    bool operator<(copy_key const& o) const noexcept {
      return std::tie(slot, prefetch, chunk, op) < std::tie(o.slot, o.prefetch, o.chunk, o.op);
    }
  };
  std::vector<copy_key> copies;
  for (std::uint32_t i = 0; i < n; ++i)
    if (auto const& o = s.ops[i]; is_copy(o.kind) && o.slot != carry_slot)
      copies.push_back({s.layers[o.layer].first_slot + o.slot, o.kind == op_kind::prefetch, o.chunk, i});
  std::sort(copies.begin(), copies.end());
  for (std::uint32_t l = 0; l < L; ++l)
    for (std::uint32_t k = 0; k < s.layers[l].slot_count; ++k) {
      auto const g = s.layers[l].first_slot + k;
      if (s.slots[g].where != placement::offload) continue;  // copies of other slots were rejected above
      for (bool prefetch : {false, true}) {
        auto const kind = prefetch ? "prefetch" : "offload";
        auto const [first, last] =
            std::equal_range(copies.begin(), copies.end(), copy_key{g, prefetch, 0, 0}, [](auto const& a, auto const& b) {
              return std::tie(a.slot, a.prefetch) < std::tie(b.slot, b.prefetch);
            });
        if (first == last)
          check_fail("completeness: " + slot_label(s, l, k) + " is offloaded but " +
                     (prefetch ? "never prefetched: no prefetch op brings it back before its backward"
                             : "never offloaded: no offload op copies it to the host"));
        auto const chunks = s.ops[first->op].chunks;
        for (auto it = first; it != last; ++it) {
          auto const c = static_cast<std::uint32_t>(it - first);
          if (s.ops[it->op].chunks != chunks)
            check_fail("completeness: " + op_name(s, it->op) + " and " + op_name(s, first->op) + " disagree on the " +
                       kind + " chunk count of " + slot_label(s, l, k));
          if (it->chunk != c)
            check_fail("completeness: " + slot_label(s, l, k) + " has " +
                       (it->chunk < c ? std::string("two ") + kind + " ops for chunk " + str(it->chunk) + ", " +
                                            op_name(s, (it - 1)->op) + " and " + op_name(s, it->op)
                                      : std::string("no ") + kind + " op for chunk " + str(c)));
        }
        if (static_cast<std::uint64_t>(last - first) != chunks)
          check_fail("completeness: " + slot_label(s, l, k) + " has no " + kind + " op for chunk " +
                     str(last - first) + " of " + str(chunks));
      }
    }

  // Byte accesses, in op order (their count is bounded first: indices into them are 32-bit).
  std::uint64_t total = 0;
  for (auto const& o : s.ops)
    total += is_copy(o.kind)                                                ? 2
             : is_collective(o.kind)                                  ? 0
                                                                          : s.layers[o.layer].slot_count * (guard > 0 ? 2u : 1u) + 2;
  if (total >= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
    check_fail("structure: the ops touch " + str(total) + " slot ranges, more than 31-bit indices name");
  p.accesses.reserve(total);
  p.first_access.reserve(std::size_t{n} + 1);
  for (std::uint32_t i = 0; i < n; ++i) {
    p.first_access.push_back(static_cast<std::uint32_t>(p.accesses.size()));
    auto const& o = s.ops[i];
    auto const slots = s.slots_of(o.layer);
    auto const chunk_start = o.chunks > 1 ? std::size_t{o.chunk} * chunk_bytes : 0;
    auto const slot = static_cast<std::uint16_t>(o.slot);
    auto add = [&](bool host, bool write, std::size_t addr, std::size_t bytes, std::uint16_t k, std::size_t data) {
      p.accesses.push_back({i, host, write, addr, addr + bytes, o.layer, k, std::uint64_t{data} - addr});
    };
    // Carry `state` at `addr`: its data is the state's, wherever it lies.
    auto add_carry = [&](bool host, bool write, std::size_t addr, std::uint32_t state) {
      p.accesses.push_back({i, host, write, addr, addr + s.carry.bytes, state, carry_slot, std::uint64_t{0} - addr});
    };
    if (o.carry_in != no_carry) add_carry(false, false, o.carry_in, o.layer);
    if (o.carry_out != no_carry) add_carry(false, o.kind != op_kind::backward, o.carry_out, o.layer + 1);
    // The guard bytes the executor's debug checks write after a slot before the op (and check
    // after it): part of the op's accesses (no overflow: proven by check_bindings).
    auto add_guard = [&](std::size_t slot_end, std::uint16_t k) {
      if (guard == 0) return;
      p.accesses.push_back({i, false, true, slot_end, slot_end + guard, o.layer, k, 0, true});
    };
    switch (o.kind) {
      case op_kind::forward:
        for (std::uint16_t k = 0; k < slots.size(); ++k) {
          add(false, true, slots[k].forward_offset, slots[k].bytes, k, 0);
          add_guard(slots[k].forward_offset + slots[k].bytes, k);
        }
        break;
      case op_kind::recompute:
        for (std::uint16_t k = 0; k < slots.size(); ++k) {
          add(false, slots[k].where == placement::remat, slots[k].backward_offset, slots[k].bytes, k, 0);
          if (slots[k].where == placement::remat) add_guard(slots[k].backward_offset + slots[k].bytes, k);
        }
        break;
      case op_kind::backward:
        for (std::uint16_t k = 0; k < slots.size(); ++k) add(false, false, slots[k].backward_offset, slots[k].bytes, k, 0);
        break;
      case op_kind::advance: break;  // the carry only
      case op_kind::offload:
        if (o.slot == carry_slot) {
          add_carry(false, false, o.device_offset, o.layer);
          add_carry(true, true, o.host_offset, o.layer);
          break;
        }
        add(false, false, o.device_offset, o.bytes, slot, chunk_start);
        add(true, true, o.host_offset, o.bytes, slot, chunk_start);
        break;
      case op_kind::prefetch:
        if (o.slot == carry_slot) {
          add_carry(true, false, o.host_offset, o.layer);
          add_carry(false, true, o.device_offset, o.layer);
          break;
        }
        add(true, false, o.host_offset, o.bytes, slot, chunk_start);
        add(false, true, o.device_offset, o.bytes, slot, chunk_start);
        break;
      case op_kind::gather:
      case op_kind::regather:
      case op_kind::reduce: break;
    }
  }
  p.first_access.push_back(static_cast<std::uint32_t>(p.accesses.size()));
  if (s.carry.present()) check_disjoint_accesses(s, p);
  return p;
}

//! Copy geometry and guards: what the executor's debug checks do beyond the ops' slot accesses
//! (poison an offload chunk's source once copied, write and check guard bytes) is harmless only
//! when the copies tile their slots where the bindings say and one op's guarded regions do not
//! overlap. Only for programs `check_program` proved in range.
inline void check_layout(schedule_view const& s) {
  auto const str = [](auto v) { return std::to_string(v); };
  auto const guard = s.buffers.guard_bytes;
  auto const chunk_bytes = s.pipeline.chunk_bytes;

  // Copies exactly where the bindings say: chunk c of a slot is its bytes [c * chunk_bytes, ...).
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    if (!is_copy(o.kind) || o.slot == carry_slot) continue;  // a carry's copy moves all of it: check_carry_fields
    auto const& b = s.slots_of(o.layer)[o.slot];
    auto const what = [&] { return "copy geometry: " + op_name(s, i); };
    bool const reload = o.kind == op_kind::prefetch;
    if (o.chunks > 1 && o.chunks != ceil_div(b.bytes, chunk_bytes))  // chunk_bytes > 0: proven
      check_fail(what() + " is one of " + str(o.chunks) + " chunks, but " + slot_label(s, o.layer, o.slot) + " (" +
                 str(b.bytes) + " bytes) goes in " + str(ceil_div(b.bytes, chunk_bytes)) + " chunks of " +
                 str(chunk_bytes) + " bytes: the chunks must tile the slot");
    // No overflow: start < b.bytes (check_program proved start + o.bytes <= b.bytes, o.bytes > 0)
    // and the slot's ranges fit in size_t (check_bindings).
    auto const start = o.chunks > 1 ? std::size_t{o.chunk} * chunk_bytes : 0;
    auto const bytes = o.chunks > 1 ? std::min(chunk_bytes, b.bytes - start) : b.bytes;
    auto const device = (reload ? b.backward_offset : b.forward_offset) + start;
    auto const host = b.host_offset + start;
    if (o.bytes != bytes || o.device_offset != device || o.host_offset != host) {
      auto const dev = "device " + bytes_text(o.device_offset, o.device_offset + o.bytes);
      auto const hst = "host " + bytes_text(o.host_offset, o.host_offset + o.bytes);
      auto const want_dev = "device " + bytes_text(device, device + bytes);
      auto const want_hst = "host " + bytes_text(host, host + bytes);
      check_fail(what() + " copies " + (reload ? hst + " to " + dev : dev + " to " + hst) + ", but bytes " +
                 bytes_text(start, start + bytes) + " of " + slot_label(s, o.layer, o.slot) + " lie at " +
                 (reload ? want_hst + " and go to " + want_dev + " (its backward offset)"
                         : want_dev + " (its forward offset) and go to " + want_hst) +
                 ": a copy must move exactly its chunk of the slot, where the bindings place it (the executor's "
                 "debug checks poison each offloaded chunk's source once copied)");
    }
  }

  // Guarded regions of one op do not overlap: the slots a forward writes, each with its guard,
  // at forward offsets; the slots a recompute or backward touches at backward offsets, remat
  // slots with their guard. (Overlaps of the slots' bytes alone were rejected by check_bindings:
  // what overlaps here is a guard.) No overflow: check_bindings proved offset + bytes + guard.
  if (guard == 0) return;
  struct region {
    std::size_t begin, end;
    std::uint32_t slot;
    bool operator<(region const& o) const noexcept { return std::tie(begin, end, slot) < std::tie(o.begin, o.end, o.slot); }
  };
  std::vector<region> regions;
  for (std::uint32_t l = 0; l < s.layers.size(); ++l) {
    auto const slots = s.slots_of(l);
    for (bool fwd : {true, false}) {
      regions.clear();
      for (std::uint32_t k = 0; k < slots.size(); ++k) {
        auto const& b = slots[k];
        auto const at = fwd ? b.forward_offset : b.backward_offset;
        bool const guarded = fwd || b.where == placement::remat;
        regions.push_back({at, at + b.bytes + (guarded ? guard : 0), k});
      }
      std::sort(regions.begin(), regions.end());
      for (std::size_t j = 1; j < regions.size(); ++j) {
        auto const& x = regions[j - 1];
        auto const& y = regions[j];
        if (x.end <= y.begin) continue;
        auto const& bx = slots[x.slot];
        check_fail("guard: the " + str(guard) + " guard bytes " + bytes_text(x.begin + bx.bytes, x.end) + " after " +
                   slot_label(s, l, x.slot) + " overlap slot '" + std::string(slots[y.slot].name) + "' " +
                   bytes_text(y.begin, y.begin + slots[y.slot].bytes) + " in the device arena (" +
                   (fwd ? "forward offsets: the executor's debug checks write guard bytes after every slot before a forward"
                        : "backward offsets: the executor's debug checks write guard bytes after every remat slot before a "
                          "recompute") +
                   ")");
      }
    }
  }
}

//! Peaks: the extent the accesses touch (device ranges plus guard, aligned) is the prediction.
inline void replay_peaks(schedule_view const& s, checked_program const& p, check_report& report) {
  auto const guard = s.buffers.guard_bytes;
  for (auto const& a : p.accesses) {
    if (a.guard) continue;  // the guard is counted after the access it follows, as predicted
    // No overflow: proven by check_program. Carries have no guard.
    auto const end = a.host || a.slot == carry_slot ? a.end : a.end + guard;
    auto const align = a.host ? s.buffers.host_alignment : s.buffers.device_alignment;
    auto const aligned = add_or_fail(end, align - 1, [&] { return "peak: the aligned end of " + op_name(s, a.op) + "'s range"; }) /
                         align * align;
    auto& r = a.host ? report.replayed_host_bytes : report.replayed_device_bytes;
    r = std::max(r, aligned);
  }
  if (report.replayed_device_bytes != s.arena.device_bytes)
    check_fail("peak: replaying the ops touches " + std::to_string(report.replayed_device_bytes) +
               " device bytes but the predicted peak is " + std::to_string(s.arena.device_bytes));
  if (report.replayed_host_bytes != s.arena.host_bytes)
    check_fail("peak: replaying the ops touches " + std::to_string(report.replayed_host_bytes) +
               " host bytes but the predicted peak is " + std::to_string(s.arena.host_bytes));
}

//! Per elementary byte interval of one arena, what the sweep needs: the op that last wrote it
//! (kept per stream so that a range query yields the latest writer per stream), the latest
//! reader per stream since that write, and the data the write left there. A segment tree with
//! lazy assignment: every query and update is O(log n).
class byte_state_tree {
 public:
  struct summary {
    std::array<std::int32_t, stream_count> writer{};  //!< max over the range, -1: none
    std::array<std::int32_t, stream_count> reader{};  //!< max over the range, -1: none
    std::int32_t data_lo, data_hi;                    //!< min and max data id, -1: never written
  };

  explicit byte_state_tree(std::size_t leaves) : n_(leaves) {
    std::size_t size = 1;
    while (size < n_) size *= 2;
    sum_.assign(2 * size, empty());
    tag_.assign(2 * size, tag{});
  }

  summary query(std::size_t lo, std::size_t hi) {
    summary r = identity();
    if (lo < hi) query(1, 0, n_, lo, hi, r);
    return r;
  }
  void write(std::size_t lo, std::size_t hi, std::int32_t op, std::size_t stream, std::int32_t data) {
    tag t;
    t.assign = true;
    t.op = op;
    t.stream = static_cast<std::uint8_t>(stream);
    t.data = data;
    if (lo < hi) update(1, 0, n_, lo, hi, t);
  }
  void read(std::size_t lo, std::size_t hi, std::int32_t op, std::size_t stream) {
    tag t;
    t.reader[stream] = op;
    if (lo < hi) update(1, 0, n_, lo, hi, t);
  }

 private:
  struct tag {
    bool assign = false;  // first: the whole range was written by `op` with `data`
    std::uint8_t stream = 0;
    std::int32_t op = -1, data = -1;
    std::array<std::int32_t, stream_count> reader{-1, -1, -1, -1};  // then: read by these (max)
  };
  static summary empty() {
    summary r;
    r.writer.fill(-1);
    r.reader.fill(-1);
    r.data_lo = r.data_hi = -1;
    return r;
  }
  static summary identity() {
    summary r = empty();
    r.data_lo = std::numeric_limits<std::int32_t>::max();
    r.data_hi = std::numeric_limits<std::int32_t>::min();
    return r;
  }
  static void merge(summary& into, summary const& x) {
    for (std::size_t t = 0; t < stream_count; ++t) {
      into.writer[t] = std::max(into.writer[t], x.writer[t]);
      into.reader[t] = std::max(into.reader[t], x.reader[t]);
    }
    into.data_lo = std::min(into.data_lo, x.data_lo);
    into.data_hi = std::max(into.data_hi, x.data_hi);
  }
  void apply(std::size_t node, tag const& t) {
    auto& s = sum_[node];
    auto& mine = tag_[node];
    if (t.assign) {
      s = empty();
      s.writer[t.stream] = t.op;
      s.reader = t.reader;  // a pushed tag carries the reads since its write: they stay visible
      s.data_lo = s.data_hi = t.data;
      mine = t;  // the earlier tag is overwritten, readers included
      return;
    }
    for (std::size_t k = 0; k < stream_count; ++k) {
      s.reader[k] = std::max(s.reader[k], t.reader[k]);
      mine.reader[k] = std::max(mine.reader[k], t.reader[k]);
    }
  }
  void push(std::size_t node) {
    auto const& t = tag_[node];
    if (!t.assign && t.reader == tag{}.reader) return;
    apply(2 * node, t);
    apply(2 * node + 1, t);
    tag_[node] = tag{};
  }
  void query(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi, summary& r) {
    if (lo <= nl && nr <= hi) return merge(r, sum_[node]);
    push(node);
    auto const mid = nl + (nr - nl) / 2;
    if (lo < mid) query(2 * node, nl, mid, lo, hi, r);
    if (mid < hi) query(2 * node + 1, mid, nr, lo, hi, r);
  }
  void update(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi, tag const& t) {
    if (lo <= nl && nr <= hi) return apply(node, t);
    push(node);
    auto const mid = nl + (nr - nl) / 2;
    if (lo < mid) update(2 * node, nl, mid, lo, hi, t);
    if (mid < hi) update(2 * node + 1, mid, nr, lo, hi, t);
    sum_[node] = identity();
    merge(sum_[node], sum_[2 * node]);
    merge(sum_[node], sum_[2 * node + 1]);
  }

  std::size_t n_;
  std::vector<summary> sum_;
  std::vector<tag> tag_;
};

//! No race and data flow: one sweep over the accesses in issue order.
inline void check_races_and_data_flow(schedule_view const& s, checked_program const& p, check_report& report) {
  auto const& acc = p.accesses;
  // Elementary intervals per arena: the sorted distinct boundaries of every access.
  std::array<std::vector<std::size_t>, 2> bounds;
  for (auto const& a : acc) {
    bounds[a.host].push_back(a.begin);
    bounds[a.host].push_back(a.end);
  }
  for (auto& b : bounds) {
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
  }
  auto leaf = [&](bool host, std::size_t x) {
    return static_cast<std::size_t>(std::lower_bound(bounds[host].begin(), bounds[host].end(), x) - bounds[host].begin());
  };
  // Data ids: equal exactly when `same_data`.
  std::vector<std::uint32_t> by_data(acc.size());
  for (std::uint32_t j = 0; j < acc.size(); ++j) by_data[j] = j;
  auto key = [&](std::uint32_t j) { return std::tuple(acc[j].layer, acc[j].slot, acc[j].shift); };
  std::sort(by_data.begin(), by_data.end(), [&](auto x, auto y) { return key(x) < key(y); });
  std::vector<std::int32_t> data(acc.size());
  std::int32_t ids = -1;
  for (std::size_t j = 0; j < by_data.size(); ++j) {
    if (j == 0 || key(by_data[j]) != key(by_data[j - 1])) ++ids;
    data[by_data[j]] = ids;
  }

  std::array<byte_state_tree, 2> trees{byte_state_tree(bounds[0].empty() ? 0 : bounds[0].size() - 1),
                                       byte_state_tree(bounds[1].empty() ? 0 : bounds[1].size() - 1)};
  // The input (carry 0) is written by the user before the step: data no op wrote, ordered
  // before every op.
  if (s.carry.present())
    for (std::uint32_t j = 0; j < acc.size(); ++j)
      if (acc[j].slot == carry_slot && acc[j].layer == 0 && !acc[j].host && acc[j].begin == s.carry.input_offset()) {
        trees[0].write(leaf(false, acc[j].begin), leaf(false, acc[j].end), -1, 0, data[j]);
        break;
      }
  auto guard_text = [&](access const& x, bool name_op) {
    return "the guard bytes after " + slot_label(s, x.layer, x.slot) + " (written by the executor's debug checks around " +
           (name_op ? op_name(s, x.op) : std::string("that op")) + ")";
  };
  auto overlap_of = [&](std::uint32_t other, access const& a) {  // the bytes `other` shares with `a`
    access const* found = nullptr;  // an access of `other` that conflicts with `a`, else one that overlaps it
    for (auto j = p.first_access[other]; j < p.first_access[other + 1]; ++j)
      if (auto const& x = acc[j]; x.host == a.host && x.begin < a.end && a.begin < x.end) {
        if (!found || (x.write && !found->write)) found = &x;
        if (found->write || a.write) break;
      }
    if (!found) return std::string("?");
    auto r = bytes_text(std::max(found->begin, a.begin), std::min(found->end, a.end));
    if (found->guard) r += ", " + guard_text(*found, true);
    if (a.guard) r += ", " + guard_text(a, true);
    return r;
  };
  auto const n = static_cast<std::uint32_t>(s.ops.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    auto const first = p.first_access[i], last = p.first_access[i + 1];
    auto const& clock = p.clock[i];
    // The accesses of one op are disjoint within an arena (proven by check_bindings, guards
    // included by check_layout), so their order within the op does not matter; all queries come
    // before the op's own updates.
    for (auto j = first; j < last; ++j) {
      auto const& a = acc[j];
      auto& tree = trees[a.host];
      auto const lo = leaf(a.host, a.begin), hi = leaf(a.host, a.end);
      auto const q = tree.query(lo, hi);
      // Race: after the last writer of every byte; a write also after the readers since then.
      for (std::size_t t = 0; t < stream_count; ++t) {
        auto const latest = a.write ? std::max(q.writer[t], q.reader[t]) : q.writer[t];
        if (latest < 0) continue;
        ++report.conflicting_pairs;
        if (clock[t] < latest)
          check_fail("race: " + op_name(s, static_cast<std::uint32_t>(latest)) + " and " + op_name(s, i) + " touch " +
                     space_name(a.host) + " bytes " + overlap_of(static_cast<std::uint32_t>(latest), a) +
                     " (one of them writing) and nothing orders them");
      }
      if (a.write || (q.data_lo == data[j] && q.data_hi == data[j])) continue;
      // Data flow: the last write to some byte of the read left other data (or none). Find it.
      for (auto k = lo; k < hi; ++k) {
        auto const at = tree.query(k, k + 1);
        if (at.data_lo == data[j]) continue;
        auto const bytes = bytes_text(bounds[a.host][k], bounds[a.host][k + 1]);
        auto const reads = "data flow: " + op_name(s, i) + " reads " + space_name(a.host) + " bytes " + bytes;
        if (at.data_lo < 0) check_fail(reads + " that no op before it wrote with this slot's data");
        auto const w = static_cast<std::uint32_t>(*std::max_element(at.writer.begin(), at.writer.end()));
        auto const w_end = acc.begin() + p.first_access[w + 1];
        auto const it = std::find_if(acc.begin() + p.first_access[w], w_end,
                                     [&](access const& x) { return data[&x - acc.data()] == at.data_lo; });
        bool const guard_bytes = it != w_end && it->guard;
        bool const same_slot = it != w_end && !it->guard && it->layer == a.layer && it->slot == a.slot;
        check_fail(reads + " but the last op to write them before it, " + op_name(s, w) + ", left " +
                   (guard_bytes ? guard_text(*it, false) : same_slot ? "other bytes of this slot" : "another slot's data") +
                   " there: this slot's bytes were never written there, or were overwritten before the read");
      }
      check_fail("data flow: " + op_name(s, i) + " reads bytes whose last writer the checker could not find");  // unreachable
    }
    for (auto j = first; j < last; ++j) {
      auto const& a = acc[j];
      auto const lo = leaf(a.host, a.begin), hi = leaf(a.host, a.end);
      auto const st = static_cast<std::size_t>(s.ops[i].stream);
      if (a.write)
        trees[a.host].write(lo, hi, static_cast<std::int32_t>(i), st, data[j]);
      else
        trees[a.host].read(lo, hi, static_cast<std::int32_t>(i), st);
    }
  }
}

}  // namespace detail

//! Verifies `s`; throws `schedule_error` naming the invariant that fails and the layer, slot or
//! ops involved. Takes any program, including malformed or hostile ones: nothing is indexed or
//! summed before it is proven in range.
inline check_report check_schedule(schedule_view const& s) {
  auto const p = detail::check_program(s);
  detail::check_layout(s);
  check_report report;
  detail::replay_peaks(s, p, report);
  detail::check_races_and_data_flow(s, p, report);
  return report;
}

}  // namespace tide
