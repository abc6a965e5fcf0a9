// expect: names the same slot twice
// expect: issue_name layer_type = issue_name{"l"}; issue_name slot = issue_name{"a"}
#include <tide/tide.hpp>
using l = tide::layer<"l", tide::slot<"a", 64>, tide::slot<"a", 128>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, l>, tide::strategy_of<tide::keep_all>>();
