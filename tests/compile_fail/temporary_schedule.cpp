// expect: use of deleted function
#include <tide/tide.hpp>
void f(tide::host_backend& b, tide::stack_spec const& st) {
  tide::executor e(b, tide::build_schedule(st, tide::strategy{}));  // the schedule would die at the semicolon
}
