#pragma once
//! \file
//! Pay for what you use: `<tide/host.hpp>` and the simulator in virtual time (`sim_backend`, its
//! cost table), without the planner (`<tide/planning.hpp>`).

#include <tide/host.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/backends/sim/sim_backend.hpp>
