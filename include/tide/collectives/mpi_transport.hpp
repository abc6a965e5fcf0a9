#pragma once
//! \file
//! `tide::mpi::transport`: a pipeline stage's boundary transport over MPI point-to-point, one rank
//! per stage (stage s is rank s of the communicator), for the host backend's communication stream.
//!
//!     tide::mpi::environment env(argc, argv);
//!     tide::mpi::communicator world;
//!     tide::mpi::transport t(world, tide::mpi::stage_ends{.input = embed, .input_gradient = embed_backward});
//!     ex.step(forward, backward, tide::turn{head}, tide::hooks{.transport = std::ref(t)});
//!
//! - Non-blocking, grouped: transfers the stage schedule posts together (a send with the next
//!   receive; interleaved, a round's sends with the next round's receives) are posted
//!   (`MPI_Isend`, `MPI_Irecv`) and left in flight; the group's last completes them all, so
//!   neighbours that send to each other (1F1B's steady state, the interleaved ring) cannot
//!   deadlock. Messages between two stages keep their order (one tag per direction on a
//!   communicator of the transport's own), which is the stage order's both ways; interleaved, the
//!   last stage's chunk c feeds stage 0's chunk c + 1 (`transport_context::peer`).
//! - Checked: every MPI call's code, the size of every message (a neighbour whose boundary tensor
//!   has another size is named), and a timeout on every wait (`transport_options::timeout`).
//! - Failure: a rank whose step fails (its op sees `step_failed`, or `failing` becomes true while it
//!   waits) sends a notice naming itself to every rank; a rank waiting for a transfer that receives
//!   one throws `collective_error` naming the rank that failed, and passes the notice on with that
//!   rank's name (so every rank names the first one, not its neighbour). A rank that times out
//!   waiting for a neighbour names that neighbour in its notice. A rank killed outright: `mpirun`
//!   ends the job (and the timeouts would).
//! - The pipeline's ends, stage 0's input and its gradient, are the user's (`stage_ends`).

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <tide/collectives/mpi.hpp>
#include <tide/core/error.hpp>
#include <tide/core/op.hpp>

namespace tide::mpi {

//! The pipeline's ends, the user's on stage 0: `input(ctx)` writes micro-batch `ctx.micro_batch`'s
//! input (`ctx.span()`: the embedding's output), `input_gradient(ctx)` takes its gradient (the
//! embedding's backward). Both run on the communication stream.
template <class Input, class InputGradient>
struct stage_ends {
  Input input;                    //!< writes the first stage's input of a micro-batch
  InputGradient input_gradient;   //!< takes the gradient of the first stage's input
};
//! `tide::mpi::stage_ends{input, input_gradient}` deduces the types.
template <class I, class G>
stage_ends(I, G) -> stage_ends<I, G>;

//! How a transport waits.
struct transport_options {
  //! The longest wait for a neighbour's transfer before the step fails naming it
  std::chrono::milliseconds timeout{60'000};
};

//! A stage's boundary transport over MPI (see the file's description); `Ends` is a `stage_ends`.
template <class Ends>
class transport {
 public:
  //! Duplicates `comm` (a collective call: every rank constructs its transport together) so that
  //! its messages never meet the user's; stage s is rank s.
  explicit transport(communicator const& comm, Ends ends, transport_options o = {}) : ends_(std::move(ends)), opt_(o) {
    rank_ = comm.rank();
    size_ = comm.size();
    check(MPI_Comm_dup(comm.native(), &comm_), "MPI_Comm_dup", rank_);
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", rank_);
    post_notice_receive();
  }
  transport(transport const&) = delete;
  transport& operator=(transport const&) = delete;
  ~transport() {
    // Requests still pending belong to an abandoned step: cancel what can be.
    if (notice_req_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&notice_req_);
      MPI_Request_free(&notice_req_);
    }
    drop_pending();
    MPI_Comm_free(&comm_);
  }

  //! The rank that failed first, as far as this rank knows (its own after its failure), or -1.
  [[nodiscard]] int failed_rank() const noexcept { return failed_rank_; }

  //! A send of the boundary tensor (to the next stage) or its gradient (to the one before, or the
  //! user's `input_gradient` on stage 0's first chunk).
  template <class Ctx>
  void send(Ctx const& c) {
    if (refuse(c)) return;
    auto const peer = c.peer();
    if (peer < 0) {
      ends_.input_gradient(c);
    } else {
      pending p{MPI_REQUEST_NULL, false, static_cast<int>(peer), c.bytes, describe(c)};
      check(MPI_Isend(c.data, count(c), MPI_BYTE, p.peer, tag(c), comm_, &p.request), "MPI_Isend", rank_);
      pending_.push_back(std::move(p));
    }
    if (c.pair != 1) wait_for(c);
  }

