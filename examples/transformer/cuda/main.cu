// The transformer demo's CUDA twin: the demo's policies (../tide_model.hpp) on tide's CUDA backend
// with the model of gpu_model.hpp, the same copy task; the gradient checksums agree bitwise across
// every policy on one GPU (exit 1 if not), the first step agrees with the CPU model's
// (../model.hpp, same weights: the loss to 1e-4 and the gradient to 1e-3, relative; the GEMMs sum
// in other orders) and the loss falls. With --graph, each policy also runs
// its steps replayed from one captured CUDA graph (the MoE layers route on the device, so nothing
// in a step synchronizes), which must give the eager run's checksums bitwise. Exits 77 without a
// GPU.
#include "cuda_device.hpp"
#include "example.hpp"
#include "gpu_model.hpp"
#include "../task.hpp"
#include "../tide_model.hpp"

#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/backends/cuda/cuda_graph.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using transformer::config;
using transformer::shape;
using transformer::cuda::gpu_model;

//! Drives gpu_model from tide's contexts on the CUDA backend, as ../tide_model.hpp's trainer does
//! on the host (device pointers, each call on ctx.stream).
class gpu_trainer {
 public:
  gpu_trainer(config c, shape s, cublasHandle_t h)
      : m_(c, s, 1, h), tokens_(s.tokens()), targets_(s.tokens()), grad_(s.tokens() * c.width) {}

  gpu_model& net() { return m_; }

