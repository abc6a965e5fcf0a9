#pragma once
//! \file
//! The planner's search state (plan/detail/plan_search.hpp): the stack's decisions, the
//! evaluation every search shares (build, simulate, keep the fastest plan that fits, per pipeline
//! too) and the searches, each defined in a header of its own: `exact_search.hpp`,
//! `heuristic_search.hpp`, `local_search.hpp` and `class_search.hpp`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/build.hpp>
#include <tide/plan/plan.hpp>
#include <tide/plan/policy_codegen.hpp>
#include <tide/plan/simulate.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

class plan_search {
 public:
  plan_search(stack_spec const& stack, cost_table const& costs, plan_options const& opt)
      : stack_(stack), costs_(costs), opt_(opt) {
    costs_.check_against(stack_);
    if (opt_.candidates.empty()) opt_.candidates = default_candidates(stack_);
    pipelines_ = opt_.candidates;
    by_pipeline_.resize(pipelines_.size());
    auto const L = stack_.layer_count();
    for (std::uint32_t l = 0; l < L; ++l) {
      first_.push_back(slots_.size());
      for (std::size_t k = 0; k < stack_.layer(l).slots.size(); ++k) slots_.push_back({l, static_cast<std::uint32_t>(k)});
    }
    best_.smallest_activation_bytes = std::numeric_limits<std::size_t>::max();
    best_.step_us = std::numeric_limits<double>::infinity();
  }

  std::size_t decisions() const noexcept { return slots_.size(); }

  //! False for a layer's input slot (`slot_spec::input`): its recompute reads it, so it is kept
  //! or offloaded, never rematerialized.
  bool remat_ok(std::size_t i) const noexcept { return !stack_.layer(slots_[i].layer).slots[slots_[i].slot].input; }
  bool runnable(std::vector<placement> const& d) const noexcept {
    for (std::size_t i = 0; i < d.size(); ++i)
      if (d[i] == placement::remat && !remat_ok(i)) return false;
    return true;
  }

  //! The candidate's buffers, pipeline and collectives with `p` as the policy.
  static tide::strategy with_policy(tide::strategy const& candidate, policy_spec p) {
    auto r = candidate;
    r.policy = std::move(p);
    return r;
  }

  //! Builds and (when it fits) simulates one candidate; updates the best plan.
  double evaluate(std::vector<placement> const& d, strategy const& pc, std::size_t* peak = nullptr) {
    if (!runnable(d)) {
      if (peak) *peak = std::numeric_limits<std::size_t>::max();
      return std::numeric_limits<double>::infinity();
    }
    auto const pol = policy_from_decisions(stack_, d);
    auto const how = with_policy(pc, pol);
    schedule s;
    if (try_build_schedule_into(s, stack_, how)) {  // e.g. too many ops: cannot be a plan
      if (peak) *peak = std::numeric_limits<std::size_t>::max();
      return std::numeric_limits<double>::infinity();
    }
    ++best_.evaluations;
    auto const dev = s.peak_device_bytes();
    if (peak) *peak = dev;
    best_.smallest_activation_bytes = std::min(best_.smallest_activation_bytes, dev);
    if (dev > opt_.device_budget || s.peak_host_bytes() > opt_.host_budget) return std::numeric_limits<double>::infinity();
    auto const t = simulate_step_us(s, costs_);
    if (held_cap_ != std::numeric_limits<std::size_t>::max() && s.peak_host_bytes() <= held_cap_ && t < held_.t)
      held_ = {d, pc, t};
    for (std::size_t k = 0; k < pipelines_.size(); ++k)  // the fastest per pipeline
      if (pipelines_[k].pipeline == pc.pipeline && pipelines_[k].buffers == pc.buffers) {
        if (t < by_pipeline_[k].t) by_pipeline_[k] = {d, pc, t};
        break;
      }
    if (t < best_.step_us) {
      best_.fits = true;
      best_.step_us = t;
      best_.decisions = d;
      best_.strategy = how;
      best_.activation_bytes = dev;
      best_.host_bytes = s.peak_host_bytes();
    }
    return t;
  }
  //! The device peak only (no simulation).
  std::size_t peak_of(std::vector<placement> const& d, strategy const& pc, std::size_t* host = nullptr) {
    if (!runnable(d)) return std::numeric_limits<std::size_t>::max();
    schedule s;
    if (try_build_schedule_into(s, stack_, with_policy(pc, policy_from_decisions(stack_, d))))
      return std::numeric_limits<std::size_t>::max();
    ++best_.evaluations;
    best_.smallest_activation_bytes = std::min(best_.smallest_activation_bytes, s.peak_device_bytes());
    if (host) *host = s.peak_host_bytes();
    return s.peak_device_bytes();
  }
  //! Every pipeline when `d` offloads something, else the first hiding one (they coincide).
  double evaluate_all_pipelines(std::vector<placement> const& d) {
    bool const any_offload = std::find(d.begin(), d.end(), placement::offload) != d.end();
    if (!any_offload) return evaluate(d, opt_.candidates.front());
    double t = std::numeric_limits<double>::infinity();
    for (auto const& pc : opt_.candidates) t = std::min(t, evaluate(d, pc));
    return t;
  }

