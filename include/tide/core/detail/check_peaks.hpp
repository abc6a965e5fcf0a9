#pragma once
//! \file
//! The checker's peak pass (core/check.hpp): replaying the ops' byte ranges reproduces the
//! predicted device, host and storage peaks.

#include <algorithm>
#include <cstddef>
#include <string>

#include <tide/core/check_report.hpp>
#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

//! Peaks: the extent the accesses touch (device ranges plus guard, aligned) is the prediction.
inline void replay_peaks(schedule_view const& s, checked_program const& p, check_report& report) {
  auto const guard = s.buffers.guard_bytes;
  auto const& ar = s.arena;
  for (auto const& a : p.accesses) {
    if (a.guard) continue;  // the guard (or padding) is counted after the access it follows, as predicted
    // No overflow: proven by check_program. Device carries have a guard as slots do (the debug
    // checks write it after every carry out).
    auto const end = a.host != device_space ? a.end : a.end + guard;
    // Spilled slots' regions, in the ring and in the file, are padded to the storage alignment;
    // so are a carry's host snapshots when its checkpoints allow disk snapshots (file regions).
    bool const padded = a.host == storage_space ||
                        (a.host == host_space && a.slot != carry_slot &&
                         s.slots[s.layers[a.layer].first_slot + a.slot].where == placement::spill);
    bool const padded_carry = a.host == host_space && a.slot == carry_slot && s.carry.file_region_bytes > 0;
    auto const align = padded         ? s.buffers.storage_alignment
                       : padded_carry ? std::max(s.buffers.storage_alignment, s.buffers.host_alignment)
                       : a.host       ? s.buffers.host_alignment
                                      : s.buffers.device_alignment;
    auto const aligned = add_or_fail(end, align - 1, [&] { return "peak: the aligned end of " + op_name(s, a.op) + "'s range"; }) /
                         align * align;
    auto& r = a.host == storage_space ? report.replayed_storage_bytes
              : a.host                ? report.replayed_host_bytes
                                      : report.replayed_device_bytes;
    r = std::max(r, aligned);
  }
  if (report.replayed_storage_bytes != ar.storage_bytes)
    check_fail("peak: replaying the ops touches " + std::to_string(report.replayed_storage_bytes) +
               " storage file bytes but the predicted peak is " + std::to_string(ar.storage_bytes));
  if (report.replayed_device_bytes != s.arena.device_bytes)
    check_fail("peak: replaying the ops touches " + std::to_string(report.replayed_device_bytes) +
               " device bytes but the predicted peak is " + std::to_string(s.arena.device_bytes));
  if (report.replayed_host_bytes != s.arena.host_bytes)
    check_fail("peak: replaying the ops touches " + std::to_string(report.replayed_host_bytes) +
               " host bytes but the predicted peak is " + std::to_string(s.arena.host_bytes));
}

}  // namespace tide::detail
