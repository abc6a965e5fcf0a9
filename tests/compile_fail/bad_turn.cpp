// expect: the turn must be callable as f(tide::turn_context<Stream> const&)
#include <tide/tide.hpp>
// The turn takes the turn's context, not a layer's: a lambda written for the backward is refused.
void f(tide::executor<tide::host_backend>& e) {
  auto none = [](auto const&) {};
  e.step(none, none, tide::turn{[](tide::backward_context<tide::host_backend::stream_type> const&) {}});
}