  // ---- exact -------------------------------------------------------------------------------
  void exact();  // exact_search.hpp

  // ---- heuristic ---------------------------------------------------------------------------
  //! With a host cap, the plan made as if there were none stands when its host bytes fit the
  //! cap, so a cap that does not bind never makes the answer worse. Otherwise the cap binds: the
  //! search runs again with it (offloads are taken while the host bytes fit), starting from the
  //! fastest candidate of the first run that fit the cap.
  void heuristic();  // heuristic_search.hpp

  plan result() {
    if (!best_.fits) {
      // Nothing fit: report the smallest peak of the extremes too (everything rematted, or
      // everything offloaded with each pipeline), so the answer says how far off the budget is.
      std::vector<placement> all(slots_.size(), placement::remat);
      for (std::size_t i = 0; i < all.size(); ++i)
        if (!remat_ok(i)) all[i] = placement::keep;  // an input slot: kept (the offload extreme is below)
      peak_of(all, opt_.candidates.front());
      std::fill(all.begin(), all.end(), placement::offload);
      for (auto const& pc : opt_.candidates) peak_of(all, pc);
    }
    if (best_.fits) best_.smallest_activation_bytes = std::min(best_.smallest_activation_bytes, best_.activation_bytes);
    else {
      best_.step_us = 0;
      best_.decisions.clear();
    }
    return best_;
  }

 private:
  struct slot_ref {
    std::uint32_t layer, slot;
  };

  //! `kept`: the kept bytes (aligned) of decisions 0..i-1; `host`: their offloaded bytes.
  void branch(std::vector<placement>& d, std::size_t i, std::size_t kept, std::size_t host);  // exact_search.hpp

  //! The step of `d` on the fastest candidate pipeline, whatever its peak (not a plan: the
  //! exact search's bound for the completions of a prefix).
  double relaxed_step_us(std::vector<placement> const& d);  // exact_search.hpp

  //! A candidate and its simulated step time.
  struct point {
    std::vector<placement> d;
    strategy pc;
    double t = std::numeric_limits<double>::infinity();
  };

  //! Steepest-descent local search from `p` (a candidate that fits), while the evaluation budget
  //! lasts. Moves: one decision; the decisions of a group (a layer's slots, or a slot name's in
  //! every layer) with one action turned to another: a layer's recompute is capped at one full
  //! recompute, so rematting its slots together can pay where one at a time does not; two slot
  //! names set in every layer; two groups changed at once, trading kept bytes; two layers of a
  //! type swapped, or one copied onto the other (the rings and the scratch take the largest
  //! layer, and which layers offload decides what overlaps); two decisions at once, in one layer
  //! or trading kept bytes across layers. A move that touches an offload tries every pipeline.
  void local_search(point p);  // local_search.hpp

  struct move {
    std::uint32_t slot;
    placement action;
  };

  //! Local search for large stacks, first improvement, every candidate built and simulated whole
  //! (about 70 us for 61 x 11 decisions). Its moves act on classes: a layer type's slot in every
  //! layer of that type (real stacks repeat a few types). A class's members with one action
  //! turn to another: all of them, or the first or last 1, 2, 4, ... of them by layer (a split
  //! point moves, or the ends of the stack become exceptions); each decision of the first two and
  //! last three layers alone (the prefetch window's ends); and, when no such move pays, pairs of
  //! one-member moves that trade device or host bytes, ranked by the recomputation they save
  //! (an estimate: the best few are built and simulated). The pipeline is the start's; the
  //! result is tried with every candidate at the end.
  void class_search(point p);  // class_search.hpp

