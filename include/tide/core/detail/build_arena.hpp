#pragma once
//! \file
//! The builder's arena layout: kept slots at offset 0, then the forward area (the offload source
//! ring, then forward remat scratch) and the backward area (the staging ring, then recompute
//! scratch or an advance's slots), shared when `buffer_spec::share_phase_regions`; every transient
//! slot's offsets resolved into them; the spill ring after the host arena's offloaded regions and
//! the storage file's regions; the carries' place after them.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <tide/core/detail/builder.hpp>

namespace tide::detail {

constexpr schedule_issue builder::lay_out_arena() {
  auto const& buffers = how.buffers;
  auto const& pipeline = how.pipeline;
  // Without latency hiding copies are serialized on the compute stream, so one source and one
  // staging buffer are all that can be in use. Ring buffer b is sized for the largest layer that
  // uses it, so every byte of the arena is used by some op.
  auto& a = s.arena;
  a.kept_bytes = kept;
  a.remat_scratch_bytes = remat_scratch;
  a.offload_buffers = std::min<std::uint32_t>(n_off, hiding ? pipeline.max_offloads_in_flight : 1);
  a.staging_buffers = std::min<std::uint32_t>(n_off, hiding ? buffers.staging_buffers : 1);
  offload_buf.assign(a.offload_buffers + 1, 0);
  staging_buf.assign(a.staging_buffers + 1, 0);
  for (std::uint32_t j = 0; j < n_off; ++j) {
    auto const bytes = s.layers[offloaded[j]].offloaded_bytes;
    auto& o = offload_buf[j % a.offload_buffers + 1];
    auto& st = staging_buf[(n_off - 1 - j) % a.staging_buffers + 1];
    o = std::max(o, bytes);
    st = std::max(st, bytes);
  }
  for (std::size_t i = 1; i < offload_buf.size(); ++i)  // prefix offsets
    if (!checked_add(offload_buf[i], offload_buf[i - 1], offload_buf[i])) return overflow("offload source ring");
  for (std::size_t i = 1; i < staging_buf.size(); ++i)
    if (!checked_add(staging_buf[i], staging_buf[i - 1], staging_buf[i])) return overflow("staging ring");
  a.offload_ring_bytes = offload_buf.back();
  a.staging_ring_bytes = staging_buf.back();
  // An advance runs on the compute stream between two layers' backward work, when the recompute
  // scratch holds nothing live: its slots share that scratch.
  a.advance_scratch_bytes = advance_scratch;
  // A recompute is lent scratch for the slots it does not rebuild (after its remat slots) and for
  // its carry out, so that a layer's unchanged forward can run as its recompute without touching
  // saved bytes; it runs on the compute stream as an advance does, so it shares that scratch.
  std::size_t recompute_slots = 0, recompute_carry = 0;
  for (std::uint32_t l = 0; l < L; ++l)
    if (buffers.lend_recompute_scratch && s.layers[l].remat_bytes > 0) recompute_slots = std::max(recompute_slots, layer_region[l]);
  // A carry's device region is padded by the guard bytes, as a slot's is: the debug checks write
  // them after every carry out a lambda writes.
  std::size_t guarded_carry = 0;
  if (carries && !checked_add(stack.carry.bytes, buffers.guard_bytes, guarded_carry))
    return overflow("carry plus guard bytes", {}, stack.carry.name);
  if (carries && recompute_slots > 0 && !checked_align_up(guarded_carry, dalign, recompute_carry))
    return overflow("carry, aligned,", {}, stack.carry.name);
  if (!checked_add(recompute_slots, recompute_carry, a.recompute_scratch_bytes)) return overflow("recompute scratch");
  std::size_t forward_size = 0, backward_size = 0;
  if (!checked_add(a.offload_ring_bytes, remat_scratch, forward_size) ||
      !checked_add(a.staging_ring_bytes, std::max({remat_scratch, advance_scratch, a.recompute_scratch_bytes}), backward_size))
    return overflow("transient area (ring plus remat, advance or recompute scratch)");
  a.forward_area = kept;
  std::size_t phases = 0;
  if (buffers.share_phase_regions) phases = std::max(forward_size, backward_size);
  else if (!checked_add(forward_size, backward_size, phases)) return overflow("transient area of both phases");
  if (!checked_add(kept, phases, a.device_bytes)) return overflow("device arena");
  a.backward_area = buffers.share_phase_regions ? kept : kept + forward_size;  // <= device_bytes: cannot wrap
  if (recompute_carry > 0) a.recompute_carry_offset = a.backward_area + a.staging_ring_bytes + recompute_slots;
  a.host_bytes = host;

  // The spill ring, after the offloaded slots' host regions: spilled layer j passes through
  // buffer j % R in both phases, so a slot's host offset is static. The last R spilled layers are
  // each their buffer's last forward user and first backward user: their bytes stay in the ring
  // and never reach the file; the others are stored and loaded back.
  auto const salign = buffers.storage_alignment;
  if (n_sp > 0) {
    a.spill_buffers = std::min<std::uint32_t>(n_sp, hiding ? buffers.spill_buffers : 1);
    spill_buf.assign(a.spill_buffers + 1, 0);
    for (std::uint32_t j = 0; j < n_sp; ++j) {
      auto& b = spill_buf[j % a.spill_buffers + 1];
      b = std::max(b, s.layers[spilled[j]].spilled_bytes);
    }
    for (std::size_t i = 1; i < spill_buf.size(); ++i)
      if (!checked_add(spill_buf[i], spill_buf[i - 1], spill_buf[i])) return overflow("spill ring");
    a.spill_ring_bytes = spill_buf.back();
    if (!checked_align_up(host, salign, a.spill_area) || !checked_add(a.spill_area, a.spill_ring_bytes, a.host_bytes))
      return overflow("pinned host arena with its spill ring");
    for (std::uint32_t j = 0; j < n_sp; ++j) {
      auto const& lb = s.layers[spilled[j]];
      bool const stored = j + a.spill_buffers < n_sp;
      for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
        auto& b = s.slots[lb.first_slot + k];
        if (b.where != placement::spill) continue;
        b.host_offset += a.spill_area + spill_buf[j % a.spill_buffers];  // below host_bytes: cannot wrap
        if (!stored) continue;
        b.file_offset = a.storage_bytes;
        std::size_t region = 0;
        if (!checked_align_up(b.bytes, salign, region) || !checked_add(a.storage_bytes, region, a.storage_bytes))
          return overflow("storage file", lb.type_name, b.name);
      }
    }
  }

