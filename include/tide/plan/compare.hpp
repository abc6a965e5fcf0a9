#pragma once
//! \file
//! The strategy table: for a stack, a cost table and a device budget, the usual ways to
//! place activations side by side, each simulated: keep all, full remat, the offload rows'
//! tensors kept on the device (when the offload rows rematerialize the rest), offload without
//! latency hiding (copies and collectives on the compute stream), with latency hiding, with
//! chunked copies and deeper prefetch, and the planner's choice. It shows the trade: prefetch buffers cost device memory, so the
//! fastest schedule's peak may be above a slower one's.

#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/build.hpp>
#include <tide/core/describe.hpp>
#include <tide/core/strategy.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/simulate.hpp>

#if TIDE_DEFINITIONS
#include <unordered_set>
#endif

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! Budgets and the rows of `compare_strategies`.
struct strategy_options {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();  //!< for activations (the schedule's peak)
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();  //!< pinned host bytes a row may use
  //! What the device holds besides activations (`transformer_resident_memory`): added to each
  //! row's device peak.
  std::size_t resident_bytes = 0;
  //! The collective hooks every row's schedule has (`training_collectives`), costed by the table.
  collective_spec collectives = {};
  //! Slots the offload rows offload (empty: every slot not in `keep_slots`).
  std::vector<tide::name> offload_slots{};
  //! Slots the remat and offload rows keep: the layer input is what a recompute starts from.
  std::vector<tide::name> keep_slots = {"layer_input"};
  //! The offload rows rematerialize the slots they neither keep nor offload (selective offload
  //! on top of full remat, as in the published JAX study); false: they keep them.
  bool remat_rest = false;
  //! Prefetch distance of the chunked row (at most the layer count - 1): layers of offloaded
  //! slots whose prefetches may be in flight, each in a staging buffer of its own.
  std::uint32_t deep_prefetch_distance = 3;
  std::size_t chunk_bytes = 0;  //!< chunk size of the chunked row (0: `default_chunk_bytes`)
  bool include_plan = true;  //!< add the planner's row (seeded with the others; shown when it fits)
  // Added after 0.3.0, last, so that positional initializers keep their meaning.
  std::size_t storage_budget = 0;  //!< bytes of spill file a row may use (the planner's `plan_options::storage_budget`)
  //! Most (layer, slot) decisions the planner's row takes (`plan_options::max_decisions`); with
  //! `include_plan`, a larger stack is refused before any row is built.
  std::size_t max_decisions = plan_options{}.max_decisions;
};

//! One simulated strategy of the table.
struct strategy_row {
  std::string name{};  //!< the label the text table shows
  //! A stable identifier: keep-all, full-remat, on-device (the offload rows' policy with their
  //! slots kept), offload-naive (no latency hiding: copies and collectives on the compute
  //! stream), offload-lhs (latency hiding), offload-lhs-pipelined (chunked, deeper prefetch),
  //! planner.
  std::string key{};
  tide::strategy strategy{};         //!< what `build_schedule` built the row's schedule from
  double step_us = 0;                //!< simulated step time
  double exposed_transfer_us = 0;    //!< compute-stream time spent on copies or waiting for them
  double recompute_us = 0;           //!< compute time spent recomputing
  std::size_t activation_bytes = 0;  //!< the schedule's device peak
  std::size_t whole_device_bytes = 0;  //!< the whole device's: resident bytes plus activations (0.2: device_bytes)
  std::size_t host_bytes = 0;        //!< the schedule's pinned host peak
  bool fits = false;                 //!< `activation_bytes` and `host_bytes` are within the budgets
  // Added after 0.3.0, last, so that positional initializers keep their meaning.
  double forward_us = 0;             //!< compute time spent in forwards
  double backward_us = 0;            //!< compute time spent in backwards
  double exposed_collective_us = 0;  //!< compute-stream time spent on collectives or waiting for them
  std::size_t storage_bytes = 0;     //!< the schedule's storage file (spilled slots)
  //! Why the row does not fit: each budget it exceeds, e.g. "storage 16.5 GiB > budget 0 B"
  //! (several joined by "; "); empty when it fits. The text table prints it after "does not fit".
  std::string over_budget{};
};

//! One row: `st` (with `opt.collectives`' hooks, not overlapped where either turns `overlap`
//! off) built for `stack`, simulated under `costs`, its peaks checked against `opt`'s budgets.
//! What `compare_strategies` does for each of its rows, for a strategy of your own (a policy
//! file, say).
TIDE_INLINE strategy_row evaluate_strategy(stack_spec const& stack, cost_table const& costs, tide::strategy st,
                                           strategy_options const& opt, std::string key, std::string name);

