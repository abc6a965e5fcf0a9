#pragma once
//! \file
//! The checker's copy geometry and guard pass (core/check.hpp): copies tile their slots where the
//! bindings say, and one op's guarded regions do not overlap.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

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

  // Stores and loads move exactly their slot, between where the bindings place it in the spill
  // ring and in the file.
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    if (!is_storage(o.kind)) continue;
    if (o.slot == carry_slot) {  // a disk snapshot: between a host snapshot's region and a disk snapshot's
      auto const& c = s.carry;
      auto const in = [](std::size_t at, std::size_t area, std::size_t region, std::uint32_t count) {
        return at >= area && region > 0 && (at - area) % region == 0 && (at - area) / region < count;
      };
      if (!in(o.host_offset, c.host_area, c.host_region_bytes, c.host_snapshots) ||
          !in(o.file_offset, c.file_area, c.file_region_bytes, c.disk_snapshots))
        check_fail("storage geometry: " + op_name(s, i) + " moves host " + bytes_text(o.host_offset, o.host_offset + o.bytes) +
                   " and file " + bytes_text(o.file_offset, o.file_offset + o.bytes) +
                   ", which are not a host snapshot's region and a disk snapshot's (host snapshots at " + std::to_string(c.host_area) +
                   ", " + std::to_string(c.host_region_bytes) + " bytes apart; disk snapshots at " + std::to_string(c.file_area) +
                   ", " + std::to_string(c.file_region_bytes) + " apart)");
      continue;
    }
    auto const& b = s.slots_of(o.layer)[o.slot];  // a stored spilled slot: proven by check_program
    if (o.bytes != b.bytes || o.host_offset != b.host_offset || o.file_offset != b.file_offset)
      check_fail("storage geometry: " + op_name(s, i) + " moves host " + bytes_text(o.host_offset, o.host_offset + o.bytes) +
                 " and file " + bytes_text(o.file_offset, o.file_offset + o.bytes) + ", but " + slot_label(s, o.layer, o.slot) +
                 " lies at host " + bytes_text(b.host_offset, b.host_offset + b.bytes) + " and file " +
                 bytes_text(b.file_offset, b.file_offset + b.bytes) + ": a store or load moves its whole slot, where the bindings place it");
  }

  // A carry's guard bytes lie in its own region: carry buffers are region_bytes apart, and the
  // debug checks write the guard after every carry out (a recompute's lent one included).
  if (auto const& c = s.carry; c.present() && guard > 0) {
    if (c.region_bytes < c.bytes || c.region_bytes - c.bytes < guard)
      check_fail("guard: the carry '" + std::string(c.name) + "' (" + str(c.bytes) + " bytes) has device regions of " +
                 str(c.region_bytes) + " bytes, too few for its " + str(guard) +
                 " guard bytes (the executor's debug checks write them after every carry out)");
    if (auto const at = s.arena.recompute_carry_offset;
        at != no_carry && (at > s.arena.device_bytes || s.arena.device_bytes - at < c.bytes || s.arena.device_bytes - at - c.bytes < guard))
      check_fail("guard: the recompute's carry scratch at device offset " + str(at) + " leaves no room for the " + str(guard) +
                 " guard bytes after its " + str(c.bytes) + " bytes in the " + str(s.arena.device_bytes) + "-byte device arena");
  }

  // Guarded regions of one op do not overlap: the slots a forward writes, each with its guard,
  // at forward offsets; the slots a recompute or backward touches at backward offsets, remat
  // slots with their guard, and the scratch a recompute is lent for the others, with its guard.
  // (Overlaps of the slots' bytes alone at forward or backward offsets were rejected by
  // check_bindings: what overlaps there is a guard.) No overflow: check_bindings proved
  // offset + bytes + guard.
  struct region {
    std::size_t begin, end;
    std::uint32_t slot;
    bool scratch;
    bool operator<(region const& o) const noexcept {
      return std::tie(begin, end, slot, scratch) < std::tie(o.begin, o.end, o.slot, o.scratch);
    }
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
        regions.push_back({at, at + b.bytes + (guarded ? guard : 0), k, false});
        if (!fwd && b.recompute_offset != slot_binding::no_scratch)
          regions.push_back({b.recompute_offset, b.recompute_offset + b.bytes + guard, k, true});
      }
      if (guard == 0 && regions.size() == slots.size()) continue;  // proven by check_bindings
      std::sort(regions.begin(), regions.end());
      for (std::size_t j = 1; j < regions.size(); ++j) {
        auto const& x = regions[j - 1];
        auto const& y = regions[j];
        if (x.end <= y.begin) continue;
        auto const& bx = slots[x.slot];
        auto const name = [&](region const& r) {
          return (r.scratch ? "the recompute scratch of " : "") + slot_label(s, l, r.slot);
        };
        if (x.begin + bx.bytes > y.begin)
          check_fail("guard: " + name(x) + " " + bytes_text(x.begin, x.begin + bx.bytes) + " overlaps " + name(y) + " " +
                     bytes_text(y.begin, y.begin + slots[y.slot].bytes) +
                     " in the device arena: a recompute touches both at once");
        check_fail("guard: the " + str(guard) + " guard bytes " + bytes_text(x.begin + bx.bytes, x.end) + " after " +
                   name(x) + " overlap " + name(y) + " " + bytes_text(y.begin, y.begin + slots[y.slot].bytes) +
                   " in the device arena (" +
                   (fwd ? "forward offsets: the executor's debug checks write guard bytes after every slot before a forward"
                        : "backward offsets: the executor's debug checks write guard bytes after every remat slot and "
                          "every slot of recompute scratch before a recompute") +
                   ")");
      }
    }
  }
}

}  // namespace tide::detail
