#pragma once
//! \file
//! The lower bound's parts (tide/plan/lower_bound.hpp): the least-recomputation envelope, the
//! keep-all step, and the minimization over the host bytes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/build.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#include <tide/plan/simulate.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

//! One piece of the least-recomputation envelope: `bytes` more rematerialized for `us` more.
struct remat_segment {
  double bytes = 0;
  double us = 0;
};

//! The least recomputation as a function of the bytes rematerialized, from below: per layer the
//! lower convex hull of (bytes, cost) over its non-input slots taken cheapest per byte first
//! (slots of one producer sharing its cost),
//! each cost capped at the layer's full recompute (a recompute of a set of slots costs their sum
//! capped so); then every layer's pieces by cost per byte. The hull lies under the fractional
//! knapsack's curve and under the cap, so it never exceeds what any set of slots costs.
class remat_envelope {
 public:
  remat_envelope(stack_spec const& stack, cost_table const& costs) {
    std::vector<remat_segment> all, items;
    std::vector<std::pair<double, double>> hull;
    for (std::uint32_t l = 0; l < stack.layer_count(); ++l) {
      auto const& slots = stack.layer(l).slots;
      auto const& c = costs.layers[l];
      double const full = std::max(0.0, c.full_recompute_us());
      bool const per_slot = c.slot_recompute_us.size() == slots.size();
      // Slots of one producer (`layer_cost::slot_producer`) share its cost, which is their
      // largest: ranked by cost, each counts what it adds to the members ranked under it, so any
      // set of them counts at most its largest member's cost, and all of them exactly that.
      bool const grouped = per_slot && c.slot_producer.size() == slots.size();
      auto const cost_at = [&](std::size_t k) { return std::max(0.0, c.slot_recompute_us[k]); };
      auto const cost_of = [&](std::size_t k) {
        if (!per_slot) return full;
        if (!grouped) return cost_at(k);
        double below = 0;
        for (std::size_t j = 0; j < slots.size(); ++j)
          if (j != k && c.slot_producer[j] == c.slot_producer[k] && !slots[j].input && slots[j].bytes > 0 &&
              (cost_at(j) < cost_at(k) || (cost_at(j) == cost_at(k) && j < k)))
            below = std::max(below, cost_at(j));
        return cost_at(k) - below;
      };
      items.clear();
      for (std::size_t k = 0; k < slots.size(); ++k)
        if (!slots[k].input && slots[k].bytes > 0) items.push_back({static_cast<double>(slots[k].bytes), cost_of(k)});
      if (items.empty()) continue;
      std::sort(items.begin(), items.end(), [](auto const& a, auto const& b) { return a.us * b.bytes < b.us * a.bytes; });
      hull.assign(1, {0.0, 0.0});
      double x = 0, y = 0;
      for (auto const& it : items) {
        x += it.bytes;
        y += it.us;
        std::pair<double, double> const p{x, std::min(y, full)};
        auto turns_left = [&] {  // the last two hull points and p turn counterclockwise
          auto const& o = hull[hull.size() - 2];
          auto const& a = hull.back();
          return (a.first - o.first) * (p.second - o.second) - (a.second - o.second) * (p.first - o.first) > 0;
        };
        while (hull.size() >= 2 && !turns_left()) hull.pop_back();
        hull.push_back(p);
      }
      for (std::size_t j = 1; j < hull.size(); ++j)
        all.push_back({hull[j].first - hull[j - 1].first, hull[j].second - hull[j - 1].second});
    }
    std::sort(all.begin(), all.end(), [](auto const& a, auto const& b) { return a.us * b.bytes < b.us * a.bytes; });
    cum_bytes_.reserve(all.size() + 1);
    cum_us_.reserve(all.size() + 1);
    cum_bytes_.push_back(0);
    cum_us_.push_back(0);
    for (auto const& s : all) {
      cum_bytes_.push_back(cum_bytes_.back() + s.bytes);
      cum_us_.push_back(cum_us_.back() + s.us);
    }
  }
  //! Bytes that can be rematerialized at all (every non-input slot).
  [[nodiscard]] double total_bytes() const noexcept { return cum_bytes_.back(); }
  //! The envelope at `bytes` (at most `total_bytes()`): recomputation no set of slots of that
  //! many bytes undercuts.
  [[nodiscard]] double us(double bytes) const noexcept {
    if (bytes <= 0) return 0;
    auto const j = static_cast<std::size_t>(std::lower_bound(cum_bytes_.begin(), cum_bytes_.end(), bytes) - cum_bytes_.begin());
    if (j >= cum_bytes_.size()) return cum_us_.back();
    auto const w = cum_bytes_[j] - cum_bytes_[j - 1];
    return cum_us_[j - 1] + (w > 0 ? (cum_us_[j] - cum_us_[j - 1]) * (bytes - cum_bytes_[j - 1]) / w : 0);
  }

 private:
  std::vector<double> cum_bytes_, cum_us_;
};