//! The planner's answer within `opt`'s budgets, with its collectives and resident bytes, seeded
//! with the strategies of `rows` and `extra_seeds`: never slower than one of them that fits. What
//! `compare_strategies` adds as its planner row.
TIDE_INLINE plan plan_seeded_by(stack_spec const& stack, cost_table const& costs, strategy_options const& opt,
                                std::vector<strategy_row> const& rows, std::vector<tide::strategy> extra_seeds = {});

//! Simulates the usual strategies for `stack` under `costs` (see the file comment), one row each,
//! in the order keep-all, full remat, offload rows, planner. Rows with nothing to remat or
//! offload are left out.
TIDE_INLINE std::vector<strategy_row> compare_strategies(stack_spec const& stack, cost_table const& costs,
                                                         strategy_options const& opt = {});

//! The table as aligned text: one row per strategy, "does not fit" where the peak is over budget.
TIDE_INLINE std::string format_strategy_table(std::vector<strategy_row> const& rows);

#if TIDE_DEFINITIONS
namespace detail {
//! The stack's slot names but `keep`'s, each once, in order of first appearance (by hash: a
//! stack of 100,000 types compared pairwise took minutes).
inline std::vector<tide::name> slot_names_except(stack_spec const& st, std::vector<tide::name> const& keep) {
  std::vector<tide::name> r;
  std::unordered_set<std::string_view> seen(keep.begin(), keep.end());
  for (auto const& t : st.types)
    for (auto const& s : t.slots)
      if (seen.insert(s.name).second) r.push_back(s.name);
  return r;
}
}  // namespace detail

TIDE_INLINE strategy_row evaluate_strategy(stack_spec const& stack, cost_table const& costs, tide::strategy st,
                                           strategy_options const& opt, std::string key, std::string name) {
  auto const overlap = st.collectives.overlap && opt.collectives.overlap;
  st.collectives = opt.collectives;
  st.collectives.overlap = overlap;
  strategy_row r{std::move(name), std::move(key), std::move(st)};
  auto s = build_schedule(stack, r.strategy);
  auto sim = simulate(s, costs);
  r.step_us = sim.summary.step_us;
  r.exposed_transfer_us = sim.summary.exposed_transfer_us;
  r.exposed_collective_us = sim.summary.exposed_collective_us;
  r.forward_us = sim.summary.forward_us;
  r.backward_us = sim.summary.backward_us;
  r.recompute_us = sim.summary.recompute_us;
  r.activation_bytes = s.peak_device_bytes();
  r.whole_device_bytes = opt.resident_bytes + r.activation_bytes;
  r.host_bytes = s.peak_host_bytes();
  r.storage_bytes = s.peak_storage_bytes();
  r.fits = r.activation_bytes <= opt.device_budget && r.host_bytes <= opt.host_budget && r.storage_bytes <= opt.storage_budget;
  // Which budget: a spill with no storage budget, say, reads "storage ... > budget 0 B", not a bare "does not fit".
  auto over = [&r](char const* what, std::size_t bytes, std::size_t budget) {
    if (bytes <= budget) return;
    if (!r.over_budget.empty()) r.over_budget += "; ";
    r.over_budget += std::string(what) + " " + format_bytes(static_cast<double>(bytes)) + " > budget " + format_bytes(static_cast<double>(budget));
  };
  over("activations", r.activation_bytes, opt.device_budget);
  over("host", r.host_bytes, opt.host_budget);
  over("storage", r.storage_bytes, opt.storage_budget);
  return r;
}

TIDE_INLINE plan plan_seeded_by(stack_spec const& stack, cost_table const& costs, strategy_options const& opt,
                                std::vector<strategy_row> const& rows, std::vector<tide::strategy> extra_seeds) {
  // Each seed with `opt.collectives` as they are: a row without latency hiding turns their
  // overlap off to compare against, which is no choice for a plan.
  std::vector<tide::strategy> seeds;
  for (auto const& r : rows) seeds.push_back(r.strategy);
  for (auto& s : extra_seeds) seeds.push_back(std::move(s));
  for (auto& s : seeds) s.collectives = opt.collectives;
  return make_plan(stack, costs,
                   {.device_budget = opt.device_budget,
                    .host_budget = opt.host_budget,
                    .max_decisions = opt.max_decisions,
                    .candidates = default_candidates(stack, opt.chunk_bytes, opt.collectives),
                    .resident_bytes = opt.resident_bytes,
                    .seeds = std::move(seeds),
                    .storage_budget = opt.storage_budget});
}

