#pragma once
//! \file
//! The planner's search (`make_plan` in planner.hpp calls it): the exact branch and bound, the
//! heuristic's orders of moves and its local searches. See planner.hpp for what each does. The
//! state they share is `search_state.hpp`; each search is in a header of its own
//! (`exact_search.hpp`, `heuristic_search.hpp`, `local_search.hpp`, `class_search.hpp`).

#include <tide/backends/sim/cost_table.hpp>
#include <tide/plan/detail/class_search.hpp>
#include <tide/plan/detail/exact_search.hpp>
#include <tide/plan/detail/heuristic_search.hpp>
#include <tide/plan/detail/local_search.hpp>
#include <tide/plan/detail/search_state.hpp>
#include <tide/plan/plan.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

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