//! The least keep-all step over `strategies`' buffers, pipelines and collectives (every carry
//! stored: the fewest ops); none: the default strategy. A strategy whose keep-all does not build
//! is skipped; when none builds, the compute time.
inline double keep_all_step_us(stack_spec const& stack, cost_table const& costs, std::span<strategy const> strategies) {
  strategy const plain{};
  if (strategies.empty()) strategies = {&plain, 1};
  double best = std::numeric_limits<double>::infinity();
  schedule s;
  for (auto const& st : strategies) {
    if (try_build_schedule_into(s, stack, {.buffers = st.buffers, .pipeline = st.pipeline, .collectives = st.collectives}))
      continue;
    best = std::min(best, simulate_step_us(s, costs));
  }
  return best < std::numeric_limits<double>::infinity() ? best : costs.compute_us();
}

//! What `minimize_bound` needs besides the stack and its costs.
struct bound_inputs {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();
  double keep_all_us = 0;
};

//! The bound and where it is reached.
struct bound_point {
  double step_us = std::numeric_limits<double>::infinity();
  double recompute_us = 0;
  double link_us = 0;
  std::size_t host_bytes = 0;
  std::size_t remat_bytes = 0;
};

//! Minimizes, over the offloaded bytes H and the rematerialized bytes M, the largest of:
//! - the keep-all step;
//! - the compute time plus the envelope at M, where M >= total - device budget - H (what
//!   leaves the device at the turn goes to the host or is rematerialized);
//! - the first layer's forward and backward plus H over the link, in each direction (both in
//!   turn on a shared link);
//! - the same with both directions in turn: at the turn (the last forward's end) the device
//!   holds the kept bytes K plus every offloaded slot still copying out or already copying back,
//!   within the budget, so all but `device budget - K` of H crossed before the turn and all but
//!   that crosses after it: f0 + b0 + H (d + h) - max(d, h) (device budget - K), K = total - H - M.
//! H runs over 1024 intervals; in each the terms are taken at the interval's ends that make them
//! least, so the result is below the minimum over every H; within one, M by bisection (the
//! envelope grows with M, the last term shrinks).
inline bound_point minimize_bound(stack_spec const& stack, cost_table const& costs, bound_inputs const& in) {
  bound_point r;
  auto const L = stack.layer_count();
  if (L == 0) {
    r.step_us = in.keep_all_us;
    return r;
  }
  remat_envelope const env(stack, costs);
  double total = 0;
  for (std::uint32_t l = 0; l < L; ++l)
    for (auto const& s : stack.layer(l).slots) total += static_cast<double>(s.bytes);
  double const device = static_cast<double>(in.device_budget);
  double const host = static_cast<double>(in.host_budget);
  auto const per_byte_us = [](link_direction const& m) { return m.bytes_per_second > 0 ? 1e6 / m.bytes_per_second : 0.0; };
  double const d2h = per_byte_us(costs.link.d2h), h2d = per_byte_us(costs.link.h2d), slower = std::max(d2h, h2d);
  double const one_way = costs.link.full_duplex ? slower : d2h + h2d;  // per byte offloaded, one direction's time
  double const compute = costs.compute_us();
  double const ends = costs.layers[0].forward_us + costs.layers[0].backward_us;
  double const lo = std::max(0.0, total - device - env.total_bytes()), hi = std::min(host, total);
  if (lo > hi) return r;  // the inputs alone exceed both budgets: nothing fits
  auto const recompute = [&](double m) { return compute + env.us(m); };
  // Both directions in turn, at offloaded bytes h and rematerialized bytes m (h's share of
  // d + h - max(d, h) is never negative, so the least h of an interval is the least term).
  auto const in_turn = [&](double h, double m) { return ends + h * (d2h + h2d - slower) - slower * (device - total + m); };
  constexpr int intervals = 1024;
  for (int i = 0; i < intervals; ++i) {
    double const a = lo + (hi - lo) * i / intervals, b = i + 1 == intervals ? hi : lo + (hi - lo) * (i + 1) / intervals;
    double const m_lo = std::max(0.0, total - device - b), m_hi = std::min(env.total_bytes(), total - a);
    if (m_lo > m_hi) continue;
    double const base = std::max(in.keep_all_us, ends + one_way * a);
    if (base >= r.step_us) continue;
    double m = m_lo, value = 0;
    if (recompute(m_lo) >= in_turn(a, m_lo)) {
      value = recompute(m_lo);
    } else if (recompute(m_hi) < in_turn(a, m_hi)) {
      m = m_hi;
      value = in_turn(a, m_hi);
    } else {
      double x = m_lo, y = m_hi;  // recompute(x) < in_turn(x); recompute(y) >= in_turn(y)
      for (int k = 0; k < 100; ++k) {
        auto const mid = x + (y - x) / 2;
        if (mid <= x || mid >= y) break;
        (recompute(mid) < in_turn(a, mid) ? x : y) = mid;
      }
      // Below x the last term is at least in_turn(x) > recompute(x); above y the envelope term
      // at least recompute(y) >= in_turn(y); between them, at least both recompute(x) and in_turn(y).
      m = x;
      value = std::max(recompute(x), in_turn(a, y));
    }
    value = std::max(base, value);
    if (value < r.step_us) {
      r.step_us = value;
      r.host_bytes = static_cast<std::size_t>(a);
      r.remat_bytes = static_cast<std::size_t>(m);
      r.recompute_us = env.us(m);
      r.link_us = std::max({one_way * a, in_turn(a, m) - ends, 0.0});
    }
  }
  return r;
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
