#pragma once
//! \file
//! The checker's structural pass (core/check.hpp): every op in range, waits and events, vector
//! clocks, completeness (one forward and backward per layer in order, recomputes, copies and
//! collectives where they belong) and every op's byte accesses, for the later passes.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <tide/core/detail/check_bindings.hpp>
#include <tide/core/detail/check_carry.hpp>
#include <tide/core/detail/check_common.hpp>
#include <tide/core/detail/check_stage.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

//! Every op's byte accesses, in op order, into `p` (`total` of them: reserved at once). For a
//! program whose structure is proven, or the builder's own (`build_stage_schedule` derives the
//! waits between micro-batches from them): `constexpr`, so that the stage builder runs at compile
//! time, while the checking passes stay out of the constant evaluator (they would cost every
//! translation unit of the header-only umbrella 8% more to compile).
constexpr void collect_accesses(schedule_view const& s, checked_program& p, std::uint64_t total) {
  auto const n = static_cast<std::uint32_t>(s.ops.size());
  auto const guard = s.buffers.guard_bytes;
  auto const chunk_bytes = s.pipeline.chunk_bytes;
  p.accesses.reserve(static_cast<std::size_t>(total));
  p.first_access.reserve(std::size_t{n} + 1);
  for (std::uint32_t i = 0; i < n; ++i) {
    p.first_access.push_back(static_cast<std::uint32_t>(p.accesses.size()));
    auto const& o = s.ops[i];
    auto const slots = s.slots_of(o.layer);
    auto const chunk_start = o.chunks > 1 ? std::size_t{o.chunk} * chunk_bytes : 0;
    auto const slot = static_cast<std::uint16_t>(o.slot);
    auto add = [&](std::uint8_t host, bool write, std::size_t addr, std::size_t bytes, std::uint16_t k, std::size_t data) {
      p.accesses.push_back({i, host, write, addr, addr + bytes, o.layer, k, std::uint64_t{data} - addr});
    };
    // Carry `state` at `addr`: its data is the state's, wherever it lies.
    auto add_carry = [&](std::uint8_t host, bool write, std::size_t addr, std::uint32_t state) {
      p.accesses.push_back({i, host, write, addr, addr + s.carry.bytes, state, carry_slot, std::uint64_t{0} - addr});
    };
    if (o.carry_in != no_carry) add_carry(false, false, o.carry_in, o.layer);
    if (o.carry_out != no_carry) add_carry(false, o.kind != op_kind::backward, o.carry_out, carry_out_state(s, o.layer));
    // The guard bytes the executor's debug checks write after a slot before the op (and check
    // after it): part of the op's accesses (no overflow: proven by check_bindings).
    // Micro-batch `m`'s boundary gradient at `at` (a stage schedule): its data is the micro-batch's.
    auto add_gradient = [&](bool write, std::size_t at, std::uint32_t m, bool rmw) {
      access a{i, false, write, at, at + s.carry.bytes, m, gradient_slot, std::uint64_t{0} - at};
      a.rmw = rmw;
      p.accesses.push_back(a);
    };
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
        // It reads the saved slots, rebuilds the remat ones, and may write the scratch it is lent
        // for the others and for its carry out (nothing reads those).
        for (std::uint16_t k = 0; k < slots.size(); ++k) {
          add(false, slots[k].where == placement::remat, slots[k].backward_offset, slots[k].bytes, k, 0);
          if (slots[k].where == placement::remat) add_guard(slots[k].backward_offset + slots[k].bytes, k);
          if (auto const at = slots[k].recompute_offset; at != slot_binding::no_scratch) {
            add(false, true, at, slots[k].bytes, k, 0);
            add_guard(at + slots[k].bytes, k);
          }
        }
        if (s.carry.present() && s.recompute_carry_offset(o.layer) != no_carry)
          add_carry(false, true, s.recompute_carry_offset(o.layer), carry_out_state(s, o.layer));
        break;
      case op_kind::backward:
        for (std::uint16_t k = 0; k < slots.size(); ++k) add(false, false, slots[k].backward_offset, slots[k].bytes, k, 0);
        break;
      case op_kind::advance:  // the carry, and its slots as scratch the lambda may write
        for (std::uint16_t k = 0; k < slots.size(); ++k) {
          add(false, true, slots[k].advance_offset, slots[k].bytes, k, 0);
          add_guard(slots[k].advance_offset + slots[k].bytes, k);
        }
        break;
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
      case op_kind::store:
      case op_kind::load: {
        // The slot's bytes, and its region's padding to the storage alignment (which the transfer
        // moves too: data of its own, as guard bytes are). No overflow: proven by check_bindings.
        auto const salign = s.buffers.storage_alignment;
        auto const pad = (salign - o.bytes % salign) % salign;
        bool const store = o.kind == op_kind::store;
        auto const from = store ? host_space : storage_space, to = store ? storage_space : host_space;
        if (o.slot == carry_slot) {  // a disk snapshot: carry `layer`, whole
          add_carry(from, false, store ? o.host_offset : o.file_offset, o.layer);
          add_carry(to, true, store ? o.file_offset : o.host_offset, o.layer);
        } else {
          add(from, false, store ? o.host_offset : o.file_offset, o.bytes, slot, 0);
          add(to, true, store ? o.file_offset : o.host_offset, o.bytes, slot, 0);
        }
        if (pad > 0) {
          auto const at = (store ? o.file_offset : o.host_offset) + o.bytes;
          p.accesses.push_back({i, static_cast<std::uint8_t>(to), true, at, at + pad, o.layer, slot, 0, true});
        }
        break;
      }
      case op_kind::gather:
      case op_kind::regather:
      case op_kind::reduce: break;
      case op_kind::send:
      case op_kind::receive: {
        // A receive writes a micro-batch's input (or its output's gradient); a send reads its
        // output (or its input's gradient).
        bool const write = o.kind == op_kind::receive;
        auto const u = s.stage.unit_of(o.layer);
        if (o.slot == gradient_slot)
          add_gradient(write, o.device_offset, u, false);
        else
          add_carry(false, write, o.device_offset, write ? o.layer : carry_out_state(s, o.layer));
        break;
      }
    }
    // In a stage schedule a backward updates its micro-batch's boundary gradient in place, and the
    // last stage's turn (in its last layer's forward) seeds it.
    if (s.stage.present() && s.carry.present()) {
      auto const u = s.stage.unit_of(o.layer);
      auto const at = s.stage.gradient_at(u);
      bool const seeds = o.kind == op_kind::forward && s.stage.ends_model(o.layer);
      if (o.kind == op_kind::backward || seeds) add_gradient(true, at, u, o.kind == op_kind::backward);
    }
  }
  p.first_access.push_back(static_cast<std::uint32_t>(p.accesses.size()));
}

