#pragma once
//! \file
//! A pipeline stage's step as a schedule: the stage's stack run for each of the step's
//! micro-batches in its stage order (core/stage_order.hpp), each micro-batch's saved data placed
//! by a policy of its own, with the boundary tensor and its gradient moved by `send` and `receive`
//! ops on the communication stream. The executor runs it as any schedule, the checker proves it.
//!
//!     auto s = tide::build_stage_schedule(stack, how, {.stage = rank, .stages = 4, .micro_batches = 8},
//!                                         tide::offload_warmup(stage, offloaded));
//!
//! Each micro-batch is built with the single-stack builder under its policy (the same buffers,
//! pipeline and checkpoints for all; `buffer_spec::share_phase_regions` off where a micro-batch
//! copies, since one micro-batch's backward runs beside another's forward), and the builds are
//! laid side by side:
//! - schedule layer `v` is the stage's layer `v % L` of micro-batch `v / L` (`stage_binding`);
//!   lambdas see the stage's layer and the micro-batch (`ctx.layer`, `ctx.micro_batch`);
//! - a micro-batch in flight (its forward run, its backward not) holds an instance region: its
//!   kept slots, its carries and its boundary gradient. There are as many instance regions as
//!   micro-batches are in flight at most (`peak_in_flight`); the copy rings and the remat, recompute
//!   and advance scratch are shared by all. The pinned host arena and the storage file hold a region
//!   per instance too;
//! - where two micro-batches' ops touch the same bytes (a shared ring, an instance region reused)
//!   the later one waits for the earlier on every other stream: offloads of one micro-batch overlap
//!   the next one's forward, prefetches the previous one's backward, as far as the rings allow; a
//!   backward that follows a forward has its first prefetches issued before that forward, so that
//!   they overlap it (PipeOffload reloads in the last free slot before the backward);
//! - each forward receives the micro-batch's input first and, but on the last stage, sends its
//!   output after; each backward receives its output's gradient first (but on the last stage, whose
//!   turn seeds it) and sends its input's gradient after. A send and the receive right after it on
//!   the communication stream are posted together (`op::chunks` 2), as Megatron-LM's
//!   `send_forward_recv_backward` pairs them, so neighbouring stages cannot deadlock in 1F1B's
//!   steady state.
//!
//! What a stage schedule does not take yet: collective hooks (`collective_spec`): reduce a data
//! parallel stage's gradients after the step.

#include <cstdint>
#include <string>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/stage_order.hpp>
#include <tide/core/strategy.hpp>

namespace tide {

//! Which policy places each micro-batch's saved data: `of_micro_batch[m]` indexes `policies`.
//! Empty `policies`: the strategy's policy for every micro-batch; empty `of_micro_batch`:
//! `policies[0]` for every one.
struct stage_policies {
  std::vector<policy_spec> policies{};          //!< the policies the micro-batches use
  std::vector<std::uint32_t> of_micro_batch{};  //!< per micro-batch: its index into `policies`
};

//! The stage's warm-up forwards: those that run before its first backward but the last of them
//! (whose backward comes soonest). 1F1B: `stages - stage - 1`, Megatron-LM's warm-up; GPipe:
//! `micro_batches - 1`. Their micro-batches (0 up to it) wait longest for their backward: what
//! PipeOffload offloads first.
[[nodiscard]] constexpr std::uint32_t warmup_forwards(stage_spec const& s) {
  if (auto const p = detail::stage_spec_problem(s); !p.empty()) throw schedule_error("tide: " + std::string(p));
  return s.order == stage_order::gpipe ? s.micro_batches - 1 : s.stages - s.stage - 1;
}

//! `offloaded` for the warm-up micro-batches of `s` (`warmup_forwards`), `steady` for the others.
[[nodiscard]] inline stage_policies warmup_policies(stage_spec const& s, policy_spec offloaded, policy_spec steady = {}) {
  auto const w = warmup_forwards(s);
  stage_policies r{{std::move(steady), std::move(offloaded)}, {}};
  r.of_micro_batch.resize(s.micro_batches);
  for (std::uint32_t m = 0; m < s.micro_batches; ++m) r.of_micro_batch[m] = m < w ? 1 : 0;
  return r;
}

//! `offloaded` for every micro-batch whose saved data is held while another pass runs (its
//! backward is not the pass right after its forward), `steady` for the others: under 1F1B every
//! micro-batch of the last stage is the latter, its backward following its forward at once, so
//! that an offload could hide behind nothing (PipeOffload leaves such micro-batches on the device:
//! their forward-to-backward gap is under three round trips).
[[nodiscard]] inline stage_policies held_policies(stage_spec const& s, policy_spec offloaded, policy_spec steady = {}) {
  check_stage(s);
  stage_policies r{{std::move(steady), std::move(offloaded)}, std::vector<std::uint32_t>(s.micro_batches, 1)};
  for (std::uint32_t k = 0; k + 1 < 2 * s.micro_batches; ++k) {
    auto const e = detail::stage_step_at(s, k), next = detail::stage_step_at(s, k + 1);
    if (e.pass == stage_pass::forward && next.pass == stage_pass::backward && next.micro_batch == e.micro_batch)
      r.of_micro_batch[e.micro_batch] = 0;
  }
  return r;
}

//! The schedule of stage `stage`'s step: `stack` (the stage's layers; it must have a carry, the
//! boundary tensor) run for each micro-batch in the stage order, under `how` (its policy for every
//! micro-batch unless `policies` gives them their own). Throws `schedule_error` naming what is
//! wrong: a stage `check_stage` refuses, a stack without a carry, collective hooks, a policy
//! index out of range, or what `build_schedule` refuses for a micro-batch's policy.
TIDE_INLINE schedule build_stage_schedule(stack_spec const& stack, strategy const& how, stage_spec const& stage,
                                          stage_policies const& policies = {});

}  // namespace tide

#if TIDE_DEFINITIONS
#include <tide/core/detail/build_stage.hpp>
#endif
