#pragma once
//! \file
//! A lower bound on the step of any schedule of a stack within device and host budgets, so a
//! plan can say how far from the best possible it can be (`plan::gap_to_bound`).
//!
//! The bound relaxes the placement problem to what every schedule must pay (docs/planning.md
//! gives the argument in full):
//! - the keep-all step: the sim is a max-plus function of the program, and any other policy only
//!   adds ops (copies, recomputes, advances) and waits to keep-all's, so no op ends earlier;
//! - the compute stream's work plus the least recomputation the budgets force: at the turn from
//!   forward to backward every kept slot is on the device and every offloaded one on the host,
//!   so at least `total - device_budget - host_bytes` bytes are rematerialized; a layer's
//!   recompute costs its rematted slots' costs capped at one full recompute, and the convex
//!   envelope of that (per layer, then over layers by cost per byte) never exceeds it;
//! - the link: every offloaded byte crosses it twice, no copy starts before the first layer's
//!   forward ends, and the first layer's backward follows the last copy back.
//! It is minimized over the host bytes, the one quantity the three terms trade. A stack with a
//! carry is bounded the same way: its first sweep runs each layer's forward once, saving the
//! slots as the policy says, and the advances after the turn rebuild carries only (their slots
//! are scratch), so every kept slot is still on the device at the turn; the carries' snapshots
//! take device or host memory and the link besides, and the advances compute time, none of which
//! the bound counts (it stays below).

#include <cstddef>
#include <limits>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#if TIDE_DEFINITIONS
#include <tide/plan/detail/lower_bound.hpp>
#endif

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! What `step_lower_bound` bounds: the budgets and the strategies whose collectives and pipeline
//! a schedule may have (their policies and checkpoints are ignored).
struct bound_options {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();  //!< for the schedule's peak (activations)
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();    //!< for the schedule's pinned host bytes
  //! The buffers, pipelines and collectives schedules may use (e.g. the planner's candidates and
  //! seeds); empty: the default strategy. The keep-all step is the least over them.
  std::vector<strategy> strategies{};
};

//! A lower bound on the step time and the terms it is the largest of.
struct step_bound {
  //! No schedule of the stack within the budgets steps faster than this (microseconds);
  //! infinity when none can fit (the layer inputs alone exceed both budgets).
  double step_us = 0;
  double keep_all_us = 0;   //!< the keep-all step (least over the strategies)
  double compute_us = 0;    //!< every layer's forward and backward: the compute stream's least work
  double recompute_us = 0;  //!< the least recomputation the budgets force, at `host_bytes`
  double link_us = 0;       //!< the copies' least time on the link, at `host_bytes`
  std::size_t host_bytes = 0;   //!< the offloaded bytes at which the bound is reached
  std::size_t remat_bytes = 0;  //!< the rematerialized bytes the budgets force there
  //! False when no schedule can fit the budgets.
  [[nodiscard]] constexpr bool feasible() const noexcept { return step_us < std::numeric_limits<double>::infinity(); }
};

//! A lower bound on the step of every schedule of `stack` under `costs` within `opt`'s budgets
//! (see the file comment). Costs a few keep-all simulations and a pass over the slots.
[[nodiscard]] TIDE_INLINE step_bound step_lower_bound(stack_spec const& stack, cost_table const& costs, bound_options const& opt = {});

#if TIDE_DEFINITIONS
TIDE_INLINE step_bound step_lower_bound(stack_spec const& stack, cost_table const& costs, bound_options const& opt) {
  costs.check_against(stack);
  detail::bound_inputs in;
  // With a carry too (see the file comment): checkpointing rebuilds carries, never saved slots.
  in.device_budget = opt.device_budget;
  in.host_budget = opt.host_budget;
  in.keep_all_us = detail::keep_all_step_us(stack, costs, opt.strategies);
  auto const r = detail::minimize_bound(stack, costs, in);
  return {.step_us = r.step_us,
          .keep_all_us = in.keep_all_us,
          .compute_us = costs.compute_us(),
          .recompute_us = r.recompute_us,
          .link_us = r.link_us,
          .host_bytes = r.host_bytes,
          .remat_bytes = r.remat_bytes};
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
