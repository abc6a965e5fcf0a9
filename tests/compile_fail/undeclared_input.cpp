// expect: does not say where its input comes from
// expect: issue_name layer_type = issue_name{"blk"}
#include <tide/tide.hpp>
// A chain of layers (each reads the last one's output) that declares neither a carry, an input
// slot nor independence: a remat-everything policy would recompute from data that is gone.
using blk = tide::layer<"blk", tide::slot<"x", 64>, tide::slot<"h", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::repeat<blk, 3>>, tide::strategy_of<tide::policy<tide::remat<>>>>();
