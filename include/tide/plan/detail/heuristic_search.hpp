#pragma once
//! \file
//! The planner's heuristic (planner.hpp): orders of moves (hidden offloads, the greedy by added
//! time per byte saved, priced orders), for each the shortest prefix that fits, then the local
//! search (`local_search.hpp`) or, above `plan_options::local_search_max_decisions`, the search
//! over classes (`class_search.hpp`) from the fastest.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <tide/plan/detail/class_search.hpp>
#include <tide/plan/detail/local_search.hpp>
#include <tide/plan/detail/search_state.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

inline void plan_search::heuristic() {
  auto const cap = opt_.host_budget;
  if (cap == std::numeric_limits<std::size_t>::max()) return heuristic_pass({});
  opt_.host_budget = std::numeric_limits<std::size_t>::max();
  held_cap_ = cap;  // meanwhile `evaluate` holds the fastest candidate within the cap
  heuristic_pass({});
  opt_.host_budget = cap;
  held_cap_ = std::numeric_limits<std::size_t>::max();
  if (best_.fits && best_.host_bytes <= cap) return;
  auto const evaluations = best_.evaluations, smallest = best_.smallest_activation_bytes;
  best_ = plan{};
  by_pipeline_.assign(pipelines_.size(), point{});
  best_.evaluations = evaluations;
  best_.smallest_activation_bytes = smallest;
  best_.step_us = std::numeric_limits<double>::infinity();
  std::vector<point> starts;
  add_seeds(starts);
  if (held_.t < std::numeric_limits<double>::infinity()) {
    evaluate(held_.d, held_.pc);
    starts.push_back(std::move(held_));
  }
  heuristic_pass(std::move(starts));
}

inline std::vector<plan_search::move> plan_search::greedy_order(std::vector<std::uint32_t> const& pool, bool offload_too,
                                                               host_room room) const {
  auto const L = stack_.layer_count();
  std::vector<std::vector<std::uint32_t>> left(L);  // pool slots of each layer not taken yet
  for (auto i : pool)
    if (remat_ok(i) || offload_too) left[slots_[i].layer].push_back(i);  // an input slot: offload or nothing
  std::vector<double> sum(L, 0);  // the rematted slots' summed recompute costs
  auto added = [&](std::uint32_t l, double c) {
    auto const full = costs_.layers[l].full_recompute_us();
    return std::min(sum[l] + c, full) - std::min(sum[l], full);
  };
  struct pick {
    double ratio = std::numeric_limits<double>::infinity();
    std::size_t index = 0;  // into left[l]; left[l].size(): the whole rest of the layer
    placement action = placement::remat;
  };
  std::vector<pick> best(L);
  auto rank = [&](std::uint32_t l) {
    pick p;
    double c_all = 0, b_all = 0;
    bool inputs = false;
    for (std::size_t k = 0; k < left[l].size(); ++k) {
      auto const i = left[l][k];
      auto const b = bytes_of(i);
      if (remat_ok(i)) {
        auto const r = added(l, recompute_of(i));
        c_all += recompute_of(i);
        b_all += b;
        if (r / b < p.ratio) p = {r / b, k, placement::remat};
      } else {
        inputs = true;
      }
      if (offload_too && exposed_of(i) / b < p.ratio && room.fits(i)) p = {exposed_of(i) / b, k, placement::offload};
    }
    if (!inputs && left[l].size() > 1 && added(l, c_all) / b_all < p.ratio)
      p = {added(l, c_all) / b_all, left[l].size(), placement::remat};
    best[l] = p;
  };
  for (std::uint32_t l = 0; l < L; ++l) rank(l);
  std::vector<move> r;
  r.reserve(pool.size());
  for (;;) {
    std::uint32_t l = L;
    for (std::uint32_t m = 0; m < L; ++m)
      if (!left[m].empty() && best[m].ratio < std::numeric_limits<double>::infinity() && (l == L || best[m].ratio < best[l].ratio))
        l = m;
    if (l == L) break;  // what is left can be neither rematerialized nor offloaded
    auto& lt = left[l];
    auto const p = best[l];
    if (p.index == lt.size()) {  // the whole rest of the layer, cheapest per byte first
      std::stable_sort(lt.begin(), lt.end(), [&](auto a, auto b) { return recompute_of(a) / bytes_of(a) < recompute_of(b) / bytes_of(b); });
      for (auto i : lt) r.push_back({i, placement::remat}), sum[l] += recompute_of(i);
      lt.clear();
    } else {
      auto const i = lt[p.index];
      r.push_back({i, p.action});
      if (p.action == placement::remat) sum[l] += recompute_of(i);
      else if (room.take(i))  // the host room shrank: offloads elsewhere may no longer fit
        for (std::uint32_t m = 0; m < L; ++m) rank(m);
      lt.erase(lt.begin() + static_cast<std::ptrdiff_t>(p.index));
    }
    rank(l);
  }
  return r;
}

