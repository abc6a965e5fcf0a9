#pragma once
//! \file
//! When each stage of a pipeline runs each micro-batch's forward and backward, in a model of
//! whole passes: a stage runs one pass at a time in its `stage_order`; a forward starts once the
//! stage is free and (past stage 0) the previous stage's forward of that micro-batch has ended and
//! its boundary tensor arrived; a backward once the stage is free and (before the last stage) the
//! next stage's backward of it has ended and the gradient arrived. What it gives: the step time,
//! each stage's bubble (the step less its busy time), and each micro-batch's wait between its
//! forward and its backward on each stage, which is what an offload of its saved data has to hide
//! in (PipeOffload, Wan et al., arXiv 2503.01328: a micro-batch is offloaded where that wait is at
//! least three round trips of its data).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/stage_order.hpp>
#include <tide/core/stage_policies.hpp>

namespace tide {

//! One stage's pass times, for every micro-batch, in microseconds.
struct stage_costs {
  double forward_us = 1;   //!< a micro-batch's forward over the stage's layers
  double backward_us = 2;  //!< its backward (recomputation included, where the stage recomputes)
  double transfer_us = 0;  //!< the boundary tensor to the next stage, or its gradient back (each way)
};

//! Every pass of every stage: `forward_begin_us[stage * micro_batches + m]` and so on.
struct stage_timeline {
  std::uint32_t stages = 0;                //!< stages timed
  std::uint32_t micro_batches = 0;         //!< micro-batches a step
  std::vector<double> forward_begin_us{};  //!< micro-batch m's forward on stage s starts (index `index(s, m)`)
  std::vector<double> forward_end_us{};    //!< ... ends
  std::vector<double> backward_begin_us{}; //!< its backward on stage s starts
  std::vector<double> backward_end_us{};   //!< ... ends
  double step_us = 0;  //!< from the first forward's start to the last backward's end
  std::vector<double> busy_us{};  //!< per stage: its passes' time

