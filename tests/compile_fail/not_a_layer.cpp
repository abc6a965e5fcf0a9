// expect: each part must be a tide::layer
#include <tide/tide.hpp>
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, int>, tide::strategy_of<tide::keep_all>>();