  // Device offsets of transient slots (each below device_bytes: cannot wrap).
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const& lb = s.layers[l];
    std::size_t scratch = a.backward_area + a.staging_ring_bytes;  // an advance's slots, packed
    std::size_t lent = scratch + lb.remat_bytes;  // a recompute's other slots, after its remat slots
    for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
      auto& b = s.slots[lb.first_slot + k];
      std::size_t region = 0;  // as in place(), which proved these cannot overflow
      if (!checked_add(b.bytes, buffers.guard_bytes, region) || !checked_align_up(region, dalign, region))
        return overflow("size plus guard bytes", lb.type_name, b.name);
      if (advanced[l]) {
        b.advance_offset = scratch;
        scratch += region;
      }
      if (buffers.lend_recompute_scratch && lb.remat_bytes > 0 && b.where != placement::remat) {
        b.recompute_offset = lent;
        lent += region;
      }
      if (b.where == placement::offload || b.where == placement::spill) {
        auto const j = ring_index[l];
        b.forward_offset += a.forward_area + offload_buf[j % a.offload_buffers];
        b.backward_offset += a.backward_area + staging_buf[(n_off - 1 - j) % a.staging_buffers];
      } else if (b.where == placement::remat) {
        b.forward_offset += a.forward_area + a.offload_ring_bytes;
        b.backward_offset += a.backward_area + a.staging_ring_bytes;
      }
    }
  }

  // The carries, after everything else (their buffers are counted once the walk has run).
  if (carries) {
    auto& cb = s.carry;
    cb.name = stack.carry.name;
    cb.bytes = stack.carry.bytes;
    // With disk snapshots, a host snapshot is a direct-I/O buffer: aligned and padded to the
    // storage alignment, as its file region is.
    bool const disk = how.checkpoints.disk_snapshots > 0;
    auto const halign = disk ? std::max(buffers.host_alignment, buffers.storage_alignment) : buffers.host_alignment;
    if (!checked_align_up(guarded_carry, dalign, cb.region_bytes) || !checked_align_up(stack.carry.bytes, halign, cb.host_region_bytes) ||
        (disk && !checked_align_up(stack.carry.bytes, buffers.storage_alignment, cb.file_region_bytes)))
      return overflow("carry, aligned,", {}, stack.carry.name);
    cb.device_area = a.device_bytes;
    if (!checked_align_up(a.host_bytes, halign, cb.host_area)) return overflow("host arena with the carry's snapshots", {}, stack.carry.name);
    cb.file_area = a.storage_bytes;  // a multiple of the storage alignment: every region before is
  }
  return {};
}

}  // namespace tide::detail
