#pragma once
//! \file
//! The builder: the expansion of a stack and a strategy into a schedule. constexpr, one
//! overflow-checked pass that validates while it sizes; `static_schedule.hpp` runs it at compile
//! time.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/reversal.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#include <tide/core/validation.hpp>

namespace tide {

namespace detail {

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

}  // namespace detail

//! Builds the schedule from values into `s`, reusing its storage: a caller that builds many
//! schedules (a planner, a sweep) allocates nothing once `s` has grown. Returns the first problem
//! with the composition (then `s` is left empty) or an issue whose code is `none`. Every size and
//! offset is computed with overflow checks.
[[nodiscard]] constexpr schedule_issue try_build_schedule_into(schedule& s, stack_spec const& stack, strategy const& how) {
  using c = schedule_issue_code;
  auto const& policy = how.policy;
  auto const& buffers = how.buffers;
  auto const& pipeline = how.pipeline;
  auto const& collectives = how.collectives;
  s.layers.clear();
  s.slots.clear();
  s.ops.clear();
  s.waits.clear();
  s.event_count = 0;
  s.arena = {};
  s.carry = {};
  // A failed build leaves nothing behind: no layers, ops or arena (a peak of 0, not the peak of
  // a schedule that does not exist); storage is kept for the next build.
  auto fail = [&](schedule_issue i) {
    s.layers.clear();
    s.slots.clear();
    s.ops.clear();
    s.waits.clear();
    s.event_count = 0;
    s.arena = {};
    s.buffers = {};
    s.pipeline = {};
    s.collectives = {};
    s.carry = {};
    return i;
  };
  if (auto issue = detail::find_structure_issue(stack, policy, buffers, how.checkpoints)) return fail(issue);

  s.buffers = buffers;
  s.pipeline = pipeline;
  s.collectives = collectives;
  auto const L = stack.layer_count();
  auto const hiding = pipeline.latency_hiding;
  auto const dalign = buffers.device_alignment;

  // 1. Placement and per-layer region sizes.
  // Bytes, not std::vector<bool>: Clang 14 cannot evaluate libstdc++ 12's vector<bool> in a constant expression.
  std::vector<std::uint8_t> rule_used(policy.rules.size(), 0);
  auto const deciding = policy.deciding_rules(stack);
  std::size_t pair = 0;
  std::size_t kept = 0, scratch = 0, host = 0, copies = 0;
  bool any_offload = false;
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const& type = stack.layer(l);
    layer_binding lb{.type_name = type.name,
                     .first_slot = static_cast<std::uint32_t>(s.slots.size()),
                     .slot_count = static_cast<std::uint32_t>(type.slots.size()),
                     .type_index = stack.layer_types[l]};
    for (auto const& sl : type.slots) {
      auto const rule = deciding[pair++];
      if (rule != policy_spec::no_rule) rule_used[rule] = 1;
      slot_binding b{sl.name, rule == policy_spec::no_rule ? placement::keep : policy.rules[rule].where, sl.bytes};
      if (sl.input && b.where == placement::remat) return fail(detail::issue(c::remat_of_input, type.name, sl.name, l));
      std::size_t region = 0;
      if (!checked_add(sl.bytes, buffers.guard_bytes, region))
        return fail(detail::overflow("size plus guard bytes", type.name, sl.name));
      if (!checked_align_up(region, dalign, region))
        return fail(detail::overflow("size plus guard bytes, aligned to the device alignment,", type.name, sl.name));
      switch (b.where) {
        case placement::keep:
          b.forward_offset = b.backward_offset = kept;
          if (!checked_add(kept, region, kept)) return fail(detail::overflow("total of kept slots", type.name, sl.name));
          break;
        case placement::offload: {
          any_offload = true;
          b.forward_offset = b.backward_offset = lb.offloaded_bytes;  // layer-local for now
          if (!checked_add(lb.offloaded_bytes, region, lb.offloaded_bytes))
            return fail(detail::overflow("total of one layer's offloaded slots", type.name, sl.name));
          b.host_offset = host;
          std::size_t host_region = 0;
          if (!checked_align_up(sl.bytes, buffers.host_alignment, host_region) || !checked_add(host, host_region, host))
            return fail(detail::overflow("pinned host arena", type.name, sl.name));
          auto const chunks = pipeline.chunk_bytes == 0 ? 1 : ceil_div(sl.bytes, pipeline.chunk_bytes);
          // Chunk and op indices are 32-bit: refuse chunk sizes that split a slot absurdly fine.
          if (chunks > max_chunks_per_slot) return fail(detail::issue(c::too_many_chunks, type.name, sl.name, chunks, max_chunks_per_slot));
          copies += chunks;
          if (copies > max_ops) return fail(detail::issue(c::too_many_ops, {}, {}, copies, max_ops));
          break;
        }
        case placement::remat:
          b.forward_offset = b.backward_offset = lb.remat_bytes;
          if (!checked_add(lb.remat_bytes, region, lb.remat_bytes))
            return fail(detail::overflow("total of one layer's remat slots", type.name, sl.name));
          break;
      }
      s.slots.push_back(b);
    }
    scratch = std::max(scratch, lb.remat_bytes);
    s.layers.push_back(lb);
  }
  auto const n_ops = 6 * std::size_t{L} + 2 * copies;  // forward, recompute, backward, gather, regather, reduce
  if (n_ops > max_ops) return fail(detail::issue(c::too_many_ops, {}, {}, n_ops, max_ops));
  if (!policy.allow_unused_rules)
    for (std::size_t i = 0; i < rule_used.size(); ++i)
      if (!rule_used[i]) {
        auto const& r = policy.rules[i];
        // type_name "+" marks a rule naming more slots than the one quoted.
        return fail(detail::issue(c::unused_rule, r.slots.size() > 1 ? "+" : "",
                                  r.slots.empty() ? std::string_view{} : r.slots[0], i, L, to_string(r.where)));
      }
  // Staging and in-flight parameters only matter once something is offloaded with latency
  // hiding (without it copies are serialized on the compute stream).
  if (hiding && any_offload) {
    if (buffers.staging_buffers == 0) return fail(detail::issue(c::zero_staging_buffers));
    if (pipeline.max_offloads_in_flight == 0) return fail(detail::issue(c::zero_offloads_in_flight));
  }

