// Built only when tide::json exists: a policy file read for a stack through tide's CMake package
// (tide::json brings nlohmann/json), and the schedule it gives.
#include <tide/io/json.hpp>
#include <tide/tide.hpp>

#include <cstdio>

int main() {
  tide::stack_spec st;
  st.append({"blk", {{"x", 4096, true}, {"h", 8192}}}, 4);
  auto const how = tide::io::strategy_from_json(
      tide::io::parse_json(R"({"rules": [{"action": "offload", "slots": ["h"]}], "pipeline": {"prefetch_distance": 2}})", "policy"),
      st);
  auto const s = tide::build_schedule(st, how);
  std::printf("consumer_json: offload h, peak %zu device bytes, %zu host bytes\n", s.peak_device_bytes(), s.peak_host_bytes());
  return s.peak_host_bytes() == 4 * 8192 ? 0 : 1;
}
