// What a trainer with a run-time stack pays per edit of its own file (tools/compile_time.sh, unit
// "runtime"): a stack built from values, a policy chosen at run time, one step on the host backend.
#include <tide/host.hpp>

#include <cstdio>
#include <span>

int main() {
  tide::stack_spec stack;
  tide::layer_spec const dense{"dense",
                               {{.name = "layer_input", .bytes = 1 << 16, .input = true},
                                {.name = "q_proj", .bytes = 1 << 16},
                                {.name = "mlp_up", .bytes = 1 << 18}}};
  for (int i = 0; i < 8; ++i) stack.append(dense);
  auto const schedule = tide::build_schedule(stack, {.policy = tide::policy_spec{tide::rule_spec{.where = tide::placement::offload}}});
  tide::host_backend backend;
  tide::executor exec(backend, schedule);
  auto forward = [](auto const& ctx) {
    for (auto& x : ctx.template slot_as<float>(ctx.slot_index("q_proj"))) x = static_cast<float>(ctx.layer);
  };
  float sum = 0;
  auto backward = [&sum](auto const& ctx) { sum += ctx.template slot_as<float const>(ctx.slot_index("q_proj"))[0]; };
  exec.step(forward, backward);
  std::printf("%g\n", static_cast<double>(sum));  // 0 + 1 + ... + 7 = 28
  return sum == 28 ? 0 : 1;
}
