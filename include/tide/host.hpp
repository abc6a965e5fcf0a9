#pragma once
//! \file
//! Pay for what you use: what a program that builds schedules (at compile time or at run time) and
//! runs them on the host backend includes: the core (stacks, policies, schedules, the checker),
//! the executor, the storage tier, the host backend and the step's trace and summary. Not the
//! planner, the checkpointing search, the cost model or the file formats: about half the compile
//! time of `<tide/tide.hpp>` (`tools/compile_time.sh`). `<tide/sim.hpp>` adds the simulator,
//! `<tide/planning.hpp>` the planner; `<tide/tide.hpp>` is all of it.

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
#include <tide/core/stage_order.hpp>
#include <tide/core/stage_policies.hpp>
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
#include <tide/trace/chrome_trace.hpp>
#include <tide/trace/json.hpp>
#include <tide/trace/summary.hpp>
#include <tide/trace/timeline.hpp>

#if defined(TIDE_SEPARATE_COMPILATION)
// The executor's step machinery for the host backend is the library's (core/config.hpp).
namespace tide {
extern template class executor<host_backend>;
}  // namespace tide
#endif
