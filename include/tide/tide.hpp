#pragma once
//! \file
//! Umbrella header: the whole host-compilable library. CUDA pieces live under
//! `<tide/backends/cuda/...>` and are included separately.

#include <tide/core/buffers.hpp>
#include <tide/core/build.hpp>
#include <tide/core/check.hpp>
#include <tide/core/check_report.hpp>
#include <tide/core/checkpoints.hpp>
#include <tide/core/collectives.hpp>
#include <tide/core/describe.hpp>
#include <tide/core/error.hpp>
#include <tide/core/link_model.hpp>
#include <tide/core/op.hpp>
#include <tide/core/pipeline.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/reversal.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/storage_link.hpp>
#include <tide/core/static_schedule.hpp>
#include <tide/core/strategy.hpp>
#include <tide/core/validation.hpp>
#include <tide/core/vocabulary.hpp>

#include <tide/executor/arena_pool.hpp>
#include <tide/executor/backend.hpp>
#include <tide/executor/context.hpp>
#include <tide/executor/executor.hpp>
#include <tide/executor/slot_map.hpp>
#include <tide/executor/turn.hpp>
#include <tide/storage/spill_file.hpp>

#include <tide/backends/host/host_backend.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/backends/sim/sim_backend.hpp>

#include <tide/plan/calibrate.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/lower_bound.hpp>
#include <tide/plan/plan.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/plan/compare.hpp>
#include <tide/plan/transformer.hpp>

#include <tide/trace/chrome_trace.hpp>
#include <tide/trace/json.hpp>
#include <tide/trace/summary.hpp>
#include <tide/trace/timeline.hpp>
