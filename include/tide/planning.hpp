#pragma once
//! \file
//! Pay for what you use: `<tide/sim.hpp>` and the planning layer: the cost model, calibration, the
//! planner and its lower bound, the planner over micro-batches, strategy comparison, checkpointing
//! (Revolve, two and three tiers) and the transformer presets. The file formats
//! (`<tide/io/json.hpp>`, nlohmann/json) stay apart.

#include <tide/sim.hpp>
#include <tide/plan/calibrate.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/lower_bound.hpp>
#include <tide/plan/plan.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/plan/stage_timeline.hpp>
#include <tide/plan/compare.hpp>
#include <tide/plan/micro_batch.hpp>
#include <tide/plan/tune.hpp>
#include <tide/plan/transformer.hpp>
