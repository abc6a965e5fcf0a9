// expect: share a name but declare different slots
#include <tide/tide.hpp>
// Two layer types named "dense" with different slots used to be merged into the first.
using a = tide::layer<"dense", tide::slot<"x", 64>>;
using b = tide::layer<"dense", tide::slot<"x", 64>, tide::slot<"y", 4096>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, a, tide::repeat<b, 2>>, tide::strategy_of<tide::keep_all>>();
