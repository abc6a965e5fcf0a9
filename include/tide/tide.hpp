#pragma once
//! \file
//! Umbrella header: the whole host-compilable library (`<tide/planning.hpp>`, which includes
//! `<tide/sim.hpp>` and `<tide/host.hpp>`). CUDA pieces live under `<tide/backends/cuda/...>` and
//! are included separately; the file formats under `<tide/io/...>` (nlohmann/json).

#include <tide/planning.hpp>
