#pragma once
//! \file
//! The planner: chooses keep, offload, remat or spill for every (layer, slot) and the pipeline
//! parameters (prefetch distance, chunk size, staging buffers), minimizing the simulated step
//! time while the schedule's device peak fits the budget (its host bytes the host cap, and its
//! storage file the storage budget).
//!
//! - Exact (small instances): branch and bound over the decisions, each complete assignment
//!   evaluated in the sim with every pipeline candidate. Bounds: the step is at least the
//!   compute time plus the recomputes already chosen; the device peak is at least the bytes
//!   already kept plus the largest remat scratch and the largest offload of one layer so far.
//! - Heuristic (large instances): orders of moves. Offload first the slots whose transfers hide
//!   behind the compute between their production and their use (per layer, largest first, up to
//!   what the link carries in the neighbouring layer's forward and backward); then a greedy by
//!   added time per byte saved that knows a layer's recompute is capped at one full recompute
//!   (the rest of a layer's slots rematted together is one of its candidates), or offload exposed
//!   where that costs less. For each order and pipeline candidate, binary-search the shortest
//!   prefix whose device peak fits and simulate it; keep the fastest. With a host cap, offloads
//!   are taken while the host bytes fit, and the plan made without the cap stands when it fits
//!   the cap, so a cap that does not bind never makes the answer worse. On small instances a
//!   local search (steepest descent over moves of one or two decisions, a layer's or a slot
//!   name's decisions together, two such groups, layer swaps) finishes from the fastest
//!   distinct candidates, within an evaluation budget, then kicks (random restarts from the best
//!   plan). Two more orders are priced: the host holds the slots dearest to recompute per byte,
//!   the cheapest are rematerialized. Above 64 decisions a search over classes (a layer type's
//!   slot in every layer of the type, split points, the stack's ends, paired trades) finishes.
//! - Storage (`plan_options::storage_budget`): where the host budget binds, the plan made as if
//!   the host held (a share of) the storage budget too, with the earliest layers' offloads spilled
//!   to the file until the pinned bytes fit; it stands where it is faster than the host-only plan
//!   or the only one that fits.
//! - Groups (`plan_options::group_above_decisions`, deep stacks): runs of identical layers keep
//!   their ends layer by layer and their middles as a few blocks; that compressed stack is
//!   planned as above under budgets found by bisection, expanded (a block's layers share its
//!   placement) and built and simulated whole (detail/group_search.hpp).
//! - Every plan carries a lower bound (`plan::lower_bound_us`, lower_bound.hpp).
//!
//! The result is a `strategy` that builds a schedule directly; `to_cpp_types`
//! (policy_codegen.hpp) prints it as a `tide::strategy_of<...>` type.


