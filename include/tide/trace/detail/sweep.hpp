#pragma once
//! \file
//! The occupancy sweep (trace/summary.hpp's `measure_occupancy`): allocation and free deltas in
//! time order, summed into a step curve.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <tide/trace/occupancy.hpp>

namespace tide::detail {

//! The step curve of `added` and `freed` (time, bytes: positive in `added`, negative in
//! `freed`): one point a time, its bytes the sum of every delta up to it. Sorts both in place and
//! merges them as it goes (no third copy: a deep stack's deltas are tens of megabytes).
inline std::vector<occupancy_point> sweep(std::vector<std::pair<double, std::ptrdiff_t>>& added,
                                          std::vector<std::pair<double, std::ptrdiff_t>>& freed) {
  // Ties in any order: a time's point is recorded after all its deltas.
  auto const by_time = [](auto const& a, auto const& b) { return a.first < b.first; };
  std::sort(added.begin(), added.end(), by_time);
  std::sort(freed.begin(), freed.end(), by_time);
  std::vector<occupancy_point> out;
  std::ptrdiff_t live = 0;
  auto step = [&](std::pair<double, std::ptrdiff_t> const& x) {
    live += x.second;
    if (!out.empty() && out.back().t_us == x.first)
      out.back().bytes = static_cast<std::size_t>(live);
    else
      out.push_back({x.first, static_cast<std::size_t>(live)});
  };
  std::size_t i = 0, j = 0;
  while (i < added.size() || j < freed.size())
    step(j == freed.size() || (i < added.size() && added[i].first <= freed[j].first) ? added[i++] : freed[j++]);
  return out;
}

}  // namespace tide::detail
