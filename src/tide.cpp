// tide's compiled parts, for separate compilation (include/tide/core/config.hpp): the checker,
// the host and simulated backends, the spill file, the builder's run-time path, the executor's
// step machinery for host_backend and sim_backend, and the planner's entry points (make_plan,
// plan_micro_batches, step_lower_bound, simulate, compare_strategies, ...), compiled once. Built by Meson with
// -Dseparate_compilation=true (and by CMake with -DTIDE_SEPARATE_COMPILATION=ON); a program
// that builds it itself compiles this file with -DTIDE_SEPARATE_COMPILATION and defines that in
// every translation unit that includes tide.
#ifndef TIDE_SEPARATE_COMPILATION
#error "src/tide.cpp is the library of tide's separate compilation: compile it with -DTIDE_SEPARATE_COMPILATION (and every file that includes tide too)"
#endif
#define TIDE_BUILDING_LIBRARY 1

#include <tide/core/stage_schedule.hpp>  // opt-in for consumers (its builder costs the umbrella 10%)
#include <tide/planning.hpp>

namespace tide::link_check {
// What every consumer's translation units reference (include/tide/core/config.hpp).
extern int const TIDE_DETAIL_LIBURING_IDENTITY = 1;
extern int const TIDE_SEPARATE_COMPILATION_is_defined_link_libtide = 1;
}  // namespace tide::link_check

namespace tide {
template class executor<host_backend>;
template class executor<sim_backend>;
}  // namespace tide
