#pragma once
//! \file
//! A pipeline's partition from per-layer costs: the contiguous split of the model's layers over
//! its stages whose slowest stage is fastest, counting the embedding on the first stage and the
//! head on the last (what makes Llama 3 405B's first and last stages a layer lighter).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/stage_partition.hpp>

namespace tide {

//! What a stage's time is made of besides its layers.
struct partition_ends {
  double first_stage_us = 0;  //!< the first stage's extra work (the embedding), microseconds
  double last_stage_us = 0;   //!< the last stage's extra work (the head and the loss), microseconds
};

//! The partition of `layer_us.size()` layers (each a layer's forward plus backward time, in
//! microseconds) over `stages` stages that minimizes the slowest stage's time, `ends` included;
//! among equally good ones, the one whose earlier stages take fewer layers (the first stage as few
//! as it can, then the second, and so on). Exact (dynamic
//! programming, stages times layers squared: refused past 1e9 steps). Throws `schedule_error`
//! naming a cost that is negative, not finite or past 1e12 us, no stages, more stages than layers,
//! or a search too long.
[[nodiscard]] inline stage_partition partition_by_cost(std::span<double const> layer_us, std::uint32_t stages,
                                                       partition_ends ends = {}) {
  auto const fail = [](std::string const& m) { throw schedule_error("tide::partition_by_cost: " + m); };
  auto const bad = [](double x) { return !(x >= 0 && x <= 1e12); };  // NaN fails both
  auto const number = [](double x) {  // as printf's %g: -1e-09, not to_string's -0.000000
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  if (stages == 0) fail("no stages: give at least 1");
  auto const L = layer_us.size();
  if (L < stages)
    fail(std::to_string(L) + " layers cannot give each of " + std::to_string(stages) + " stages one: use fewer stages");
  // The exact search takes stages x layers^2 / 2 steps: past 1e9 (seconds) it is refused, not run.
  if (static_cast<double>(stages) * static_cast<double>(L) * static_cast<double>(L) / 2 > 1e9)
    fail(std::to_string(L) + " layers over " + std::to_string(stages) +
         " stages take the exact search too long (stages x layers^2 / 2 > 1e9 steps): group layers into blocks, "
         "adding their costs, and partition the blocks");
  for (std::size_t i = 0; i < L; ++i)
    if (bad(layer_us[i]))
      fail("layer " + std::to_string(i) + "'s cost is " + number(layer_us[i]) +
           " us: give each layer a finite time from 0 to 1e12 us");
  if (bad(ends.first_stage_us) || bad(ends.last_stage_us))
    fail("partition_ends holds a time that is negative, not finite or past 1e12 us");
  std::vector<double> prefix(L + 1, 0.0);
  for (std::size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layer_us[i];
  auto const stage_us = [&](std::uint32_t s, std::size_t from, std::size_t to) {
    return prefix[to] - prefix[from] + (s == 0 ? ends.first_stage_us : 0) + (s + 1 == stages ? ends.last_stage_us : 0);
  };
  // rest[s][i]: the slowest of stages s..S-1 when they run layers [i, L), at best.
  auto const inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> rest(stages, std::vector<double>(L + 1, inf));
  for (std::size_t i = 0; i + 1 <= L; ++i) rest[stages - 1][i] = stage_us(stages - 1, i, L);
  for (std::uint32_t s = stages - 1; s-- > 0;)
    for (std::size_t i = s; i + (stages - s) <= L; ++i)
      for (std::size_t j = i + 1; j + (stages - s - 1) <= L; ++j)  // stage s runs [i, j): at least one layer each
        rest[s][i] = std::min(rest[s][i], std::max(stage_us(s, i, j), rest[s + 1][j]));
  // The best bottleneck, then from the first stage on the fewest layers that keep it: the same
  // expressions as above, so the optimum compares equal to itself.
  auto const bound = rest[0][0];
  stage_partition p{std::vector<std::uint32_t>(stages, 0)};
  std::size_t i = 0;
  for (std::uint32_t s = 0; s + 1 < stages; ++s) {
    auto j = i + 1;
    while (std::max(stage_us(s, i, j), rest[s + 1][j]) > bound) ++j;
    p.layers[s] = static_cast<std::uint32_t>(j - i);
    i = j;
  }
  p.layers[stages - 1] = static_cast<std::uint32_t>(L - i);
  return p;
}

}  // namespace tide
