#pragma once
//! \file
//! Pay for what you use: `<tide/host.hpp>` and the simulator in virtual time (`sim_backend`, its
//! cost table), without the planner (`<tide/planning.hpp>`).

#include <tide/host.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/backends/sim/sim_backend.hpp>

#if defined(TIDE_SEPARATE_COMPILATION)
// The executor's step machinery for the simulated backend is the library's (core/config.hpp).
namespace tide {
extern template class executor<sim_backend>;
}  // namespace tide
#endif
