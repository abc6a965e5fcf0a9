#pragma once
//! \file
//! Umbrella header: the whole host-compilable library (`<tide/planning.hpp>`, which includes
//! `<tide/sim.hpp>` and `<tide/host.hpp>`). CUDA pieces live under `<tide/backends/cuda/...>` and
//! are included separately; the file formats under `<tide/io/...>` (nlohmann/json); the
//! collectives under `<tide/collectives/...>` (MPI, NCCL); and the pipeline stage builder,
//! `<tide/core/stage_schedule.hpp>` (a tenth of this header's compile: what only a pipeline needs).

#include <tide/planning.hpp>
