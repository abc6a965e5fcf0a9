// expect: ignoring return value
#include <tide/tide.hpp>
// A build's result is its only report of failure: ignoring it is a diagnostic ([[nodiscard]]).
#pragma GCC diagnostic error "-Wunused-result"
void f(tide::schedule& s, tide::stack_spec const& st) { tide::try_build_schedule_into(s, st, tide::strategy{}); }
