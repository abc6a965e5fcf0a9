// The executor's defaults follow NDEBUG: debug checks and the schedule check are on without it
// and off with it. Built twice (tests/meson.build), once with -DNDEBUG and once with -UNDEBUG,
// so every build type checks both defaults, whatever its own NDEBUG.
#include <cstdio>

#include <tide/executor/executor.hpp>

int main() {
  tide::executor_options const o;
#ifdef NDEBUG
  bool const want = false;
  char const* build = "NDEBUG";
#else
  bool const want = true;
  char const* build = "no NDEBUG";
#endif
  if (o.debug_checks != want || o.check_schedule != want) {
    std::fprintf(stderr, "with %s: debug_checks %d, check_schedule %d; expected both %d\n", build, o.debug_checks,
                 o.check_schedule, want);
    return 1;
  }
  std::printf("with %s: debug_checks and check_schedule default to %d\n", build, want);
  return 0;
}
