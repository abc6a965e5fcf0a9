// expect: each argument must be a tide::policy<...>, tide::buffers<...>, tide::pipeline<...>, tide::collectives<...> or tide::checkpoints<...>
#include <tide/tide.hpp>
// A rule where a policy belongs: tide::strategy_of<tide::policy<tide::offload<>>> was meant.
using l = tide::layer<"l", tide::slot<"a", 64>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, l>, tide::strategy_of<tide::offload<>>>();
