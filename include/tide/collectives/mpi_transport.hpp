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
//! - Non-blocking, paired: a send the stage schedule pairs with the next receive is posted
//!   (`MPI_Isend`) and left in flight; the receive (`MPI_Irecv`) completes both, so two neighbours
//!   that send to each other in 1F1B's steady state cannot deadlock. Messages between two stages
//!   keep their order (one tag per direction on a communicator of the transport's own), which is
//!   the stage order's: micro-batches in order both ways.
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
    for (auto* r : {&notice_req_, &pending_send_})
      if (*r != MPI_REQUEST_NULL) {
        MPI_Cancel(r);
        MPI_Request_free(r);
      }
    MPI_Comm_free(&comm_);
  }

  //! The rank that failed first, as far as this rank knows (its own after its failure), or -1.
  [[nodiscard]] int failed_rank() const noexcept { return failed_rank_; }

  //! A send of the boundary tensor (to stage + 1) or its gradient (to stage - 1, or the user's
  //! `input_gradient` on stage 0).
  template <class Ctx>
  void send(Ctx const& c) {
    if (refuse(c)) return;
    auto const peer = c.peer();
    if (peer < 0) {
      ends_.input_gradient(c);
      if (c.pair != 1) wait_for(c, {});
      return;
    }
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Isend(c.data, count(c), MPI_BYTE, static_cast<int>(peer), tag(c), comm_, &r), "MPI_Isend", rank_);
    if (c.pair == 1) {
      pending_send_ = r;
      pending_what_ = describe(c);
      return;
    }
    wait_for(c, {r});
  }

  //! A receive of the boundary tensor (from stage - 1, or the user's `input` on stage 0) or of its
  //! gradient (from stage + 1); completes a pair's send too.
  template <class Ctx>
  void receive(Ctx const& c) {
    if (refuse(c)) return;
    auto const peer = c.peer();
    if (peer < 0) {
      ends_.input(c);
      wait_for(c, {});
      return;
    }
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Irecv(c.data, count(c), MPI_BYTE, static_cast<int>(peer), tag(c), comm_, &r), "MPI_Irecv", rank_);
    wait_for(c, {r}, static_cast<int>(peer));
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
    return std::string(c.gradient ? "the gradient of " : "") + "micro-batch " + std::to_string(c.micro_batch) + "'s " +
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

  //! Waits for `reqs` and a pair's pending send, polling the failure notices, this step's own
  //! failure and the timeout. `peer` (a receive's) is named when its message has another size.
  void wait_for(auto const& c, std::vector<MPI_Request> reqs, int peer = -1) {
    std::size_t const receive_at = reqs.size() == 1 && peer >= 0 ? 0 : std::size_t(-1);
    if (pending_send_ != MPI_REQUEST_NULL) reqs.push_back(std::exchange(pending_send_, MPI_REQUEST_NULL));
    if (reqs.empty()) return;
    std::vector<MPI_Status> st(reqs.size());
    auto const deadline = std::chrono::steady_clock::now() + opt_.timeout;
    for (;;) {
      int done = 0;
      if (int const rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, st.data()); rc != MPI_SUCCESS) {
        int cls = 0;
        MPI_Error_class(rc == MPI_ERR_IN_STATUS && receive_at == 0 ? st[0].MPI_ERROR : rc, &cls);
        if (cls == MPI_ERR_TRUNCATE)
          throw collective_error("tide::mpi::transport: " + who(peer) + " sent more than the " + std::to_string(c.bytes) +
                                 " bytes of " + describe(c) + " that stage " + std::to_string(c.stage) +
                                 " expects: neighbouring stages must agree on the carry's size");
        check(rc, "MPI_Testall", rank_);
      }
      if (done) break;
      poll_notice();
      if (failed_rank_ >= 0 && failed_rank_ != rank_) {
        abandon(reqs);
        notify(failed_rank_);
        throw collective_error("tide::mpi::transport: " + who(failed_rank_) + " failed or stopped answering during this step; rank " +
                               std::to_string(rank_) + " stops waiting for " + describe(c) +
                               (pending_what_.empty() ? "" : " and the send of " + pending_what_));
      }
      if (c.failing && c.failing->load(std::memory_order_relaxed)) {  // this rank's step failed elsewhere
        abandon(reqs);
        notify(rank_);
        return;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abandon(reqs);
        auto const p = c.peer();
        notify(p >= 0 ? static_cast<int>(p) : rank_);  // the others then name the rank that stopped answering
        throw collective_error("tide::mpi::transport: rank " + std::to_string(rank_) + " timed out after " +
                               std::to_string(opt_.timeout.count()) + " ms waiting for " + describe(c) +
                               (p >= 0 ? std::string(c.kind == op_kind::send ? " to reach " : " from ") + who(static_cast<int>(p)) : std::string()) +
                               (pending_what_.empty() ? "" : " (with the send of " + pending_what_ + ")") +
                               ": that rank is gone or stuck (transport_options::timeout)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    pending_what_.clear();
    if (receive_at == 0) {
      int got = 0;
      check(MPI_Get_count(&st[0], MPI_BYTE, &got), "MPI_Get_count", rank_);
      if (static_cast<std::size_t>(got) != c.bytes)
        throw collective_error("tide::mpi::transport: " + who(peer) + " sent " + std::to_string(got) + " bytes for " + describe(c) +
                               ", but stage " + std::to_string(c.stage) + "'s boundary tensor has " + std::to_string(c.bytes) +
                               ": neighbouring stages must agree on the carry's size");
    }
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
  void abandon(std::vector<MPI_Request>& reqs) {
    for (auto& r : reqs)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
  }
  void drop_pending() {
    if (pending_send_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&pending_send_);
      MPI_Request_free(&pending_send_);
    }
  }

  Ends ends_;
  transport_options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Request notice_req_ = MPI_REQUEST_NULL, pending_send_ = MPI_REQUEST_NULL;
  std::string pending_what_;
  int notice_in_ = -1, notice_out_ = -1;
  int failed_rank_ = -1;
  bool notified_ = false;
};
//! `tide::mpi::transport t(comm, ends)` deduces `Ends`.
template <class Ends>
transport(communicator const&, Ends, transport_options = {}) -> transport<Ends>;

}  // namespace tide::mpi
