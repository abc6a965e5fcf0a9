#pragma once
//! \file
//! The checker's bindings pass (core/check.hpp): the slot table and every slot's ranges, before
//! anything indexes through them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

//! Bindings: the slot table and every slot's ranges, before anything indexes through them.
inline void check_bindings(schedule_view const& s) {
  auto pow2 = [](std::size_t a) { return a > 0 && (a & (a - 1)) == 0; };
  if (!pow2(s.buffers.device_alignment) || !pow2(s.buffers.host_alignment) || !pow2(s.buffers.storage_alignment))
    check_fail("buffers: the device alignment " + std::to_string(s.buffers.device_alignment) + ", host alignment " +
               std::to_string(s.buffers.host_alignment) + " or storage alignment " +
               std::to_string(s.buffers.storage_alignment) + " is not a power of two");
  auto const salign = s.buffers.storage_alignment;
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
      if (b.where != placement::keep && b.where != placement::offload && b.where != placement::remat &&
          b.where != placement::spill)
        check_fail("binding: " + what() + " has no valid placement");
      if (b.where != placement::spill && b.file_offset != slot_binding::not_stored)
        check_fail("binding: " + what() + " is " + std::string(to_string(b.where)) + " but has a storage file offset");
      if (b.bytes == 0) check_fail("binding: " + what() + " has zero bytes");
      // The executor writes guard bytes after forward and recompute regions; replay counts them.
      auto const with_guard = add_or_fail(b.bytes, guard, [&] { return "binding: the size plus guard of " + what(); });
      add_or_fail(b.forward_offset, with_guard, [&] { return "binding: the forward range of " + what(); });
      add_or_fail(b.backward_offset, with_guard, [&] { return "binding: the backward range of " + what(); });
      add_or_fail(b.advance_offset, with_guard, [&] { return "binding: the advance range of " + what(); });
      if (b.recompute_offset != slot_binding::no_scratch) {
        if (b.where == placement::remat)
          check_fail("binding: " + what() + " is rematerialized but has recompute scratch: a recompute rebuilds it at its "
                     "backward offset");
        add_or_fail(b.recompute_offset, with_guard, [&] { return "binding: the recompute scratch range of " + what(); });
      }
      if (b.where == placement::offload)
        add_or_fail(b.host_offset, b.bytes, [&] { return "binding: the host range of " + what(); });
      if (b.where == placement::spill) {
        // Stores and loads move the slot padded to the storage alignment: its regions start on it,
        // and its ring region lies inside the ring (what a load writes stays in the arena).
        auto const padded = add_or_fail(b.bytes, salign - 1, [&] { return "binding: the padded size of " + what(); }) / salign * salign;
        auto const end = add_or_fail(b.host_offset, padded, [&] { return "binding: the spill ring range of " + what(); });
        auto const& a = s.arena;
        auto const ring_end = add_or_fail(a.spill_area, a.spill_ring_bytes, [&] { return std::string("binding: the spill ring"); });
        if (b.host_offset < a.spill_area || end > ring_end || ring_end > a.host_bytes)
          check_fail("binding: " + what() + " is spilled at host " + bytes_text(b.host_offset, end) +
                     " (padded), outside the spill ring " + bytes_text(a.spill_area, ring_end) + " of the " +
                     std::to_string(a.host_bytes) + "-byte host arena");
        if (b.host_offset % salign != 0 || (b.stored() && b.file_offset % salign != 0))
          check_fail("binding: " + what() + " is spilled at host offset " + std::to_string(b.host_offset) +
                     (b.stored() ? " and file offset " + std::to_string(b.file_offset) : std::string()) +
                     ", not on the storage alignment " + std::to_string(salign) + " direct I/O needs");
        if (b.stored()) add_or_fail(b.file_offset, padded, [&] { return "binding: the storage file range of " + what(); });
      }
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

}  // namespace tide::detail
