#pragma once
//! \file
//! The builder's stage 4, the op program: what the reversal's walk emits for a layer's forward
//! (its gather ahead, its offloads and stores), its backward (the regather, loads, prefetches,
//! recompute, reduce), and the carry buffers' hand-out and ordering.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <tide/core/detail/builder.hpp>

namespace tide::detail {

constexpr std::uint32_t builder::chunk_count(std::size_t bytes) const {
  auto const chunk = how.pipeline.chunk_bytes;
  if (chunk == 0 || bytes <= chunk) return 1;
  return static_cast<std::uint32_t>(ceil_div(bytes, chunk));
}

// Chunk `c` of `n` of slot `k` of layer `l`, between device offset `device` and its host copy.
constexpr op builder::chunk_op(op_kind kind, stream_role stream, slot_binding const& b, std::size_t device, std::uint32_t k,
                               std::uint32_t l, std::uint32_t c, std::uint32_t n) const {
  auto const chunk = how.pipeline.chunk_bytes;
  auto const begin = chunk * c;
  op o{kind, stream, static_cast<std::uint16_t>(k), l, c, n};
  o.device_offset = device + begin;
  o.host_offset = b.host_offset + begin;
  o.bytes = n == 1 ? b.bytes : std::min(chunk, b.bytes - begin);
  return o;
}

// Calls f(k, binding, c, n) for chunk c of n of every offloaded or spilled slot k of layer l, in
// order.
template <class F>
constexpr void builder::for_each_offloaded_chunk(std::uint32_t l, F&& f) const {
  auto const& lb = s.layers[l];
  for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
    auto const& b = s.slots[lb.first_slot + k];
    if (b.where != placement::offload && b.where != placement::spill) continue;
    auto const n = chunk_count(b.bytes);
    for (std::uint32_t c = 0; c < n; ++c) f(k, b, c, n);
  }
}

constexpr std::int32_t builder::take_buffer() {
  if (!free_bufs.empty()) {
    auto const b = free_bufs.back();
    free_bufs.pop_back();
    return static_cast<std::int32_t>(b);
  }
  cbuf.emplace_back();
  return static_cast<std::int32_t>(cbuf.size() - 1);
}

// Buffers 0 and 1 (input, output) are never handed out again.
constexpr void builder::release_if_unused(std::int32_t b) {
  if (b >= 2 && b != working && cbuf[static_cast<std::size_t>(b)].refs == 0) free_bufs.push_back(static_cast<std::uint32_t>(b));
}

constexpr void builder::wait_to_read(std::int32_t b) {
  if (b >= 0) w.wait(cbuf[static_cast<std::size_t>(b)].writer);
}

constexpr void builder::wait_to_write(std::int32_t b) {
  if (b < 0) return;
  auto const& x = cbuf[static_cast<std::size_t>(b)];
  w.wait(x.writer);
  for (auto r : x.readers) w.wait(r);
}

// Op `idx` read buffer `read` and wrote buffer `wrote` (either may be none).
constexpr void builder::note(std::uint32_t idx, std::int32_t read, std::int32_t wrote) {
  auto const st = static_cast<std::size_t>(s.ops[idx].stream);
  if (read >= 0) cbuf[static_cast<std::size_t>(read)].readers[st] = idx;
  if (wrote >= 0) {
    auto& x = cbuf[static_cast<std::size_t>(wrote)];
    x.writer = idx;
    x.readers.fill(-1);
  }
}

// A layer op that reads buffer `in` and writes buffer `out` (either may be none).
constexpr std::uint32_t builder::emit_layer_op(op o, std::int32_t in, std::int32_t out) {
  if (in >= 0) o.carry_in = carry_at(in);
  if (out >= 0) o.carry_out = carry_at(out);
  wait_to_read(in);
  wait_to_write(out);
  auto const idx = w.emit(o);
  note(idx, in, out);
  return idx;
}

