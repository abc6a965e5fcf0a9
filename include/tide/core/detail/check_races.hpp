#pragma once
//! \file
//! The checker's race and data-flow sweep (core/check.hpp): every pair of conflicting byte
//! accesses is ordered, and every read sees the bytes written for its (layer, slot). One sweep in
//! issue order over each arena's elementary byte intervals, kept in a `byte_state_tree`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <tide/core/check_report.hpp>
#include <tide/core/detail/byte_state_tree.hpp>
#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

//! No race and data flow: one sweep over the accesses in issue order.
inline void check_races_and_data_flow(schedule_view const& s, checked_program const& p, check_report& report) {
  auto const& acc = p.accesses;
  // Elementary intervals per arena: the sorted distinct boundaries of every access.
  std::array<std::vector<std::size_t>, space_count> bounds;
  for (auto const& a : acc) {
    bounds[a.host].push_back(a.begin);
    bounds[a.host].push_back(a.end);
  }
  for (auto& b : bounds) {
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
  }
  auto leaf = [&](std::uint8_t host, std::size_t x) {
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

  std::array<byte_state_tree, space_count> trees{byte_state_tree(bounds[0].empty() ? 0 : bounds[0].size() - 1),
                                                 byte_state_tree(bounds[1].empty() ? 0 : bounds[1].size() - 1),
                                                 byte_state_tree(bounds[2].empty() ? 0 : bounds[2].size() - 1)};
  // The input (carry 0) is written by the user before the step: data no op wrote, ordered
  // before every op.
  if (s.carry.present() && !s.stage.present())  // a stage's receives write its inputs
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
      if ((a.write && !a.rmw) || (q.data_lo == data[j] && q.data_hi == data[j])) continue;
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

}  // namespace tide::detail
