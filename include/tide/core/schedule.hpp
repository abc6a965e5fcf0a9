#pragma once
//! \file The schedule: the expansion of (stack, policy, buffers, pipeline, sizes) into an op
//! program with a static buffer assignment and predicted peaks. `build_schedule` is constexpr;
//! `static_schedule.hpp` freezes its result into a literal type for compile-time use.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tide/core/buffers.hpp>
#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/op.hpp>
#include <tide/core/pipeline.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/stack.hpp>

namespace tide {

//! A non-owning view of any schedule (run-time or static); what executors and checkers take.
struct schedule_view {
  std::span<layer_binding const> layers;
  std::span<slot_binding const> slots;
  std::span<op const> ops;
  std::span<std::uint32_t const> waits;
  std::uint32_t event_count = 0;
  arena_layout arena;
  buffer_spec buffers;
  pipeline_spec pipeline;
  collective_spec collectives;

  constexpr std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(layers.size()); }
  constexpr std::size_t peak_device_bytes() const noexcept { return arena.device_bytes; }
  constexpr std::size_t peak_host_bytes() const noexcept { return arena.host_bytes; }
  constexpr std::span<slot_binding const> slots_of(std::uint32_t layer) const {
    return slots.subspan(layers[layer].first_slot, layers[layer].slot_count);
  }
  constexpr std::span<std::uint32_t const> waits_of(op const& o) const {
    return waits.subspan(o.wait_begin, o.wait_count);
  }
};

//! A schedule built at run time (or transiently inside a constant expression).
struct schedule {
  std::vector<layer_binding> layers;
  std::vector<slot_binding> slots;
  std::vector<op> ops;
  std::vector<std::uint32_t> waits;
  std::uint32_t event_count = 0;
  arena_layout arena;
  buffer_spec buffers;
  pipeline_spec pipeline;
  collective_spec collectives;

  constexpr std::size_t peak_device_bytes() const noexcept { return arena.device_bytes; }
  constexpr std::size_t peak_host_bytes() const noexcept { return arena.host_bytes; }
  constexpr std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(layers.size()); }
  constexpr schedule_view view() const& noexcept {
    return {layers, slots, ops, waits, event_count, arena, buffers, pipeline, collectives};
  }
  constexpr operator schedule_view() const& noexcept { return view(); }
  // A view of a temporary would dangle (`executor ex(b, build_schedule(...))`): keep the
  // schedule in a variable.
  schedule_view view() const&& = delete;
  operator schedule_view() const&& = delete;
};

// ---------------------------------------------------------------------------------------------
// Validation: one function, used by static_asserts (codes) and at run time (messages).

enum class schedule_issue_code : std::uint8_t {
  none,
  empty_stack,
  duplicate_slot,
  zero_size_slot,
  dynamic_size,
  unknown_rule_slot,
  empty_rule_range,
  prefetch_beyond_stack,
  zero_staging_buffers,
  zero_offloads_in_flight,
  bad_alignment,
  too_many_slots,
  too_many_chunks,
};

struct schedule_issue {
  schedule_issue_code code = schedule_issue_code::none;
  std::string_view type_name;
  std::string_view slot_name;
  std::size_t value = 0;
  std::size_t limit = 0;
  constexpr explicit operator bool() const noexcept { return code != schedule_issue_code::none; }
};

constexpr bool any_placement(stack_spec const& s, policy_spec const& p, placement what) {
  for (std::uint32_t l = 0; l < s.layer_count(); ++l)
    for (auto const& slot : s.layer(l).slots)
      if (p.decide(l, slot) == what) return true;
  return false;
}

