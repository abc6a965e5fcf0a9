// expect: decides no (layer, slot) of the stack
#include <tide/tide.hpp>
// A rule for layers [20, end) of a 16-layer stack matches nothing: almost always a typo.
using l = tide::layer<"l", tide::slot<"a", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, tide::repeat<l, 16>>,
                                       tide::strategy_of<tide::policy<tide::offload<tide::layer_range<20>>>>>();