#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/build.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/plan/lower_bound.hpp>
#include <tide/plan/plan.hpp>
#include <tide/plan/policy_codegen.hpp>
#include <tide/plan/simulate.hpp>
#if TIDE_DEFINITIONS
#include <tide/plan/detail/group_search.hpp>
#include <tide/plan/detail/plan_search.hpp>
#endif

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {


//! The device snapshot counts the planner tries for a stack of `layers` layers with a carry:
//! every carry stored, then 2^k for 2^k < layers - 1, largest first (Revolve's cost grows slowly
//! as s halves: a few counts span the trade between snapshot memory and segment recomputation),
//! while the recomputation stays within 16 forwards a layer (s = 1 costs about L / 2 a layer:
//! quadratic ops for long stacks, and never the fastest plan that fits where a larger s does).
inline std::vector<std::uint32_t> snapshot_candidates(std::uint32_t layers) {
  std::vector<std::uint32_t> r{every_carry};
  std::uint32_t top = 1;
  while (layers >= 2 && std::uint64_t{top} * 2 < layers - 1) top *= 2;
  for (std::uint32_t s = top; s >= 1 && layers >= 3; s /= 2)
    if (revolve_extra_forwards(layers, s) <= 16 * std::int64_t{layers}) r.push_back(s);
  return r;
}

//! The chain costs of a stack with a carry under `costs`: each layer's forward and backward, and
//! one carry's copy each way over the link (what `two_tier_plan` weighs).
inline chain_costs carry_chain_costs(stack_spec const& stack, cost_table const& costs) {
  chain_costs c;
  c.forward_us.clear();
  c.backward_us.clear();
  for (auto const& l : costs.layers) {
    c.forward_us.push_back(l.forward_us);
    c.backward_us.push_back(l.backward_us);
  }
  c.d2h_us = costs.link.d2h.time_us(stack.carry.bytes);
  c.h2d_us = costs.link.h2d.time_us(stack.carry.bytes);
  return c;
}

#if TIDE_DEFINITIONS
namespace detail {
//! `a + b`, or SIZE_MAX when the sum does not fit (an unlimited budget stays unlimited).
constexpr std::size_t saturating_add(std::size_t a, std::size_t b) noexcept {
  std::size_t r = 0;
  return checked_add(a, b, r) ? r : std::numeric_limits<std::size_t>::max();
}

//! The storage tier: `plan_slots` as if the host could pin `host_share + storage_share`, then
//! the offloaded slots of the earliest layers go to the file instead (spilled), fewest layers
//! first, until the pinned bytes (the offloads left and the spill ring) fit the host budget and
//! the file the storage budget. The earliest layers' data waits longest between its forward and
//! its backward, so their stores and loads have the most compute to hide behind. Each candidate
//! is built and simulated (the cost table's `storage` link prices the transfers); the first that
//! fits is the answer (spilling more only adds transfers). `fits` false when none does.
inline plan plan_with_storage(stack_spec const& stack, cost_table const& costs, plan_options const& opt,
                              std::size_t host_share, std::size_t storage_share) {
  auto wide = opt;
  wide.host_budget = saturating_add(host_share, storage_share);
  wide.storage_budget = 0;
  auto p = plan_slots(stack, costs, wide);
  if (!p.fits || p.host_bytes <= opt.host_budget) {
    p.fits = p.fits && p.host_bytes <= opt.host_budget;
    return p;
  }
  auto const L = stack.layer_count();
  std::vector<std::size_t> first(L + 1, 0);
  for (std::uint32_t l = 0; l < L; ++l) first[l + 1] = first[l] + stack.layer(l).slots.size();
  auto d = p.decisions;
  for (std::uint32_t l = 0; l < L; ++l) {
    bool moved = false;
    for (auto i = first[l]; i < first[l + 1]; ++i)
      if (d[i] == placement::offload) d[i] = placement::spill, moved = true;
    if (!moved) continue;
    // The spill ring as the strategy has it, or of one buffer (its layers' bytes are pinned twice
    // over otherwise: a tight host budget may need the room).
    for (std::uint32_t ring : {std::max(p.strategy.buffers.spill_buffers, 1u), 1u}) {
      auto st = p.strategy;
      st.policy = policy_from_decisions(stack, d);
      st.buffers.spill_buffers = ring;
      schedule s;
      ++p.evaluations;
      if (try_build_schedule_into(s, stack, st)) continue;  // e.g. too many ops with the transfers
      if (s.peak_host_bytes() > opt.host_budget || s.peak_storage_bytes() > opt.storage_budget ||
          s.peak_device_bytes() > opt.device_budget)
        continue;
      p.decisions = d;
      p.strategy = std::move(st);
      p.step_us = simulate_step_us(s, costs);
      p.activation_bytes = s.peak_device_bytes();
      p.host_bytes = s.peak_host_bytes();
      p.storage_bytes = s.peak_storage_bytes();
      return p;
    }
  }
  p.fits = false;
  return p;
}

//! `plan_slots`, and with a storage budget the plans that spill (`plan_with_storage`) with the
//! whole budget and with halves of it down to a 128th (a drive is slower than the host link: the
//! plan that spills everything it may is rarely the fastest), each planned with the host budget
//! and without it (the spill ring then holds what the host pins), where one is faster or the
//! only one that fits.
inline plan plan_tiers(stack_spec const& stack, cost_table const& costs, plan_options const& opt) {
  auto best = plan_slots(stack, costs, opt);
  if (opt.storage_budget == 0 || opt.host_budget == std::numeric_limits<std::size_t>::max()) return best;
  auto evaluations = best.evaluations;
  for (std::size_t share = opt.storage_budget, k = 0; k < 8 && share > 0; ++k, share /= 2)
    for (auto host_share : {opt.host_budget, std::size_t{0}}) {  // the host's room planned too, or left to the ring
      auto q = plan_with_storage(stack, costs, opt, host_share, share);
      evaluations += q.evaluations;
      if (q.fits && (!best.fits || q.step_us < best.step_us)) best = std::move(q);
      else if (!best.fits) best.smallest_activation_bytes = std::min(best.smallest_activation_bytes, q.smallest_activation_bytes);
    }
  best.evaluations = evaluations;
  // The spills above are placed by a rule (the earliest layers' offloads), not searched: the
  // exact search proves nothing over them, so the plan is not exact (with a storage budget, an
  // "exact" plan was up to 46% slower than the best over every placement, or did not fit where
  // others did: issue 40). Without a host cap the planner never spills and stays exact above.
  best.exact = false;
  return best;
}
}  // namespace detail
#endif  // TIDE_DEFINITIONS

//! The (layer, slot) decisions a plan of `stack` makes: what `plan_options::max_decisions` bounds.
//! Cheap (one pass over the layers), so a caller can refuse a stack before any costly work.
[[nodiscard]] inline std::size_t decision_count(stack_spec const& stack) noexcept {
  std::size_t decisions = 0;
  for (std::uint32_t l = 0; l < stack.layer_count(); ++l) decisions += stack.layer(l).slots.size();
  return decisions;
}

//! Plans `stack` under `costs` and `opt`: the fastest simulated schedule that fits, or
//! `fits == false` with the smallest device peak reached. For a stack with a carry it chooses the
//! carries' checkpoints with the slots' placements: the slots are planned for each of
//! `snapshot_candidates` (a dropped carry costs its segment recomputations, advances the sim
//! charges a whole forward each, and its snapshots' memory is in the device peak) and, where the
//! host budget leaves room, for each count with as many host snapshots again (the reversal of
//! least time in the chain model, `two_tier_plan` with `carry_chain_costs`); the fastest plan that
//! fits wins. A layer's input slot (`slot_spec::input`) is never rematerialized. Throws
//! `schedule_error` for a stack that cannot be built (e.g. one that does not say where a layer's
//! input comes from).
[[nodiscard]] TIDE_INLINE plan make_plan(stack_spec const& stack, cost_table const& costs, plan_options const& opt = {});

#if TIDE_DEFINITIONS
TIDE_INLINE plan make_plan(stack_spec const& stack, cost_table const& costs, plan_options const& opt) {
  // A stack that does not say where a layer's input comes from would let the search
  // rematerialize it: refuse it by name rather than plan wrong gradients (or nothing).
  if (auto const i = detail::find_structure_issue(stack, {}, {}, {})) throw schedule_error(to_message(i));
  auto const decisions = decision_count(stack);
  if (decisions > opt.max_decisions)
    throw schedule_error("tide: the planner takes at most " + std::to_string(opt.max_decisions) +
                         " (layer, slot) decisions (plan_options::max_decisions) and this stack has " +
                         std::to_string(decisions) + " (" + std::to_string(stack.layer_count()) +
                         " layers): plan a representative part of the stack (its layer types in the same proportions) "
                         "and repeat the plan's rules, or raise the limit knowing planning takes minutes");
  if (opt.group_max_period == 0 || opt.group_max_period > max_group_period)
    throw schedule_error("tide: plan_options::group_max_period is " + std::to_string(opt.group_max_period) +
                         ": it takes 1 (runs of one repeated layer) to " + std::to_string(max_group_period) +
                         " (runs of a repeating block of that many layers)");
  auto const bound = [&] {
    // Spilled bytes cross the host link as offloaded ones do, and more besides: the bound takes
    // the storage budget as host memory.
    bound_options b{.device_budget = opt.device_budget, .host_budget = detail::saturating_add(opt.host_budget, opt.storage_budget),
                    .strategies = opt.candidates.empty() ? default_candidates(stack) : opt.candidates};
    b.strategies.insert(b.strategies.end(), opt.seeds.begin(), opt.seeds.end());
    return step_lower_bound(stack, costs, b).step_us;
  };
  if (!stack.has_carry()) {
    // Deep stacks: runs of identical layers, or of a repeating block of layers, planned as groups
    // (detail/group_search.hpp), unless nothing compresses (then the compressed stack is the
    // stack: planned as usual).
    bool const grouped = decisions > opt.group_above_decisions && opt.storage_budget == 0 && opt.method != plan_method::exact;
    if (grouped) costs.check_against(stack);
    auto const edge = grouped ? detail::group_edge(stack, opt) : 0;
    auto p = grouped && detail::compress_runs(stack, costs, edge, opt.group_blocks, opt.group_max_period).stand_ins > 0
                 ? detail::plan_grouped(stack, costs, opt, edge, opt.group_blocks)
                 : detail::plan_tiers(stack, costs, opt);
    p.resident_bytes = opt.resident_bytes;
    p.lower_bound_us = bound();
    return p;
  }
  costs.check_against(stack);
  auto const L = stack.layer_count();
  std::vector<checkpoint_spec> tries;
  for (auto s : snapshot_candidates(L)) tries.push_back({.device_snapshots = s});
  if (opt.host_budget >= stack.carry.bytes) {
    auto const chain = carry_chain_costs(stack, costs);
    for (auto s : snapshot_candidates(L)) {
      if (s == every_carry) continue;
      auto const h = static_cast<std::uint32_t>(std::min<std::uint64_t>(s, opt.host_budget / stack.carry.bytes));
      tries.push_back({.device_snapshots = s, .host_snapshots = h, .reversal = two_tier_plan(L, s, h, chain).actions});
    }
  }
  plan best;
  best.smallest_activation_bytes = std::numeric_limits<std::size_t>::max();
  std::size_t evaluations = 0;
  for (auto const& k : tries) {
    auto o = opt;
    if (o.candidates.empty()) o.candidates = default_candidates(stack);
    for (auto& c : o.candidates) c.checkpoints = k;
    auto p = detail::plan_tiers(stack, costs, o);
    evaluations += p.evaluations;
    auto const smallest = std::min(best.smallest_activation_bytes, p.smallest_activation_bytes);
    if (p.fits && (!best.fits || p.step_us < best.step_us)) best = std::move(p);
    best.smallest_activation_bytes = smallest;
  }
  best.evaluations = evaluations;
  best.resident_bytes = opt.resident_bytes;
  best.lower_bound_us = bound();
  return best;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
