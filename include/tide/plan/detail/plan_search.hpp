#pragma once
//! \file
//! The planner's search (`make_plan` in planner.hpp calls it): the exact branch and bound, the
//! heuristic's orders of moves and its local searches. See planner.hpp for what each does.

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

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/build.hpp>
#include <tide/plan/lower_bound.hpp>
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
    best_.smallest_device_bytes = std::numeric_limits<std::size_t>::max();
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
    best_.smallest_device_bytes = std::min(best_.smallest_device_bytes, dev);
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
      best_.device_bytes = dev;
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
    best_.smallest_device_bytes = std::min(best_.smallest_device_bytes, s.peak_device_bytes());
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
  void exact() {
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
    auto const per_byte_us = [](link_model const& m) { return m.bytes_per_second > 0 ? 1e6 / m.bytes_per_second : 0.0; };
    link_us_per_byte_ = costs_.link.full_duplex ? std::max(per_byte_us(costs_.link.d2h), per_byte_us(costs_.link.h2d))
                                                : per_byte_us(costs_.link.d2h) + per_byte_us(costs_.link.h2d);
    branch(d, 0, 0, 0);
    std::vector<point> seeds;
    add_seeds(seeds);  // a seed's own pipeline may be none of the candidates
    best_.exact = true;
  }

  // ---- heuristic ---------------------------------------------------------------------------
  //! With a host cap, the plan made as if there were none stands when its host bytes fit the
  //! cap, so a cap that does not bind never makes the answer worse. Otherwise the cap binds: the
  //! search runs again with it (offloads are taken while the host bytes fit), starting from the
  //! fastest candidate of the first run that fit the cap.
  void heuristic() {
    auto const cap = opt_.host_budget;
    if (cap == std::numeric_limits<std::size_t>::max()) return heuristic_pass({});
    opt_.host_budget = std::numeric_limits<std::size_t>::max();
    held_cap_ = cap;  // meanwhile `evaluate` holds the fastest candidate within the cap
    heuristic_pass({});
    opt_.host_budget = cap;
    held_cap_ = std::numeric_limits<std::size_t>::max();
    if (best_.fits && best_.host_bytes <= cap) return;
    auto const evaluations = best_.evaluations, smallest = best_.smallest_device_bytes;
    best_ = plan{};
    by_pipeline_.assign(pipelines_.size(), point{});
    best_.evaluations = evaluations;
    best_.smallest_device_bytes = smallest;
    best_.step_us = std::numeric_limits<double>::infinity();
    std::vector<point> starts;
    add_seeds(starts);
    if (held_.t < std::numeric_limits<double>::infinity()) {
      evaluate(held_.d, held_.pc);
      starts.push_back(std::move(held_));
    }
    heuristic_pass(std::move(starts));
  }

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
    if (best_.fits) best_.smallest_device_bytes = std::min(best_.smallest_device_bytes, best_.device_bytes);
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
  void branch(std::vector<placement>& d, std::size_t i, std::size_t kept, std::size_t host) {
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

  //! The step of `d` on the fastest candidate pipeline, whatever its peak (not a plan: the
  //! exact search's bound for the completions of a prefix).
  double relaxed_step_us(std::vector<placement> const& d) {
    auto const pol = policy_from_decisions(stack_, d);
    double t = std::numeric_limits<double>::infinity();
    schedule s;
    for (auto const& pc : opt_.candidates)
      if (!try_build_schedule_into(s, stack_, with_policy(pc, pol))) t = std::min(t, simulate_step_us(s, costs_));
    return t;
  }

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
  void local_search(point p) {
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
  void class_search(point p) {
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
    return costs_.link.h2d.seconds(stack_.layer(slots_[i].layer).slots[slots_[i].slot].bytes) * 1e6;
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
  std::vector<move> greedy_order(std::vector<std::uint32_t> const& pool, bool offload_too, host_room room) const {
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
  void heuristic_pass(std::vector<point> starts) {
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
        auto const o = link.d2h.seconds(slots[k].bytes) * 1e6, p = link.h2d.seconds(slots[k].bytes) * 1e6;
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
          auto const oc = link.d2h.seconds(b) * 1e6, pc = link.h2d.seconds(b) * 1e6;
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

  //! Kicks (iterated local search): from `from()`, two or three decisions changed at random (a
  //! fixed seed: plans are reproducible), then the descent again; escapes optima that only a
  //! three-decision move leaves.
  template <class From>
  void kicks(std::mt19937& rng, std::size_t count, std::size_t evaluations, From from) {
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

inline plan plan_slots(stack_spec const& stack, cost_table const& costs, plan_options const& opt) {
  detail::plan_search search(stack, costs, opt);
  bool const exact = opt.method == plan_method::exact ||
                     (opt.method == plan_method::automatic && search.decisions() <= opt.exact_max_decisions);
  if (exact) search.exact();
  else search.heuristic();
  return search.result();
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
