// Data parallel on the GPUs of one node: one thread per GPU, communicators from
// ncclCommInitAll, each rank training the same stack on its own data. The after-backward (reduce)
// hook all-reduces each layer's weight gradient on the communication stream right after that layer's
// backward, overlapping with the backward of the layers below and with the prefetches. Checks
// that every rank ends with bitwise identical weight gradients. With one GPU it runs one rank;
// without a GPU it exits 77. (Across nodes the same hooks take a communicator bootstrapped
// with MPI: ncclGetUniqueId on rank 0, MPI_Bcast, ncclCommInitRank.)
#include "model.hpp"

#include <tide/collectives/nccl.hpp>

#include <barrier>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

int main() {
  if (auto const rc = example::without_device("data_parallel")) return *rc;
  try {
    int ranks = 0;
    TIDE_CUDA_CHECK(cudaGetDeviceCount(&ranks));
    std::vector<int> devices(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devices[static_cast<std::size_t>(r)] = r;
    std::vector<ncclComm_t> comms(devices.size());
    TIDE_NCCL_CHECK(ncclCommInitAll(comms.data(), ranks, devices.data()));

    cuda_stack::dims const d{6, 256, 256};
    // Offload with latency hiding, with room for a reduce hook after each layer's backward.
    auto strategy = cuda_stack::policy_cases(d)[3].strategy;
    strategy.collectives = {.after_backward = true};
    std::vector<std::vector<float>> grads(devices.size());
    std::vector<std::string> errors(devices.size());
    // A communicator the hooks aborted (a dead peer, an NCCL error) is freed: never destroyed again.
    std::vector<char> aborted(devices.size(), 0);
    // Every rank allocates its arenas before any starts an all-reduce: NCCL kernels waiting for
    // a peer can deadlock with that peer's cudaMalloc/cudaHostAlloc.
    std::barrier ready(static_cast<std::ptrdiff_t>(devices.size()));
    std::vector<std::thread> workers;
    for (std::size_t r = 0; r < devices.size(); ++r)
      workers.emplace_back([&, r] {
        bool arrived = false;
        try {
          TIDE_CUDA_CHECK(cudaSetDevice(devices[r]));
          cuda_stack::model const m(d, static_cast<std::uint32_t>(r + 1));  // each rank its own data
          auto const s = cuda_stack::build(d, strategy);
          tide::nccl_hooks hooks(comms[r], d.layers);
          struct note_abort {  // on every way out of this scope, the error path included
            tide::nccl_hooks const& h;
            char& out;
            ~note_abort() { out = h.aborted(); }
          } const noted{hooks, aborted[r]};
          for (std::uint32_t l = 0; l < d.layers; ++l) hooks.all_reduce(l, m.weight_grad(l), m.weight_elements());
          cuda_stack::run_options o;
          o.steps = 2;
          // A dead peer, or an NCCL error, ends the wait with an error instead of a hang.
          o.watcher = [&hooks](bool timed_out) { hooks.poll(timed_out); };
          o.before_first_step = [&] {
            arrived = true;
            ready.arrive_and_wait();
          };
          // By reference: the hooks keep the step's state (and are told when it finishes).
          grads[r] = cuda_stack::run(m, s, o, tide::hooks{.after_backward = std::ref(hooks)}).grads;
          grads[r].resize(std::size_t{d.layers} * m.weight_elements());  // the all-reduced part
        } catch (std::exception const& e) {
          errors[r] = e.what();
          if (!arrived) ready.arrive_and_drop();  // the other ranks do not wait for this one
        }
      });
    for (auto& w : workers) w.join();
    for (std::size_t r = 0; r < comms.size(); ++r)
      if (!aborted[r]) TIDE_NCCL_CHECK(ncclCommDestroy(comms[r]));

    bool ok = true;
    for (std::size_t r = 0; r < devices.size(); ++r) {
      if (!errors[r].empty()) {
        std::printf("rank %zu: %s\n", r, errors[r].c_str());
        ok = false;
      } else if (!cuda_stack::bitwise_equal(grads[r], grads[0])) {
        std::printf("rank %zu: weight gradients differ from rank 0\n", r);
        ok = false;
      }
    }
    std::printf("data_parallel: %d rank(s), %u layers, all-reduce after each backward: %s\n", ranks, d.layers,
                ok ? "weight gradients bitwise equal on every rank" : "FAILED");
    return ok ? 0 : 1;
  } catch (tide::error const& e) {
    std::fprintf(stderr, "data_parallel: %s\n", e.what());
    return 1;
  }
}
