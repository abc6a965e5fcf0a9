#pragma once
//! \file
//! The sim backend: the backend concept in virtual time. The generic executor runs the
//! same op program as on the host or a GPU, but nothing is computed or copied: compute ops take
//! their time from a `cost_table`, copies take latency plus bytes over bandwidth on a
//! per-direction link (full duplex or shared), collectives take their time from the table.
//!
//! The executor issues every op, and every wait and record around it, in program order, and on
//! each stream ops run in that order; so one pass in issue order yields the whole timeline: a
//! stream's op starts when the stream is free, the events it waits on have been recorded, and
//! (for a copy) the link direction is free. A recorded event is usable `sync_latency_us` after
//! its record, by every waiter, so the step time is a max-plus function of the costs: more work
//! is never faster. The result is deterministic and a 128-layer step takes well under a
//! millisecond, so planners and sweeps can call it thousands of times.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/executor/backend.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! Budgets for the sim backend's arenas, so that a sweep can reject schedules that do not fit.
struct sim_options {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();  //!< setup throws above this
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();    //!< setup throws above this
};

//! A `backend` that runs a schedule in virtual time: step times from a `cost_table`, no data.
class sim_backend {
 public:
  using tide_backend_tag = void;  //!< opts in to the `backend` concept
  //! Host lambdas receive the role itself: there is no stream behind it.
  using stream_type = stream_role;
  //! There is no memory behind the arenas, so debug guards and poisoning cannot run.
  static constexpr bool device_memory_is_host_accessible = false;

  //! `costs` must outlive the backend (sweeps reuse one table for thousands of steps).
  explicit sim_backend(cost_table const& costs, sim_options opt = {}) : costs_(&costs), opt_(opt) {}
  sim_backend(cost_table&&, sim_options = {}) = delete;

  //! Records each op's interval and each blocking wait into `t` (nullptr: stop recording).
  void record_timeline(timeline* t) noexcept { timeline_ = t; }
  //! The table the backend was built with.
  cost_table const& costs() const noexcept { return *costs_; }
  //! The budgets the backend was built with.
  sim_options const& options() const noexcept { return opt_; }

  //! The last step's time: the end of its last op, in microseconds.
  double step_us() const noexcept { return step_us_; }
  //! The device arena of the last setup, in bytes.
  std::size_t device_peak_bytes() const noexcept { return device_bytes_; }
  //! The pinned host arena of the last setup, in bytes.
  std::size_t host_peak_bytes() const noexcept { return host_bytes_; }

  //! Checks the cost table (`cost_table::check`: a NaN time ran as one), that it has one layer per
  //! layer of the schedule (throws `cost_model_error` naming both counts), and the budgets.
  arenas setup(backend_setup const& s) {
    costs_->check();
    check_layers(s.schedule);
    if (s.device_bytes > opt_.device_budget)
      throw out_of_memory("tide: sim backend device arena", s.device_bytes, opt_.device_budget);
    if (s.host_bytes > opt_.host_budget)
      throw out_of_memory("tide: sim backend pinned host arena", s.host_bytes, opt_.host_budget);
    device_bytes_ = s.device_bytes;
    host_bytes_ = s.host_bytes;
    // A new executor's schedule may sit where a freed one was (build_schedule_into reuses its
    // storage): its first step takes it anew.
    step_slots_ = {};
    if (timeline_) timeline_->reserve(s.ops);
    // The executor forms pointers from these bases and offsets but the sim never dereferences
    // them; distinct non-null bases keep that arithmetic well defined for sanitizers.
    return {reinterpret_cast<std::byte*>(std::uintptr_t{1} << 44), reinterpret_cast<std::byte*>(std::uintptr_t{1} << 45)};
  }

  //! `r` itself.
  stream_type stream(stream_role r) const noexcept { return r; }

