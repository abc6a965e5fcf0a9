#pragma once
//! \file
//! The builder's stage 3, the reversal: the chain actions (the strategy's own, Revolve's for its
//! device snapshots, or the plain forward-then-backward of a stack without a carry), walked one
//! by one against what the carries hold, each emitting its ops (stage 4); then the carry's
//! buffers placed after everything else in both arenas.

#include <cstddef>
#include <cstdint>

#include <tide/core/detail/build_program.hpp>
#include <tide/core/detail/builder.hpp>

namespace tide::detail {

constexpr schedule_issue builder::choose_reversal() {
  using c = schedule_issue_code;
  auto const& ck = how.checkpoints;
  if (carries && !ck.reversal.empty()) {
    actions = ck.reversal;
  } else if (carries) {
    auto const slots = ck.device_snapshots >= L ? std::int64_t{L} : std::int64_t{ck.device_snapshots};
    actions = revolve_schedule(L, slots);
  } else {
    actions.reserve(L + 2);
    if (L > 1) actions.push_back(chain_action::advance(0, static_cast<std::int32_t>(L - 1)));
    actions.push_back(chain_action::turn(static_cast<std::int32_t>(L - 1)));
    for (std::uint32_t l = L; l-- > 0;) actions.push_back(chain_action::backward(static_cast<std::int32_t>(l)));
  }
  // Ops beyond 6 per layer (the first sweep's forwards are among those): the later advances and
  // the carry's copies. The actions are not validated yet: out-of-range advances are left to the
  // walk, which names them.
  // The layers advanced after the turn (segment recomputations) write their slots into scratch
  // that the arena lays out for the largest of them.
  std::size_t ran = 0;
  bool turn_seen = false;
  advanced.assign(L, 0);
  for (auto const& x : actions)
    if (x.op == chain_op::advance && x.carry >= 0 && x.to > x.carry && x.to <= static_cast<std::int64_t>(L)) {
      ran += static_cast<std::size_t>(std::int64_t{x.to} - x.carry);  // others: bad_reversal in the walk
      for (auto i = x.carry; turn_seen && i < x.to; ++i) advanced[static_cast<std::size_t>(i)] = 1;
    } else if (x.op == chain_op::offload || x.op == chain_op::prefetch || x.op == chain_op::spill || x.op == chain_op::load) {
      ++extra_ops;
    } else if (x.op == chain_op::turn) {
      turn_seen = true;
    }
  extra_ops += ran > L ? ran - L : 0;
  if (n_ops + extra_ops > max_ops) return issue(c::too_many_ops, {}, {}, n_ops + extra_ops, max_ops);
  for (std::uint32_t l = 0; l < L; ++l)
    if (advanced[l]) advance_scratch = std::max(advance_scratch, layer_region[l]);
  return {};
}

constexpr schedule_issue builder::write_program() {
  s.ops.reserve(n_ops + extra_ops);
  s.waits.reserve(2 * n_ops);
  w.clocks.reserve(n_ops + extra_ops);
  first_chunk_op.assign(s.slots.size(), 0);
  for (auto* v : {&last_offload_of_layer, &forward_op, &backward_op, &last_prefetch_of_layer, &gather_op, &regather_op})
    v->assign(L, -1);
  last_store_of_layer.assign(L, -1);
  load_op.assign(s.slots.size(), -1);
  cbuf.assign(carries ? 2 : 0, carry_buffer{});
  working = carries ? 0 : none;
  next_backward = static_cast<std::int64_t>(L) - 1;

  if (how.collectives.before_forward) emit_gather(0);
  // Prefetch issue points: layer k (backward order) is issued before the backward work of layer
  // min(l + distance, L - 1), but never before its staging buffer's previous reader was issued.
  // A distance at or beyond the stack's end means "as early as the staging ring allows".
  issue_at.assign(L, -1);
  std::uint32_t const dist = hiding ? how.pipeline.prefetch_distance : 0;
  auto const staging = s.arena.staging_buffers;
  for (std::uint32_t k = 0; k < n_off; ++k) {
    auto const l = offloaded[n_off - 1 - k];
    auto t = dist >= L - 1 - l ? L - 1 : l + dist;
    if (k >= staging) t = std::min(t, offloaded[n_off - 1 - (k - staging)] - 1);
    issue_at[l] = t;
  }
  for (std::size_t at = 0; at < actions.size(); ++at)
    if (auto i = walk(at, actions[at])) return i;
  if (next_backward >= 0) return bad(actions.size(), "the reversal ends before the backward of layer 0");
  return {};
}

// One action of the reversal, checked against what the carries hold, then emitted.
constexpr schedule_issue builder::walk(std::size_t at, chain_action const& x) {
  auto const& ck = how.checkpoints;
  std::uint32_t const dcap = ck.reversal.empty() || ck.device_snapshots == every_carry ? L : ck.device_snapshots;
  std::uint32_t const hcap = ck.host_snapshots;
  auto& cb = s.carry;
  // A reversal uses fewer snapshots than it has actions: that bounds the tables below too.
  auto const dslot_ok = [&] {
    return x.snapshot >= 0 && static_cast<std::uint32_t>(x.snapshot) < dcap && static_cast<std::size_t>(x.snapshot) < actions.size();
  };
  auto const hslot_ok = [&] {
    return x.host_snapshot >= 0 && static_cast<std::uint32_t>(x.host_snapshot) < hcap && static_cast<std::size_t>(x.host_snapshot) < actions.size();
  };
  auto const grow = [&] {
    if (dslots.size() <= static_cast<std::size_t>(x.snapshot)) dslots.resize(static_cast<std::size_t>(x.snapshot) + 1);
  };
  auto const hgrow = [&] {
    if (hslots.size() <= static_cast<std::size_t>(x.host_snapshot)) hslots.resize(static_cast<std::size_t>(x.host_snapshot) + 1);
  };
  std::uint32_t const kcap = ck.disk_snapshots;
  auto const kslot_ok = [&] {
    return x.disk_snapshot >= 0 && static_cast<std::uint32_t>(x.disk_snapshot) < kcap && static_cast<std::size_t>(x.disk_snapshot) < actions.size();
  };
  auto const kgrow = [&] {
    if (kslots.size() <= static_cast<std::size_t>(x.disk_snapshot)) kslots.resize(static_cast<std::size_t>(x.disk_snapshot) + 1);
  };
  auto const kslot_held = [&] {
    return kslot_ok() && static_cast<std::size_t>(x.disk_snapshot) < kslots.size() && kslots[static_cast<std::size_t>(x.disk_snapshot)].state >= 0;
  };
  // The action's device (host) snapshot is in range and holds a carry.
  auto const dslot_held = [&] {
    return dslot_ok() && static_cast<std::size_t>(x.snapshot) < dslots.size() && dslots[static_cast<std::size_t>(x.snapshot)].buffer >= 0;
  };
  auto const hslot_held = [&] {
    return hslot_ok() && static_cast<std::size_t>(x.host_snapshot) < hslots.size() && hslots[static_cast<std::size_t>(x.host_snapshot)].state >= 0;
  };
  auto const host_at = [&] { return cb.host_area + cb.host_region_bytes * static_cast<std::size_t>(x.host_snapshot); };
  // A spill's store or a load of carry `state`: the whole carry, between the action's host and
  // disk snapshots (the backends pad it to the storage alignment, as the regions are).
  auto const carry_transfer = [&](op_kind kind, std::int32_t state) {
    op o{kind, storage, carry_slot, static_cast<std::uint32_t>(state)};
    o.host_offset = host_at();
    o.file_offset = cb.file_area + cb.file_region_bytes * static_cast<std::size_t>(x.disk_snapshot);
    o.bytes = cb.bytes;
    return o;
  };
  // The action's device snapshot takes `buffer`, holding carry `state`.
  auto const hold = [&](std::int32_t buffer, std::int32_t state) {
    dslots[static_cast<std::size_t>(x.snapshot)] = {buffer, state};
    ++cbuf[static_cast<std::size_t>(buffer)].refs;
    ++held;
    cb.device_snapshots = std::max(cb.device_snapshots, held);
  };
  if (next_backward < 0 && x.op != chain_op::free && x.op != chain_op::free_host && x.op != chain_op::free_disk)
    return bad(at, "it follows the backward of layer 0, which ends the step (only frees may)");
  switch (x.op) {
    case chain_op::advance: {
      if (x.carry != working_state || !have_working)
        return bad(at, "it advances from a carry that is not the working carry (restore it first)");
      if (x.to <= x.carry || x.to > static_cast<std::int64_t>(L) - 1)
        return bad(at, "it advances to a carry before its start or beyond the last layer's input (the turn runs the last layer)");
      if (!turned && static_cast<std::uint32_t>(x.carry) != forwarded)
        return bad(at, "the first sweep runs each layer once, in order: this advance runs a layer again before the turn");
      for (auto i = x.carry; i < x.to; ++i) {
        auto const l = static_cast<std::uint32_t>(i);
        auto const out = carries ? take_buffer() : none;
        if (!turned) {
          emit_forward(l, working, out);
          ++forwarded;
        } else {
          if (how.collectives.before_forward || how.collectives.before_backward)
            return issue(schedule_issue_code::advance_without_gather, {}, stack.carry.name, l);
          // Its slots are scratch in the backward area: the first use of it waits like a recompute's.
          if (first_backward_area_use_compute && how.buffers.share_phase_regions) w.wait(last_offload);
          first_backward_area_use_compute = false;
          emit_layer_op({op_kind::advance, stream_role::compute, no_slot, l}, working, out);
          ++cb.advances;
        }
        auto const old = working;
        working = out;
        ++working_state;
        release_if_unused(old);
      }
      return {};
    }
    case chain_op::turn:
      if (turned || x.carry != static_cast<std::int64_t>(L) - 1 || forwarded != L - 1 || working_state != x.carry)
        return bad(at, "the turn runs the last layer forward once, after the first sweep has run every other layer");
      emit_forward(L - 1, working, carries ? 1 : none);
      last_forward = forward_op[L - 1];
      ++forwarded;
      turned = true;
      emit_prefetches_at(L - 1);
      return {};
    case chain_op::store:
      if (!dslot_ok()) return bad(at, "it names a device snapshot slot beyond checkpoint_spec::device_snapshots");
      grow();
      if (dslots[static_cast<std::size_t>(x.snapshot)].buffer >= 0) return bad(at, "it stores into a device slot that is not empty");
      if (x.carry != working_state || !have_working) return bad(at, "it stores a carry that is not the working carry");
      hold(working, working_state);  // a stack without a carry has no stores
      return {};
    case chain_op::restore: {
      if (!dslot_held()) return bad(at, "it restores from a device slot that holds no carry");
      auto const old = working;
      working = dslots[static_cast<std::size_t>(x.snapshot)].buffer;
      working_state = dslots[static_cast<std::size_t>(x.snapshot)].state;
      have_working = true;
      if (old >= 0) release_if_unused(old);
      return {};
    }
    case chain_op::free: {
      if (!dslot_held()) return bad(at, "it frees a device slot that holds no carry");
      auto& d = dslots[static_cast<std::size_t>(x.snapshot)];
      --cbuf[static_cast<std::size_t>(d.buffer)].refs;
      release_if_unused(d.buffer);
      d = {};
      --held;
      return {};
    }
    case chain_op::backward: {
      if (!turned || x.carry != next_backward) return bad(at, "backward steps run from the last layer to the first, after the turn");
      if (carries && (working_state != x.carry || !have_working))  // without a carry: the plain reversal
        return bad(at, "the layer's input is not the working carry (restore or advance to it first)");
      emit_backward(static_cast<std::uint32_t>(x.carry), working);
      --next_backward;
      auto const old = working;
      working = none;  // consumed
      have_working = false;
      release_if_unused(old);
      return {};
    }
    case chain_op::offload: {
      if (!dslot_held()) return bad(at, "it offloads a device slot that holds no carry");
      if (!hslot_ok()) return bad(at, "it names a host snapshot slot beyond checkpoint_spec::host_snapshots");
      hgrow();
      auto& h = hslots[static_cast<std::size_t>(x.host_snapshot)];
      if (h.state >= 0) return bad(at, "it offloads into a host slot that is not empty");
      auto const& d = dslots[static_cast<std::size_t>(x.snapshot)];
      op o{op_kind::offload, d2h, carry_slot, static_cast<std::uint32_t>(d.state)};
      o.device_offset = carry_at(d.buffer);
      o.host_offset = host_at();
      o.bytes = cb.bytes;
      wait_to_read(d.buffer);
      w.wait(h.writer);
      w.wait(h.reader);
      w.wait(h.storer);
      auto const idx = w.emit(o);
      note(idx, d.buffer, none);
      h = {d.state, idx, -1, -1};
      cb.host_snapshots = std::max(cb.host_snapshots, static_cast<std::uint32_t>(x.host_snapshot) + 1);
      return {};
    }
    case chain_op::prefetch: {
      if (!hslot_held()) return bad(at, "it prefetches from a host slot that holds no carry");
      if (!dslot_ok()) return bad(at, "it names a device snapshot slot beyond checkpoint_spec::device_snapshots");
      grow();
      if (dslots[static_cast<std::size_t>(x.snapshot)].buffer >= 0) return bad(at, "it prefetches into a device slot that is not empty");
      auto& h = hslots[static_cast<std::size_t>(x.host_snapshot)];
      auto const b = take_buffer();
      op o{op_kind::prefetch, h2d, carry_slot, static_cast<std::uint32_t>(h.state)};
      o.device_offset = carry_at(b);
      o.host_offset = host_at();
      o.bytes = cb.bytes;
      w.wait(h.writer);
      wait_to_write(b);
      auto const idx = w.emit(o);
      note(idx, none, b);
      h.reader = idx;
      hold(b, h.state);
      return {};
    }
    case chain_op::free_host:
      if (!hslot_held()) return bad(at, "it frees a host slot that holds no carry");
      hslots[static_cast<std::size_t>(x.host_snapshot)].state = -1;
      return {};
    case chain_op::spill: {  // host snapshot -> disk snapshot: a store of the whole carry, padded
      if (!hslot_held()) return bad(at, "it spills a host slot that holds no carry");
      if (!kslot_ok()) return bad(at, "it names a disk snapshot slot beyond checkpoint_spec::disk_snapshots");
      kgrow();
      auto& k = kslots[static_cast<std::size_t>(x.disk_snapshot)];
      if (k.state >= 0) return bad(at, "it spills into a disk snapshot that is not empty");
      auto& h = hslots[static_cast<std::size_t>(x.host_snapshot)];
      auto const o = carry_transfer(op_kind::store, h.state);
      w.wait(h.writer);
      w.wait(k.writer);
      w.wait(k.reader);
      auto const idx = w.emit(o);
      h.storer = idx;
      k = {h.state, idx, -1};
      cb.disk_snapshots = std::max(cb.disk_snapshots, static_cast<std::uint32_t>(x.disk_snapshot) + 1);
      return {};
    }
    case chain_op::load: {  // disk snapshot -> host snapshot
      if (!kslot_held()) return bad(at, "it loads from a disk snapshot that holds no carry");
      if (!hslot_ok()) return bad(at, "it names a host snapshot slot beyond checkpoint_spec::host_snapshots");
      hgrow();
      auto& h = hslots[static_cast<std::size_t>(x.host_snapshot)];
      if (h.state >= 0) return bad(at, "it loads into a host slot that is not empty");
      auto& k = kslots[static_cast<std::size_t>(x.disk_snapshot)];
      auto const o = carry_transfer(op_kind::load, k.state);
      w.wait(k.writer);
      w.wait(h.writer);
      w.wait(h.reader);
      w.wait(h.storer);
      auto const idx = w.emit(o);
      k.reader = idx;
      h = {k.state, idx, -1, -1};
      cb.host_snapshots = std::max(cb.host_snapshots, static_cast<std::uint32_t>(x.host_snapshot) + 1);
      return {};
    }
    case chain_op::free_disk:
      if (!kslot_held()) return bad(at, "it frees a disk snapshot that holds no carry");
      kslots[static_cast<std::size_t>(x.disk_snapshot)].state = -1;
      return {};
    default: return bad(at, "it is no chain action");
  }
}

// The carry's buffers, after everything else in both arenas.
constexpr schedule_issue builder::place_carries() {
  if (!carries) return {};
  auto& a = s.arena;
  auto& cb = s.carry;
  cb.device_buffers = static_cast<std::uint32_t>(cbuf.size());
  std::size_t dev = 0, hst = 0;
  if (!checked_mul(cb.region_bytes, cbuf.size(), dev) || !checked_add(a.device_bytes, dev, a.device_bytes))
    return overflow("device arena with the carry's buffers", {}, stack.carry.name);
  if (!checked_mul(cb.host_region_bytes, std::size_t{cb.host_snapshots}, hst) ||
      (cb.host_snapshots > 0 && !checked_add(cb.host_area, hst, a.host_bytes)))
    return overflow("host arena with the carry's snapshots", {}, stack.carry.name);
  std::size_t file = 0;
  if (!checked_mul(cb.file_region_bytes, std::size_t{cb.disk_snapshots}, file) ||
      (cb.disk_snapshots > 0 && !checked_add(cb.file_area, file, a.storage_bytes)))
    return overflow("storage file with the carry's disk snapshots", {}, stack.carry.name);
  a.carry_bytes = dev;
  a.host_carry_bytes = hst;
  return {};
}

}  // namespace tide::detail