//! The number of byte accesses `collect_accesses` records for `s`'s ops (layers proven in range).
constexpr std::uint64_t access_count(schedule_view const& s) {
  std::uint64_t total = 0;
  auto const guard = s.buffers.guard_bytes;
  for (auto const& o : s.ops)
    total += is_storage(o.kind)                                             ? 4
             : is_copy(o.kind)                                              ? 2
             : is_collective(o.kind)                                  ? 0
             : is_boundary(o.kind)                                    ? 1
                                                                          : s.layers[o.layer].slot_count * (guard > 0 ? 4u : 2u) + 4;
  return total;
}

//! Structure, vector clocks and completeness; collects every op's byte accesses.
inline checked_program check_program(schedule_view const& s) {
  check_bindings(s);
  if (s.stage.present()) check_stage_tables(s);
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
    if (is_boundary(o.kind)) check_boundary_op(s, i);
    bool const carry_transfer = is_storage(o.kind) && o.slot == carry_slot;  // a disk snapshot's store or load
    if (o.slot != no_slot && !carry_copy && !carry_transfer && !is_boundary(o.kind) && o.slot >= s.layers[o.layer].slot_count)
      check_fail("structure: op #" + str(i) + " names slot " + str(o.slot) + " which layer " + str(o.layer) + " does not have");
    if (is_copy(o.kind) && o.slot == no_slot) check_fail("structure: op #" + str(i) + " is a copy of no slot");
    if (st >= stream_count) check_fail("structure: " + op_name(s, i) + " names no valid stream");
    check_carry_fields(s, i);
    if (is_copy(o.kind) && !carry_copy) {
      auto const& b = s.slots_of(o.layer)[o.slot];
      auto const what = [&] { return "structure: " + op_name(s, i); };
      if (b.where != placement::offload && b.where != placement::spill)
        check_fail(what() + " copies a slot that is neither offloaded nor spilled (" + std::string(to_string(b.where)) + ")");
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
    if (is_storage(o.kind)) {
      auto const what = [&] { return "structure: op #" + str(i) + " (" + std::string(to_string(o.kind)) + " L" + str(o.layer) + ")"; };
      if (o.slot == no_slot) check_fail(what() + " moves no slot");
      if (carry_transfer) {
        if (!s.carry.present() || s.carry.disk_snapshots == 0)
          check_fail(what() + " moves a carry, but the schedule has no disk snapshots of one");
        if (o.bytes != s.carry.bytes) check_fail(what() + " must move the whole carry (" + str(s.carry.bytes) + " bytes)");
      } else if (auto const& b = s.slots_of(o.layer)[o.slot]; !b.stored()) {
        check_fail("structure: " + op_name(s, i) + " moves a slot that is not stored (" + std::string(to_string(b.where)) +
                   (b.where == placement::spill ? ", held in the spill ring" : "") + ")");
      }
      if (o.chunks != 1 || o.chunk != 0) check_fail("structure: " + op_name(s, i) + " claims chunk " + str(o.chunk) + " of " + str(o.chunks));
      if (o.carry_in != no_carry || o.carry_out != no_carry) check_fail("structure: " + op_name(s, i) + " names a carry");
      // One stream's order: a storage file moves one transfer at a time, and a store and a load
      // of one ring buffer are ordered by it.
      auto const want = s.pipeline.latency_hiding ? stream_role::storage : stream_role::compute;
      if (o.stream != want)
        check_fail("structure: " + op_name(s, i) + " is a storage transfer on the " + std::string(to_string(o.stream)) +
                   " stream: stores and loads run on the " + std::string(to_string(want)) + " stream" +
                   (s.pipeline.latency_hiding ? "" : " (latency hiding is off)"));
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
    // Advances: as many as the reversal needs; copies and storage transfers: per slot, below.
    if (is_copy(o.kind) || is_storage(o.kind) || is_boundary(o.kind) || o.kind == op_kind::advance) continue;
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
    auto const layer = [&] { return "layer " + str(l); };  // built only for a message
    if (fwd[l] == absent) check_fail("completeness: " + layer() + " has no forward op");
    if (bwd[l] == absent) check_fail("completeness: " + layer() + " has no backward op: its gradient would never be computed");
    ordered(fwd[l], bwd[l], "a layer's backward follows its forward");
    if (!s.first_layer(l)) {  // within a unit: its chunk's layers
      ordered(fwd[l - 1], fwd[l], "forwards run in layer order");
      ordered(bwd[l], bwd[l - 1], "backwards run in reverse layer order");
    }
    auto const slots = s.slots_of(l);
    auto const remat = std::find_if(slots.begin(), slots.end(), [](auto const& b) { return b.where == placement::remat; });
    if (remat != slots.end() && rec[l] == absent)
      check_fail("completeness: " + layer() + " has remat slot '" + std::string(remat->name) +
                 "' but no recompute op: its backward would read a slot nothing rebuilt");
    if (remat == slots.end() && rec[l] != absent)
      check_fail("completeness: " + op_name(s, rec[l]) + " recomputes a layer that has no remat slot");
    if (rec[l] != absent) {
      ordered(fwd[l], rec[l], "a recompute follows its layer's forward");
      ordered(rec[l], bwd[l], "a layer's backward follows its recompute");
    }
    if (s.collectives.before_forward && gat[l] == absent)
      check_fail("completeness: " + layer() + " has no gather op though the schedule's collectives gather before forward");
    if (!s.collectives.before_forward && gat[l] != absent)
      check_fail("completeness: " + op_name(s, gat[l]) + " gathers though the schedule's collectives do not");
    if (gat[l] != absent) ordered(gat[l], fwd[l], "a layer's forward follows its gather");
    if (s.collectives.before_backward && reg[l] == absent)
      check_fail("completeness: " + layer() + " has no regather op though the schedule's collectives regather before backward");
    if (!s.collectives.before_backward && reg[l] != absent)
      check_fail("completeness: " + op_name(s, reg[l]) + " regathers though the schedule's collectives do not");
    if (reg[l] != absent) {
      ordered(reg[l], bwd[l], "a layer's backward follows its regather");
      if (rec[l] != absent) ordered(reg[l], rec[l], "a layer's recompute follows its regather");
    }
    if (s.collectives.after_backward && col[l] == absent)
      check_fail("completeness: " + layer() + " has no reduce op though the schedule's collectives reduce after backward");
    if (!s.collectives.after_backward && col[l] != absent)
      check_fail("completeness: " + op_name(s, col[l]) + " reduces though the schedule's collectives do not");
    if (col[l] != absent) ordered(bwd[l], col[l], "a layer's reduce follows its backward");
  }

  if (s.stage.present()) check_stage_program(s, p, fwd, bwd);

  // Completeness of copies: every offloaded slot goes out and comes back, each chunk once.
  struct copy_key {
    std::uint32_t slot;  // global binding index
    bool prefetch;
    std::uint32_t chunk;
    std::uint32_t op;
    constexpr bool operator<(copy_key const& o) const noexcept {
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
      // Copies of other slots were rejected above.
      if (s.slots[g].where != placement::offload && s.slots[g].where != placement::spill) continue;
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

  // Completeness of storage transfers: a stored slot is stored once and loaded once (what orders
  // them is the data flow's to prove); other slots were rejected above.
  {
    std::vector<std::array<std::uint32_t, 2>> moves(s.slots.size(), {absent, absent});
    for (std::uint32_t i = 0; i < n; ++i)
      if (auto const& o = s.ops[i]; is_storage(o.kind) && o.slot != carry_slot) {  // a carry's: the data flow proves them
        auto& at = moves[s.layers[o.layer].first_slot + o.slot][o.kind == op_kind::load];
        if (at != absent)
          check_fail("completeness: " + slot_label(s, o.layer, o.slot) + " has two " + std::string(to_string(o.kind)) +
                     " ops, " + op_name(s, at) + " and " + op_name(s, i));
        at = i;
      }
    for (std::uint32_t l = 0; l < L; ++l)
      for (std::uint32_t k = 0; k < s.layers[l].slot_count; ++k) {
        auto const g = s.layers[l].first_slot + k;
        if (!s.slots[g].stored()) continue;
        if (moves[g][0] == absent)
          check_fail("completeness: " + slot_label(s, l, k) + " is stored but no store op writes it to the file");
        if (moves[g][1] == absent)
          check_fail("completeness: " + slot_label(s, l, k) + " is stored but no load op reads it back before its backward");
      }
  }

  // Byte accesses, in op order (their count is bounded first: indices into them are 32-bit).
  auto const total = access_count(s);
  if (total >= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
    check_fail("structure: the ops touch " + str(total) + " slot ranges, more than 31-bit indices name");
  collect_accesses(s, p, total);
  if (s.carry.present()) check_disjoint_accesses(s, p);
  return p;
}

}  // namespace tide::detail