// Collective hooks run on the communication stream, or, without overlap, on the compute stream
// just before the op that needs them.
constexpr stream_role builder::collective_stream() const {
  return how.collectives.overlap ? stream_role::comm : stream_role::compute;
}

constexpr void builder::emit_gather(std::uint32_t l) {
  gather_op[l] = w.emit({op_kind::gather, collective_stream(), no_slot, l});
}

constexpr void builder::emit_forward(std::uint32_t l, std::int32_t in, std::int32_t out) {
  auto const& collectives = how.collectives;
  // Gathers run one layer ahead and no further: the gather of layer l + 1 waits for the forward
  // of layer l - 1, so two receive buffers suffice.
  if (collectives.before_forward && !collectives.overlap && l > 0) emit_gather(l);
  if (collectives.before_forward && collectives.overlap && l + 1 < L) {
    if (l >= 1) w.wait(forward_op[l - 1]);
    emit_gather(l + 1);
  }
  auto const& lb = s.layers[l];
  w.wait(gather_op[l]);
  if (lb.offloaded_bytes > 0 && ring_index[l] >= s.arena.offload_buffers)
    w.wait(last_offload_of_layer[offloaded[ring_index[l] - s.arena.offload_buffers]]);
  forward_op[l] = emit_layer_op({op_kind::forward, stream_role::compute, no_slot, l}, in, out);
  for_each_offloaded_chunk(l, [&](std::uint32_t k, slot_binding const& b, std::uint32_t c, std::uint32_t n) {
    auto const o = chunk_op(op_kind::offload, d2h, b, b.forward_offset, k, l, c, n);
    w.wait(forward_op[l]);
    // The spill buffer's previous layer must be on its way to the file before it is overwritten.
    if (b.where == placement::spill && spill_index[l] >= s.arena.spill_buffers)
      w.wait(last_store_of_layer[spilled[spill_index[l] - s.arena.spill_buffers]]);
    auto const idx = w.emit(o);
    if (c == 0) first_chunk_op[lb.first_slot + k] = idx;
    last_offload_of_layer[l] = last_offload = idx;
  });
  if (lb.spilled_bytes > 0) emit_stores_of(l);
}

// A store or load of stored slot `k` of layer `l`: the whole slot, between its ring region and
// its file region.
constexpr op builder::transfer_op(op_kind kind, slot_binding const& b, std::uint32_t k, std::uint32_t l) const {
  op o{kind, storage, static_cast<std::uint16_t>(k), l};
  o.host_offset = b.host_offset;
  o.file_offset = b.file_offset;
  o.bytes = b.bytes;
  return o;
}

// A spilled slot outside the ring's last uses goes to the file once all of its chunks have
// reached the ring; the storage stream runs the stores in order.
constexpr void builder::emit_stores_of(std::uint32_t l) {
  auto const& lb = s.layers[l];
  for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
    auto const g = lb.first_slot + k;
    auto const& b = s.slots[g];
    if (!b.stored()) continue;
    w.wait(first_chunk_op[g] + chunk_count(b.bytes) - 1);
    last_store_of_layer[l] = w.emit(transfer_op(op_kind::store, b, k, l));
  }
}

// The loads of stored spilled layer l, into its spill buffer once the buffer's previous backward
// user (spilled layer j + R) has been prefetched from it.
constexpr void builder::emit_loads_of(std::uint32_t l) {
  auto const& lb = s.layers[l];
  auto const next_user = spilled[spill_index[l] + s.arena.spill_buffers];
  for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
    auto const g = lb.first_slot + k;
    auto const& b = s.slots[g];
    if (!b.stored()) continue;
    w.wait(last_prefetch_of_layer[next_user]);
    load_op[g] = w.emit(transfer_op(op_kind::load, b, k, l));
  }
}

