// expect: the stack has no carry
#include <tide/tide.hpp>
#include <tide/core/static_stage_schedule.hpp>
using blk = tide::layer<"blk", tide::slot<"h", 64>>;
using net = tide::stack<tide::independent_layers, tide::repeat<blk, 2>>;
constexpr auto s = tide::make_stage_schedule<net, tide::strategy_of<>, tide::stage_spec{.stage = 0, .stages = 2, .micro_batches = 4}>();
