#include <tide/tide.hpp>

#include <cstdio>

using blk = tide::layer<"blk", tide::slot<"x", 4096>>;
constexpr auto s =
    tide::make_schedule<tide::stack<tide::independent_layers, tide::repeat<blk, 4>>, tide::strategy_of<tide::policy<tide::offload<>>>>();
static_assert(s.peak_device_bytes() < 4 * 4096);

int main() {
  tide::host_backend backend;
  tide::executor exec(backend, s);
  int forwards = 0, backwards = 0;
  exec.step([&](auto const&) { ++forwards; }, [&](auto const&) { ++backwards; });
  std::printf("consumer: %d forwards, %d backwards, peak %zu bytes\n", forwards, backwards, s.peak_device_bytes());
  return forwards == 4 && backwards == 4 ? 0 : 1;
}
