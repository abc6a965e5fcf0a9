#pragma once
//! \file
//! Deprecated (0.3): `tide::link_model` is `tide::link_direction` (its latency now in
//! microseconds, `latency_us`), in `<tide/core/host_link.hpp>`.

#include <tide/core/host_link.hpp>

namespace tide {

//! Deprecated (0.3): one direction of the host link.
using link_model [[deprecated("use tide::link_direction (<tide/core/host_link.hpp>); its latency is latency_us")]] = link_direction;

}  // namespace tide
