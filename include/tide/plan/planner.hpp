#pragma once
//! \file The planner: chooses keep, offload or remat for every (layer, slot) and the pipeline
//! parameters (prefetch distance, chunk size, staging buffers), minimizing the simulated step
//! time while the schedule's device peak fits the budget (and its host bytes the host cap).
//!
//! - Exact (small instances): branch and bound over the decisions, each complete assignment
//!   evaluated in the sim with every pipeline candidate. Bounds: the step is at least the
//!   compute time plus the recomputes already chosen; the device peak is at least the bytes
//!   already kept.
//! - Heuristic (large instances): offload first the slots whose transfers hide behind the
//!   compute between their production and their use (per layer, largest first, up to what the
//!   link carries in the neighbouring layer's forward and backward), then recompute by bytes
//!   saved per microsecond of recompute, or offload exposed where that costs less; for each such
//!   ordering of moves, binary-search the shortest prefix that fits, simulate it with every
//!   pipeline candidate, keep the fastest; on small instances finish with a local search.
//!
//! The result is a run-time policy value (`policy_spec` plus `pipeline_spec` and `buffer_spec`)
//! that builds a schedule directly; `to_cpp_types` prints it as `tide::policy<...>` types.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <numeric>
#include <string>
#include <vector>

#include <tide/backends/sim/sim_backend.hpp>
#include <tide/core/schedule.hpp>
#include <tide/plan/cost_model.hpp>

namespace tide {

//! A pipeline and the buffers that go with it: one point of the planner's search.
struct pipeline_choice {
  pipeline_spec pipeline{};
  buffer_spec buffers{};
};

//! Pipeline candidates for `stack`: copies on the compute stream (least memory), latency hiding
//! with one, two and three staging buffers (prefetch distance 0, 1, 2), and the deepest of those
//! with copies chunked (`chunk_bytes`, 0: a quarter of the largest slot).
inline std::vector<pipeline_choice> default_pipeline_choices(stack_spec const& stack, std::size_t chunk_bytes = 0) {
  std::size_t largest = 0;
  for (auto const& t : stack.types)
    for (auto const& s : t.slots) largest = std::max(largest, s.bytes);
  if (chunk_bytes == 0) chunk_bytes = std::max<std::size_t>(align_up(largest / 4, 4096), 4096);
  auto const L = stack.layer_count();
  auto dist = [&](std::uint32_t d) { return std::min<std::uint32_t>(d, L == 0 ? 0 : L - 1); };
  std::vector<pipeline_choice> r;
  auto add = [&](pipeline_spec p, std::uint32_t staging) {
    buffer_spec b;
    b.staging_buffers = staging;
    r.push_back({p, b});
  };
  add({false, 0, 0, 1}, 1);
  add({true, dist(0), 0, 1}, 1);
  add({true, dist(1), 0, 2}, 2);
  add({true, dist(2), 0, 2}, 3);
  add({true, dist(2), chunk_bytes, 2}, 3);
  return r;
}

enum class plan_method : std::uint8_t {
  automatic,  //!< exact up to `exact_max_decisions`, heuristic above
  exact,
  heuristic,
};

struct plan_options {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();
  plan_method method = plan_method::automatic;
  std::size_t exact_max_decisions = 10;  //!< (layer, slot) pairs up to which `automatic` is exact
  std::size_t local_search_max_decisions = 64;  //!< the heuristic's local search runs up to this size
  std::vector<pipeline_choice> pipelines;  //!< empty: `default_pipeline_choices`
};

//! A planner's answer.
struct plan {
  bool fits = false;                 //!< false: nothing found fits; see `smallest_device_bytes`
  std::vector<placement> decisions;  //!< per (layer, slot), layers in order, slots in type order
  policy_spec policy;
  pipeline_spec pipeline;
  buffer_spec buffers;
  double step_us = 0;                //!< simulated step time
  std::size_t device_bytes = 0;      //!< the schedule's device peak
  std::size_t host_bytes = 0;        //!< the schedule's pinned host bytes
  std::size_t smallest_device_bytes = 0;  //!< when it does not fit: the smallest peak reached
  std::size_t evaluations = 0;       //!< schedules built
  bool exact = false;                //!< found by the exact search