//! The first problem with a composition, or `code == none`.
constexpr schedule_issue find_schedule_issue(stack_spec const& s, policy_spec const& p, buffer_spec const& b,
                                             pipeline_spec const& pl) {
  using c = schedule_issue_code;
  if (s.layer_count() == 0) return {c::empty_stack, {}, {}, 0, 0};
  for (auto const& t : s.types) {
    if (t.slots.size() >= no_slot) return {c::too_many_slots, t.name, {}, t.slots.size(), no_slot - 1};
    for (std::size_t i = 0; i < t.slots.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j)
        if (t.slots[i].name == t.slots[j].name) return {c::duplicate_slot, t.name, t.slots[i].name};
      if (t.slots[i].bytes == dynamic_bytes) return {c::dynamic_size, t.name, t.slots[i].name};
      if (t.slots[i].bytes == 0) return {c::zero_size_slot, t.name, t.slots[i].name};
    }
  }
  for (auto const& r : p.rules) {
    for (auto n : r.slots)
      if (!s.has_slot(n)) return {c::unknown_rule_slot, {}, n};
    if (r.first_layer >= r.last_layer) return {c::empty_rule_range, {}, {}, r.first_layer, r.last_layer};
  }
  auto pow2 = [](std::size_t a) { return a > 0 && (a & (a - 1)) == 0; };
  if (!pow2(b.device_alignment)) return {c::bad_alignment, "device", {}, b.device_alignment};
  if (!pow2(b.host_alignment)) return {c::bad_alignment, "host", {}, b.host_alignment};
  // Prefetch, staging and in-flight parameters only matter once something is offloaded with
  // latency hiding (without it copies are serialized on the compute stream).
  if (pl.latency_hiding && any_placement(s, p, placement::offload)) {
    if (pl.prefetch_distance >= s.layer_count())
      return {c::prefetch_beyond_stack, {}, {}, pl.prefetch_distance, s.layer_count()};
    if (b.staging_buffers == 0) return {c::zero_staging_buffers, {}, {}, 0, 0};
    if (pl.max_offloads_in_flight == 0) return {c::zero_offloads_in_flight, {}, {}, 0, 0};
  }
  // Chunk and op indices are 32-bit: refuse chunk sizes that would split a slot absurdly fine.
  if (pl.chunk_bytes > 0)
    for (auto const& t : s.types)
      for (auto const& sl : t.slots)
        if (auto const n = sl.bytes / pl.chunk_bytes + (sl.bytes % pl.chunk_bytes != 0); n > (std::size_t{1} << 24))
          return {c::too_many_chunks, t.name, sl.name, n, std::size_t{1} << 24};
  return {};
}

inline std::string to_message(schedule_issue const& i) {
  using c = schedule_issue_code;
  auto q = [](std::string_view v) {
    std::string r;  // appended piecewise: "'" + std::string(v) trips GCC 12's -Wrestrict (PR 105651)
    r.reserve(v.size() + 2);
    r.append(1, '\'').append(v).append(1, '\'');
    return r;
  };
  switch (i.code) {
    case c::none: return "no issue";
    case c::empty_stack: return "tide: the stack has no layers: add at least one layer";
    case c::duplicate_slot:
      return "tide: layer type " + q(i.type_name) + " names slot " + q(i.slot_name) +
             " twice: give each slot of a layer a distinct name";
    case c::zero_size_slot:
      return "tide: slot " + q(i.slot_name) + " of layer type " + q(i.type_name) +
             " has zero bytes: drop the slot or give it a size";
    case c::dynamic_size:
      return "tide: slot " + q(i.slot_name) + " of layer type " + q(i.type_name) +
             " has a run-time size and none was given: pass it in tide::slot_sizes";
    case c::unknown_rule_slot:
      return "tide: a policy rule names slot " + q(i.slot_name) +
             " which no layer of the stack has: check the names in the rule's slot selector";
    case c::empty_rule_range:
      return "tide: a policy rule selects layers [" + std::to_string(i.value) + ", " + std::to_string(i.limit) +
             "), an empty range: use first < last";
    case c::prefetch_beyond_stack:
      return "tide: prefetch distance " + std::to_string(i.value) + " reaches beyond a stack of " +
             std::to_string(i.limit) + " layers: use a distance of at most " +
             std::to_string(i.limit == 0 ? 0 : i.limit - 1);
    case c::zero_staging_buffers:
      return "tide: the policy offloads slots but the buffers have zero staging buffers: use at least one "
             "(tide::staging_ring<N>, N >= 1)";
    case c::zero_offloads_in_flight:
      return "tide: the policy offloads slots but the pipeline allows zero offloads in flight: use at least one";
    case c::bad_alignment:
      return "tide: the " + std::string(i.type_name) + " alignment " + std::to_string(i.value) +
             " is not a power of two";
    case c::too_many_chunks:
      return "tide: slot " + q(i.slot_name) + " of layer type " + q(i.type_name) + " would be copied in " +
             std::to_string(i.value) + " chunks, more than the supported " + std::to_string(i.limit) +
             ": use a larger chunk size";
    case c::too_many_slots:
      return "tide: layer type " + q(i.type_name) + " has " + std::to_string(i.value) +
             " slots, more than the supported " + std::to_string(i.limit);
  }
  return "tide: invalid schedule";
}

// ---------------------------------------------------------------------------------------------
// The builder

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
};

}  // namespace detail

