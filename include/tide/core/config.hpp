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

// `if consteval` (C++23) where the compiler accepts it in C++20 as an extension (GCC 12+, Clang
// 14+; not nvcc's front end): `try_build_schedule_into` (core/build.hpp) then does not reference
// the constexpr schedule builder from code that runs, so a translation unit that builds its
// schedules at run time from the library (separate compilation) does not hand the builder's
// thousands of functions to the optimizer. Elsewhere `std::is_constant_evaluated()` stands in.
#if defined(__cpp_if_consteval) && __cpp_if_consteval >= 202106L
#define TIDE_DETAIL_IF_CONSTEVAL 1
#define TIDE_DETAIL_IF_CONSTEVAL_BEGIN
#define TIDE_DETAIL_IF_CONSTEVAL_END
#elif defined(__clang__) && !defined(__CUDACC__) && __clang_major__ >= 14
#define TIDE_DETAIL_IF_CONSTEVAL 1
#define TIDE_DETAIL_IF_CONSTEVAL_BEGIN _Pragma("clang diagnostic push") _Pragma("clang diagnostic ignored \"-Wc++2b-extensions\"")
#define TIDE_DETAIL_IF_CONSTEVAL_END _Pragma("clang diagnostic pop")
#elif defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__NVCOMPILER) && !defined(__INTEL_LLVM_COMPILER) && \
    __GNUC__ >= 12
#define TIDE_DETAIL_IF_CONSTEVAL 1
#define TIDE_DETAIL_IF_CONSTEVAL_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wc++23-extensions\"") \
  _Pragma("GCC diagnostic ignored \"-Wpedantic\"")
#define TIDE_DETAIL_IF_CONSTEVAL_END _Pragma("GCC diagnostic pop")
#else
//! 1 where `try_build_schedule_into` dispatches with `if consteval` (TIDE_DETAIL_IF_CONSTEVAL_BEGIN and
//! _END then open and close the region where its extension warning is silenced), 0 where with
//! `std::is_constant_evaluated()`. (Doxygen reads this branch.)
#define TIDE_DETAIL_IF_CONSTEVAL 0
#endif

// The link-time identity of separate compilation: tide's library defines one symbol per macro that
// changes the layout of a type it compiles (TIDE_HAVE_LIBURING: the spill file's io_uring state
// inside host_backend), named by the macro's value there, and every translation unit that
// includes tide in separate compilation references the one named by its own value. A consumer
// compiled with another value fails to link, naming the macro ("undefined reference to
// tide::link_check::libtide_built_with_TIDE_HAVE_LIBURING_1"); one that forgot the library names
// that. (TIDE_HAS_NCCL and TIDE_HAVE_CUFILE change only the CUDA backend's types, which the
// library does not compile: they are header-only in both modes. NDEBUG may differ: no public
// type's layout depends on it.)
#if defined(TIDE_HAVE_LIBURING) && TIDE_HAVE_LIBURING
#define TIDE_DETAIL_LIBURING_IDENTITY libtide_built_with_TIDE_HAVE_LIBURING_1
#else
//! The link-time identity symbol for this translation unit's TIDE_HAVE_LIBURING (see above).
#define TIDE_DETAIL_LIBURING_IDENTITY libtide_built_with_TIDE_HAVE_LIBURING_0
#endif
#if defined(TIDE_SEPARATE_COMPILATION)
namespace tide::link_check {
extern int const TIDE_DETAIL_LIBURING_IDENTITY;
extern int const TIDE_SEPARATE_COMPILATION_is_defined_link_libtide;
#if !defined(TIDE_BUILDING_LIBRARY)
// Kept (gnu::used) so that the linker must resolve both in every program built this way.
[[gnu::used]] static int const* const identity[] = {&TIDE_DETAIL_LIBURING_IDENTITY,
                                                    &TIDE_SEPARATE_COMPILATION_is_defined_link_libtide};
#endif
}  // namespace tide::link_check
#endif