inline void plan_search::heuristic_pass(std::vector<point> starts) {
  auto const n = slots_.size();
  std::vector<placement> keep(n, placement::keep);
  if (evaluate(keep, opt_.candidates.front()) < std::numeric_limits<double>::infinity()) return;  // keep-all fits: fastest
  if (starts.empty()) add_seeds(starts);

  auto const& link = costs_.link;
  auto const L = stack_.layer_count();
  // Hidden offloads: per layer, largest first, while the layer's copies fit in the next
  // layer's forward (offload) and backward (prefetch) at the link's rate.
  std::vector<std::vector<std::uint32_t>> hidden(L);  // slot indices into slots_
  std::vector<bool> is_hidden(n, false);
  auto const& first = first_;
  for (std::uint32_t l = 0; l + 1 < L; ++l) {
    auto const& slots = stack_.layer(l).slots;
    std::vector<std::uint32_t> order(slots.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return slots[a].bytes > slots[b].bytes; });
    double off_us = 0, pre_us = 0;
    double const fwd_window = costs_.layers[l + 1].forward_us, bwd_window = costs_.layers[l + 1].backward_us;
    for (auto k : order) {
      auto const o = link.d2h.time_us(slots[k].bytes), p = link.h2d.time_us(slots[k].bytes);
      if (off_us + o > fwd_window || pre_us + p > bwd_window) continue;
      off_us += o;
      pre_us += p;
      hidden[l].push_back(static_cast<std::uint32_t>(first[l] + k));
      is_hidden[first[l] + k] = true;
    }
  }
  std::vector<move> hidden_moves;  // round-robin over layers: every layer's largest first
  for (std::size_t r = 0;; ++r) {
    bool any = false;
    for (std::uint32_t l = 0; l < L; ++l)
      if (r < hidden[l].size()) hidden_moves.push_back({hidden[l][r], placement::offload}), any = true;
    if (!any) break;
  }
  // Every decision, dearest to recompute per byte first (inputs, which cannot be, first of all).
  std::vector<std::uint32_t> by_value(n);
  std::iota(by_value.begin(), by_value.end(), 0u);
  {
    std::vector<double> value(n);
    for (std::uint32_t i = 0; i < n; ++i)
      value[i] = remat_ok(i) ? recompute_of(i) / bytes_of(i) : std::numeric_limits<double>::infinity();
    std::stable_sort(by_value.begin(), by_value.end(), [&](auto a, auto b) { return value[a] > value[b]; });
  }
  // The orders of moves. With a host cap, offloads are taken (in each order's sequence) while
  // the host bytes fit, and the slots left out go to the remat greedy.
  static constexpr std::size_t order_count = 6;
  auto orders_for = [&](std::size_t alignment) {
    host_room const room0{this, alignment, opt_.host_budget};
    auto room = room0;
    std::vector<move> hidden_in;  // the hidden offloads that fit the host cap
    std::vector<bool> taken(n, false);
    for (auto m : hidden_moves)
      if (room.fits(m.slot)) hidden_in.push_back(m), taken[m.slot] = true, room.take(m.slot);
    std::vector<std::uint32_t> rest, all(n);
    std::iota(all.begin(), all.end(), 0u);
    for (std::uint32_t i = 0; i < n; ++i)
      if (!taken[i]) rest.push_back(i);
    auto then = [](std::vector<move> a, std::vector<move> const& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    std::vector<std::vector<move>> orders;
    orders.reserve(order_count);
    orders.push_back(then(hidden_in, greedy_order(rest, false, room)));  // hidden offloads, then remat
    orders.push_back(then(hidden_in, greedy_order(rest, true, room)));   // ... or exposed offloads where cheaper
    orders.push_back(greedy_order(all, false, room0));                   // remat only (no host memory)
    {  // hidden offloads, then exposed offloads (no recompute; remat what the host cap leaves)
      auto r = rest;
      std::stable_sort(r.begin(), r.end(), [&](auto a, auto b) { return exposed_of(a) / bytes_of(a) < exposed_of(b) / bytes_of(b); });
      auto o = hidden_in;
      std::vector<std::uint32_t> left;
      for (auto i : r)
        if (room.fits(i)) o.push_back({i, placement::offload}), room.take(i);
        else left.push_back(i);
      orders.push_back(then(o, greedy_order(left, false, room)));
    }
    // Priced (what a Lagrangian price on device and host bytes chooses): the host holds the
    // slots dearest to recompute per byte (layer inputs first), while they fit the host cap
    // (and, in the first of the two, the link's room in the neighbouring layer); the cheapest
    // per byte are rematerialized, as the greedy ranks them, until the device peak fits.
    for (bool const link_room : {true, false}) {
      auto r = room0;
      std::vector<double> off_us(L, 0), pre_us(L, 0);
      std::vector<move> o;
      std::vector<std::uint32_t> left;
      for (auto i : by_value) {
        auto const l = slots_[i].layer;
        auto const b = stack_.layer(l).slots[slots_[i].slot].bytes;
        auto const oc = link.d2h.time_us(b), pc = link.h2d.time_us(b);
        bool const hides = l + 1 < L && off_us[l] + oc <= costs_.layers[l + 1].forward_us &&
                           pre_us[l] + pc <= costs_.layers[l + 1].backward_us;
        if (!r.fits(i) || (link_room && !hides)) {
          left.push_back(i);
          continue;
        }
        off_us[l] += oc;
        pre_us[l] += pc;
        o.push_back({i, placement::offload});
        r.take(i);
      }
      orders.push_back(then(o, greedy_order(left, false, r)));
    }
    return orders;
  };
  // Without a cap the orders are the same for every pipeline.
  std::vector<std::pair<std::size_t, std::vector<std::vector<move>>>> orders_by_alignment;
  auto orders_of = [&](strategy const& pc) -> std::vector<std::vector<move>> const& {
    auto const a = opt_.host_budget == std::numeric_limits<std::size_t>::max() ? 0 : pc.buffers.host_alignment;
    for (auto const& [b, o] : orders_by_alignment)
      if (b == a) return o;
    return orders_by_alignment.emplace_back(a, orders_for(std::max<std::size_t>(a, 1))).second;
  };
  auto apply = [&](std::vector<move> const& o, std::size_t k) {
    std::vector<placement> d(n, placement::keep);
    for (std::size_t i = 0; i < k; ++i) d[o[i].slot] = o[i].action;
    return d;
  };
  // For each order and pipeline: the shortest prefix whose device peak fits (more moves fit
  // better; the host bytes fit by construction), simulated.
  for (std::size_t which = 0; which < order_count; ++which)
    for (auto const& pc : opt_.candidates) {
      auto const& o = orders_of(pc)[which];
      auto fits = [&](std::size_t k) { return peak_of(apply(o, k), pc) <= opt_.device_budget; };
      if (!fits(o.size())) continue;
      std::size_t lo = 0, hi = o.size();  // fits(hi); find the smallest such prefix
      while (lo < hi) {
        auto const mid = lo + (hi - lo) / 2;
        if (fits(mid)) hi = mid;
        else lo = mid + 1;
      }
      auto d = apply(o, hi);
      auto const t = evaluate(d, pc);
      if (t < std::numeric_limits<double>::infinity()) starts.push_back({std::move(d), pc, t});
    }
  if (!best_.fits) return;
  std::stable_sort(starts.begin(), starts.end(), [](auto const& a, auto const& b) { return a.t < b.t; });
  std::vector<std::vector<placement>> seen;
  if (n > opt_.local_search_max_decisions) {  // large: the search over classes
    evaluation_limit_ = best_.evaluations + opt_.class_search_max_evaluations;
    for (auto& p : starts) {
      if (best_.evaluations >= evaluation_limit_ || seen.size() == opt_.class_search_starts) break;
      if (std::find(seen.begin(), seen.end(), p.d) != seen.end()) continue;
      seen.push_back(p.d);
      class_search(std::move(p));
    }
    return;
  }
  // Local search from the fastest candidates with different decisions.
  evaluation_limit_ = best_.evaluations + opt_.local_search_max_evaluations;
  for (auto& p : starts) {
    if (best_.evaluations >= evaluation_limit_) break;
    if (seen.size() == opt_.local_search_starts) break;
    if (std::find(seen.begin(), seen.end(), p.d) != seen.end()) continue;
    seen.push_back(p.d);
    local_search(std::move(p));
  }
  // Kicks from the best plan.
  std::mt19937 rng(static_cast<std::uint32_t>(n));
  kicks(rng, opt_.local_search_kicks, opt_.local_search_kick_evaluations, [&] {
    return best_.fits ? point{best_.decisions, best_.strategy, best_.step_us} : point{};
  });
  // Then the same per pipeline, from the fastest plan with it: each pipeline's optimum can be
  // far from the best's (one staging buffer leaves room to keep more, a deeper prefetch hides
  // more offloads), and a descent that may change the pipeline returns to the best's.
  auto const starts_by = by_pipeline_;
  for (std::size_t k = 0; k < pipelines_.size(); ++k) {
    if (!(starts_by[k].t < std::numeric_limits<double>::infinity())) continue;
    if (pipelines_[k].pipeline == best_.strategy.pipeline && pipelines_[k].buffers == best_.strategy.buffers) continue;
    opt_.candidates = {pipelines_[k]};
    evaluation_limit_ = best_.evaluations + opt_.local_search_kick_evaluations / 4;
    local_search(starts_by[k]);
    kicks(rng, opt_.local_search_kicks / 4, opt_.local_search_kick_evaluations / 4, [&] { return by_pipeline_[k]; });
  }
  opt_.candidates = pipelines_;
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
