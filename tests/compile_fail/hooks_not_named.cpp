// expect: the third argument must be tide::hooks
#include <tide/tide.hpp>
// 0.1 took the collective hooks by position (step(fwd, bwd, gather, reduce)); they are named now:
// e.step(fwd, bwd, tide::hooks{.before_forward = gather}).
void f(tide::executor<tide::host_backend>& e) {
  auto none = [](auto const&) {};
  e.step(none, none, none);
}