//! Builds the schedule from values into `s`, reusing its storage: a caller that builds many
//! schedules (a planner, a sweep) allocates nothing once `s` has grown. Throws `schedule_error`
//! naming what is wrong (then `s` is left empty).
constexpr void build_schedule_into(schedule& s, stack_spec const& stack, policy_spec const& policy,
                                   buffer_spec const& buffers = {}, pipeline_spec const& pipeline = {},
                                   collective_spec const& collectives = {}) {
  s.layers.clear();
  s.slots.clear();
  s.ops.clear();
  s.waits.clear();
  s.event_count = 0;
  s.arena = {};
  if (auto issue = find_schedule_issue(stack, policy, buffers, pipeline)) throw schedule_error(to_message(issue));

  s.buffers = buffers;
  s.pipeline = pipeline;
  s.collectives = collectives;
  auto const L = stack.layer_count();
  auto const hiding = pipeline.latency_hiding;
  auto const dalign = buffers.device_alignment;

  // 1. Placement and per-layer region sizes.
  std::size_t kept = 0, scratch = 0, host = 0;
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const& type = stack.layer(l);
    layer_binding lb{type.name, static_cast<std::uint32_t>(s.slots.size()),
                     static_cast<std::uint32_t>(type.slots.size())};
    for (auto const& sl : type.slots) {
      slot_binding b{sl.name, policy.decide(l, sl), sl.bytes};
      auto const region = align_up(sl.bytes + buffers.guard_bytes, dalign);
      switch (b.where) {
        case placement::keep: b.forward_offset = b.backward_offset = kept; kept += region; break;
        case placement::offload:
          b.forward_offset = b.backward_offset = lb.offloaded_bytes;  // layer-local for now
          lb.offloaded_bytes += region;
          b.host_offset = host;
          host += align_up(sl.bytes, buffers.host_alignment);
          break;
        case placement::remat: b.forward_offset = b.backward_offset = lb.remat_bytes; lb.remat_bytes += region; break;
      }
      s.slots.push_back(b);
    }
    scratch = std::max(scratch, lb.remat_bytes);
    s.layers.push_back(lb);
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
  for (std::size_t i = 1; i < offload_buf.size(); ++i) offload_buf[i] += offload_buf[i - 1];  // prefix offsets
  for (std::size_t i = 1; i < staging_buf.size(); ++i) staging_buf[i] += staging_buf[i - 1];
  a.offload_ring_bytes = offload_buf.back();
  a.staging_ring_bytes = staging_buf.back();
  auto const forward_size = a.offload_ring_bytes + scratch;
  auto const backward_size = a.staging_ring_bytes + scratch;
  a.forward_area = kept;
  a.backward_area = buffers.share_phase_regions ? kept : kept + forward_size;
  a.device_bytes = buffers.share_phase_regions ? kept + std::max(forward_size, backward_size)
                                               : kept + forward_size + backward_size;
  a.host_bytes = host;

  // Resolve device offsets of transient slots.
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

  // 3. The op program.
  detail::program_writer w(s);
  {
    std::size_t copies = 0;
    for (auto const& b : s.slots)
      if (b.where == placement::offload)
        copies += pipeline.chunk_bytes == 0 ? 1 : (b.bytes + pipeline.chunk_bytes - 1) / pipeline.chunk_bytes;
    auto const n_ops = 5 * std::size_t{L} + 2 * copies;
    s.ops.reserve(n_ops);
    s.waits.reserve(2 * n_ops);
    w.clocks.reserve(n_ops);
  }
  auto const compute = stream_role::compute;
  auto const d2h = hiding ? stream_role::d2h : compute;
  auto const h2d = hiding ? stream_role::h2d : compute;
  auto const chunk_count = [&](std::size_t bytes) -> std::uint32_t {
    if (pipeline.chunk_bytes == 0 || bytes <= pipeline.chunk_bytes) return 1;
    return static_cast<std::uint32_t>((bytes + pipeline.chunk_bytes - 1) / pipeline.chunk_bytes);
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
  // Per (slot binding, chunk): the offload op, so the matching prefetch chunk waits on it.
  std::vector<std::uint32_t> first_chunk_op(s.slots.size(), 0);
  std::vector<std::int64_t> last_offload_of_layer(L, -1), forward_op(L, -1), backward_op(L, -1),
      last_prefetch_of_layer(L, -1), gather_op(L, -1);

  auto emit_gather = [&](std::uint32_t l) { gather_op[l] = w.emit({op_kind::gather, stream_role::comm, no_slot, l}); };
  if (collectives.before_forward) emit_gather(0);
  std::int64_t last_offload = -1;
  for (std::uint32_t l = 0; l < L; ++l) {
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
    forward_op[l] = w.emit({op_kind::forward, compute, no_slot, l});
    for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
      auto const& b = s.slots[lb.first_slot + k];
      if (b.where != placement::offload) continue;
      auto const n = chunk_count(b.bytes);
      for (std::uint32_t c = 0; c < n; ++c) {
        auto const o = chunk_op(op_kind::offload, d2h, b, b.forward_offset, k, l, c, n);
        w.wait(forward_op[l]);
        auto const idx = w.emit(o);
        if (c == 0) first_chunk_op[lb.first_slot + k] = idx;
        last_offload_of_layer[l] = last_offload = idx;
      }
    }
  }
  auto const last_forward = forward_op[L - 1];

  // Prefetch issue points: layer k (backward order) is issued before the backward work of layer
  // min(l + distance, L - 1), but never before its staging buffer's previous reader was issued.
  std::vector<std::int64_t> issue_at(L, -1);  // issue layer for each offloaded layer, by layer id
  {
    std::uint32_t const dist = hiding ? pipeline.prefetch_distance : 0;
    for (std::uint32_t k = 0; k < n_off; ++k) {
      auto const l = offloaded[n_off - 1 - k];
      auto t = std::min<std::uint32_t>(l + dist, L - 1);
      if (k >= a.staging_buffers) t = std::min(t, offloaded[n_off - 1 - (k - a.staging_buffers)] - 1);
      issue_at[l] = t;
    }
  }
  bool first_backward_area_use_h2d = true, first_backward_area_use_compute = true;
  auto emit_prefetches_of = [&](std::uint32_t l) {
    auto const& lb = s.layers[l];
    auto const k = n_off - 1 - ring_index[l];
    for (std::uint32_t i = 0; i < lb.slot_count; ++i) {
      auto const& b = s.slots[lb.first_slot + i];
      if (b.where != placement::offload) continue;
      auto const n = chunk_count(b.bytes);
      for (std::uint32_t c = 0; c < n; ++c) {
        auto const o = chunk_op(op_kind::prefetch, h2d, b, b.backward_offset, i, l, c, n);
        w.wait(first_chunk_op[lb.first_slot + i] + c);  // the chunk's data has reached the host
        if (k >= a.staging_buffers) w.wait(backward_op[offloaded[n_off - 1 - (k - a.staging_buffers)]]);
        if (first_backward_area_use_h2d && buffers.share_phase_regions) {
          w.wait(last_offload);
          w.wait(last_forward);
          first_backward_area_use_h2d = false;
        }
        last_prefetch_of_layer[l] = w.emit(o);
      }
    }
  };

  std::uint32_t next_prefetch = 0;  // issue points fall monotonically with k, so one cursor serves
  for (std::uint32_t l = L; l-- > 0;) {
    while (next_prefetch < n_off && issue_at[offloaded[n_off - 1 - next_prefetch]] == static_cast<std::int64_t>(l))
      emit_prefetches_of(offloaded[n_off - 1 - next_prefetch++]);
    auto const& lb = s.layers[l];
    if (lb.remat_bytes > 0) {
      w.wait(last_prefetch_of_layer[l]);
      if (first_backward_area_use_compute && buffers.share_phase_regions) w.wait(last_offload);
      first_backward_area_use_compute = false;
      w.emit({op_kind::recompute, compute, no_slot, l});
    }
    w.wait(last_prefetch_of_layer[l]);
    backward_op[l] = w.emit({op_kind::backward, compute, no_slot, l});
    if (collectives.after_backward) {
      w.wait(backward_op[l]);
      w.emit({op_kind::collective, stream_role::comm, no_slot, l});
    }
  }
}

//! Builds the schedule from values. Throws `schedule_error` naming what is wrong.
constexpr schedule build_schedule(stack_spec const& stack, policy_spec const& policy, buffer_spec const& buffers = {},
                                  pipeline_spec const& pipeline = {}, collective_spec const& collectives = {}) {
  schedule s;
  build_schedule_into(s, stack, policy, buffers, pipeline, collectives);
  return s;
}

//! Builds from a stack whose dynamic slot sizes are given in `sizes`.
constexpr schedule build_schedule(stack_spec const& stack, slot_sizes const& sizes, policy_spec const& policy,
                                  buffer_spec const& buffers = {}, pipeline_spec const& pipeline = {},
                                  collective_spec const& collectives = {}) {
  return build_schedule(bind_sizes(stack, sizes), policy, buffers, pipeline, collectives);
}

}  // namespace tide
