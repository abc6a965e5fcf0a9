// expect: collective hooks are not taken in a stage schedule yet
#include <tide/tide.hpp>
#include <tide/core/static_stage_schedule.hpp>
using blk = tide::layer<"blk", tide::slot<"h", 64>>;
using net = tide::stack<tide::carry<"x", 64>, tide::repeat<blk, 2>>;
constexpr auto s = tide::make_stage_schedule<net, tide::strategy_of<tide::collectives<tide::after_backward>>,
                                             tide::stage_spec{.stage = 0, .stages = 2, .micro_batches = 4}>();