  //! Stamps event `e` with the time stream `r` is free, i.e. the end of its last op.
  void record(stream_role r, std::uint32_t e) { event_us_[e] = ready_[index(r)]; }
  //! Waits for the most recent record, as on CUDA: the stream resumes no earlier than
  //! `sync_latency_us` after it, whether it arrived before or after the record (a later waiter is
  //! never better off than an earlier one). A never-recorded event is a no-op, as on CUDA.
  void wait(stream_role r, std::uint32_t e) {
    if (event_us_[e] == never) return;
    auto& t = ready_[index(r)];
    auto const usable = event_us_[e] + costs_->sync_latency_us;
    if (usable <= t) return;
    if (timeline_) timeline_->waits.push_back({r, e, t, usable});
    t = usable;
  }
  //! Compute or a collective: advances the stream by the op's cost. The task is not called:
  //! there is no data.
  void run(stream_role r, std::uint32_t i, op const& o, task) {
    if (o.layer >= costs_->layer_count())
      throw cost_model_error("tide: sim backend: op #" + std::to_string(i) + " (" + op_label({}, o) +
                             ") is beyond the cost table, which has " +
                           std::to_string(costs_->layer_count()) + " layers: give one layer_cost per layer");
    auto const& c = costs_->layers[o.layer];
    double d = 0;
    switch (o.kind) {
      case op_kind::forward:
      case op_kind::advance: d = c.forward_us; break;  // a segment recomputation runs the whole layer
      case op_kind::recompute: d = o.layer < recompute_us_.size() ? recompute_us_[o.layer] : c.full_recompute_us(); break;
      case op_kind::backward: d = c.backward_us; break;
      case op_kind::gather: d = c.gather_us; break;
      case op_kind::regather: d = c.regather_us; break;
      case op_kind::reduce: d = c.reduce_us; break;
      default: break;
    }
    auto const begin = ready_[index(r)] + costs_->op_overhead_us;
    if (!is_collective(o.kind)) d += contention_us(begin, d, c.memory_bound_share);
    advance(r, i, begin, d);
  }
  //! Stream `r` resumes once every stream is free (plus `sync_latency_us` when it waited); the
  //! task is not called.
  void run_after_all(stream_role r, task) noexcept {
    auto& t = ready_[index(r)];
    auto const last = *std::max_element(ready_.begin(), ready_.end());
    if (last > t) t = last + costs_->sync_latency_us;
  }
  //! A copy waits for its stream and for its link direction (both directions on a shared link).
  void copy(stream_role r, std::uint32_t i, op const& o, void*, void const*, std::size_t n) {
    bool const d2h = o.kind == op_kind::offload;
    auto const& link = costs_->link;
    auto& busy = link_us_[link.full_duplex && !d2h ? 1 : 0];
    auto const begin = std::max(ready_[index(r)] + costs_->op_overhead_us, busy);
    busy = advance(r, i, begin, (d2h ? link.d2h : link.h2d).time_us(n));
    if (costs_->hbm_bytes_per_second > 0 && busy > begin && r != stream_role::compute)
      copies_.push_back({begin, busy, static_cast<double>(n) / ((busy - begin) * 1e-6) / costs_->hbm_bytes_per_second});
  }
  //! A store waits for its stream and the storage path (`cost_table::storage`; both directions
  //! share it unless it is full duplex).
  void store(stream_role r, std::uint32_t i, op const& o, void const*) { transfer(r, i, o, true); }
  //! A load, as a store the other way.
  void load(stream_role r, std::uint32_t i, op const& o, void*) { transfer(r, i, o, false); }
  //! Does nothing: the debug checks it would run need data.
  void host_task(stream_role, task) noexcept {}