  //! The schedule of this plan for `stack` (the stack it was planned for).
  schedule build(stack_spec const& stack) const { return build_schedule(stack, policy, buffers, pipeline); }
};

// ---------------------------------------------------------------------------------------------
// Decisions -> policy

//! The fewest rules (per slot name: maximal layer ranges; rules with the same action and range
//! merged) whose first-match decisions equal `decisions`.
inline policy_spec policy_from_decisions(stack_spec const& stack, std::vector<placement> const& decisions) {
  auto const L = stack.layer_count();
  std::vector<std::size_t> first(L + 1, 0);
  for (std::uint32_t l = 0; l < L; ++l) first[l + 1] = first[l] + stack.layer(l).slots.size();
  if (decisions.size() != first[L])
    throw schedule_error("tide: " + std::to_string(decisions.size()) + " decisions given for a stack with " +
                         std::to_string(first[L]) + " (layer, slot) pairs");
  std::vector<std::string_view> names;
  for (auto const& t : stack.types)
    for (auto const& s : t.slots)
      if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
  auto decision_of = [&](std::uint32_t l, std::string_view n, placement& out) {
    auto const& slots = stack.layer(l).slots;
    for (std::size_t k = 0; k < slots.size(); ++k)
      if (slots[k].name == n) return out = decisions[first[l] + k], true;
    return false;
  };
  policy_spec p;
  for (auto action : {placement::offload, placement::remat})
    for (auto n : names) {
      std::uint32_t l = 0;
      while (l < L) {
        placement d{};
        if (!decision_of(l, n, d) || d != action) {
          ++l;
          continue;
        }
        auto const begin = l;
        auto end = l + 1;  // one past the last matching layer
        for (auto k = l + 1; k < L; ++k) {
          placement dk{};
          if (!decision_of(k, n, dk)) continue;  // a layer without the slot does not break the run
          if (dk != action) break;
          end = k + 1;
        }
        auto const last = end == L ? all_layers : end;
        auto it = std::find_if(p.rules.begin(), p.rules.end(), [&](rule_spec const& r) {
          return r.action == action && r.first_layer == begin && r.last_layer == last;
        });
        if (it == p.rules.end()) p.rules.push_back({action, {n}, begin, last, 0});
        else it->slots.push_back(n);
        l = end;
      }
    }
  return p;
}

//! The plan as C++ types, for users who want the schedule fixed at compile time.
inline std::string to_cpp_types(plan const& p, std::string_view prefix = "planned") {
  std::string r = "using " + std::string(prefix) + "_policy = tide::policy<";
  for (std::size_t i = 0; i < p.policy.rules.size(); ++i) {
    auto const& rule = p.policy.rules[i];
    r += i == 0 ? "\n    " : ",\n    ";
    r += "tide::" + std::string(to_string(rule.action)) + "<tide::slots<";
    for (std::size_t k = 0; k < rule.slots.size(); ++k) r += (k ? ", \"" : "\"") + std::string(rule.slots[k]) + "\"";
    r += ">, tide::layers<" + std::to_string(rule.first_layer);
    if (rule.last_layer != all_layers) r += ", " + std::to_string(rule.last_layer);
    r += ">>";
  }
  r += ">;\n";
  auto const& pl = p.pipeline;
  r += "using " + std::string(prefix) + "_pipeline = tide::pipeline<" + (pl.latency_hiding ? "true" : "false") + ", " +
       std::to_string(pl.prefetch_distance) + ", " + std::to_string(pl.chunk_bytes) + ", " +
       std::to_string(pl.max_offloads_in_flight) + ">;\n";
  r += "using " + std::string(prefix) + "_buffers = tide::buffers<tide::staging_ring<" +
       std::to_string(p.buffers.staging_buffers) + ">>;\n";
  return r;
}

// ---------------------------------------------------------------------------------------------
// The planner

namespace detail {

class plan_search {
 public:
  plan_search(stack_spec const& stack, cost_table const& costs, plan_options const& opt)
      : stack_(stack), costs_(costs), opt_(opt) {
    costs_.check_against(stack_);
    if (opt_.pipelines.empty()) opt_.pipelines = default_pipeline_choices(stack_);
    auto const L = stack_.layer_count();
    for (std::uint32_t l = 0; l < L; ++l) {
      first_.push_back(slots_.size());
      for (std::size_t k = 0; k < stack_.layer(l).slots.size(); ++k) slots_.push_back({l, static_cast<std::uint32_t>(k)});
    }
    best_.smallest_device_bytes = std::numeric_limits<std::size_t>::max();
    best_.step_us = std::numeric_limits<double>::infinity();
  }

  std::size_t decisions() const noexcept { return slots_.size(); }

