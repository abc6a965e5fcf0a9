// expect: tide::strategy_of<...>: two policies
#include <tide/tide.hpp>
// A strategy has one policy; its rules go in one tide::policy<...>, first match first.
using l = tide::layer<"l", tide::slot<"a", 64>, tide::slot<"b", 64>>;
using both = tide::strategy_of<tide::policy<tide::offload<tide::slot_names<"a">>>, tide::naive_pipeline,
                               tide::policy<tide::remat<tide::slot_names<"b">>>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, tide::repeat<l, 4>>, both>();
