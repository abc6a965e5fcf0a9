// expect: does not fit in std::size_t
#include <tide/tide.hpp>
#include <cstdint>
// A kept slot of SIZE_MAX - 1 bytes used to wrap to a predicted peak of 0, so this passed.
using l = tide::layer<"l", tide::slot<"huge", SIZE_MAX - 1>>;
constexpr auto s = tide::make_schedule<tide::stack<tide::independent_layers, l>, tide::strategy_of<tide::keep_all>>();
static_assert(s.peak_device_bytes() <= 4096);
