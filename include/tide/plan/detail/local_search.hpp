#pragma once
//! \file
//! The planner's local search for small stacks (planner.hpp): steepest descent over moves of one
//! or two decisions, groups and layer swaps, and kicks (random restarts from the best plan).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <tide/plan/detail/search_state.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

inline void plan_search::local_search(point p) {
  static constexpr placement actions[] = {placement::keep, placement::offload, placement::remat};
  base_us_ = costs_.compute_us();
  auto& d = p.d;
  auto const n = d.size();
  auto const L = stack_.layer_count();
  std::vector<placement> c;
  std::vector<std::vector<std::uint32_t>> groups;  // decisions that move together
  for (std::uint32_t l = 0; l < stack_.layer_count(); ++l) {
    groups.emplace_back(stack_.layer(l).slots.size());
    std::iota(groups.back().begin(), groups.back().end(), static_cast<std::uint32_t>(first_[l]));
  }
  auto const layer_groups = groups.size();
  {
    std::vector<std::string_view> names;
    for (auto const& t : stack_.types)
      for (auto const& s : t.slots)
        if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
    for (auto name : names) {
      groups.emplace_back();
      for (std::uint32_t i = 0; i < n; ++i)
        if (stack_.layer(slots_[i].layer).slots[slots_[i].slot].name == name) groups.back().push_back(i);
    }
  }
  std::unique_ptr<bool[]> flags(new bool[n]());
  point next = p;  // the best neighbour of p so far
  auto better = [&](bool offload) {  // evaluates c; true when it is the best neighbour so far
    // Skip without building what cannot fit or cannot be faster: the kept bytes alone over
    // the budget, or compute plus recomputes already as slow as p (as in `branch`).
    std::size_t kept = 0;
    if (!runnable(c)) return false;
    for (std::size_t i = 0; i < n; ++i) {
      flags[i] = c[i] == placement::remat;
      if (c[i] == placement::keep) kept += stack_.layer(slots_[i].layer).slots[slots_[i].slot].bytes;
    }
    if (kept > opt_.device_budget) return false;
    double lb = base_us_;
    for (std::uint32_t l = 0; l < stack_.layer_count(); ++l) {
      std::span<bool const> f(flags.get() + first_[l], stack_.layer(l).slots.size());
      if (std::find(f.begin(), f.end(), true) != f.end()) lb += costs_.layers[l].recompute_time_us(f);
    }
    if (lb >= next.t || best_.evaluations >= evaluation_limit_) return false;
    auto pc = p.pc;
    double t = std::numeric_limits<double>::infinity();
    if (!offload) t = evaluate(c, pc);
    else if (std::find(c.begin(), c.end(), placement::offload) == c.end()) t = evaluate(c, pc = opt_.candidates.front());
    else
      for (auto const& q : opt_.candidates)
        if (auto const tq = evaluate(c, q); tq < t) t = tq, pc = q;
    if (!(t < next.t)) return false;
    next = {c, pc, t};
    return true;
  };
  for (bool improved = true; improved;) {
    improved = false;
    if (next.t < p.t) p = next;
    for (std::size_t i = 0; i < n; ++i)
      for (auto a : actions) {
        if (a == d[i]) continue;
        c = d;
        c[i] = a;
        improved |= better(a == placement::offload || d[i] == placement::offload);
      }
    for (auto const& g : groups)
      for (auto from : actions)
        for (auto to : actions) {
          if (from == to || std::count_if(g.begin(), g.end(), [&](auto i) { return d[i] == from; }) < 2) continue;
          c = d;
          for (auto i : g)
            if (c[i] == from) c[i] = to;
          improved |= better(from == placement::offload || to == placement::offload);
        }
    for (std::size_t g = layer_groups; g < groups.size(); ++g)
      for (std::size_t h = g + 1; h < groups.size(); ++h)
        for (auto a : actions)
          for (auto b : actions) {
            c = d;
            bool offload = false, changed = false;
            for (auto [members, x] : {std::pair{&groups[g], a}, std::pair{&groups[h], b}})
              for (auto i : *members) {
                offload |= c[i] == placement::offload || x == placement::offload;
                changed |= c[i] != x;
                c[i] = x;
              }
            if (changed) improved |= better(offload);
          }
    auto dir = [](placement from, placement to) { return (to == placement::keep) - (from == placement::keep); };
    for (std::size_t g = 0; g < groups.size(); ++g)  // two groups, each with one action to another,
      for (std::size_t h = g + 1; h < groups.size(); ++h)  // trading kept bytes
        for (auto from_g : actions)
          for (auto to_g : actions) {
            if (from_g == to_g || std::none_of(groups[g].begin(), groups[g].end(), [&](auto i) { return d[i] == from_g; }))
              continue;
            for (auto from_h : actions)
              for (auto to_h : actions) {
                if (from_h == to_h || dir(from_g, to_g) + dir(from_h, to_h) != 0 ||
                    std::none_of(groups[h].begin(), groups[h].end(), [&](auto i) { return d[i] == from_h; }))
                  continue;
                c = d;
                for (auto i : groups[g])
                  if (d[i] == from_g) c[i] = to_g;
                for (auto i : groups[h])
                  if (d[i] == from_h) c[i] = to_h;
                improved |= better(from_g == placement::offload || to_g == placement::offload ||
                                   from_h == placement::offload || to_h == placement::offload);
              }
          }
    for (std::uint32_t l1 = 0; l1 < L; ++l1)  // two layers of a type: swap, or copy one onto the other
      for (std::uint32_t l2 = l1 + 1; l2 < L; ++l2) {
        if (stack_.layer_types[l1] != stack_.layer_types[l2]) continue;
        auto const a = d.begin() + static_cast<std::ptrdiff_t>(first_[l1]), b = d.begin() + static_cast<std::ptrdiff_t>(first_[l2]);
        auto const S = static_cast<std::ptrdiff_t>(stack_.layer(l1).slots.size());
        if (std::equal(a, a + S, b)) continue;
        bool const offload = std::find(a, a + S, placement::offload) != a + S || std::find(b, b + S, placement::offload) != b + S;
        for (int k = 0; k < 3; ++k) {
          c = d;
          auto const ca = c.begin() + (a - d.begin()), cb = c.begin() + (b - d.begin());
          if (k != 1) std::copy(b, b + S, ca);
          if (k != 2) std::copy(a, a + S, cb);
          improved |= better(offload);
        }
      }
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j)
        for (auto a : actions)
          for (auto b : actions) {
            if (a == d[i] || b == d[j]) continue;
            // Across layers only pairs that trade kept bytes (or offload for remat).
            if (slots_[i].layer != slots_[j].layer && dir(d[i], a) + dir(d[j], b) != 0) continue;
            c = d;
            c[i] = a;
            c[j] = b;
            improved |= better(a == placement::offload || b == placement::offload || d[i] == placement::offload ||
                               d[j] == placement::offload);
          }
  }
}

