// expect: the second argument must be a tide::policy
#include <tide/tide.hpp>
using l = tide::layer<"l", tide::slot<"a", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<l>, tide::offload<>>();