  // Offloaded layers in forward order (j); backward order is k = n_off - 1 - j.
  std::vector<std::uint32_t> offloaded;
  std::vector<std::uint32_t> ring_index(L, 0);
  for (std::uint32_t l = 0; l < L; ++l)
    if (s.layers[l].offloaded_bytes > 0) {
      ring_index[l] = static_cast<std::uint32_t>(offloaded.size());
      offloaded.push_back(l);
    }
  auto const n_off = static_cast<std::uint32_t>(offloaded.size());

  // 2. Arena layout. Without latency hiding copies are serialized on the compute stream, so one
  // source and one staging buffer are all that can be in use. Ring buffer b is sized for the
  // largest layer that uses it, so every byte of the arena is used by some op.
  auto& a = s.arena;
  a.kept_bytes = kept;
  a.remat_scratch_bytes = scratch;
  a.offload_buffers = std::min<std::uint32_t>(n_off, hiding ? pipeline.max_offloads_in_flight : 1);
  a.staging_buffers = std::min<std::uint32_t>(n_off, hiding ? buffers.staging_buffers : 1);
  std::vector<std::size_t> offload_buf(a.offload_buffers + 1, 0), staging_buf(a.staging_buffers + 1, 0);
  for (std::uint32_t j = 0; j < n_off; ++j) {
    auto const bytes = s.layers[offloaded[j]].offloaded_bytes;
    auto& o = offload_buf[j % a.offload_buffers + 1];
    auto& st = staging_buf[(n_off - 1 - j) % a.staging_buffers + 1];
    o = std::max(o, bytes);
    st = std::max(st, bytes);
  }
  for (std::size_t i = 1; i < offload_buf.size(); ++i)  // prefix offsets
    if (!checked_add(offload_buf[i], offload_buf[i - 1], offload_buf[i])) return fail(detail::overflow("offload source ring"));
  for (std::size_t i = 1; i < staging_buf.size(); ++i)
    if (!checked_add(staging_buf[i], staging_buf[i - 1], staging_buf[i])) return fail(detail::overflow("staging ring"));
  a.offload_ring_bytes = offload_buf.back();
  a.staging_ring_bytes = staging_buf.back();
  std::size_t forward_size = 0, backward_size = 0;
  if (!checked_add(a.offload_ring_bytes, scratch, forward_size) || !checked_add(a.staging_ring_bytes, scratch, backward_size))
    return fail(detail::overflow("transient area (ring plus remat scratch)"));
  a.forward_area = kept;
  std::size_t phases = 0;
  if (buffers.share_phase_regions) phases = std::max(forward_size, backward_size);
  else if (!checked_add(forward_size, backward_size, phases)) return fail(detail::overflow("transient area of both phases"));
  if (!checked_add(kept, phases, a.device_bytes)) return fail(detail::overflow("device arena"));
  a.backward_area = buffers.share_phase_regions ? kept : kept + forward_size;  // <= device_bytes: cannot wrap
  a.host_bytes = host;

