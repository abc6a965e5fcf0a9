#pragma once
//! \file
//! A pipeline's partition from per-layer costs: the contiguous split of the model's layers over
//! its stages whose slowest stage is fastest, counting the embedding on the first stage and the
//! head on the last (what makes Llama 3 405B's first and last stages a layer lighter).

#include <cmath>
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
//! among equally good ones, the one whose earlier stages take fewer layers. Exact (dynamic
//! programming, stages times layers squared: refused past 1e9 steps). Throws `schedule_error`
//! naming a cost that is negative, not finite or past 1e12 us, no stages, more stages than layers,
//! or a search too long.
[[nodiscard]] inline stage_partition partition_by_cost(std::span<double const> layer_us, std::uint32_t stages,
                                                       partition_ends ends = {}) {
  auto const fail = [](std::string const& m) { throw schedule_error("tide::partition_by_cost: " + m); };
  auto const bad = [](double x) { return !(x >= 0 && x <= 1e12); };  // NaN fails both
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
      fail("layer " + std::to_string(i) + "'s cost is " + std::to_string(layer_us[i]) +
           " us: give each layer a finite time from 0 to 1e12 us");
  if (bad(ends.first_stage_us) || bad(ends.last_stage_us))
    fail("partition_ends holds a time that is negative, not finite or past 1e12 us");
  std::vector<double> prefix(L + 1, 0.0);
  for (std::size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layer_us[i];
  auto const stage_us = [&](std::uint32_t s, std::size_t from, std::size_t to) {
    return prefix[to] - prefix[from] + (s == 0 ? ends.first_stage_us : 0) + (s + 1 == stages ? ends.last_stage_us : 0);
  };
  // best[s][i]: the slowest of stages 0..s when they run layers [0, i); cut[s][i]: where stage s starts.
  auto const inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages, std::vector<double>(L + 1, inf));
  std::vector<std::vector<std::size_t>> cut(stages, std::vector<std::size_t>(L + 1, 0));
  for (std::size_t i = 1; i <= L; ++i) best[0][i] = stage_us(0, 0, i);
  for (std::uint32_t s = 1; s < stages; ++s)
    for (std::size_t i = s + 1; i <= L; ++i)
      for (std::size_t j = s; j < i; ++j) {  // stage s runs [j, i): at least one layer each
        auto const t = std::max(best[s - 1][j], stage_us(s, j, i));
        if (t < best[s][i]) {  // strictly: the earliest cut wins a tie, so earlier stages take fewer
          best[s][i] = t;
          cut[s][i] = j;
        }
      }
  stage_partition p{std::vector<std::uint32_t>(stages, 0)};
  for (std::size_t s = stages, end = L; s-- > 0;) {
    auto const begin = s == 0 ? 0 : cut[s][end];
    p.layers[s] = static_cast<std::uint32_t>(end - begin);
    end = begin;
  }
  return p;
}

}  // namespace tide
