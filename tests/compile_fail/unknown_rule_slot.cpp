// expect: a policy rule names a slot that no layer of the stack has
// expect: issue_name slot = issue_name{"q_proj"}
#include <tide/tide.hpp>
using l = tide::layer<"l", tide::slot<"a", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, l>, tide::strategy_of<tide::policy<tide::remat<tide::slot_names<"q_proj">>>>>();
