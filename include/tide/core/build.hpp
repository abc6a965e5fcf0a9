#pragma once
//! \file
//! The builder: the expansion of a stack and a strategy into a schedule. constexpr, one
//! overflow-checked pass that validates while it sizes; `static_schedule.hpp` runs it at compile
//! time. Its stages (placement, arena layout, reversal, op program) are in `core/detail/build_*.hpp`,
//! on the state of `core/detail/builder.hpp`.

#include <type_traits>

#include <tide/core/config.hpp>
#include <tide/core/detail/build_arena.hpp>
#include <tide/core/detail/build_placement.hpp>
#include <tide/core/detail/build_program.hpp>
#include <tide/core/detail/build_reversal.hpp>
#include <tide/core/detail/builder.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#include <tide/core/validation.hpp>

namespace tide {

namespace detail {
// The builder itself (what try_build_schedule_into does), run at compile time in every mode.
[[nodiscard]] constexpr schedule_issue build_into(schedule& s, stack_spec const& stack, strategy const& how) {
  // A failed build leaves nothing behind: no layers, ops or arena (a peak of 0, not the peak of
  // a schedule that does not exist); storage is kept for the next build.
  auto clear = [&s] {
    s.layers.clear();
    s.slots.clear();
    s.ops.clear();
    s.waits.clear();
    s.event_count = 0;
    s.arena = {};
    s.carry = {};
  };
  auto fail = [&](schedule_issue i) {
    clear();
    s.buffers = {};
    s.pipeline = {};
    s.collectives = {};
    return i;
  };
  clear();
  if (auto i = detail::find_structure_issue(stack, how.policy, how.buffers, how.checkpoints)) return fail(i);
  s.buffers = how.buffers;
  s.pipeline = how.pipeline;
  s.collectives = how.collectives;
  detail::builder b(s, stack, how);
  for (auto stage : {&detail::builder::place, &detail::builder::choose_reversal, &detail::builder::lay_out_arena,
                     &detail::builder::write_program, &detail::builder::place_carries})
    if (auto i = (b.*stage)()) return fail(i);
  return {};
}

// The builder's run-time path: the library's copy in separate compilation (core/config.hpp), so
// a translation unit that builds schedules at run time does not compile the builder again.
TIDE_INLINE schedule_issue build_at_run_time(schedule& s, stack_spec const& stack, strategy const& how);
}  // namespace detail

//! Builds the schedule from values into `s`, reusing its storage: a caller that builds many
//! schedules (a planner, a sweep) allocates nothing once `s` has grown. Returns the first problem
//! with the composition (then `s` is left empty) or an issue whose code is `none`. Every size and
//! offset is computed with overflow checks.
[[nodiscard]] constexpr schedule_issue try_build_schedule_into(schedule& s, stack_spec const& stack, strategy const& how) {
#if TIDE_DETAIL_IF_CONSTEVAL
  // The builder is referenced from constant evaluation only (core/config.hpp).
  TIDE_DETAIL_IF_CONSTEVAL_BEGIN
  if consteval {
    return detail::build_into(s, stack, how);
  } else {
    return detail::build_at_run_time(s, stack, how);
  }
  TIDE_DETAIL_IF_CONSTEVAL_END
#else
  if (!std::is_constant_evaluated()) return detail::build_at_run_time(s, stack, how);
  return detail::build_into(s, stack, how);
#endif
}

//! Builds the schedule into `s`, reusing its storage. Throws `schedule_error` naming what is
//! wrong (then `s` is left empty).
constexpr void build_schedule_into(schedule& s, stack_spec const& stack, strategy const& how) {
  if (auto issue = try_build_schedule_into(s, stack, how)) throw schedule_error(to_message(issue));
}

//! The first problem with a stack and a strategy, or an issue whose code is `none` (builds the
//! schedule to find out).
[[nodiscard]] constexpr schedule_issue find_schedule_issue(stack_spec const& stack, strategy const& how) {
  schedule s;
  return try_build_schedule_into(s, stack, how);
}

//! The schedule of `stack` under `how`: `tide::build_schedule(stack, {.policy = p})`. Throws
//! `schedule_error` naming what is wrong.
[[nodiscard]] constexpr schedule build_schedule(stack_spec const& stack, strategy const& how) {
  schedule s;
  build_schedule_into(s, stack, how);
  return s;
}

//! The same for a stack whose run-time slot sizes are given in `sizes`.
[[nodiscard]] constexpr schedule build_schedule(stack_spec const& stack, slot_sizes const& sizes, strategy const& how) {
  return build_schedule(bind_sizes(stack, sizes), how);
}

#if TIDE_DEFINITIONS
TIDE_INLINE schedule_issue detail::build_at_run_time(schedule& s, stack_spec const& stack, strategy const& how) {
  return build_into(s, stack, how);
}
#endif

}  // namespace tide