  //! Starts virtual time at zero for the step of `s`. When `s` is not the previous step's schedule
  //! (executors may share a backend) it notes which slots each layer rematerializes (a recompute
  //! costs only the slots it produces) and sizes the events for it.
  void begin_step(schedule_view s) {
    if (s.stage.present())
      throw error("tide::sim_backend: the schedule is a pipeline stage's (build_stage_schedule); the simulator runs one "
                  "stack's step, not a stage's micro-batches and boundary transfers yet: run the stage on host_backend");
    if (s.slots.data() != step_slots_.data() || s.slots.size() != step_slots_.size() || s.event_count != event_us_.size()) {
      check_layers(s);
      recompute_us_.resize(s.layer_count());
      for (std::uint32_t l = 0; l < s.layer_count(); ++l) recompute_us_[l] = costs_->layers[l].recompute_time_us(s.slots_of(l));
      event_us_.resize(s.event_count);
      step_slots_ = s.slots;
    }
    ready_.fill(0);
    link_us_.fill(0);
    storage_us_.fill(0);
    copies_.clear();
    std::fill(event_us_.begin(), event_us_.end(), never);
    step_us_ = 0;
    if (timeline_) timeline_->clear();
  }
  //! Sets `step_us()` to the end of the last op on any stream.
  void end_step() noexcept { step_us_ = *std::max_element(ready_.begin(), ready_.end()); }
  //! Does nothing: the step was computed as it was issued.
  void wait_step() noexcept {}

 private:
  void check_layers(schedule_view s) const {
    if (s.layer_count() != costs_->layer_count())
      throw cost_model_error("tide: sim backend: the schedule has " + std::to_string(s.layer_count()) +
                             " layers but the cost table has " + std::to_string(costs_->layer_count()));
  }
  static constexpr double never = std::numeric_limits<double>::lowest();  // an event not recorded this step
  static std::size_t index(stream_role r) noexcept { return static_cast<std::size_t>(r); }
  // HBM contention (`cost_table::hbm_bytes_per_second`): the time a compute op of `d` from `begin`
  // loses to the host copies running beside it, each taking its rate's share of HBM from the
  // op's memory-bound part. One pass in issue order sees the copies issued before the op: an
  // offload is issued after the forward it follows and before the next, a prefetch before the
  // backward work it feeds, so these are the copies that overlap it.
  double contention_us(double begin, double d, double memory_bound_share) {
    if (copies_.empty() || memory_bound_share <= 0 || d <= 0) return 0;
    std::erase_if(copies_, [&](copy_span const& c) { return c.end <= begin; });  // compute starts only later
    double lost = 0;
    for (auto const& c : copies_) lost += std::max(0.0, std::min(c.end, begin + d) - std::max(c.begin, begin)) * c.share;
    return lost * memory_bound_share;
  }
  void transfer(stream_role r, std::uint32_t i, op const& o, bool write) {
    auto const& st = costs_->storage;
    auto& busy = storage_us_[st.full_duplex && !write ? 1 : 0];
    auto const begin = std::max(ready_[index(r)] + costs_->op_overhead_us, busy);
    busy = advance(r, i, begin, (write ? st.write : st.read).time_us(o.bytes));
  }
  double advance(stream_role r, std::uint32_t i, double begin, double d) {
    auto const end = begin + d;
    ready_[index(r)] = end;
    if (timeline_) timeline_->ops.push_back({i, r, begin, end});
    return end;
  }

  cost_table const* costs_;
  sim_options opt_;
  std::vector<double> recompute_us_;
  std::span<slot_binding const> step_slots_;  // the schedule recompute_us_ and event_us_ are for
  std::vector<double> event_us_;
  std::array<double, stream_count> ready_{};
  std::array<double, 2> link_us_{};
  std::array<double, 2> storage_us_{};  // when the storage path (each direction, if full duplex) is next free
  struct copy_span {
    double begin, end;
    double share;  // of HBM bandwidth: the copy's rate over hbm_bytes_per_second
  };
  std::vector<copy_span> copies_;  // host copies that may still overlap a compute op
  double step_us_ = 0;
  std::size_t device_bytes_ = 0, host_bytes_ = 0;
  timeline* timeline_ = nullptr;
};

static_assert(storage_backend<sim_backend>);

}  // namespace tide
