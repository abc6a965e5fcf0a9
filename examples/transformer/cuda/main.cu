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

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using transformer::config;
using transformer::shape;
using transformer::cuda::gpu_model;

//! Pinned host memory for `n` elements of T, so that copies to and from it run asynchronously.
template <class T>
class pinned {
 public:
  explicit pinned(std::size_t n) : n_(n) { TRANSFORMER_CUDA(cudaMallocHost(&p_, n * sizeof(T))); }
  pinned(pinned const&) = delete;
  pinned& operator=(pinned const&) = delete;
  ~pinned() { static_cast<void>(cudaFreeHost(p_)); }
  T* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

//! The device pointers of a layer's slots, as gpu_model takes them.
template <class Span>
auto pointers(std::array<Span, transformer::tensor_count> const& spans) {
  std::array<typename Span::pointer, transformer::tensor_count> p{};
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = spans[i].data();
  return p;
}

//! Drives gpu_model from tide's contexts on the CUDA backend, as ../tide_model.hpp's trainer does
//! on the host: the slots through the same handles, every call on ctx.stream. A step enqueues
//! everything on the backend's streams; the executor's wait at its end is its one synchronization.
class gpu_trainer {
 public:
  gpu_trainer(config c, shape s, cublasHandle_t h)
      : m_(c, s, 1, h), slots_(transformer::make_slot_map(transformer::make_stack(c, s))), tokens_(s.tokens()), targets_(s.tokens()),
        grad_(s.tokens() * c.width), staged_(2 * s.tokens()), loss_(1) {}

  gpu_model& net() { return m_; }

  //! One step: eager, or replayed from `graph` (captured on its first use).
  template <class Executor>
  double step(Executor& ex, std::vector<std::int32_t> const& tokens, std::vector<std::int32_t> const& targets,
              tide::cuda_graph* graph = nullptr) {
    auto const st = ex.backend().stream(tide::stream_role::compute);
    auto const n = tokens.size();
    std::copy(tokens.begin(), tokens.end(), staged_.get());  // the previous step has synchronized
    std::copy(targets.begin(), targets.end(), staged_.get() + n);
    TRANSFORMER_CUDA(cudaMemcpyAsync(tokens_.get(), staged_.get(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, st));
    TRANSFORMER_CUDA(cudaMemcpyAsync(targets_.get(), staged_.get() + n, n * sizeof(std::int32_t), cudaMemcpyHostToDevice, st));
    m_.zero_gradients(st);
    m_.embed_tokens(tokens_.get(), ex.template carry_input<float>().data(), st);
    auto fwd = [this](auto const& ctx) { forward(ctx); };
    auto bwd = [this](auto const& ctx) { backward(ctx); };
    // The head and the loss between the last forward and the first backward, seeding grad_.
    tide::turn const turn{[this](auto const& ctx) { m_.head(ctx.template output<float>().data(), targets_.get(), grad_.get(), ctx.stream); }};
    if (!graph) {
      ex.step(fwd, bwd, turn);
    } else {
      if (!graph->ready()) graph->capture(ex, fwd, bwd, turn);  // runs nothing
      graph->replay();
      TRANSFORMER_CUDA(cudaStreamSynchronize(st));
    }
    return *loss_.get();
  }

 private:
  template <class Ctx>
  void forward(Ctx const& ctx) {
    auto const in = ctx.template carry_in<float>().data();
    if (ctx.mode == tide::forward_mode::recompute) {
      // The tensors it rebuilds where tide wants them (slot()), the ones it reads instead their
      // saved data (saved(): in a recompute, slot() of a tensor it does not rebuild is scratch).
      auto p = pointers(slots_.spans(ctx));
      auto const saved = slots_.saved(ctx);
      for (std::size_t i = 0; i < p.size(); ++i)
        if (!saved[i].empty()) p[i] = const_cast<float*>(saved[i].data());  // read only: `available`
      m_.layer_recompute(ctx.layer, in, p, slots_.produced(ctx), slots_.bound(ctx), ctx.stream);
    } else {  // a forward, or an advance (whose slots tide lends as scratch)
      m_.layer_forward(ctx.layer, in, pointers(slots_.spans(ctx)), ctx.template carry_out<float>().data(), ctx.stream);
    }
  }
  template <class Ctx>
  void backward(Ctx const& ctx) {
    auto const l = ctx.layer;
    m_.layer_backward(l, ctx.template carry_in<float>().data(), pointers(slots_.spans(ctx)), grad_.get(),
                      grad_.get(), ctx.stream);
    if (l == 0) {  // the embedding's backward and the loss, still in the step
      m_.embed_backward_tokens(tokens_.get(), grad_.get(), ctx.stream);
      TRANSFORMER_CUDA(cudaMemcpyAsync(loss_.get(), m_.loss_on_device(), sizeof(double), cudaMemcpyDeviceToHost, ctx.stream));
    }
  }

  gpu_model m_;
  transformer::slot_map slots_;
  transformer::cuda::device_array<std::int32_t> tokens_, targets_;
  transformer::cuda::device_array<float> grad_;
  pinned<std::int32_t> staged_;  // the step's tokens and targets
  pinned<double> loss_;
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
  for (auto const& p : transformer::published_strategies()) {
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
        if (i + 1 == steps) r.sum = tr.net().gradient_checksum();
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
        tr.net().adamw_step({.learning_rate = 1e-2}, be.stream(tide::stream_role::compute));
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
