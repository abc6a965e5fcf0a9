#pragma once
//! \file
//! `tide::nccl_transport`: a pipeline stage's boundary transport over NCCL point-to-point, one rank
//! per stage (stage s is rank s of the communicator), for the CUDA backend's communication stream.
//!
//!     tide::nccl_transport t(comm, tide::nccl_stage_ends{.input = embed, .input_gradient = embed_backward});
//!     backend.watch([&t](bool timed_out) { t.poll(timed_out); });
//!     ex.step(forward, backward, tide::turn{head}, tide::hooks{.transport = std::ref(t)});
//!
//! - Stream-ordered and grouped: each transfer is an `ncclSend` or `ncclRecv` of the carry's bytes
//!   on the communication stream, which the stage schedule orders against compute and copies with
//!   events. Transfers the schedule posts together (a send with the next receive; interleaved, a
//!   round's sends with the next round's receives: `transport_context::pair`) are one NCCL group,
//!   so neighbours that send to each other, the interleaved ring's last stage and stage 0 among
//!   them, cannot deadlock although every NCCL transfer waits for its peer.
//! - Capture-safe: nothing waits on the host (on a blocking communicator; a non-blocking one's
//!   `ncclInProgress` is polled on the host, as the hooks do), so a step captured by
//!   `tide::cuda_graph::capture` replays its transfers (NCCL captures point-to-point calls).
//! - Failure agreement, dead peers, aborts, non-blocking communicators: as `tide::nccl_hooks`
//!   (their shared `detail::basic_nccl_agreement`). A rank whose step failed still makes every
//!   transfer its peers expect (told `ctx.step_failed`; it skips the user's ends), so none hangs;
//!   the step-end agreement then makes every rank's `finish_step()` throw.
//! - Not checked on the wire: NCCL does not tell a receiver the size its peer sent, so neighbours
//!   whose carries differ in size hang until the backend's watcher times out (`poll`); the MPI
//!   transport names them. Use the same stack carry on every stage.
//! - The pipeline's ends, stage 0's first chunk's input and its gradient, are the user's
//!   (`nccl_stage_ends`), enqueued on `ctx.stream`.
//!
//! Not run by this project's tests on a GPU: NCCL cannot run two ranks on one device, and the
//! GPU machines this project is tested on have one (docs/cuda.md). The grouping, peers, ends and
//! failure path are tested against a fake NCCL (tests/cuda/nccl_transport_test.cpp).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <tide/collectives/nccl.hpp>
#include <tide/core/op.hpp>
#include <tide/executor/transport.hpp>

namespace tide {

//! The pipeline's ends on stage 0's first chunk: `input(ctx)` writes micro-batch
//! `ctx.micro_batch`'s input into `ctx.data` (the embedding's output), `input_gradient(ctx)` takes
//! its gradient (the embedding's backward); both enqueue their work on `ctx.stream`.
template <class Input, class InputGradient>
struct nccl_stage_ends {
  Input input;                   //!< writes the first stage's input of a micro-batch
  InputGradient input_gradient;  //!< takes the gradient of the first stage's input
};
//! `tide::nccl_stage_ends{input, input_gradient}` deduces the types.
template <class I, class G>
nccl_stage_ends(I, G) -> nccl_stage_ends<I, G>;

//! A stage's boundary transport over NCCL (see the file's description); `Ends` is an
//! `nccl_stage_ends`. `tide::nccl_transport` deduces it; `Api` is for tests.
template <class Ends, class Api = detail::nccl_api>
class basic_nccl_transport : public detail::basic_nccl_agreement<Api> {
  using base = detail::basic_nccl_agreement<Api>;

 public:
  //! `comm` must outlive the transport; stage s is its rank s. Allocates the failure flag on the
  //! communicator's device. `progress_timeout` bounds the wait for a call that returned
  //! `ncclInProgress` (then the communicator is aborted).
  basic_nccl_transport(ncclComm_t comm, Ends ends, std::chrono::milliseconds progress_timeout = std::chrono::minutes(5))
      : base(comm, progress_timeout, "nccl_transport"), ends_(std::move(ends)) {
    TIDE_NCCL_CHECK(Api::count(comm, &ranks_));
  }

  //! A send of the boundary tensor (to the next stage) or its gradient (to the one before, or the
  //! user's `input_gradient` on stage 0's first chunk).
  void send(transport_context<cudaStream_t> const& c) {
    transfer(c, [&](int peer) {
      this->check_nccl_call(Api::send(c.data, c.bytes, peer, this->comm_, c.stream), "ncclSend (a stage's boundary)");
    }, [&] { ends_.input_gradient(c); });
  }

  //! A receive of the boundary tensor (from the stage before, or the user's `input` on stage 0's
  //! first chunk) or of its gradient (from the next stage).
  void receive(transport_context<cudaStream_t> const& c) {
    transfer(c, [&](int peer) {
      this->check_nccl_call(Api::recv(c.data, c.bytes, peer, this->comm_, c.stream), "ncclRecv (a stage's boundary)");
    }, [&] { ends_.input(c); });
  }

 private:
  //! One transfer: the group opened at a group's first, the NCCL call (or the user's end), the
  //! group closed at its last; a failure inside the group closes it before it propagates.
  template <class Call, class End>
  void transfer(transport_context<cudaStream_t> const& c, Call&& call, End&& end) {
    this->throw_if_aborted();
    if (ranks_ != static_cast<int>(c.stages))
      throw collective_error("tide: nccl_transport: the communicator has " + std::to_string(ranks_) + " ranks but the pipeline " +
                             std::to_string(c.stages) + " stages: one rank per stage");
    if (this->rank_ != static_cast<int>(c.stage))
      throw collective_error("tide: nccl_transport: rank " + std::to_string(this->rank_) + " runs the schedule of stage " +
                             std::to_string(c.stage) + ": stage s runs on rank s");
    if (c.pair == 1 && !this->in_group()) this->open_group();
    if (c.pair != 1 && c.pair != 2 && this->in_group()) {
      this->close_group();  // the step-end agreement must not land in it
      throw collective_error("tide: nccl_transport: a transfer alone (pair 0) came inside an open group: the stage "
                             "schedule's groups end with pair 2");
    }
    try {
      if (auto const peer = c.peer(); peer >= 0) call(static_cast<int>(peer));
      else if (!c.step_failed) end();  // a failed step's ends are its own: only the peers must not wait
    } catch (...) {
      this->close_group();
      throw;
    }
    if (c.pair == 2 && this->in_group()) this->end_group();
  }

  Ends ends_;
  int ranks_ = 0;
};

//! `basic_nccl_transport t(comm, ends)` deduces `Ends`.
template <class Ends>
basic_nccl_transport(ncclComm_t, Ends, std::chrono::milliseconds = std::chrono::minutes(5)) -> basic_nccl_transport<Ends>;

//! The NCCL transport on the real NCCL and CUDA runtime: `tide::nccl_transport t(comm, ends)`.
template <class Ends>
using nccl_transport = basic_nccl_transport<Ends>;

}  // namespace tide
