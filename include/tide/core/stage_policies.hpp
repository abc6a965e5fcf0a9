#pragma once
//! \file
//! Which policy places each micro-batch's saved data in a pipeline stage's step
//! (`build_stage_schedule`, core/stage_schedule.hpp), and the rules that choose it: the warm-up
//! micro-batches, those held while another pass runs. A header of its own so that what chooses
//! policies (the planner's `offload_by_wait`) does not parse the stage builder.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/stage_order.hpp>

namespace tide {

//! Which policy places each micro-batch's saved data: `of_micro_batch[m]` indexes `policies`.
//! Interleaved (`stage_spec::virtual_stages` v > 1), one entry per (chunk, micro-batch) unit,
//! chunk-major: chunk c's micro-batch m at `c * micro_batches + m` (`stage_unit`). Empty
//! `policies`: the strategy's policy for every micro-batch; empty `of_micro_batch`: `policies[0]`
//! for every one.
struct stage_policies {
  std::vector<policy_spec> policies{};          //!< the policies the micro-batches use
  std::vector<std::uint32_t> of_micro_batch{};  //!< per micro-batch (per unit): its index into `policies`
};


//! The stage's warm-up forwards: those that run before its first backward but the last of them
//! (whose backward comes soonest). 1F1B: `stages - stage - 1`, Megatron-LM's warm-up; GPipe:
//! `micro_batches - 1`; interleaved, Megatron-LM's `(stages - stage - 1) * 2 + (v - 1) * stages`
//! (at most every unit but one). Their units wait longest for their backward: what PipeOffload
//! offloads first.
[[nodiscard]] constexpr std::uint32_t warmup_forwards(stage_spec const& s) {
  if (auto const p = detail::stage_spec_problem(s); !p.empty()) throw schedule_error("tide: " + std::string(p));
  auto const w = detail::warmup_length(s);
  return w == s.units() ? w - 1 : w;
}

//! `offloaded` for the units of `s`'s warm-up forwards (`warmup_forwards`), `steady` for the others.
[[nodiscard]] constexpr stage_policies warmup_policies(stage_spec const& s, policy_spec offloaded, policy_spec steady = {}) {
  auto const w = warmup_forwards(s);
  stage_policies r{{std::move(steady), std::move(offloaded)}, {}};
  r.of_micro_batch.resize(s.units(), 0);
  for (std::uint32_t k = 0; k < w; ++k) {
    auto const e = detail::nth_pass(s, stage_pass::forward, k);
    r.of_micro_batch[stage_unit(s, e.chunk, e.micro_batch)] = 1;
  }
  return r;
}

//! `offloaded` for every micro-batch whose saved data is held while another pass runs (its
//! backward is not the pass right after its forward), `steady` for the others: under 1F1B every
//! micro-batch of the last stage is the latter, its backward following its forward at once, so
//! that an offload could hide behind nothing (PipeOffload leaves such micro-batches on the device:
//! their forward-to-backward gap is under three round trips).
[[nodiscard]] constexpr stage_policies held_policies(stage_spec const& s, policy_spec offloaded, policy_spec steady = {}) {
  check_stage(s);
  stage_policies r{{std::move(steady), std::move(offloaded)}, std::vector<std::uint32_t>(s.units(), 1)};
  for (std::uint32_t k = 0; k + 1 < 2 * s.units(); ++k) {
    auto const e = detail::stage_step_at(s, k), next = detail::stage_step_at(s, k + 1);
    if (e.pass == stage_pass::forward && next.pass == stage_pass::backward && next.micro_batch == e.micro_batch &&
        next.chunk == e.chunk)
      r.of_micro_batch[stage_unit(s, e.chunk, e.micro_batch)] = 0;
  }
  return r;
}

}  // namespace tide