  // Resolve device offsets of transient slots (each below device_bytes: cannot wrap).
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const& lb = s.layers[l];
    for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
      auto& b = s.slots[lb.first_slot + k];
      if (b.where == placement::offload) {
        auto const j = ring_index[l];
        b.forward_offset += a.forward_area + offload_buf[j % a.offload_buffers];
        b.backward_offset += a.backward_area + staging_buf[(n_off - 1 - j) % a.staging_buffers];
      } else if (b.where == placement::remat) {
        b.forward_offset += a.forward_area + a.offload_ring_bytes;
        b.backward_offset += a.backward_area + a.staging_ring_bytes;
      }
    }
  }

  // 3. The reversal: which layers run forward when, and where each carry lives. A stack without
  // a carry runs the plain one: every forward, then every backward.
  auto const& ck = how.checkpoints;
  bool const carries = stack.has_carry();
  std::vector<chain_action> actions;
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
  // walk below, which names them.
  std::size_t extra_ops = 0, advanced = 0;
  for (auto const& x : actions)
    if (x.op == chain_op::advance && x.state >= 0 && x.to > x.state && x.to <= static_cast<std::int64_t>(L))
      advanced += static_cast<std::size_t>(std::int64_t{x.to} - x.state);  // others: bad_reversal below
    else if (x.op == chain_op::offload || x.op == chain_op::prefetch) ++extra_ops;
  extra_ops += advanced > L ? advanced - L : 0;
  if (n_ops + extra_ops > max_ops) return fail(detail::issue(c::too_many_ops, {}, {}, n_ops + extra_ops, max_ops));
  auto& cb = s.carry;
  if (carries) {
    cb.name = stack.carry.name;
    cb.bytes = stack.carry.bytes;
    if (!checked_align_up(stack.carry.bytes, dalign, cb.region_bytes) ||
        !checked_align_up(stack.carry.bytes, buffers.host_alignment, cb.host_region_bytes))
      return fail(detail::overflow("carry, aligned,", {}, stack.carry.name));
    cb.device_area = a.device_bytes;
    cb.host_area = a.host_bytes;
  }

  // 4. The op program.
  detail::program_writer w(s);
  s.ops.reserve(n_ops + extra_ops);
  s.waits.reserve(2 * n_ops);
  w.clocks.reserve(n_ops + extra_ops);
  auto const compute = stream_role::compute;
  auto const d2h = hiding ? stream_role::d2h : compute;
  auto const h2d = hiding ? stream_role::h2d : compute;
  auto const chunk_count = [&](std::size_t bytes) -> std::uint32_t {
    if (pipeline.chunk_bytes == 0 || bytes <= pipeline.chunk_bytes) return 1;
    return static_cast<std::uint32_t>(ceil_div(bytes, pipeline.chunk_bytes));
  };
  // Chunk `c` of `n` of slot `k` of layer `l`, between device offset `device` and its host copy.
  auto const chunk_op = [&](op_kind kind, stream_role stream, slot_binding const& b, std::size_t device,
                            std::uint32_t k, std::uint32_t l, std::uint32_t c, std::uint32_t n) {
    auto const begin = pipeline.chunk_bytes * c;
    op o{kind, stream, static_cast<std::uint16_t>(k), l, c, n};
    o.device_offset = device + begin;
    o.host_offset = b.host_offset + begin;
    o.bytes = n == 1 ? b.bytes : std::min(pipeline.chunk_bytes, b.bytes - begin);
    return o;
  };
  // Calls f(k, binding, c, n) for chunk c of n of every offloaded slot k of layer l, in order.
  auto const for_each_offloaded_chunk = [&](std::uint32_t l, auto&& f) {
    auto const& lb = s.layers[l];
    for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
      auto const& b = s.slots[lb.first_slot + k];
      if (b.where != placement::offload) continue;
      auto const n = chunk_count(b.bytes);
      for (std::uint32_t c = 0; c < n; ++c) f(k, b, c, n);
    }
  };
  // Per (slot binding, chunk): the offload op, so the matching prefetch chunk waits on it.
  std::vector<std::uint32_t> first_chunk_op(s.slots.size(), 0);
  std::vector<std::int64_t> last_offload_of_layer(L, -1), forward_op(L, -1), backward_op(L, -1),
      last_prefetch_of_layer(L, -1), gather_op(L, -1), regather_op(L, -1);

  // The carry's device buffers: 0 holds the input (the user writes it), 1 the output; the others
  // are handed out and taken back as the reversal stores, restores and frees carries. A buffer
  // is reused in place (no copies): its next writer waits for its last writer and readers.
  struct carry_buffer {
    std::int64_t writer = -1;
    std::array<std::int64_t, stream_count> readers{-1, -1, -1, -1};
    std::uint32_t refs = 0;  // device snapshot slots holding it
  };
  std::vector<carry_buffer> cbuf(carries ? 2 : 0);
  std::vector<std::uint32_t> free_bufs;
  constexpr std::int32_t none = -1;
  std::int32_t working = carries ? 0 : none;  // buffer of the working carry
  std::int32_t working_state = 0;
  bool have_working = true;  // the working carry holds a state (a backward consumes it)
  struct dslot {
    std::int32_t buffer = -1, state = -1;
  };
  struct hslot {
    std::int32_t state = -1;
    std::int64_t writer = -1, reader = -1;
  };
  std::vector<dslot> dslots;
  std::vector<hslot> hslots;
  std::uint32_t held = 0;
  auto const carry_at = [&](std::int32_t b) -> std::size_t { return cb.device_area + cb.region_bytes * static_cast<std::size_t>(b); };
  auto const take_buffer = [&]() -> std::int32_t {
    if (!free_bufs.empty()) {
      auto const b = free_bufs.back();
      free_bufs.pop_back();
      return static_cast<std::int32_t>(b);
    }
    cbuf.emplace_back();
    return static_cast<std::int32_t>(cbuf.size() - 1);
  };
  auto const release_if_unused = [&](std::int32_t b) {
    if (b >= 2 && b != working && cbuf[static_cast<std::size_t>(b)].refs == 0) free_bufs.push_back(static_cast<std::uint32_t>(b));
  };
  auto const wait_to_read = [&](std::int32_t b) {
    if (b >= 0) w.wait(cbuf[static_cast<std::size_t>(b)].writer);
  };
  auto const wait_to_write = [&](std::int32_t b) {
    if (b < 0) return;
    auto const& x = cbuf[static_cast<std::size_t>(b)];
    w.wait(x.writer);
    for (auto r : x.readers) w.wait(r);
  };
  auto const note = [&](std::uint32_t idx, std::int32_t read, std::int32_t wrote) {
    auto const st = static_cast<std::size_t>(s.ops[idx].stream);
    if (read >= 0) cbuf[static_cast<std::size_t>(read)].readers[st] = idx;
    if (wrote >= 0) {
      auto& x = cbuf[static_cast<std::size_t>(wrote)];
      x.writer = idx;
      x.readers = {-1, -1, -1, -1};
    }
  };
  // A layer op that reads buffer `in` and writes buffer `out` (either may be none).
  auto const emit_layer_op = [&](op o, std::int32_t in, std::int32_t out) {
    if (in >= 0) o.carry_in = carry_at(in);
    if (out >= 0) o.carry_out = carry_at(out);
    wait_to_read(in);
    wait_to_write(out);
    auto const idx = w.emit(o);
    note(idx, in, out);
    return idx;
  };

  auto emit_gather = [&](std::uint32_t l) { gather_op[l] = w.emit({op_kind::gather, stream_role::comm, no_slot, l}); };
  if (collectives.before_forward) emit_gather(0);
  std::int64_t last_offload = -1;
  auto const emit_forward = [&](std::uint32_t l, std::int32_t in, std::int32_t out) {
    // Gathers run one layer ahead and no further: the gather of layer l + 1 waits for the
    // forward of layer l - 1, so two receive buffers suffice.
    if (collectives.before_forward && l + 1 < L) {
      if (l >= 1) w.wait(forward_op[l - 1]);
      emit_gather(l + 1);
    }
    auto const& lb = s.layers[l];
    w.wait(gather_op[l]);
    if (lb.offloaded_bytes > 0 && ring_index[l] >= a.offload_buffers)
      w.wait(last_offload_of_layer[offloaded[ring_index[l] - a.offload_buffers]]);
    forward_op[l] = emit_layer_op({op_kind::forward, compute, no_slot, l}, in, out);
    for_each_offloaded_chunk(l, [&](std::uint32_t k, slot_binding const& b, std::uint32_t c, std::uint32_t n) {
      auto const o = chunk_op(op_kind::offload, d2h, b, b.forward_offset, k, l, c, n);
      w.wait(forward_op[l]);
      auto const idx = w.emit(o);
      if (c == 0) first_chunk_op[lb.first_slot + k] = idx;
      last_offload_of_layer[l] = last_offload = idx;
    });
  };

  // Prefetch issue points: layer k (backward order) is issued before the backward work of layer
  // min(l + distance, L - 1), but never before its staging buffer's previous reader was issued.
  // A distance at or beyond the stack's end means "as early as the staging ring allows".
  std::vector<std::int64_t> issue_at(L, -1);  // issue layer for each offloaded layer, by layer id
  {
    std::uint32_t const dist = hiding ? pipeline.prefetch_distance : 0;
    for (std::uint32_t k = 0; k < n_off; ++k) {
      auto const l = offloaded[n_off - 1 - k];
      auto t = dist >= L - 1 - l ? L - 1 : l + dist;
      if (k >= a.staging_buffers) t = std::min(t, offloaded[n_off - 1 - (k - a.staging_buffers)] - 1);
      issue_at[l] = t;
    }
  }
  bool first_backward_area_use_h2d = true, first_backward_area_use_compute = true;
  std::int64_t last_forward = -1;
  auto emit_prefetches_of = [&](std::uint32_t l) {
    auto const& lb = s.layers[l];
    auto const k = n_off - 1 - ring_index[l];
    for_each_offloaded_chunk(l, [&](std::uint32_t i, slot_binding const& b, std::uint32_t c, std::uint32_t n) {
      auto const o = chunk_op(op_kind::prefetch, h2d, b, b.backward_offset, i, l, c, n);
      w.wait(first_chunk_op[lb.first_slot + i] + c);  // the chunk's data has reached the host
      if (k >= a.staging_buffers) w.wait(backward_op[offloaded[n_off - 1 - (k - a.staging_buffers)]]);
      if (first_backward_area_use_h2d && buffers.share_phase_regions) {
        w.wait(last_offload);
        w.wait(last_forward);
        first_backward_area_use_h2d = false;
      }
      last_prefetch_of_layer[l] = w.emit(o);
    });
  };
  // The prefetches issued before the backward work of layer `t` (issue points fall monotonically
  // with k, so one cursor serves). Emitted as soon as the backward of layer t + 1 is (or the first
  // sweep has ended), so that they overlap the segment recomputation before layer t's backward.
  std::uint32_t next_prefetch = 0;
  auto emit_prefetches_at = [&](std::uint32_t t) {
    while (next_prefetch < n_off && issue_at[offloaded[n_off - 1 - next_prefetch]] == static_cast<std::int64_t>(t))
      emit_prefetches_of(offloaded[n_off - 1 - next_prefetch++]);
  };
  // Regathers (before backward) run one layer ahead like the gathers, continuing their sequence:
  // each waits for the user of the gather two before it, so the hook needs two receive buffers.
  auto const emit_regather = [&](std::uint32_t l, std::int64_t after) {
    regather_op[l] = w.emit_aside({op_kind::regather, stream_role::comm, no_slot, l}, after);
  };
  auto emit_backward = [&](std::uint32_t l, std::int32_t in) {
    auto const& lb = s.layers[l];
    if (collectives.before_backward) {
      auto const forward_of = [&](std::uint32_t m) { return collectives.before_forward ? forward_op[m] : -1; };
      if (l == L - 1) emit_regather(l, L >= 2 ? forward_of(L - 2) : -1);
      if (l >= 1) emit_regather(l - 1, l + 1 < L ? backward_op[l + 1] : forward_of(L - 1));
      w.wait(regather_op[l]);
    }
    if (lb.remat_bytes > 0) {
      w.wait(last_prefetch_of_layer[l]);
      if (first_backward_area_use_compute && buffers.share_phase_regions) w.wait(last_offload);
      first_backward_area_use_compute = false;
      // It reads the layer's carry in and writes the remat slots alone: no carry out (a selective
      // recompute may be far cheaper than the layer's forward).
      emit_layer_op({op_kind::recompute, compute, no_slot, l}, carries ? in : none, none);
    }
    w.wait(last_prefetch_of_layer[l]);
    op o{op_kind::backward, compute, no_slot, l};
    if (carries && l == L - 1) o.carry_out = cb.output_offset();
    if (carries && l == L - 1) w.wait(cbuf[1].writer);
    backward_op[l] = emit_layer_op(o, in, none);
    if (carries && l == L - 1) cbuf[1].readers[static_cast<std::size_t>(compute)] = backward_op[l];
    if (collectives.after_backward) {
      w.wait(backward_op[l]);
      w.emit({op_kind::reduce, stream_role::comm, no_slot, l});
    }
    if (l > 0) emit_prefetches_at(l - 1);
  };

  // Walk the reversal, checking each action against what the carries hold.
  auto bad = [&](std::size_t at, std::string_view why) { return fail(detail::issue(c::bad_reversal, {}, {}, at, 0, why)); };
  std::uint32_t forwarded = 0;   // layers the first sweep has run
  bool turned = false;
  std::int64_t next_backward = static_cast<std::int64_t>(L) - 1;
  std::uint32_t const dcap = ck.reversal.empty() || ck.device_snapshots == every_carry ? L : ck.device_snapshots;
  std::uint32_t const hcap = ck.host_snapshots;
  for (std::size_t at = 0; at < actions.size(); ++at) {
    auto const& x = actions[at];
    // A reversal uses fewer slots than it has actions: that bounds the tables below too.
    auto const dslot_ok = [&] {
      return x.slot >= 0 && static_cast<std::uint32_t>(x.slot) < dcap && static_cast<std::size_t>(x.slot) < actions.size();
    };
    auto const hslot_ok = [&] {
      return x.host >= 0 && static_cast<std::uint32_t>(x.host) < hcap && static_cast<std::size_t>(x.host) < actions.size();
    };
    auto const grow = [&] {
      if (dslots.size() <= static_cast<std::size_t>(x.slot)) dslots.resize(static_cast<std::size_t>(x.slot) + 1);
    };
    auto const hgrow = [&] {
      if (hslots.size() <= static_cast<std::size_t>(x.host)) hslots.resize(static_cast<std::size_t>(x.host) + 1);
    };
    // The action's device (host) slot is in range and holds a carry.
    auto const dslot_held = [&] {
      return dslot_ok() && static_cast<std::size_t>(x.slot) < dslots.size() && dslots[static_cast<std::size_t>(x.slot)].buffer >= 0;
    };
    auto const hslot_held = [&] {
      return hslot_ok() && static_cast<std::size_t>(x.host) < hslots.size() && hslots[static_cast<std::size_t>(x.host)].state >= 0;
    };
    auto const host_at = [&] { return cb.host_area + cb.host_region_bytes * static_cast<std::size_t>(x.host); };
    // The action's device slot takes `buffer`, holding carry `state`.
    auto const hold = [&](std::int32_t buffer, std::int32_t state) {
      dslots[static_cast<std::size_t>(x.slot)] = {buffer, state};
      ++cbuf[static_cast<std::size_t>(buffer)].refs;
      ++held;
      cb.device_snapshots = std::max(cb.device_snapshots, held);
    };
    if (next_backward < 0 && x.op != chain_op::free && x.op != chain_op::free_host)
      return bad(at, "it follows the backward of layer 0, which ends the step (only frees may)");
    switch (x.op) {
      case chain_op::advance: {
        if (x.state != working_state || !have_working)
          return bad(at, "it advances from a carry that is not the working carry (restore it first)");
        if (x.to <= x.state || x.to > static_cast<std::int64_t>(L) - 1)
          return bad(at, "it advances to a carry before its start or beyond the last layer's input (the turn runs the last layer)");
        if (!turned && static_cast<std::uint32_t>(x.state) != forwarded)
          return bad(at, "the first sweep runs each layer once, in order: this advance runs a layer again before the turn");
        for (auto i = x.state; i < x.to; ++i) {
          auto const l = static_cast<std::uint32_t>(i);
          auto const out = carries ? take_buffer() : none;
          if (!turned) {
            emit_forward(l, working, out);
            ++forwarded;
          } else {
            if (collectives.before_forward || collectives.before_backward)
              return fail(detail::issue(c::advance_without_gather, {}, stack.carry.name, l));
            emit_layer_op({op_kind::advance, compute, no_slot, l}, working, out);
            ++cb.advances;
          }
          auto const old = working;
          working = out;
          ++working_state;
          release_if_unused(old);
        }
        break;
      }
      case chain_op::turn:
        if (turned || x.state != static_cast<std::int64_t>(L) - 1 || forwarded != L - 1 || working_state != x.state)
          return bad(at, "the turn runs the last layer forward once, after the first sweep has run every other layer");
        emit_forward(L - 1, working, carries ? 1 : none);
        last_forward = forward_op[L - 1];
        ++forwarded;
        turned = true;
        emit_prefetches_at(L - 1);
        break;
      case chain_op::store:
        if (!dslot_ok()) return bad(at, "it names a device snapshot slot beyond checkpoint_spec::device_snapshots");
        grow();
        if (dslots[static_cast<std::size_t>(x.slot)].buffer >= 0) return bad(at, "it stores into a device slot that is not empty");
        if (x.state != working_state || !have_working) return bad(at, "it stores a carry that is not the working carry");
        hold(working, working_state);  // a stack without a carry has no stores
        break;
      case chain_op::restore: {
        if (!dslot_held()) return bad(at, "it restores from a device slot that holds no carry");
        auto const old = working;
        working = dslots[static_cast<std::size_t>(x.slot)].buffer;
        working_state = dslots[static_cast<std::size_t>(x.slot)].state;
        have_working = true;
        if (old >= 0) release_if_unused(old);
        break;
      }
      case chain_op::free: {
        if (!dslot_held()) return bad(at, "it frees a device slot that holds no carry");
        auto& d = dslots[static_cast<std::size_t>(x.slot)];
        --cbuf[static_cast<std::size_t>(d.buffer)].refs;
        release_if_unused(d.buffer);
        d = {};
        --held;
        break;
      }
      case chain_op::backward: {
        if (!turned || x.state != next_backward) return bad(at, "backward steps run from the last layer to the first, after the turn");
        if (carries && (working_state != x.state || !have_working))  // without a carry: the plain reversal
          return bad(at, "the layer's input is not the working carry (restore or advance to it first)");
        emit_backward(static_cast<std::uint32_t>(x.state), working);
        --next_backward;
        auto const old = working;
        working = none;  // consumed
        have_working = false;
        release_if_unused(old);
        break;
      }
      case chain_op::offload: {
        if (!dslot_held()) return bad(at, "it offloads a device slot that holds no carry");
        if (!hslot_ok()) return bad(at, "it names a host snapshot slot beyond checkpoint_spec::host_snapshots");
        hgrow();
        auto& h = hslots[static_cast<std::size_t>(x.host)];
        if (h.state >= 0) return bad(at, "it offloads into a host slot that is not empty");
        auto const& d = dslots[static_cast<std::size_t>(x.slot)];
        op o{op_kind::offload, d2h, carry_slot, static_cast<std::uint32_t>(d.state)};
        o.device_offset = carry_at(d.buffer);
        o.host_offset = host_at();
        o.bytes = cb.bytes;
        wait_to_read(d.buffer);
        w.wait(h.writer);
        w.wait(h.reader);
        auto const idx = w.emit(o);
        note(idx, d.buffer, none);
        h = {d.state, idx, -1};
        cb.host_snapshots = std::max(cb.host_snapshots, static_cast<std::uint32_t>(x.host) + 1);
        break;
      }
      case chain_op::prefetch: {
        if (!hslot_held()) return bad(at, "it prefetches from a host slot that holds no carry");
        if (!dslot_ok()) return bad(at, "it names a device snapshot slot beyond checkpoint_spec::device_snapshots");
        grow();
        if (dslots[static_cast<std::size_t>(x.slot)].buffer >= 0) return bad(at, "it prefetches into a device slot that is not empty");
        auto& h = hslots[static_cast<std::size_t>(x.host)];
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
        break;
      }
      case chain_op::free_host:
        if (!hslot_held()) return bad(at, "it frees a host slot that holds no carry");
        hslots[static_cast<std::size_t>(x.host)].state = -1;
        break;
      default: return bad(at, "it is no chain action");
    }
  }
  if (next_backward >= 0) return bad(actions.size(), "the reversal ends before the backward of layer 0");

  // The carry's buffers, after everything else in both arenas.
  if (carries) {
    cb.device_buffers = static_cast<std::uint32_t>(cbuf.size());
    std::size_t dev = 0, hst = 0;
    if (!checked_mul(cb.region_bytes, cbuf.size(), dev) || !checked_add(a.device_bytes, dev, a.device_bytes))
      return fail(detail::overflow("device arena with the carry's buffers", {}, stack.carry.name));
    if (!checked_mul(cb.host_region_bytes, std::size_t{cb.host_snapshots}, hst) || !checked_add(a.host_bytes, hst, a.host_bytes))
      return fail(detail::overflow("host arena with the carry's snapshots", {}, stack.carry.name));
    a.carry_bytes = dev;
    a.host_carry_bytes = hst;
  }
  return {};
}

//! Builds the schedule into `s`, reusing its storage. Throws `schedule_error` naming what is
//! wrong (then `s` is left empty).
constexpr void build_schedule_into(schedule& s, stack_spec const& stack, strategy const& how) {
  if (auto issue = try_build_schedule_into(s, stack, how)) throw schedule_error(to_message(issue));
}

//! The first problem with a stack and a strategy, or an issue whose code is `none` (builds the
//! schedule to find out).
[[nodiscard]] constexpr schedule_issue find_schedule_issue(stack_spec const& stack, strategy const& how) {
  schedule s;
  return try_build_schedule_into(s, stack, how);
}

//! The schedule of `stack` under `how`: `tide::build_schedule(stack, {.policy = p})`. Throws
//! `schedule_error` naming what is wrong.
[[nodiscard]] constexpr schedule build_schedule(stack_spec const& stack, strategy const& how) {
  schedule s;
  build_schedule_into(s, stack, how);
  return s;
}

//! The same for a stack whose run-time slot sizes are given in `sizes`.
[[nodiscard]] constexpr schedule build_schedule(stack_spec const& stack, slot_sizes const& sizes, strategy const& how) {
  return build_schedule(bind_sizes(stack, sizes), how);
}

}  // namespace tide
