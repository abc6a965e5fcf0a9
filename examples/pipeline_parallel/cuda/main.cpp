// The pipeline example's CUDA twin: a stack of y = rmsnorm(relu(x W)) layers split into S stages,
// one MPI rank and one GPU each, each stage's step a tide stage schedule on the CUDA backend, the
// boundary tensor and its gradient moved by tide::nccl_transport (NCCL point-to-point, grouped as
// the schedule posts them) on the communication stream.
//
//   mpirun -np S pipeline_parallel_cuda [--pp-schedule gpipe|1f1b|interleaved] [--virtual-stages v]
//          [--micro-batches M] [--policy keep-all|offload-all|offload-warmup|remat]
//          [--layers-per-stage K] [--width D] [--batch B] [--steps N] [--check]
//
// --check runs every micro-batch through the whole model on rank 0 (the same kernels, one after
// the other) and compares every stage's weight gradients and stage 0's input gradients bitwise.
// Needs one GPU per rank (NCCL cannot run two ranks on one device; a node's ranks take its GPUs
// in local rank order): with fewer it says so and exits 77 (skipped) on every rank; without a
// GPU, the same. Every GPU is taken to be the same
// model (cuBLAS's results are compared bitwise across them).
#include "example.hpp"
#include "kernels.hpp"       // this example's accumulate
#include "../../cuda_stack/kernels.hpp"  // the layer's GEMM, ReLU, RMSNorm and random fill
#include "cuda_device.hpp"

#include <mpi.h>

#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/collectives/mpi.hpp>
#include <tide/collectives/nccl_transport.hpp>
#include <tide/core/stage_partition.hpp>
#include <tide/core/stage_schedule.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using block = tide::layer<"block", tide::slot<"pre">, tide::slot<"act">>;
constexpr auto pre = tide::slot_handle_of<block, "pre", float>;
constexpr auto act = tide::slot_handle_of<block, "act", float>;

struct options {
  std::string order = "1f1b", policy = "offload-all";
  std::uint32_t micro_batches = 8, layers_per_stage = 2, virtual_stages = 0, width = 256, batch = 256;
  int steps = 2;
  bool check = false;
};

//! A device buffer of floats.
struct device_floats {
  float* p = nullptr;
  explicit device_floats(std::size_t n) { TIDE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float))); }
  device_floats(device_floats&& o) noexcept : p(std::exchange(o.p, nullptr)) {}
  device_floats& operator=(device_floats&&) = delete;
  ~device_floats() { static_cast<void>(cudaFree(p)); }
};

