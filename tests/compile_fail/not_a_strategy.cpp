// expect: the second argument must be a tide::strategy_of<...>
#include <tide/tide.hpp>
// 0.1 took the policy as make_schedule's second argument; now the parts travel in tide::strategy_of.
using l = tide::layer<"l", tide::slot<"a", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, l>, tide::policy<tide::offload<>>>();
