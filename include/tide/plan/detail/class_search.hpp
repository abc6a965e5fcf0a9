#pragma once
//! \file
//! The planner's search over classes for large stacks (planner.hpp): first-improvement moves on
//! a layer type's slot in every layer of the type (split points, the stack's ends), then paired
//! trades ranked by the recomputation they save.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include <tide/plan/detail/search_state.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

inline void plan_search::class_search(point p) {
  static constexpr placement actions[] = {placement::keep, placement::offload, placement::remat};
  auto const n = p.d.size();
  auto const L = stack_.layer_count();
  base_us_ = costs_.compute_us();
  std::vector<std::vector<std::uint32_t>> classes;  // decision indices, by layer
  {
    std::vector<std::size_t> first_of_type(stack_.types.size(), std::numeric_limits<std::size_t>::max());
    for (std::uint32_t l = 0; l < L; ++l) {
      auto const type = stack_.layer_types[l];
      auto const S = stack_.layer(l).slots.size();
      if (first_of_type[type] == std::numeric_limits<std::size_t>::max()) {
        first_of_type[type] = classes.size();
        classes.resize(classes.size() + S);
      }
      for (std::size_t k = 0; k < S; ++k) classes[first_of_type[type] + k].push_back(static_cast<std::uint32_t>(first_[l] + k));
    }
  }
  std::unique_ptr<bool[]> flags(new bool[n]());
  std::vector<placement> c;
  // Builds and simulates c unless its kept bytes alone exceed the budget or its compute and
  // recomputes already take as long as p; true (and p = c) when it is faster.
  auto improves = [&] {
    if (c == p.d || best_.evaluations >= evaluation_limit_ || !runnable(c)) return false;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      flags[i] = c[i] == placement::remat;
      if (c[i] == placement::keep) kept += stack_.layer(slots_[i].layer).slots[slots_[i].slot].bytes;
    }
    if (kept > opt_.device_budget) return false;
    double lb = base_us_;
    for (std::uint32_t l = 0; l < L; ++l) {
      std::span<bool const> f(flags.get() + first_[l], stack_.layer(l).slots.size());
      if (std::find(f.begin(), f.end(), true) != f.end()) lb += costs_.layers[l].recompute_time_us(f);
    }
    if (lb >= p.t) return false;
    auto const t = evaluate(c, p.pc);
    if (!(t < p.t)) return false;
    p.d = c;
    p.t = t;
    return true;
  };
  // The members of class `m` whose action is `x`, by layer.
  std::vector<std::uint32_t> with;
  auto members = [&](std::vector<std::uint32_t> const& m, placement x) {
    with.clear();
    for (auto i : m)
      if (p.d[i] == x) with.push_back(i);
    return with.size();
  };
  auto single_moves = [&] {
    for (auto const& m : classes)
      for (auto to : actions) {
        if (to == placement::remat && !remat_ok(m.front())) continue;
        for (auto from : actions) {
          if (from == to) continue;
          auto const count = members(m, from);
          if (count == 0) continue;
          c = p.d;
          for (auto i : with) c[i] = to;
          if (improves()) return true;
          for (std::size_t j = 1; j < count; j *= 2)
            for (bool const last : {false, true}) {
              members(m, from);
              if (j >= with.size()) break;
              c = p.d;
              for (std::size_t q = 0; q < j; ++q) c[last ? with[with.size() - 1 - q] : with[q]] = to;
              if (improves()) return true;
            }
        }
      }
    for (std::uint32_t l = 0; l < L; l = l == 1 && L > 5 ? L - 3 : l + 1) {  // the ends, one decision at a time
      for (std::size_t i = first_[l]; i < first_[l] + stack_.layer(l).slots.size(); ++i)
        for (auto to : actions) {
          if (to == p.d[i] || (to == placement::remat && !remat_ok(static_cast<std::uint32_t>(i)))) continue;
          c = p.d;
          c[i] = to;
          if (improves()) return true;
        }
    }
    return false;
  };
  // A one-member move: the first or last member with action `from` of a class turns `to`.
  struct unit {
    std::uint32_t slot;
    placement to;
    double kept, host, recompute;  // changes: bytes kept, bytes offloaded, recompute estimate
  };
  auto pair_moves = [&] {
    std::vector<unit> units;
    for (auto const& m : classes)
      for (auto from : actions)
        for (auto to : actions) {
          if (from == to || (to == placement::remat && !remat_ok(m.front())) || members(m, from) == 0) continue;
          for (auto i : {with.front(), with.back()}) {
            double const b = bytes_of(i), r = recompute_of(i);
            units.push_back({i, to, b * ((to == placement::keep) - (from == placement::keep)),
                             b * ((to == placement::offload) - (from == placement::offload)),
                             r * ((to == placement::remat) - (from == placement::remat))});
            if (with.size() == 1) break;
          }
        }
    struct candidate {
      double saves;
      std::uint32_t a, b;
    };
    std::vector<candidate> pairs;
    bool const host_capped = opt_.host_budget != std::numeric_limits<std::size_t>::max();
    for (std::uint32_t a = 0; a < units.size(); ++a)
      for (std::uint32_t b = a + 1; b < units.size(); ++b) {
        auto const& x = units[a];
        auto const& y = units[b];
        if (x.slot == y.slot || x.kept + y.kept > 0 || (host_capped && x.host + y.host > 0)) continue;
        if (auto const r = x.recompute + y.recompute; r < 0) pairs.push_back({-r, a, b});
      }
    std::stable_sort(pairs.begin(), pairs.end(), [](auto const& x, auto const& y) { return x.saves > y.saves; });
    if (pairs.size() > opt_.class_search_pairs) pairs.resize(opt_.class_search_pairs);
    for (auto const& q : pairs) {
      c = p.d;
      c[units[q.a].slot] = units[q.a].to;
      c[units[q.b].slot] = units[q.b].to;
      if (improves()) return true;
    }
    return false;
  };
  while (best_.evaluations < evaluation_limit_ && (single_moves() || pair_moves())) {
  }
  for (auto const& pc : opt_.candidates) (void)evaluate(p.d, pc);  // every pipeline, for the result
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