  //! Builds and (when it fits) simulates one candidate; updates the best plan.
  double evaluate(std::vector<placement> const& d, pipeline_choice const& pc, std::size_t* peak = nullptr) {
    auto const pol = policy_from_decisions(stack_, d);
    auto const s = build_schedule(stack_, pol, pc.buffers, pc.pipeline);
    ++best_.evaluations;
    auto const dev = s.peak_device_bytes();
    if (peak) *peak = dev;
    best_.smallest_device_bytes = std::min(best_.smallest_device_bytes, dev);
    if (dev > opt_.device_budget || s.peak_host_bytes() > opt_.host_budget) return std::numeric_limits<double>::infinity();
    auto const t = simulate_step_us(s, costs_);
    if (t < best_.step_us) {
      best_.fits = true;
      best_.step_us = t;
      best_.decisions = d;
      best_.policy = pol;
      best_.pipeline = pc.pipeline;
      best_.buffers = pc.buffers;
      best_.device_bytes = dev;
      best_.host_bytes = s.peak_host_bytes();
    }
    return t;
  }
  //! The device peak only (no simulation).
  std::size_t peak_of(std::vector<placement> const& d, pipeline_choice const& pc, std::size_t* host = nullptr) {
    auto const s = build_schedule(stack_, policy_from_decisions(stack_, d), pc.buffers, pc.pipeline);
    ++best_.evaluations;
    best_.smallest_device_bytes = std::min(best_.smallest_device_bytes, s.peak_device_bytes());
    if (host) *host = s.peak_host_bytes();
    return s.peak_device_bytes();
  }
  //! Every pipeline when `d` offloads something, else the first hiding one (they coincide).
  double evaluate_all_pipelines(std::vector<placement> const& d) {
    bool const any_offload = std::find(d.begin(), d.end(), placement::offload) != d.end();
    if (!any_offload) return evaluate(d, opt_.pipelines.front());
    double t = std::numeric_limits<double>::infinity();
    for (auto const& pc : opt_.pipelines) t = std::min(t, evaluate(d, pc));
    return t;
  }

  // ---- exact -------------------------------------------------------------------------------
  void exact() {
    std::vector<placement> d(slots_.size(), placement::keep);
    base_us_ = costs_.compute_us();
    remat_flags_.reset(new bool[slots_.size()]());
    branch(d, 0, 0);
    best_.exact = true;
  }

  // ---- heuristic ---------------------------------------------------------------------------
  void heuristic() {
    auto const n = slots_.size();
    std::vector<placement> keep(n, placement::keep);
    if (evaluate(keep, opt_.pipelines.front()) < std::numeric_limits<double>::infinity()) return;  // keep-all fits: fastest

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
    struct move {
      std::uint32_t slot;
      placement action;
    };
    std::vector<move> hidden_moves;  // round-robin over layers: every layer's largest first
    for (std::size_t r = 0;; ++r) {
      bool any = false;
      for (std::uint32_t l = 0; l < L; ++l)
        if (r < hidden[l].size()) hidden_moves.push_back({hidden[l][r], placement::offload}), any = true;
      if (!any) break;
    }
    auto bytes_of = [&](std::uint32_t i) { return static_cast<double>(stack_.layer(slots_[i].layer).slots[slots_[i].slot].bytes); };
    auto recompute_of = [&](std::uint32_t i) {
      auto const& c = costs_.layers[slots_[i].layer];
      return c.slot_recompute_us.empty() ? c.full_recompute_us() : c.slot_recompute_us[slots_[i].slot];
    };
    auto exposed_of = [&](std::uint32_t i) { return link.h2d.seconds(static_cast<std::size_t>(bytes_of(i))) * 1e6; };
    std::vector<std::uint32_t> rest;
    for (std::uint32_t i = 0; i < n; ++i)
      if (!is_hidden[i]) rest.push_back(i);
    auto by_cost = [&](auto cost) {
      auto r = rest;
      std::stable_sort(r.begin(), r.end(), [&](auto a, auto b) { return cost(a) / bytes_of(a) < cost(b) / bytes_of(b); });
      return r;
    };
    std::vector<std::vector<move>> orders;
    {  // hidden offloads, then remat by bytes per microsecond
      auto o = hidden_moves;
      for (auto i : by_cost(recompute_of)) o.push_back({i, placement::remat});
      orders.push_back(o);
    }
    {  // hidden offloads, then the cheaper of remat and exposed offload per byte
      auto o = hidden_moves;
      auto cheaper = [&](std::uint32_t i) { return std::min(recompute_of(i), exposed_of(i)); };
      for (auto i : by_cost(cheaper))
        o.push_back({i, recompute_of(i) <= exposed_of(i) ? placement::remat : placement::offload});
      orders.push_back(o);
    }
    {  // remat only (no host memory)
      std::vector<move> o;
      auto saved = rest;
      rest.clear();
      for (std::uint32_t i = 0; i < n; ++i) rest.push_back(i);
      for (auto i : by_cost(recompute_of)) o.push_back({i, placement::remat});
      rest = saved;
      orders.push_back(o);
    }
    {  // hidden offloads, then exposed offloads (no recompute)
      auto o = hidden_moves;
      for (auto i : by_cost(exposed_of)) o.push_back({i, placement::offload});
      orders.push_back(o);
    }
    auto apply = [&](std::vector<move> const& o, std::size_t k) {
      std::vector<placement> d(n, placement::keep);
      for (std::size_t i = 0; i < k; ++i) d[o[i].slot] = o[i].action;
      return d;
    };
    for (auto const& o : orders)
      for (auto const& pc : opt_.pipelines) {
        auto fits = [&](std::size_t k) {
          std::size_t host = 0;
          auto const peak = peak_of(apply(o, k), pc, &host);
          return peak <= opt_.device_budget && host <= opt_.host_budget;
        };
        if (!fits(o.size())) continue;
        std::size_t lo = 0, hi = o.size();  // fits(hi); find the smallest such prefix
        while (lo < hi) {
          auto const mid = lo + (hi - lo) / 2;
          if (fits(mid)) hi = mid;
          else lo = mid + 1;
        }
        evaluate(apply(o, hi), pc);
      }
    if (best_.fits && n <= opt_.local_search_max_decisions) local_search();
  }

