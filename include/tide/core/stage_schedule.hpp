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
//!   steady state;
//! - interleaved (`stage_order::interleaved`, v chunks a stage), the units are (chunk,
//!   micro-batch) pairs: schedule layer `v` is still the stage's layer `v % L` of micro-batch
//!   `v / L`, the stage's layers its chunks' in turn (`stage_chunks`), and each unit has its own
//!   policy (its rules' layer bounds count the stage's layers over all its chunks), instance
//!   region, transfers and build (chunks of the same layer types under the same rules share one). The
//!   transfers go in rounds, as Megatron-LM's interleaved schedule posts them: after a warm-up
//!   forward, a forward and backward pair, or a cool-down backward, its sends and the next
//!   round's receives are one group (`op::chunks` up to 4), which no neighbour can deadlock on
//!   even when every transfer waits for its peer (the ring of the last stage back to stage 0
//!   deadlocks pairs).
//!
//! What a stage schedule does not take yet: collective hooks (`collective_spec`): reduce a data
//! parallel stage's gradients after the step; spilling to storage (each unit in flight would need
//! a spill ring of its own): offload instead.

#include <cstdint>
#include <string>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/stage_order.hpp>
#include <tide/core/stage_partition.hpp>
#include <tide/core/stage_policies.hpp>
#include <tide/core/strategy.hpp>

namespace tide {

//! The schedule of stage `stage`'s step: `stack` (the stage's layers; it must have a carry, the
//! boundary tensor) run for each micro-batch in the stage order, under `how` (its policy for every
//! micro-batch unless `policies` gives them their own). Interleaved, `stack` holds the stage's
//! chunks' layers in turn, `chunks` says how many each (empty: as many to each). Throws
//! `schedule_error` naming what is wrong: a stage `check_stage` refuses, a stack without a carry,
//! collective hooks, a policy that spills, a policy index out of range, chunks that do not split
//! the stack, or what `build_schedule` refuses for a micro-batch's policy.
TIDE_INLINE schedule build_stage_schedule(stack_spec const& stack, strategy const& how, stage_spec const& stage,
                                          stage_policies const& policies = {}, stage_chunks const& chunks = {});

}  // namespace tide

#if TIDE_DEFINITIONS
#include <tide/core/detail/stage_schedule_impl.hpp>
#endif
