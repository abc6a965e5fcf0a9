// Data parallelism across processes: each rank trains the same network on its own data; after
// each layer's backward, its gradients are all-reduced through MPI on the communication stream,
// overlapped with the next layer's backward and with the prefetches. The weights stay bitwise
// identical on every rank.
//
//   mpirun -np 2 mpi_data_parallel [--steps N] [--fail-rank R --fail-step S]
//
// With --fail-rank, rank R's backward throws in step S: R reports its own error, the other
// ranks a collective_error naming R, nobody hangs, and the next step succeeds everywhere.
#include "../mlp/mlp.hpp"
#include "example.hpp"

#include <tide/collectives/mpi.hpp>
#include <tide/tide.hpp>

#include <array>
#include <cstdio>
#include <stdexcept>

int main(int argc, char** argv) {
  tide::mpi::environment env(argc, argv);
  tide::mpi::communicator comm;
  int steps = 4, fail_rank = -1, fail_step = -1;
  example::cli cli("mpi_data_parallel");
  cli.option("--steps", steps, "N", "training steps (at least 2)")
      .option("--fail-rank", fail_rank, "R", "the rank whose backward throws in step --fail-step")
      .option("--fail-step", fail_step, "S", "the step in which rank --fail-rank fails");
  cli.parse(argc, argv);
  if (steps < 2) cli.fail("need --steps >= 2");

  mlp::config cfg{8, 64, 16, 0.05f, 1000 + static_cast<std::uint64_t>(comm.rank())};
  // Offload the inputs and activations, prefetch two layers ahead, and make room for a reduce
  // hook after each layer's backward.
  auto const s = tide::build_schedule(
      mlp::make_stack(cfg), {.policy = {tide::rule_spec{.where = tide::placement::offload, .slots = {"input", "act"}}},
                             .pipeline = {.prefetch_distance = 2},
                             .collectives = {.after_backward = true}});
  tide::host_backend backend;
  tide::timeline tl;
  tide::executor exec(backend, s, {.timeline = &tl});
  mlp::network net(cfg);

  // The after-backward hook, on the communication stream: all-reduces each layer's weight and
  // bias gradients, and agrees with the peers once at the step's end whether any rank failed.
  auto reduce = comm.gradient_hook([&](std::uint32_t l) { return std::array{net.weight_grad(l), net.bias_grad(l)}; });
  int failures_seen = 0;
  bool ok = true;
  float first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    auto bwd = [&](auto const& ctx) {
      if (comm.rank() == fail_rank && step == fail_step && ctx.layer == 3) throw std::runtime_error("injected failure");
      net.backward(ctx);
    };
    try {
      exec.step([&](auto const& ctx) { net.forward(ctx); }, bwd, tide::hooks{.after_backward = reduce});
      net.update();
      if (step == 0) first = net.loss();
      last = net.loss();
    } catch (tide::collective_error const& e) {
      ++failures_seen;
      net.discard_gradients();
      if (comm.rank() == fail_rank || step != fail_step) ok = false;
      std::printf("rank %d step %d: %s\n", comm.rank(), step, e.what());
    } catch (std::runtime_error const& e) {
      ++failures_seen;
      net.discard_gradients();
      if (comm.rank() != fail_rank || step != fail_step) ok = false;
      std::printf("rank %d step %d: %s\n", comm.rank(), step, e.what());
    }
  }
  if (fail_rank >= 0 && failures_seen != 1) ok = false;
  if (fail_rank < 0 && failures_seen != 0) ok = false;

  // Every rank must hold the same weights.
  unsigned long long mine = net.weight_checksum(), lo = 0, hi = 0;
  tide::mpi::check(MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm.native()), "MPI_Allreduce", comm.rank());
  tide::mpi::check(MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm.native()), "MPI_Allreduce", comm.rank());
  auto const sum = tide::summarize(tl, s);
  int good = ok && lo == hi && last < first ? 1 : 0, all_good = 0;
  tide::mpi::check(MPI_Allreduce(&good, &all_good, 1, MPI_INT, MPI_MIN, comm.native()), "MPI_Allreduce", comm.rank());
  if (comm.rank() == 0)
    std::printf("%d ranks, %d steps: loss %.6f -> %.6f, weights %s across ranks, last step %.2f ms, "
                "collective wait on compute %.2f ms; %s\n",
                comm.size(), steps, first, last, lo == hi ? "bitwise identical" : "DIFFER", sum.step_us / 1000,
                sum.exposed_collective_us / 1000, all_good ? "ok" : "FAILED");
  return all_good ? 0 : 1;
}