TIDE_INLINE std::vector<strategy_row> compare_strategies(stack_spec const& stack, cost_table const& costs,
                                                         strategy_options const& opt) {
  costs.check_against(stack);
  // The planner's row refuses a stack over its limit: before the other rows are built, not after.
  if (opt.include_plan && decision_count(stack) > opt.max_decisions)
    throw schedule_error("tide: compare_strategies' planner row takes at most " + std::to_string(opt.max_decisions) +
                         " (layer, slot) decisions (strategy_options::max_decisions) and this stack has " +
                         std::to_string(decision_count(stack)) +
                         ": raise the limit knowing planning takes minutes, or set include_plan = false");
  std::vector<strategy_row> rows;
  auto add = [&](std::string key, std::string name, tide::strategy st) {
    rows.push_back(evaluate_strategy(stack, costs, std::move(st), opt, std::move(key), std::move(name)));
  };
  auto const rest = detail::slot_names_except(stack, opt.keep_slots);
  auto const offloaded = opt.offload_slots.empty() ? rest : opt.offload_slots;
  auto const L = stack.layer_count();
  auto const d = std::min<std::uint32_t>(opt.deep_prefetch_distance, L - 1);
  auto const chunk = opt.chunk_bytes == 0 ? default_chunk_bytes(stack) : opt.chunk_bytes;
  policy_spec off{rule_spec{.where = placement::offload, .slots = offloaded}};
  policy_spec on_device;  // the offloaded slots kept, the rest as the offload rows have it
  if (opt.remat_rest) {
    std::vector<tide::name> others;
    std::unordered_set<std::string_view> const off_names(offloaded.begin(), offloaded.end());
    for (auto n : rest)
      if (!off_names.contains(n)) others.push_back(n);
    if (!others.empty()) {
      off.rules.push_back(rule_spec{.where = placement::remat, .slots = others});
      on_device.rules.push_back(rule_spec{.where = placement::remat, .slots = others});
    }
  }
  add("keep-all", "keep all", {});
  if (!rest.empty()) add("full-remat", "full remat", {.policy = {rule_spec{.where = placement::remat, .slots = rest}}});
  if (!offloaded.empty() && !on_device.rules.empty()) add("on-device", "offload's slots kept on device", {.policy = on_device});
  if (!offloaded.empty()) {
    // No latency hiding: copies and collectives on the compute stream, each just before its use.
    add("offload-naive", "offload, no latency hiding",
        {.policy = off,
         .buffers = {.staging_buffers = 1},
         .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1},
         .collectives = {.overlap = false}});
    add("offload-lhs", "offload, latency hiding", {.policy = off, .pipeline = {.prefetch_distance = std::min<std::uint32_t>(1, L - 1)}});
    add("offload-lhs-pipelined", "offload, chunked, prefetch " + std::to_string(d),
        {.policy = off, .buffers = {.staging_buffers = d + 1}, .pipeline = {.prefetch_distance = d, .chunk_bytes = chunk}});
  }
  if (opt.include_plan) {
    auto p = plan_seeded_by(stack, costs, opt, rows);
    if (p.fits) add("planner", p.exact ? "planner (exact)" : "planner (heuristic)", p.strategy);
  }
  return rows;
}

TIDE_INLINE std::string format_strategy_table(std::vector<strategy_row> const& rows) {
  std::string r;
  // Each line sized to what it holds: a long row name is never cut.
  auto line = [&r](char const* format, auto... v) {
    auto const n = std::snprintf(nullptr, 0, format, v...);
    if (n <= 0) return;
    auto const at = r.size();
    r.resize(at + static_cast<std::size_t>(n) + 1);
    std::snprintf(r.data() + at, static_cast<std::size_t>(n) + 1, format, v...);
    r.pop_back();  // the terminator snprintf wrote
  };
  line("  %-32s %12s %12s %12s %12s %12s %12s %12s %12s  %s\n", "strategy", "step ms", "exposed ms", "coll. ms", "recomp ms", "activations",
       "device peak", "host", "storage", "fits");
  for (auto const& row : rows) {
    // A misfit says which budget (a "does not fit" from the storage budget alone said nothing).
    std::string const fits = row.fits ? "yes" : row.over_budget.empty() ? "does not fit" : "does not fit: " + row.over_budget;
    line("  %-32s %12.2f %12.2f %12.2f %12.2f %12s %12s %12s %12s  %s\n", row.name.c_str(), row.step_us / 1e3, row.exposed_transfer_us / 1e3,
         row.exposed_collective_us / 1e3, row.recompute_us / 1e3, format_bytes(static_cast<double>(row.activation_bytes)).c_str(),
         format_bytes(static_cast<double>(row.whole_device_bytes)).c_str(), format_bytes(static_cast<double>(row.host_bytes)).c_str(),
         format_bytes(static_cast<double>(row.storage_bytes)).c_str(), fits.c_str());
  }
  return r;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