constexpr void builder::emit_prefetches_of(std::uint32_t l) {
  auto const& lb = s.layers[l];
  auto const k = n_off - 1 - ring_index[l];
  auto const staging = s.arena.staging_buffers;
  for_each_offloaded_chunk(l, [&](std::uint32_t i, slot_binding const& b, std::uint32_t c, std::uint32_t n) {
    auto const o = chunk_op(op_kind::prefetch, h2d, b, b.backward_offset, i, l, c, n);
    w.wait(first_chunk_op[lb.first_slot + i] + c);  // the chunk's data has reached the host
    w.wait(load_op[lb.first_slot + i]);             // ... and, when stored, come back from the file
    if (k >= staging) w.wait(backward_op[offloaded[n_off - 1 - (k - staging)]]);
    if (first_backward_area_use_h2d && how.buffers.share_phase_regions) {
      w.wait(last_offload);
      w.wait(last_forward);
      first_backward_area_use_h2d = false;
    }
    last_prefetch_of_layer[l] = w.emit(o);
  });
  // The spill buffer this layer has just been read from is free for the layer that used it
  // before: its loads go now, as early as the ring allows.
  if (lb.spilled_bytes > 0 && spill_index[l] >= s.arena.spill_buffers) emit_loads_of(spilled[spill_index[l] - s.arena.spill_buffers]);
}

// The prefetches issued before the backward work of layer `t` (issue points fall monotonically
// with k, so one cursor serves). Emitted as soon as the backward of layer t + 1 is (or the first
// sweep has ended), so that they overlap the segment recomputation before layer t's backward.
constexpr void builder::emit_prefetches_at(std::uint32_t t) {
  while (next_prefetch < n_off && issue_at[offloaded[n_off - 1 - next_prefetch]] == static_cast<std::int64_t>(t))
    emit_prefetches_of(offloaded[n_off - 1 - next_prefetch++]);
}

// Regathers (before backward) run one layer ahead like the gathers, continuing their sequence:
// each waits for the user of the gather two before it, so the hook needs two receive buffers.
constexpr void builder::emit_regather(std::uint32_t l, std::int64_t after) {
  regather_op[l] = w.emit_aside({op_kind::regather, collective_stream(), no_slot, l}, after);
}

constexpr void builder::emit_backward(std::uint32_t l, std::int32_t in) {
  auto const& collectives = how.collectives;
  auto const compute = stream_role::compute;
  auto const& lb = s.layers[l];
  if (collectives.before_backward && !collectives.overlap) {
    emit_regather(l, -1);
  } else if (collectives.before_backward) {
    auto const forward_of = [&](std::uint32_t m) { return collectives.before_forward ? forward_op[m] : -1; };
    if (l == L - 1) emit_regather(l, L >= 2 ? forward_of(L - 2) : -1);
    if (l >= 1) emit_regather(l - 1, l + 1 < L ? backward_op[l + 1] : forward_of(L - 1));
    w.wait(regather_op[l]);
  }
  if (lb.remat_bytes > 0) {
    w.wait(last_prefetch_of_layer[l]);
    if (first_backward_area_use_compute && how.buffers.share_phase_regions) w.wait(last_offload);
    first_backward_area_use_compute = false;
    // It reads the layer's carry in and writes the remat slots alone: no carry out (a selective
    // recompute may be far cheaper than the layer's forward).
    emit_layer_op({op_kind::recompute, compute, no_slot, l}, carries ? in : none, none);
  }
  w.wait(last_prefetch_of_layer[l]);
  op o{op_kind::backward, compute, no_slot, l};
  if (carries && l == L - 1) o.carry_out = s.carry.output_offset();
  if (carries && l == L - 1) w.wait(cbuf[1].writer);
  backward_op[l] = emit_layer_op(o, in, none);
  if (carries && l == L - 1) cbuf[1].readers[static_cast<std::size_t>(compute)] = backward_op[l];
  if (collectives.after_backward) {
    w.wait(backward_op[l]);
    w.emit({op_kind::reduce, collective_stream(), no_slot, l});
  }
  if (l > 0) emit_prefetches_at(l - 1);
}

}  // namespace tide::detail