std::uint64_t fnv(std::vector<float> const& v) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto const* b = reinterpret_cast<unsigned char const*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::vector<float> to_host(float const* p, std::size_t n) {
  std::vector<float> h(n);
  TIDE_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

//! The model: every layer's weights on every rank (from fixed seeds), and the layer's kernels.
struct model {
  int b, w;
  std::size_t n, ww;
  std::uint32_t layers;
  device_floats weights, grads, tmp, tmp_w;
  model(std::uint32_t layers_, int batch, int width)
      : b(batch), w(width), n(std::size_t(batch) * width), ww(std::size_t(width) * width), layers(layers_),
        weights(layers_ * ww), grads(layers_ * ww), tmp(n), tmp_w(ww) {
    for (std::uint32_t l = 0; l < layers; ++l)
      cuda_stack::fill_random(weight(l), ww, 1000 + l, 1.5f / std::sqrt(static_cast<float>(w)), nullptr);
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  float* weight(std::uint32_t l) const { return weights.p + l * ww; }
  float* grad(std::uint32_t l) const { return grads.p + l * ww; }
  void zero_grads() const {
    TIDE_CUDA_CHECK(cudaMemset(grads.p, 0, layers * ww * sizeof(float)));
    TIDE_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy stream's memset before the step's streams
  }
  //! pre = x W, act = relu(pre), y = rmsnorm(act): each only where asked.
  void forward(std::uint32_t l, float const* x, float* p, bool make_pre, float* a, float const* p_in, bool make_act, float* y,
               cudaStream_t s) const {
    if (make_pre) cuda_stack::gemm(b, w, w, x, w, 1, weight(l), w, 1, p, s);
    if (make_act) cuda_stack::relu_forward(p_in, a, n, s);
    if (y) cuda_stack::rmsnorm_forward(a, y, b, w, s);
  }
  //! g (the output's gradient) becomes the input's; the weight gradient is accumulated.
  void backward(std::uint32_t l, float const* x, float const* p, float const* a, float* g, cudaStream_t s) const {
    cuda_stack::rmsnorm_backward(g, a, tmp.p, b, w, s);
    cuda_stack::relu_backward(tmp.p, p, tmp.p, n, s);
    cuda_stack::gemm(w, w, b, x, 1, w, tmp.p, w, 1, tmp_w.p, s);  // dW = x^T d pre
    pipeline_cuda::accumulate(grad(l), tmp_w.p, ww, s);
    cuda_stack::gemm(b, w, w, tmp.p, w, 1, weight(l), 1, w, g, s);  // d x = d pre W^T
  }
};

void input_of(float* x, std::size_t n, int step, std::uint32_t m, cudaStream_t s) {
  cuda_stack::fill_random(x, n, 1 + static_cast<std::uint32_t>(step) * 4099u + m, 1.0f, s);
}

tide::stage_policies policies_of(std::string const& name, tide::stage_spec const& st) {
  tide::policy_spec const offload{tide::rule_spec{.where = tide::placement::offload}};
  if (name == "keep-all") return {};
  if (name == "offload-all") return tide::held_policies(st, offload);
  if (name == "offload-warmup") return tide::warmup_policies(st, offload);
  if (name == "remat") return {{tide::policy_spec{tide::rule_spec{.where = tide::placement::remat}}}, {}};
  throw std::invalid_argument("--policy: '" + name + "' is none of keep-all, offload-all, offload-warmup, remat");
}

}  // namespace

int main(int argc, char** argv) {
  tide::mpi::environment env(argc, argv);
  tide::mpi::communicator world;
  int const rank = world.rank(), S = world.size();
  options o;
  example::cli cli("pipeline_parallel_cuda");
  cli.option("--pp-schedule", o.order, "gpipe|1f1b|interleaved", "the stage order")
      .option("--virtual-stages", o.virtual_stages, "v", "chunks per stage under interleaved (default 2)")
      .option("--micro-batches", o.micro_batches, "M", "micro-batches a step")
      .option("--policy", o.policy, "NAME", "keep-all, offload-all, offload-warmup or remat")
      .option("--layers-per-stage", o.layers_per_stage, "K", "layers on each stage (each chunk, interleaved)")
      .option("--width", o.width, "D", "the layer's width")
      .option("--batch", o.batch, "B", "tokens a micro-batch")
      .option("--steps", o.steps, "N", "training steps")
      .flag("--check", o.check, "compare the gradients bitwise with one process on rank 0");
  cli.parse(argc, argv);
  if (o.order != "gpipe" && o.order != "1f1b" && o.order != "interleaved") cli.fail("--pp-schedule must be gpipe, 1f1b or interleaved");
  if (o.virtual_stages == 0) o.virtual_stages = o.order == "interleaved" ? 2 : 1;
  if (o.steps < 1 || o.layers_per_stage < 1 || o.width < 1 || o.batch < 1) cli.fail("--steps, --layers-per-stage, --width and --batch must be at least 1");

  if (o.order != "interleaved" && o.virtual_stages != 1) cli.fail("--virtual-stages needs --pp-schedule interleaved");
  // One GPU per rank on each node (the node's ranks take its GPUs in local rank order), or every
  // rank skips.
  MPI_Comm node = MPI_COMM_NULL;
  tide::mpi::check(MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type", rank);
  int local_rank = 0, local_ranks = 1;
  tide::mpi::check(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank", rank);
  tide::mpi::check(MPI_Comm_size(node, &local_ranks), "MPI_Comm_size", rank);
  MPI_Comm_free(&node);
  int devices = 0;
  bool const usable = !example::without_device("pipeline_parallel_cuda") && cudaGetDeviceCount(&devices) == cudaSuccess;
  int ok = usable && devices >= local_ranks ? 1 : 0, all = 0;
  tide::mpi::check(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, world.native()), "MPI_Allreduce", rank);
  if (!all) {
    if (rank == 0)
      std::printf("pipeline_parallel_cuda: every rank needs a GPU of its own (NCCL cannot run two ranks on one device): %d "
                  "ranks on this node, %d GPUs found; skipping\n", local_ranks, devices);
    return example::skip_exit_code;
  }
  try {
    TIDE_CUDA_CHECK(cudaSetDevice(local_rank));
    ncclUniqueId id{};
    if (rank == 0) TIDE_NCCL_CHECK(ncclGetUniqueId(&id));
    tide::mpi::check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world.native()), "MPI_Bcast", rank);
    ncclComm_t comm = nullptr;
    TIDE_NCCL_CHECK(ncclCommInitRank(&comm, S, id, rank));

    auto const V = o.virtual_stages;
    tide::stage_partition const part{std::vector<std::uint32_t>(static_cast<std::size_t>(S) * V, o.layers_per_stage)};
    std::uint32_t L = 0;
    for (auto k : part.layers) L += k;
    auto const chunks = tide::chunks_of(part, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(S), V);
    auto const model_layer = tide::model_layers_of(part, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(S), V);

    model const net(L, static_cast<int>(o.batch), static_cast<int>(o.width));
    auto const bytes = net.n * sizeof(float);
    tide::stack_spec stack;
    stack.carry = {"x", bytes};
    stack.append(block::spec(), static_cast<std::uint32_t>(model_layer.size()));
    stack = tide::bind_sizes(stack, {{"pre", bytes}, {"act", bytes}});
    tide::stage_spec const st{.stage = static_cast<std::uint32_t>(rank), .stages = static_cast<std::uint32_t>(S),
                              .micro_batches = o.micro_batches,
                              .order = o.order == "gpipe"   ? tide::stage_order::gpipe
                                       : o.order == "1f1b" ? tide::stage_order::one_f_one_b
                                                           : tide::stage_order::interleaved,
                              .virtual_stages = V};
    tide::strategy const how{.buffers = {.staging_buffers = 2}, .pipeline = {.prefetch_distance = 1}};
    auto const schedule = tide::build_stage_schedule(stack, how, st, policies_of(o.policy, st), chunks);

    device_floats input_grads(std::size_t{o.micro_batches} * net.n);  // stage 0: each micro-batch's input gradient
    int step = 0;
    tide::nccl_transport transport(comm, tide::nccl_stage_ends{
        [&](tide::transport_context<cudaStream_t> const& c) { input_of(reinterpret_cast<float*>(c.data), net.n, step, c.micro_batch, c.stream); },
        [&](tide::transport_context<cudaStream_t> const& c) {
          TIDE_CUDA_CHECK(cudaMemcpyAsync(input_grads.p + c.micro_batch * net.n, c.data, bytes, cudaMemcpyDeviceToDevice, c.stream));
        }});
    tide::cuda_backend backend(example::backend_options());
    backend.watch([&transport](bool timed_out) { transport.poll(timed_out); });
    tide::executor ex(backend, schedule);

    auto forward = [&](tide::forward_context<cudaStream_t> const& c) {
      auto const read = [&](tide::slot_handle<float> h) -> float const* {
        return c.mode == tide::forward_mode::recompute && !c.produces(h) ? c.saved(h).data() : c.slot(h).data();
      };
      net.forward(model_layer[c.layer], c.carry_in<float>().data(), c.slot(pre).data(), c.produces(pre), c.slot(act).data(),
                  read(pre), c.produces(act), c.carry_out<float>().data(), c.stream);
    };
    auto backward = [&](tide::backward_context<cudaStream_t> const& c) {
      net.backward(model_layer[c.layer], c.carry_in<float>().data(), c.slot(pre).data(), c.slot(act).data(), c.gradient<float>().data(),
                   c.stream);
    };
    auto turn = [&](tide::turn_context<cudaStream_t> const& c) {  // the loss |y|^2 / 2: its gradient is y
      TIDE_CUDA_CHECK(cudaMemcpyAsync(c.gradient().data(), c.output().data(), bytes, cudaMemcpyDeviceToDevice, c.stream));
    };

    // The one-process reference on rank 0: every micro-batch through every layer, in order.
    std::optional<model> ref;
    if (o.check && rank == 0) ref.emplace(L, static_cast<int>(o.batch), static_cast<int>(o.width));
    bool equal = true;
    double step_ms = 0;
    for (step = 0; step < o.steps; ++step) {
      net.zero_grads();
      auto const t0 = std::chrono::steady_clock::now();
      ex.step(forward, backward, tide::turn{turn}, tide::hooks{.transport = std::ref(transport)});
      step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      // Each stage's checksums of the layers it owns, on rank 0.
      std::vector<unsigned long long> mine(L, 0), sums(L, 0);
      for (auto l : model_layer) mine[l] = fnv(to_host(net.grad(l), net.ww));
      tide::mpi::check(MPI_Reduce(mine.data(), sums.data(), static_cast<int>(L), MPI_UNSIGNED_LONG_LONG, MPI_BOR, 0, world.native()),
                       "MPI_Reduce", rank);
      if (!ref) continue;
      ref->zero_grads();
      std::vector<device_floats> xs, ps, as;
      for (std::uint32_t l = 0; l <= L; ++l) xs.emplace_back(net.n), ps.emplace_back(net.n), as.emplace_back(net.n);
      device_floats g(net.n);
      for (std::uint32_t m = 0; m < o.micro_batches; ++m) {
        input_of(xs[0].p, net.n, step, m, nullptr);
        for (std::uint32_t l = 0; l < L; ++l) ref->forward(l, xs[l].p, ps[l].p, true, as[l].p, ps[l].p, true, xs[l + 1].p, nullptr);
        TIDE_CUDA_CHECK(cudaMemcpy(g.p, xs[L].p, bytes, cudaMemcpyDeviceToDevice));
        for (std::uint32_t l = L; l-- > 0;) ref->backward(l, xs[l].p, ps[l].p, as[l].p, g.p, nullptr);
        if (to_host(g.p, net.n) != to_host(input_grads.p + m * net.n, net.n)) {
          std::fprintf(stderr, "pipeline_parallel_cuda: step %d: micro-batch %u's input gradient differs from one process's\n", step, m);
          equal = false;
        }
      }
      for (std::uint32_t l = 0; l < L; ++l)
        if (fnv(to_host(ref->grad(l), ref->ww)) != sums[l]) {
          std::fprintf(stderr, "pipeline_parallel_cuda: step %d: layer %u's weight gradient differs from one process's\n", step, l);
          equal = false;
        }
    }
    int eq = equal ? 1 : 0;
    tide::mpi::check(MPI_Bcast(&eq, 1, MPI_INT, 0, world.native()), "MPI_Bcast", rank);
    std::printf("pipeline_parallel_cuda: stage %d of %d, %s, %u chunks, %u micro-batches, policy %s: predicted device peak %zu, "
                "host %zu bytes, last step %.3f ms%s\n",
                rank, S, o.order.c_str(), V, o.micro_batches, o.policy.c_str(), schedule.peak_device_bytes(),
                schedule.peak_host_bytes(), step_ms, o.check && rank == 0 ? (eq ? "; one-process check: bitwise equal" : "; one-process check: DIFFERENT") : "");
    if (!transport.aborted()) TIDE_NCCL_CHECK(ncclCommDestroy(comm));
    return eq ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "pipeline_parallel_cuda: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
