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

#include <tide/collectives/mpi.hpp>
#include <tide/tide.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  tide::mpi::environment env(argc, argv);
  tide::mpi::communicator comm;
  int steps = 4, fail_rank = -1, fail_step = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--fail-rank") fail_rank = std::atoi(argv[i + 1]);
    else if (a == "--fail-step") fail_step = std::atoi(argv[i + 1]);
  }

  mlp::config cfg{8, 64, 16, 0.05f, 1000 + static_cast<std::uint64_t>(comm.rank())};
  auto const s = tide::build_schedule(
      mlp::make_stack(cfg), tide::policy_spec{tide::rule_spec{tide::placement::offload, {"input", "act"}, 0, tide::all_layers, 0}},
      {}, {true, 2, 0, 2}, {false, true});
  tide::host_backend backend;
  tide::timeline tl;
  backend.record_timeline(&tl);
  tide::executor exec(backend, s);
  mlp::network net(cfg);

  auto reduce = [&](auto const& ctx) {
    if (ctx.kind != tide::op_kind::collective) return;
    comm.allreduce(net.weight_grad(ctx.layer), ctx.step_failed, ctx.layer);
    comm.allreduce(net.bias_grad(ctx.layer), ctx.step_failed, ctx.layer);
  };
  int failures_seen = 0;
  bool ok = true;
  float first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    auto bwd = [&](auto const& ctx) {
      if (comm.rank() == fail_rank && step == fail_step && ctx.layer == 3) throw std::runtime_error("injected failure");
      net.backward(ctx);
    };
    try {
      exec.step([&](auto const& ctx) { net.forward(ctx); }, bwd, tide::no_hook{}, reduce);
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
