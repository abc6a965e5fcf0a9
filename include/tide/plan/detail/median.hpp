#pragma once
// The median of a sample, the mean of the two middle values for an even count: what `tune`
// reports of its rounds and `median_costs` keeps of calibration rounds. (`calibrate`'s own
// per-op median, `detail::median` in calibrate.hpp, takes the upper middle value.)

#include <algorithm>
#include <vector>

namespace tide::detail {

[[nodiscard]] inline double midpoint_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto const n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace tide::detail
