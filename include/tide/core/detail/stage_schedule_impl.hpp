#pragma once
// build_stage_schedule's definition: header-only it is inline here; in separate compilation
// (core/config.hpp) it is compiled once, in the library. Included at the end of
// core/stage_schedule.hpp; not on its own.

#include <tide/core/detail/build_stage.hpp>
#include <tide/core/stage_schedule.hpp>

namespace tide {

TIDE_INLINE schedule build_stage_schedule(stack_spec const& stack, strategy const& how, stage_spec const& stage,
                                          stage_policies const& policies, stage_chunks const& chunks) {
  return detail::build_stage(stack, how, stage, policies, chunks);
}

}  // namespace tide