  //! Stage `s`'s idle time within the step.
  [[nodiscard]] double bubble_us(std::uint32_t s) const { return step_us - busy_us.at(s); }
  //! Micro-batch `m`'s wait on stage `s` from its forward's end to its backward's start.
  [[nodiscard]] double wait_us(std::uint32_t s, std::uint32_t m) const {
    auto const i = index(s, m);
    return backward_begin_us.at(i) - forward_end_us.at(i);
  }
  //! Micro-batches whose saved data stage `s` can offload and bring back within their wait: those
  //! waiting at least `round_trips` (PipeOffload: 3) times `round_trip_us` (its data to the host
  //! and back), in micro-batch order.
  [[nodiscard]] std::vector<std::uint32_t> waits_at_least(std::uint32_t s, double round_trip_us, double round_trips = 3) const {
    std::vector<std::uint32_t> r;
    for (std::uint32_t m = 0; m < micro_batches; ++m)
      if (wait_us(s, m) >= round_trips * round_trip_us) r.push_back(m);
    return r;
  }
  //! Where (stage `s`, micro-batch `m`) is in the per-pass vectors; throws `schedule_error` outside.
  [[nodiscard]] std::size_t index(std::uint32_t s, std::uint32_t m) const {
    if (s >= stages || m >= micro_batches)
      throw schedule_error("tide: stage_timeline: stage " + std::to_string(s) + ", micro-batch " + std::to_string(m) +
                           " is outside its " + std::to_string(stages) + " stages and " + std::to_string(micro_batches) + " micro-batches");
    return static_cast<std::size_t>(s) * micro_batches + m;
  }
};

//! Most (stage, micro-batch) pairs `time_stages` takes: four times per pair, 512 MiB at the limit.
inline constexpr std::uint64_t max_stage_timeline_pairs = std::uint64_t{1} << 24;

//! The timeline of `stages` stages, each in `order`, with `micro_batches` micro-batches and
//! `costs[s]` for stage s (one entry: every stage). Throws `schedule_error` for a pipeline
//! `check_stage` refuses or costs that are not finite times from 0 to 1e12 us, naming them.
[[nodiscard]] inline stage_timeline time_stages(stage_order order, std::uint32_t stages, std::uint32_t micro_batches,
                                                std::span<stage_costs const> costs) {
  check_stage({.stage = 0, .stages = stages, .micro_batches = micro_batches, .order = order});
  if (std::uint64_t{stages} * micro_batches > max_stage_timeline_pairs)
    throw schedule_error("tide: time_stages: " + std::to_string(stages) + " stages x " + std::to_string(micro_batches) +
                         " micro-batches is more than tide::max_stage_timeline_pairs (16777216) (stage, micro-batch) pairs: "
                         "time a representative pipeline (its bubble and waits scale with the stages and micro-batches)");
  if (costs.size() != 1 && costs.size() != stages)
    throw schedule_error("tide: time_stages: " + std::to_string(costs.size()) + " stage_costs for " + std::to_string(stages) +
                         " stages: give one (every stage) or one per stage");
  for (std::size_t s = 0; s < costs.size(); ++s)
    for (auto const& [v, what] : {std::pair{costs[s].forward_us, "forward_us"}, {costs[s].backward_us, "backward_us"},
                                  {costs[s].transfer_us, "transfer_us"}})
      if (!(v >= 0 && v <= 1e12))
        throw schedule_error("tide: time_stages: stage_costs[" + std::to_string(s) + "]." + what + " is " + std::to_string(v) +
                             ": give a time from 0 to 1e12 microseconds");
  auto const cost = [&](std::uint32_t s) -> stage_costs const& { return costs[costs.size() == 1 ? 0 : s]; };
  stage_timeline t{.stages = stages, .micro_batches = micro_batches};
  auto const n = static_cast<std::size_t>(stages) * micro_batches;
  constexpr double unset = -1;  // internal: times are never negative
  t.forward_begin_us.assign(n, unset), t.forward_end_us.assign(n, unset);
  t.backward_begin_us.assign(n, unset), t.backward_end_us.assign(n, unset);
  t.busy_us.assign(stages, 0);
  std::vector<std::uint32_t> next(stages, 0);  // each stage's next entry of its order
  std::vector<double> free_at(stages, 0);
  std::size_t done = 0, total = 2 * n;
  // Each round runs every stage as far as its next pass's input is ready; a round without
  // progress would be a cycle (the orders above have none; the check keeps a bad one from hanging).
  while (done < total) {
    bool progress = false;
    for (std::uint32_t s = 0; s < stages; ++s) {
      stage_spec const spec{.stage = s, .stages = stages, .micro_batches = micro_batches, .order = order};
      while (next[s] < 2 * micro_batches) {
        auto const step = detail::stage_step_at(spec, next[s]);
        auto const i = t.index(s, step.micro_batch);
        double ready = free_at[s];
        if (step.pass == stage_pass::forward) {
          if (s > 0) {
            auto const prev = t.forward_end_us[t.index(s - 1, step.micro_batch)];
            if (prev < 0) break;
            ready = std::max(ready, prev + cost(s - 1).transfer_us);
          }
          t.forward_begin_us[i] = ready;
          t.forward_end_us[i] = free_at[s] = ready + cost(s).forward_us;
          t.busy_us[s] += cost(s).forward_us;
        } else {
          if (s + 1 < stages) {
            auto const later = t.backward_end_us[t.index(s + 1, step.micro_batch)];
            if (later < 0) break;
            ready = std::max(ready, later + cost(s).transfer_us);
          }
          t.backward_begin_us[i] = ready;
          t.backward_end_us[i] = free_at[s] = ready + cost(s).backward_us;
          t.busy_us[s] += cost(s).backward_us;
        }
        ++next[s], ++done, progress = true;
      }
    }
    if (!progress) throw schedule_error("tide: time_stages: internal error: the stage orders wait on each other");
  }
  for (auto e : t.backward_end_us) t.step_us = std::max(t.step_us, e);
  return t;
}

//! PipeOffload's rule as stage `s`'s policies (Wan et al., arXiv 2503.01328): `offloaded` for the
//! micro-batches whose wait between forward and backward in `t` is at least `round_trips` round
//! trips of their data (`waits_at_least`), `steady` for the others; pass the result to
//! `build_stage_schedule`.
[[nodiscard]] inline stage_policies offload_by_wait(stage_timeline const& t, std::uint32_t s, double round_trip_us,
                                                    policy_spec offloaded, policy_spec steady = {}, double round_trips = 3) {
  if (!(round_trip_us >= 0) || !std::isfinite(round_trip_us) || !(round_trips >= 0) || !std::isfinite(round_trips))
    throw schedule_error("tide::offload_by_wait: the round trip (" + std::to_string(round_trip_us) + " us) and the round trips (" +
                         std::to_string(round_trips) + ") must be finite and not negative");
  if (s >= t.stages)
    throw schedule_error("tide::offload_by_wait: stage " + std::to_string(s) + " of a " + std::to_string(t.stages) + "-stage timeline");
  stage_policies r{{std::move(steady), std::move(offloaded)}, std::vector<std::uint32_t>(t.micro_batches, 0)};
  for (auto m : t.waits_at_least(s, round_trip_us, round_trips)) r.of_micro_batch[m] = 1;
  return r;
}

}  // namespace tide