  //! A receive of the boundary tensor (from the stage before, or the user's `input` on stage 0's
  //! first chunk) or of its gradient (from the next stage); the last of a group completes it.
  template <class Ctx>
  void receive(Ctx const& c) {
    if (refuse(c)) return;
    auto const peer = c.peer();
    if (peer < 0) {
      ends_.input(c);
    } else {
      pending p{MPI_REQUEST_NULL, true, static_cast<int>(peer), c.bytes, describe(c)};
      check(MPI_Irecv(c.data, count(c), MPI_BYTE, p.peer, tag(c), comm_, &p.request), "MPI_Irecv", rank_);
      pending_.push_back(std::move(p));
    }
    if (c.pair != 1) wait_for(c);
  }

  //! The step-end agreement: a rank whose step failed tells every rank (once).
  template <class Ctx>
  void agree(Ctx const& c) {
    if (c.step_failed) notify(failed_rank_ >= 0 ? failed_rank_ : rank_);
  }

 private:
  static constexpr int tensor_tag = 0x7d00, gradient_tag = 0x7d01, notice_tag = 0x7dff;

  int tag(auto const& c) const noexcept { return c.gradient ? gradient_tag : tensor_tag; }
  int count(auto const& c) const {
    if (c.bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw collective_error("tide::mpi::transport: a boundary of " + std::to_string(c.bytes) +
                             " bytes is more than MPI's int count allows");
    return static_cast<int>(c.bytes);
  }
  static std::string describe(auto const& c) {
    return std::string(c.gradient ? "the gradient of " : "") + "micro-batch " + std::to_string(c.micro_batch) +
           (c.virtual_stages > 1 ? " (chunk " + std::to_string(c.chunk) + ")" : std::string()) + "'s " +
           (c.gradient ? (c.kind == op_kind::send ? "input" : "output") : (c.kind == op_kind::send ? "output" : "input"));
  }
  std::string who(int r) const { return "stage " + std::to_string(r) + " (rank " + std::to_string(r) + ")"; }

  //! True when the op must not move data: this step failed here (tell the peers), or earlier.
  bool refuse(auto const& c) {
    if (size_ != static_cast<int>(c.stages))
      throw collective_error("tide::mpi::transport: the communicator has " + std::to_string(size_) + " ranks but the pipeline " +
                             std::to_string(c.stages) + " stages: run one rank per stage (mpirun -np " + std::to_string(c.stages) + ")");
    if (rank_ != static_cast<int>(c.stage))
      throw collective_error("tide::mpi::transport: rank " + std::to_string(rank_) + " runs the schedule of stage " +
                             std::to_string(c.stage) + ": stage s runs on rank s");
    if (c.step_failed) {
      notify(failed_rank_ >= 0 ? failed_rank_ : rank_);
      drop_pending();
      return true;
    }
    if (failed_rank_ >= 0 && failed_rank_ != rank_)
      throw collective_error("tide::mpi::transport: " + who(failed_rank_) + " failed; rank " + std::to_string(rank_) +
                             " does not move " + describe(c));
    return false;
  }

  //! Waits for the open group's transfers (`pending_`), polling the failure notices, this step's
  //! own failure and the timeout; a receive's message of another size names its sender. Whatever
  //! it throws, the group's transfers still in flight are cancelled first, not carried into the
  //! next step.
  void wait_for(auto const& c) {
    try {
      wait_group(c);
    } catch (...) {
      drop_pending();
      throw;
    }
  }
  void wait_group(auto const& c) {
    if (pending_.empty()) return;
    std::vector<MPI_Request> reqs;
    for (auto const& p : pending_) reqs.push_back(p.request);
    std::vector<MPI_Status> st(reqs.size());
    auto const group = [&] {
      std::string r;
      for (auto const& p : pending_) r += (r.empty() ? "" : ", ") + std::string(p.receive ? "the receive of " : "the send of ") + p.what;
      return r;
    };
    auto const deadline = std::chrono::steady_clock::now() + opt_.timeout;
    for (;;) {
      bool done = true;
      for (std::size_t k = 0; k < reqs.size(); ++k) {  // one at a time: what is still in flight names its peer
        if (reqs[k] == MPI_REQUEST_NULL) continue;
        int got = 0;
        int const rc = MPI_Test(&reqs[k], &got, &st[k]);
        pending_[k].request = reqs[k];  // null once complete (or freed by the failed test)
        if (rc != MPI_SUCCESS) {
          int cls = 0;
          MPI_Error_class(rc, &cls);
          if (pending_[k].receive && cls == MPI_ERR_TRUNCATE)
            throw collective_error("tide::mpi::transport: " + who(pending_[k].peer) + " sent more than the " +
                                   std::to_string(pending_[k].bytes) + " bytes of " + pending_[k].what + " that stage " +
                                   std::to_string(c.stage) + " expects: neighbouring stages must agree on the carry's size");
          check(rc, "MPI_Test", rank_);
        }
        done = done && got;
      }
      if (done) break;
      poll_notice();
      if (failed_rank_ >= 0 && failed_rank_ != rank_) {
        auto const what = group();
        drop_pending();
        notify(failed_rank_);
        throw collective_error("tide::mpi::transport: " + who(failed_rank_) + " failed or stopped answering during this step; rank " +
                               std::to_string(rank_) + " stops waiting for " + what);
      }
      if (c.failing && c.failing->load(std::memory_order_relaxed)) {  // this rank's step failed elsewhere
        drop_pending();
        notify(rank_);
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        auto const what = group();
        int stuck = rank_;  // the first peer whose transfer did not complete
        for (std::size_t k = 0; k < reqs.size() && stuck == rank_; ++k)
          if (reqs[k] != MPI_REQUEST_NULL) stuck = pending_[k].peer;
        drop_pending();
        notify(stuck);  // the others then name the rank that stopped answering
        throw collective_error("tide::mpi::transport: rank " + std::to_string(rank_) + " timed out after " +
                               std::to_string(opt_.timeout.count()) + " ms waiting for " + what +
                               (stuck != rank_ ? " (no answer from " + who(stuck) + ")" : std::string()) +
                               ": that rank is gone or stuck (transport_options::timeout)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    for (std::size_t k = 0; k < pending_.size(); ++k) {
      if (!pending_[k].receive) continue;
      int got = 0;
      check(MPI_Get_count(&st[k], MPI_BYTE, &got), "MPI_Get_count", rank_);
      if (static_cast<std::size_t>(got) != pending_[k].bytes)
        throw collective_error("tide::mpi::transport: " + who(pending_[k].peer) + " sent " + std::to_string(got) + " bytes for " +
                               pending_[k].what + ", but stage " + std::to_string(c.stage) + "'s boundary tensor has " +
                               std::to_string(pending_[k].bytes) + ": neighbouring stages must agree on the carry's size");
    }
    pending_.clear();
  }

  void post_notice_receive() {
    check(MPI_Irecv(&notice_in_, 1, MPI_INT, MPI_ANY_SOURCE, notice_tag, comm_, &notice_req_), "MPI_Irecv (failure notice)", rank_);
  }
  void poll_notice() {
    if (notice_req_ == MPI_REQUEST_NULL || failed_rank_ >= 0) return;
    int got = 0;
    check(MPI_Test(&notice_req_, &got, MPI_STATUS_IGNORE), "MPI_Test (failure notice)", rank_);
    if (got) failed_rank_ = notice_in_;
  }
  //! Tells every other rank that `origin` failed (once).
  void notify(int origin) {
    if (notified_) return;
    notified_ = true;
    if (failed_rank_ < 0) failed_rank_ = origin;
    notice_out_ = origin;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request q = MPI_REQUEST_NULL;
      if (MPI_Isend(&notice_out_, 1, MPI_INT, r, notice_tag, comm_, &q) == MPI_SUCCESS) MPI_Request_free(&q);
    }
  }
  //! Cancels and frees the open group's transfers still in flight.
  void drop_pending() noexcept {
    for (auto& p : pending_)
      if (p.request != MPI_REQUEST_NULL) {
        MPI_Cancel(&p.request);
        MPI_Request_free(&p.request);
      }
    pending_.clear();
  }

  //! A transfer of the open group, posted.
  struct pending {
    MPI_Request request = MPI_REQUEST_NULL;
    bool receive = false;
    int peer = -1;
    std::size_t bytes = 0;
    std::string what;
  };

  Ends ends_;
  transport_options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Request notice_req_ = MPI_REQUEST_NULL;
  std::vector<pending> pending_;
  int notice_in_ = -1, notice_out_ = -1;
  int failed_rank_ = -1;
  bool notified_ = false;
};
//! `tide::mpi::transport t(comm, ends)` deduces `Ends`.
template <class Ends>
transport(communicator const&, Ends, transport_options = {}) -> transport<Ends>;

}  // namespace tide::mpi
