#pragma once
//! \file
//! Simulation: a schedule run once by the generic executor on the sim backend, for its step
//! time (the planner's inner loop) or its whole timeline and summary.

#include <tide/core/config.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/backends/sim/sim_backend.hpp>
#include <tide/core/schedule.hpp>
#include <tide/executor/executor.hpp>
#include <tide/trace/summary.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! Executor options for simulation: no checks (the sim has no data to check, and the schedule
//! builder's programs are checked by the core tests).
inline constexpr executor_options sim_executor_options() noexcept {
  executor_options o;
  o.debug_checks = false;
  o.check_schedule = false;
  return o;
}

//! The step time of schedule `s` under `costs`, in microseconds (no timeline; the planner's
//! inner loop).
[[nodiscard]] TIDE_INLINE double simulate_step_us(schedule_view s, cost_table const& costs);

//! One simulated step: its timeline and its summary (step time, exposed transfer time, peaks).
struct sim_result {
  timeline trace{};        //!< every op's interval and every blocking wait
  step_summary summary{};  //!< `summarize` of `trace`
};

//! Simulates one step of `s`. Throws `out_of_memory` when `opt` sets a budget it exceeds.
[[nodiscard]] TIDE_INLINE sim_result simulate(schedule_view s, cost_table const& costs, sim_options opt = {});

#if TIDE_DEFINITIONS
namespace detail {
//! A collective hook that does nothing: the sim charges the op's cost, it has no data to move.
struct simulated_hook {
  template <class Ctx>
  void operator()(Ctx const&) const noexcept {}
};
//! One step with empty lambdas and a `simulated_hook` for each hook `s` makes room for (the
//! executor refuses hooks missing or without room).
inline void simulated_step(executor<sim_backend>& ex, collective_spec const& c) {
  auto none = [](auto const&) {};
  with_hooks_for(c, simulated_hook{}, [&](auto& h) { ex.step(none, none, h); });
}
}  // namespace detail

TIDE_INLINE double simulate_step_us(schedule_view s, cost_table const& costs) {
  sim_backend b(costs);
  executor<sim_backend> ex(b, s, sim_executor_options());
  detail::simulated_step(ex, s.collectives);
  return b.step_us();
}

TIDE_INLINE sim_result simulate(schedule_view s, cost_table const& costs, sim_options opt) {
  sim_result r;
  sim_backend b(costs, opt);
  auto eo = sim_executor_options();
  eo.timeline = &r.trace;
  executor<sim_backend> ex(b, s, eo);
  detail::simulated_step(ex, s.collectives);
  r.summary = summarize(r.trace, s);
  return r;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide
