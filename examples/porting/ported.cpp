// The trainer of original.hpp ported to tide, its kernels (model.hpp) unchanged: tide owns each
// layer's saved activations, the residual stream is the carry, the head and loss run in the turn,
// and each layer's unchanged forward is also its recompute. docs/porting.md walks through it.
//
// It trains under every policy (keep-all, full remat, offload with and without latency hiding,
// spill to disk, fewer stored carries, and the planner's choice under half of keep-all's peak) and
// exits 1 unless every step's loss and gradient checksum equal the original trainer's bit for bit.
//
//   porting_tide [--spill-dir DIR]   (default: a new directory under the system's temp directory)

#include <tide/tide.hpp>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include "original.hpp"

using namespace porting;

// ---- tide code: the minimal port (begin) -------------------------------------------------------
enum act : std::size_t { ln, ln_mean, ln_rstd, fc, fc_gelu, act_count };  // the struct's arrays, by name
constexpr std::array<char const*, act_count> act_names{"ln", "ln_mean", "ln_rstd", "fc", "fc_gelu"};

//! The block as a stack: one layer type with the slots the struct of activations held per layer.
[[nodiscard]] tide::stack_spec make_stack(config const& c) {
  std::size_t const B = c.batch * sizeof(float), BC = B * c.channels;
  tide::stack_spec st;
  st.append({"block", {{"ln", BC}, {"ln_mean", B}, {"ln_rstd", B}, {"fc", 4 * BC}, {"fc_gelu", 4 * BC}}}, c.layers);
  st.carry = {"residual", BC};  // layer l + 1's input is layer l's output
  return st;
}

//! A layer's slots as the model's struct of pointers (float, or float const in a backward).
template <class Spans>
[[nodiscard]] auto acts_of(Spans const& s) {
  using T = std::remove_pointer_t<decltype(s[0].data())>;
  return block_acts_of<T>{s[ln].data(), s[ln_mean].data(), s[ln_rstd].data(), s[fc].data(), s[fc_gelu].data()};
}

//! The original trainer's state, less the struct of activations (tide holds them now).
struct tide_trainer {
  config c;
  tide::slot_map<float, act_count> slots;
  parameters p{c}, g{c, true};
  backward_scratch scratch{c};
  std::vector<float> dres = std::vector<float>(std::size_t(c.batch) * c.channels);  // the residual's gradient
  float loss = 0;

  tide_trainer(config cfg, tide::stack_spec const& st) : c(cfg), slots(st, [](std::size_t i) { return act_names[i]; }) {}

  // The same block forward in every mode: tide lends scratch for what a recompute does not rebuild.
  void forward(auto const& ctx) {
    block_forward(c, p, int(ctx.layer), ctx.template carry_in<float>().data(), acts_of(slots.spans(ctx)),
                  ctx.template carry_out<float>().data());
  }
  void backward(auto const& ctx) {
    block_backward(c, p, g, int(ctx.layer), ctx.template carry_in<float>().data(), acts_of(slots.spans(ctx)), dres.data(), scratch);
  }

  template <class Backend>
  step_result step(tide::executor<Backend>& ex, batch const& b) {
    std::memcpy(ex.carry_input().data(), b.x.data(), b.x.size() * sizeof(float));
    auto fwd = [&](auto const& ctx) { forward(ctx); };
    auto bwd = [&](auto const& ctx) { backward(ctx); };
    tide::turn const head{[&](auto const& ctx) {  // between the last forward and the first backward
      loss = head_loss(c, p, g, ctx.template output<float>().data(), b.targets.data(), dres.data());
    }};
    ex.step(fwd, bwd, head);
    return {loss, checksum_and_update(c, p, g)};
  }
};
// ---- tide code: the minimal port (end) ---------------------------------------------------------

namespace {

struct run_result {
  std::vector<step_result> steps;
  std::size_t device = 0, host = 0, storage = 0;
};

//! Trains `c.steps` steps under `how`, from the initial weights, twice: under every check tide has
//! (`executor_options::checked()`: writes past a slot or the carry out, bytes left unwritten, a
//! recompute that does not rebuild its slots bitwise, an input not written) on the schedule with 64
//! guard bytes after every slot and carry, then as a training run would (checks off, within the
//! backend's budget); both must train the same. The peaks are those of the training run's schedule.
run_result train(config const& c, tide::stack_spec const& st, tide::strategy const& how, tide::host_backend_options o = {}) {
  auto guarded = how;
  guarded.buffers.guard_bytes = 64;  // counted in the checked schedule's peak: run it without the budget
  auto const checked = tide::build_schedule(st, guarded);
  auto unbudgeted = o;
  unbudgeted.device_budget = tide::host_backend_options{}.device_budget;
  std::vector<step_result> checked_steps;
  {
    tide::host_backend backend(unbudgeted);
    tide::executor ex(backend, checked, tide::executor_options::checked());
    tide_trainer t(c, st);
    for (int i = 0; i < c.steps; ++i) checked_steps.push_back(t.step(ex, batch(c, i)));
  }
  auto const s = tide::build_schedule(st, how);
  tide::host_backend backend(o);
  tide::executor ex(backend, s, {.debug_checks = false, .check_schedule = true});
  tide_trainer t(c, st);
  run_result r{{}, s.peak_device_bytes(), s.peak_host_bytes(), s.peak_storage_bytes()};
  for (int i = 0; i < c.steps; ++i) r.steps.push_back(t.step(ex, batch(c, i)));
  if (checked_steps != r.steps) r.steps.clear();  // reported as DIFFERENT
  return r;
}

tide::policy_spec all(tide::placement where) { return {tide::rule_spec{.where = where}}; }

}  // namespace

