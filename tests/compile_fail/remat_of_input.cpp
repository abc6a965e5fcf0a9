// expect: rematerializes a layer's input slot
#include <tide/tide.hpp>
using blk = tide::layer<"blk", tide::input_slot<"in", 64>, tide::slot<"h", 64>>;
using net = tide::stack<tide::repeat<blk, 3>>;
constexpr auto s = tide::make_schedule<net, tide::strategy_of<tide::policy<tide::remat<>>>>();
