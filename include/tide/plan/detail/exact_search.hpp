#pragma once
//! \file
//! The planner's exact search (planner.hpp): branch and bound over the decisions, from the
//! heuristic's plan as the incumbent, each complete assignment simulated with every pipeline.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include <tide/plan/detail/heuristic_search.hpp>
#include <tide/plan/detail/search_state.hpp>
#include <tide/plan/detail/lower_bound.hpp>  // keep_all_step_us (plan/lower_bound.hpp shows it only with its definitions)
#include <tide/plan/lower_bound.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

inline void plan_search::exact() {
  // The heuristic's plan first: an incumbent from the start prunes most of the tree.
  heuristic();
  std::vector<placement> d(slots_.size(), placement::keep);
  base_us_ = costs_.compute_us();
  remat_flags_.reset(new bool[slots_.size()]());
  alignment_ = opt_.candidates.front().buffers.device_alignment;
  for (auto const& pc : opt_.candidates) alignment_ = std::min(alignment_, pc.buffers.device_alignment);
  layer_bytes_.assign(2 * stack_.layer_count(), 0);
  keep_all_us_ = keep_all_step_us(stack_, costs_, opt_.candidates);
  if (stack_.layer_count() > 0) ends_us_ = costs_.layers[0].forward_us + costs_.layers[0].backward_us;
  auto const per_byte_us = [](link_direction const& m) { return m.bytes_per_second > 0 ? 1e6 / m.bytes_per_second : 0.0; };
  link_us_per_byte_ = costs_.link.full_duplex ? std::max(per_byte_us(costs_.link.d2h), per_byte_us(costs_.link.h2d))
                                              : per_byte_us(costs_.link.d2h) + per_byte_us(costs_.link.h2d);
  branch(d, 0, 0, 0);
  std::vector<point> seeds;
  add_seeds(seeds);  // a seed's own pipeline may be none of the candidates
  best_.exact = true;
}

inline void plan_search::branch(std::vector<placement>& d, std::size_t i, std::size_t kept, std::size_t host) {
  if (i == slots_.size()) {
    evaluate_all_pipelines(d);
    return;
  }
  auto const l = slots_[i].layer, k = slots_[i].slot;  // (not a structured binding: lambdas capture l)
  auto const bytes = stack_.layer(l).slots[k].bytes;
  auto const region = align_up(bytes, alignment_);  // at most what any pipeline's arena takes
  // What every completion steps at least (lower_bound.hpp): the keep-all step, the compute
  // plus the recomputes chosen so far, the offloads chosen so far over the link.
  auto const lb = [&](std::size_t offloaded) {
    double t = base_us_;
    for (std::uint32_t m = 0; m < stack_.layer_count(); ++m) {
      std::span<bool const> f(remat_flags_.get() + first_[m], stack_.layer(m).slots.size());
      if (std::find(f.begin(), f.end(), true) != f.end()) t += costs_.layers[m].recompute_time_us(f);
    }
    return std::max({t, keep_all_us_, ends_us_ + link_us_per_byte_ * static_cast<double>(offloaded)});
  };
  // The device arena holds the kept slots, the remat scratch (the most any layer rematerializes)
  // and the offload or staging ring (at least the most any layer offloads).
  auto const transient = [&] {
    std::size_t r = 0, o = 0;
    for (std::uint32_t m = 0; m <= l; ++m) r = std::max(r, layer_bytes_[2 * m]), o = std::max(o, layer_bytes_[2 * m + 1]);
    return r + o;
  };
  for (auto action : {placement::keep, placement::offload, placement::remat}) {
    if (action == placement::remat && !remat_ok(i)) continue;
    d[i] = action;
    if (action == placement::remat) remat_flags_[first_[l] + k] = true;
    auto& layer_bytes = layer_bytes_[2 * l + (action == placement::offload)];
    if (action != placement::keep) layer_bytes += region;
    auto const kept2 = kept + (action == placement::keep ? region : 0);
    auto const host2 = host + (action == placement::offload ? bytes : 0);
    // Prune: the kept bytes and the transient regions chosen so far exceed the budget, the
    // offloaded bytes the host cap, or the compute and recomputes chosen so far already take
    // as long as the best plan.
    // After an offload, also the step of this prefix with everything after it kept (any
    // completion only adds ops and waits to that program, and the sim never makes more work
    // faster), on the pipeline that makes it fastest.
    if (kept2 + transient() <= opt_.device_budget && host2 <= opt_.host_budget && lb(host2) < best_.step_us &&
        (action != placement::offload || i + 1 == slots_.size() || relaxed_step_us(d) < best_.step_us))
      branch(d, i + 1, kept2, host2);
    if (action != placement::keep) layer_bytes -= region;
    if (action == placement::remat) remat_flags_[first_[l] + k] = false;
  }
  d[i] = placement::keep;
}

inline double plan_search::relaxed_step_us(std::vector<placement> const& d) {
  auto const pol = policy_from_decisions(stack_, d);
  double t = std::numeric_limits<double>::infinity();
  schedule s;
  for (auto const& pc : opt_.candidates)
    if (!try_build_schedule_into(s, stack_, with_policy(pc, pol))) t = std::min(t, simulate_step_us(s, costs_));
  return t;
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
