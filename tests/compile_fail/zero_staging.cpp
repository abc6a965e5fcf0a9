// expect: zero staging buffers
#include <tide/tide.hpp>
using l = tide::layer<"l", tide::slot<"a", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, tide::repeat<l, 4>>,
                                       tide::strategy_of<tide::policy<tide::offload<>>, tide::buffers<tide::staging_buffers<0>>>>();