int main(int argc, char** argv) {
  config const c;
  std::filesystem::path spill_dir;
  bool own_dir = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--spill-dir" && i + 1 < argc) {
      spill_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--spill-dir DIR]\n", argv[0]);
      return 2;
    }
  }
  if (spill_dir.empty()) {
    spill_dir = std::filesystem::temp_directory_path() / ("tide_porting_" + std::to_string(::getpid()));
    std::filesystem::create_directories(spill_dir);
    own_dir = true;
  }

  auto const want = train_original(c);
  auto const st = make_stack(c);
  using tide::placement;
  std::vector<std::pair<std::string, tide::strategy>> policies{
      {"keep-all", {}},
      {"full remat", {.policy = all(placement::remat)}},
      {"offload, latency hiding", {.policy = all(placement::offload)}},
      {"offload, no latency hiding", {.policy = all(placement::offload), .pipeline = {.latency_hiding = false}}},
      {"spill to disk", {.policy = all(placement::spill)}},
      {"remat, 2 stored carries", {.policy = all(placement::remat), .checkpoints = {.device_snapshots = 2}}},
  };
  tide::host_backend_options with_disk;
  with_disk.storage = {.directory = spill_dir.string(), .quiet = true};

  // The planner: calibrate on this machine (the same lambdas), then plan under half of keep-all's peak.
  auto const keep_peak = tide::build_schedule(st, tide::strategy{}).peak_device_bytes();
  {
    tide::host_backend backend;
    tide_trainer t(c, st);
    batch const b(c, 0);
    auto const costs = tide::calibrate(
        st, backend, [&](auto const& ctx) { t.forward(ctx); }, [&](auto const& ctx) { t.backward(ctx); },
        {.input = [&](std::span<std::byte> in) { std::memcpy(in.data(), b.x.data(), in.size()); }});
    auto const plan = tide::make_plan(st, costs, {.device_budget = keep_peak / 2});
    if (!plan.fits) {
      std::fprintf(stderr, "FAIL: the planner found nothing under %zu bytes (smallest %zu)\n", keep_peak / 2,
                   plan.smallest_activation_bytes);
      return 1;
    }
    policies.push_back({"planner, half of keep-all's peak", plan.strategy});
  }

  std::printf("original: %d steps, last loss %.6f, grad checksum %016llx\n", c.steps, static_cast<double>(want.back().loss),
              static_cast<unsigned long long>(want.back().grad_checksum));
  std::printf("%-34s %12s %12s %12s  %s\n", "policy", "device peak", "host", "storage", "vs original");
  bool ok = true;
  for (auto const& [name, how] : policies) {
    auto o = how.policy.rules.empty() || how.policy.rules[0].where != placement::spill ? tide::host_backend_options{} : with_disk;
    if (name.starts_with("planner")) o.device_budget = keep_peak / 2;  // it runs within the budget, too
    auto const got = train(c, st, how, o);
    bool const same = got.steps == want;
    ok = ok && same;
    std::printf("%-34s %10zu B %10zu B %10zu B  %s\n", name.c_str(), got.device, got.host, got.storage,
                same ? "bitwise equal" : "DIFFERENT");
  }
  // Keep-all under half its own peak: the out-of-memory message names each way to fit, with what
  // each takes on this stack (docs/porting.md quotes it).
  try {
    tide::host_backend small({.device_budget = keep_peak / 2});
    auto const keep = tide::build_schedule(st, tide::strategy{});
    tide::executor ex(small, keep);
    ok = false;
  } catch (tide::out_of_memory const& e) {
    std::printf("\nkeep-all under half its peak:\n%s\n", e.what());
  }
  if (own_dir) std::filesystem::remove_all(spill_dir);
  if (!ok) std::fprintf(stderr, "FAIL: a policy's gradients differ from the original trainer's\n");
  return ok ? 0 : 1;
}
