// Writes what a user of tide-plan would: the calibration file of a stack measured on the host
// backend (tide::calibrate, then tide::io::write_calibration_file), and the model file of that
// stack without costs (so the calibration gives them). tests/io/tide_plan_test.py plans with both.
//
//   calibrate_host OUT_DIR   -> OUT_DIR/calibration.json, OUT_DIR/model.json
#include <tide/io/json.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cstdio>
#include <string>

namespace {
void spin_us(double us) {
  auto const until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}
}  // namespace

int main(int argc, char** argv) {
  using namespace tide;
  if (argc != 2) {
    std::fprintf(stderr, "usage: calibrate_host OUT_DIR\n");
    return 2;
  }
  std::string const out = argv[1];
  // The copies are paced at 1 GB/s and the compute spins, so times have a real machine's ratios.
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"x", 256 << 10, true}, {"qkv", 768 << 10}, {"mlp_up", 1 << 20}}}, 8);
  host_backend_options o;
  o.d2h = o.h2d = {.bytes_per_second = 1e9, .latency_us = 10};
  host_backend backend(o);
  auto fwd = [](forward_context<stream_role> const& c) {
    spin_us(300);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (c.produces(k)) c.slot(k)[0] = std::byte{1};
  };
  auto bwd = [](backward_context<stream_role> const&) { spin_us(600); };
  auto const measured = calibrate(st, backend, fwd, bwd, {.repeats = 2});
  io::write_calibration_file(out + "/calibration.json", measured);

  io::json model;
  model["name"] = "host-calibrated stack";
  model["resident_bytes"] = 0;
  io::json type;
  type["name"] = "blk";
  for (auto const& s : st.types[0].slots) {
    io::json slot = {{"name", std::string(s.name)}, {"bytes", s.bytes}};
    if (s.input) slot["input"] = true;
    type["slots"].push_back(slot);
  }
  model["layer_types"] = io::json::array({type});
  model["layers"] = io::json::array({{{"type", "blk"}, {"count", st.layer_count()}}});
  io::write_json_file(out + "/model.json", model);
  std::printf("calibrated %u layers: forward %.0f us, backward %.0f us, d2h %.2f GB/s + %.1f us\n", measured.layer_count(),
              measured.layers[0].forward_us, measured.layers[0].backward_us, measured.link.d2h.bytes_per_second / 1e9,
              measured.link.d2h.latency_us);
  return 0;
}