  plan result() {
    if (!best_.fits) {
      // Nothing fit: report the smallest peak of the extremes too (everything rematted, or
      // everything offloaded with each pipeline), so the answer says how far off the budget is.
      std::vector<placement> all(slots_.size(), placement::remat);
      peak_of(all, opt_.pipelines.front());
      std::fill(all.begin(), all.end(), placement::offload);
      for (auto const& pc : opt_.pipelines) peak_of(all, pc);
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

  void branch(std::vector<placement>& d, std::size_t i, std::size_t kept) {
    if (i == slots_.size()) {
      evaluate_all_pipelines(d);
      return;
    }
    auto const [l, k] = slots_[i];
    auto const bytes = stack_.layer(l).slots[k].bytes;
    auto const region = align_up(bytes, opt_.pipelines.front().buffers.device_alignment);
    auto const lb = [&] {
      double t = base_us_;
      for (std::uint32_t m = 0; m < stack_.layer_count(); ++m) {
        std::span<bool const> f(remat_flags_.get() + first_[m], stack_.layer(m).slots.size());
        if (std::find(f.begin(), f.end(), true) != f.end()) t += costs_.layers[m].recompute_time_us(f);
      }
      return t;
    };
    for (auto action : {placement::keep, placement::offload, placement::remat}) {
      d[i] = action;
      if (action == placement::remat) remat_flags_[first_[l] + k] = true;
      auto const kept2 = kept + (action == placement::keep ? region : 0);
      // Prune: the kept bytes alone exceed the budget, or the compute and recomputes chosen so
      // far already take as long as the best plan.
      if (kept2 <= opt_.device_budget && lb() < best_.step_us) branch(d, i + 1, kept2);
      if (action == placement::remat) remat_flags_[first_[l] + k] = false;
    }
    d[i] = placement::keep;
  }

  void local_search() {
    auto d = best_.decisions;
    auto pc = pipeline_choice{best_.pipeline, best_.buffers};
    for (bool improved = true; improved;) {
      improved = false;
      for (std::size_t i = 0; i < d.size(); ++i) {
        auto const was = d[i];
        for (auto action : {placement::keep, placement::offload, placement::remat}) {
          if (action == was) continue;
          d[i] = action;
          auto const before = best_.step_us;
          if (action == placement::offload || was == placement::offload) evaluate_all_pipelines(d);
          else evaluate(d, pc);
          if (best_.step_us < before) {
            d = best_.decisions;
            pc = {best_.pipeline, best_.buffers};
            improved = true;
            break;
          }
          d[i] = was;
        }
      }
    }
  }

  stack_spec const& stack_;
  cost_table const& costs_;
  plan_options opt_;
  std::vector<slot_ref> slots_;
  std::vector<std::size_t> first_;  // index of each layer's first slot in slots_
  std::unique_ptr<bool[]> remat_flags_;
  double base_us_ = 0;
  plan best_;
};

}  // namespace detail

//! Plans `stack` under `costs` and `opt`: the fastest simulated schedule that fits, or
//! `fits == false` with the smallest device peak reached.
inline plan make_plan(stack_spec const& stack, cost_table const& costs, plan_options const& opt = {}) {
  detail::plan_search search(stack, costs, opt);
  bool const exact = opt.method == plan_method::exact ||
                     (opt.method == plan_method::automatic && search.decisions() <= opt.exact_max_decisions);
  if (exact) search.exact();
  else search.heuristic();
  return search.result();
}

}  // namespace tide
