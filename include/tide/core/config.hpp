#pragma once
//! \file
//! How tide is compiled: header-only (the default) or separately.
//!
//! Header-only, every translation unit that includes tide compiles what it uses of it. With
//! `TIDE_SEPARATE_COMPILATION` defined in every translation unit of a program (Meson:
//! `-Dseparate_compilation=true`; CMake: `-DTIDE_SEPARATE_COMPILATION=ON`; otherwise compile
//! `src/tide.cpp` into the program), the parts that do not depend on the user's types (the
//! checker, the host and simulated backends, the spill file, the executor's step machinery for
//! `host_backend` and `sim_backend`) are compiled once into a library, as fmt, spdlog and
//! Boost.Asio offer: a translation unit that includes `<tide/host.hpp>` or `<tide/sim.hpp>` then
//! parses their declarations and compiles only its own lambdas' glue. The two modes give the same
//! program; the test suite runs in both.

#if defined(TIDE_SEPARATE_COMPILATION) && !defined(TIDE_BUILDING_LIBRARY)
#define TIDE_DEFINITIONS 0
#else
//! 1 where a translation unit sees the definitions of tide's compiled parts (header-only, or the
//! library itself), 0 where it sees only their declarations (a consumer in separate compilation).
#define TIDE_DEFINITIONS 1
#endif

#if defined(TIDE_SEPARATE_COMPILATION)
#define TIDE_INLINE
#else
//! Marks a compiled part: `inline` header-only; in separate compilation, external linkage (its one
//! definition is in the library).
#define TIDE_INLINE inline
#endif