  //! One step: eager, or replayed from `graph` (captured on its first use).
  template <class Executor>
  double step(Executor& ex, std::vector<std::int32_t> const& tokens, std::vector<std::int32_t> const& targets,
              tide::cuda_graph* graph = nullptr) {
    TRANSFORMER_CUDA(cudaMemcpy(tokens_.get(), tokens.data(), tokens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    TRANSFORMER_CUDA(cudaMemcpy(targets_.get(), targets.data(), targets.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    m_.zero_gradients(nullptr);
    auto in = ex.carry_input();
    m_.embed_tokens(tokens_.get(), reinterpret_cast<float*>(in.data()), nullptr);
    TRANSFORMER_CUDA(cudaDeviceSynchronize());  // the step's streams start after these
    auto fwd = [this](auto const& ctx) { forward(ctx); };
    auto bwd = [this](auto const& ctx) { backward(ctx); };
    if (!graph) {
      ex.step(fwd, bwd);
    } else {
      if (!graph->ready()) graph->capture(ex, fwd, bwd);  // runs nothing
      graph->replay();
      TRANSFORMER_CUDA(cudaStreamSynchronize(ex.backend().stream(tide::stream_role::compute)));
    }
    m_.embed_backward_tokens(tokens_.get(), grad_.get(), nullptr);
    double loss = 0;
    TRANSFORMER_CUDA(cudaMemcpy(&loss, m_.loss_on_device(), sizeof(double), cudaMemcpyDeviceToHost));
    return loss;
  }

 private:
  static float* floats(std::span<std::byte const> b) { return reinterpret_cast<float*>(const_cast<std::byte*>(b.data())); }
  static transformer::tensor tensor_of(std::string_view slot) {
    for (std::size_t i = 0; i < transformer::tensor_count; ++i)
      if (transformer::name(static_cast<transformer::tensor>(i)) == slot) return static_cast<transformer::tensor>(i);
    throw std::invalid_argument("no tensor " + std::string(slot));
  }
  template <class Ctx>
  gpu_model::saved bind(Ctx const& ctx) const {
    gpu_model::saved sv{};
    for (std::uint16_t k = 0; k < ctx.slot_count(); ++k) sv[transformer::tensor_index(tensor_of(ctx.slot_name(k)))] = floats(ctx.slot(k));
    sv[transformer::tensor_index(transformer::tensor::decoder_layer_input)] = floats(ctx.carry_in());
    return sv;
  }
  template <class Ctx>
  void forward(Ctx const& ctx) {
    auto const l = ctx.layer;
    if (ctx.advance) {
      auto const sv = m_.scratch_tensors(l);  // a segment recomputation produces the carry alone
      m_.layer_forward(l, floats(ctx.carry_in()), sv, floats(ctx.carry_out()), ctx.stream);
    } else if (ctx.recompute) {
      transformer::tensor_set which, available;
      for (std::uint16_t k = 0; k < ctx.slot_count(); ++k)
        (ctx.produces(k) ? which : available).set(transformer::tensor_index(tensor_of(ctx.slot_name(k))));
      m_.layer_recompute(l, bind(ctx), which, available, ctx.stream);
    } else {
      m_.layer_forward(l, floats(ctx.carry_in()), bind(ctx), floats(ctx.carry_out()), ctx.stream);
    }
  }
  template <class Ctx>
  void backward(Ctx const& ctx) {
    auto const l = ctx.layer;
    if (l + 1 == m_.cfg().layers) m_.head(floats(ctx.output()), targets_.get(), grad_.get(), ctx.stream);
    m_.layer_backward(l, bind(ctx), grad_.get(), grad_.get(), ctx.stream);
  }

  gpu_model m_;
  transformer::cuda::device_array<std::int32_t> tokens_, targets_;
  transformer::cuda::device_array<float> grad_;
};

}  // namespace

int main(int argc, char** argv) {
  bool small = false, graph = false;
  int steps = 4;
  example::cli cli("transformer_cuda");
  cli.flag("--small", small, "a fast configuration")
      .flag("--graph", graph, "also replay each policy's steps from a captured CUDA graph (checksums must match)")
      .option("--steps", steps, "N", "steps per policy (at least 2)");
  cli.parse(argc, argv);
  if (steps < 2) cli.fail("--steps must be at least 2");
  if (auto const rc = example::without_device("transformer_cuda")) return *rc;
  config c{.vocab = 32, .width = 64, .heads = 4, .kv_heads = 2, .layers = small ? 4u : 8u, .dense_layers = small ? 1u : 2u,
           .mlp_hidden = 192, .experts = 8, .top_k = 2, .expert_hidden = 64, .shared_hidden = 64};
  shape const s{4, 48};
  transformer::copy_task task{.length = s.seq / 2, .vocab = c.vocab};
  transformer::rng r{2026};
  std::vector<std::int32_t> tokens, targets;
  task.sample(r, s.batch, tokens, targets);
  auto const stack = transformer::make_stack(c, s);
  cublasHandle_t h = nullptr;
  TRANSFORMER_CUDA(cublasCreate(&h));
  std::uint64_t first = 0;
  // The CPU model's first step, from the same weights (gpu_model draws them with seed 1).
  transformer::model cpu(c, 1);
  double const cpu_loss = cpu.compute_gradients(tokens, targets, s);
  std::vector<float> const cpu_grad(cpu.gradients().begin(), cpu.gradients().end());
  bool same = true, falls = true, replayed_same = true, agrees = true;
  std::printf("%-24s %9s %12s %12s %10s  %s\n", "policy", "step ms", "device", "host", "loss", "grad checksum");
  struct run_result {
    double loss0 = 0, loss = 0, ms = 0;
    std::uint64_t sum = 0;
    double loss_error = 0, grad_error = 0;  // the first step against the CPU model's, relative
  };
  for (auto const& p : transformer::published_strategies(c.layers)) {
    auto const sched = tide::build_schedule(stack, p.strategy);
    // `steps` steps from the same initial weights, eager or replayed from one captured graph.
    auto run = [&](bool replay) {
      tide::cuda_backend be(example::backend_options());
      tide::executor ex(be, sched, {.debug_checks = false, .check_schedule = true});
      gpu_trainer tr(c, s, h);
      tide::cuda_graph g;
      run_result r;
      for (int i = 0; i < steps; ++i) {
        auto const t0 = std::chrono::steady_clock::now();
        r.loss = tr.step(ex, tokens, targets, replay ? &g : nullptr);
        if (i > 0) r.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (i == 0) r.loss0 = r.loss;
        r.sum = tr.net().gradient_checksum();
        if (i == 0 && !replay) {
          auto const g = tr.net().host_gradients();
          double diff = 0, norm = 0;
          for (std::size_t k = 0; k < g.size(); ++k) {
            double const e = static_cast<double>(g[k]) - static_cast<double>(cpu_grad[k]);
            diff += e * e;
            norm += static_cast<double>(cpu_grad[k]) * static_cast<double>(cpu_grad[k]);
          }
          r.loss_error = std::abs(r.loss - cpu_loss) / std::abs(cpu_loss);
          r.grad_error = std::sqrt(diff / norm);
        }
        tr.net().adamw_step({.learning_rate = 1e-2}, nullptr);
      }
      return r;
    };
    auto const r = run(false);
    if (first == 0) first = r.sum;
    same &= r.sum == first;
    falls &= r.loss < r.loss0;
    bool const near = r.loss_error < 1e-4 && r.grad_error < 1e-3;
    agrees &= near;
    if (!near)
      std::printf("%s: the first step differs from the CPU model's: loss %.3g, gradient %.3g (relative)\n",
                  std::string(p.name).c_str(), r.loss_error, r.grad_error);
    std::printf("%-24s %9.2f %12s %12s %10.4f  %016llx\n", std::string(p.name).c_str(), r.ms / (steps - 1),
                tide::format_bytes(static_cast<double>(sched.peak_device_bytes())).c_str(),
                tide::format_bytes(static_cast<double>(sched.peak_host_bytes())).c_str(), r.loss,
                static_cast<unsigned long long>(r.sum));
    if (graph) {
      auto const g = run(true);
      replayed_same &= g.sum == r.sum && g.loss == r.loss;
      std::printf("%-24s %9.2f %12s %12s %10.4f  %016llx  %s\n", "  (graph replay)", g.ms / (steps - 1), "", "", g.loss,
                  static_cast<unsigned long long>(g.sum), g.sum == r.sum && g.loss == r.loss ? "= eager" : "DIFFERS from eager");
    }
  }
  static_cast<void>(cublasDestroy(h));
  std::printf("gradient checksums %s across policies%s; first step %s the CPU model's; loss %s\n",
              same ? "bitwise equal" : "DIFFER", graph ? (replayed_same ? " and graph replays" : ", graph replays DIFFER") : "",
              agrees ? "agrees with" : "DIFFERS from", falls ? "falls under every policy" : "does NOT fall");
  return same && falls && replayed_same && agrees ? 0 : 1;
}
