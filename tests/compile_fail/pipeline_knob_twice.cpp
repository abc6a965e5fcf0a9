// expect: tide::pipeline<...>: a knob is given twice
#include <tide/tide.hpp>
// Two prefetch distances: which one was meant?
using l = tide::layer<"l", tide::slot<"a", 64>>;
using twice = tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<32>, tide::prefetch_distance<3>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, tide::repeat<l, 4>>, tide::strategy_of<tide::policy<tide::offload<>>, twice>>();
