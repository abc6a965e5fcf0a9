// expect: tide::pipeline<...>: each argument must be a pipeline knob
#include <tide/tide.hpp>
// A buffer knob in the pipeline: it belongs in tide::buffers<...>.
using l = tide::layer<"l", tide::slot<"a", 64>>;
using mixed_up = tide::pipeline<tide::prefetch_distance<2>, tide::staging_buffers<3>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, tide::repeat<l, 4>>, tide::strategy_of<tide::policy<tide::offload<>>, mixed_up>>();
