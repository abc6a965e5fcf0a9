#pragma once
//! \file
//! Occupancy curves: device and host bytes live over a step (`measure_occupancy`, in
//! trace/summary.hpp, measures them from a timeline).

#include <cstddef>
#include <vector>

namespace tide {

//! One step of an occupancy curve: from `t_us` on, `bytes` are live.
struct occupancy_point {
  double t_us = 0;        //!< microseconds from the step's start
  std::size_t bytes = 0;  //!< bytes live from `t_us` on
};

//! Device and host bytes live over a step, as step curves in time order.
struct occupancy {
  std::vector<occupancy_point> device{};  //!< bytes live in the device arena over the step
  std::vector<occupancy_point> host{};    //!< the same in the host arena
};

}  // namespace tide