template <class From>
void plan_search::kicks(std::mt19937& rng, std::size_t count, std::size_t evaluations, From from) {
  auto const n = slots_.size();
  evaluation_limit_ = best_.evaluations + evaluations;
  for (std::size_t kick = 0; kick < count && best_.evaluations < evaluation_limit_; ++kick) {
    point q = from();
    if (!(q.t < std::numeric_limits<double>::infinity())) return;
    auto change = [&](std::size_t i, placement to) {
      q.d[i] = to == placement::remat && !remat_ok(static_cast<std::uint32_t>(i)) ? placement::offload : to;
    };
    auto const kind = kick % 3;
    if (kind == 1) {  // a slot name's decisions in every layer to one action, and one more decision
      auto const name = stack_.layer(0).slots[rng() % stack_.layer(0).slots.size()].name;
      auto const to = static_cast<placement>(rng() % 3);
      for (std::size_t i = 0; i < n; ++i)
        if (stack_.layer(slots_[i].layer).slots[slots_[i].slot].name == name) change(i, to);
    } else if (kind == 2) {  // two swaps of layers of one type (which layers offload decides what overlaps)
      auto const L = stack_.layer_count();
      for (int j = 0; j < 2; ++j) {
        auto const a = static_cast<std::uint32_t>(rng() % L), b = static_cast<std::uint32_t>(rng() % L);
        if (stack_.layer_types[a] != stack_.layer_types[b]) continue;
        for (std::size_t k = 0; k < stack_.layer(a).slots.size(); ++k)
          if (j == 0) std::swap(q.d[first_[a] + k], q.d[first_[b] + k]);
          else q.d[first_[b] + k] = q.d[first_[a] + k];
      }
    }
    for (std::size_t j = 0, changes = kind == 0 ? 2 + rng() % 2 : kind == 1; j < changes; ++j) {
      auto const i = rng() % n;
      change(i, static_cast<placement>((static_cast<unsigned>(q.d[i]) + 1 + rng() % 2) % 3));
    }
    q.t = std::numeric_limits<double>::infinity();
    for (auto const& pc : opt_.candidates)
      if (auto const t = evaluate(q.d, pc); t < q.t) q.t = t, q.pc = pc;
    if (q.t < std::numeric_limits<double>::infinity()) local_search(std::move(q));
  }
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