  double bytes_of(std::uint32_t i) const {
    return static_cast<double>(std::max<std::size_t>(stack_.layer(slots_[i].layer).slots[slots_[i].slot].bytes, 1));
  }
  //! The recompute time of slot `i` alone (a full recompute when the table has no slot costs).
  double recompute_of(std::uint32_t i) const {
    auto const& c = costs_.layers[slots_[i].layer];
    return c.slot_recompute_us.empty() ? c.full_recompute_us() : c.slot_recompute_us[slots_[i].slot];
  }
  //! The prefetch time of slot `i`, as if nothing hid it.
  double exposed_of(std::uint32_t i) const {
    return costs_.link.h2d.time_us(stack_.layer(slots_[i].layer).slots[slots_[i].slot].bytes);
  }

  //! The pinned host bytes left under the cap, as a pipeline's buffers align host regions.
  struct host_room {
    plan_search const* search;
    std::size_t alignment;
    std::size_t left;
    std::size_t bytes(std::uint32_t i) const {
      return align_up(search->stack_.layer(search->slots_[i].layer).slots[search->slots_[i].slot].bytes, alignment);
    }
    bool fits(std::uint32_t i) const { return bytes(i) <= left; }
    //! Takes slot i's bytes; true when the cap is finite (so what fits may have changed).
    bool take(std::uint32_t i) {
      if (left == std::numeric_limits<std::size_t>::max()) return false;
      left -= bytes(i);
      return true;
    }
  };

  //! The slots of `pool` in the order a greedy takes them: at each step the move with the least
  //! added time per byte saved, given what each layer already recomputes. A layer's recompute
  //! costs the sum of its rematted slots' costs capped at one full recompute, so once a layer
  //! recomputes its other slots come cheap or free: the candidates are each slot alone (remat,
  //! or with `offload_too` an exposed offload where that is cheaper) and the rest of a layer's
  //! pool slots rematted together.
  std::vector<move> greedy_order(std::vector<std::uint32_t> const& pool, bool offload_too,
                                 host_room room) const;  // heuristic_search.hpp

  //! The seeds' decisions, each evaluated with its own buffers and pipeline and with every
  //! candidate's, as starts.
  void add_seeds(std::vector<point>& starts) {
    for (auto const& seed : opt_.seeds) {
      schedule s;
      if (try_build_schedule_into(s, stack_, seed)) continue;  // a seed that does not build is no start
      std::vector<placement> d(slots_.size());
      for (std::size_t i = 0; i < d.size(); ++i) d[i] = s.slots[i].where;
      if (auto const t = evaluate(d, seed); t < std::numeric_limits<double>::infinity()) starts.push_back({d, seed, t});
      for (auto const& pc : opt_.candidates)
        if (auto const t = evaluate(d, pc); t < std::numeric_limits<double>::infinity()) starts.push_back({d, pc, t});
    }
  }

  //! One run of the heuristic under `opt_`; `starts`: candidates the local search also starts from.
  void heuristic_pass(std::vector<point> starts);  // heuristic_search.hpp

  //! Kicks (iterated local search): from `from()`, two or three decisions changed at random (a
  //! fixed seed: plans are reproducible), then the descent again; escapes optima that only a
  //! three-decision move leaves.
  template <class From>
  void kicks(std::mt19937& rng, std::size_t count, std::size_t evaluations, From from);  // local_search.hpp

  stack_spec const& stack_;
  cost_table const& costs_;
  plan_options opt_;
  std::vector<slot_ref> slots_;
  std::vector<std::size_t> first_;  // index of each layer's first slot in slots_
  std::unique_ptr<bool[]> remat_flags_;
  double base_us_ = 0;
  double keep_all_us_ = 0, ends_us_ = 0, link_us_per_byte_ = 0;  // the exact search's bound terms
  std::size_t alignment_ = 1;            // the smallest device alignment of the pipelines
  std::vector<std::size_t> layer_bytes_;  // per layer: rematted, offloaded bytes (exact search)
  std::size_t held_cap_ = std::numeric_limits<std::size_t>::max();
  point held_;  // the fastest candidate evaluated within held_cap_
  std::vector<strategy> pipelines_;  // the candidate pipelines (opt_.candidates may be one of them)
  std::vector<point> by_pipeline_;   // per pipeline: the fastest plan evaluated with it
  std::size_t evaluation_limit_ = 0;  // the local search stops building schedules here
  plan best_;
};

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
