#pragma once
//! \file
//! The host backend: each stream is a worker thread with a FIFO queue, events are
//! completion counters other streams wait on, copies are `memcpy` on the copy stream's worker.
//! The device arena is ordinary memory with a hard budget standing for the GPU's memory:
//! it bounds the bytes held at once, arenas of live executors included (see arena_pool.hpp).
//! An optional link model per direction paces copies, so overlap can be studied on a CPU with
//! realistic ratios of copy time to compute time. Stores and loads of spilled slots go to a
//! `spill_file` (io_uring or `pread`/`pwrite`) on the storage stream's worker.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <memory>
#include <new>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/link_model.hpp>
#include <tide/executor/arena_pool.hpp>
#include <tide/executor/backend.hpp>
#include <tide/storage/spill_file.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! Budgets and copy pacing for a `host_backend`.
struct host_backend_options {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();  //!< the "GPU memory" budget, bytes held at once
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();    //!< the pinned memory budget, bytes held at once
  link_direction d2h{};                                                     //!< paces offloads; the default is unpaced (as fast as `memcpy`)
  link_direction h2d{};                                                     //!< paces prefetches; the default is unpaced (as fast as `memcpy`)
  //! The storage tier spilled slots go to: a file in `storage.directory` (none by default: a
  //! schedule that stores bytes is then refused when its executor is built)
  storage_options storage{};
};

namespace detail {

//! Host memory for an arena_pool, page-aligned or more (the schedule's alignment); nullptr (not
//! `std::bad_alloc`) when the machine has not that much, so that the pool reports it as
//! `out_of_memory` naming the request.
struct page_allocator {
  static constexpr std::size_t page = 4096;
  std::byte* allocate(std::size_t bytes, std::size_t alignment) noexcept {
    return static_cast<std::byte*>(::operator new(bytes, std::align_val_t{std::max(alignment, page)}, std::nothrow));
  }
  void deallocate(std::byte* p, std::size_t, std::size_t alignment) noexcept {
    ::operator delete(p, std::align_val_t{std::max(alignment, page)});
  }
};

}  // namespace detail

//! A `backend` that runs a schedule on the CPU with real data: one worker thread per stream.
class host_backend {
 public:
  using tide_backend_tag = void;  //!< opts in to the `backend` concept
  //! Host lambdas run on the stream's worker thread; the handle says which stream that is.
  using stream_type = stream_role;
  //! Both arenas are host memory, so debug guards and poisoning can run.
  static constexpr bool device_memory_is_host_accessible = true;

  //! The largest latency, and the longest copy, a paced link may give: 1e12 us (11.6 days), as a
  //! cost table's times (beyond it the pacing's clock arithmetic would overflow).
  static constexpr double max_copy_us = 1e12;

  //! Starts one worker thread per stream; throws `error` naming a link whose bandwidth is negative
  //! or not finite, or whose latency is outside [0, max_copy_us], and throws if a thread cannot start.
  explicit host_backend(host_backend_options opt = {});
  host_backend(host_backend const&) = delete;
  host_backend& operator=(host_backend const&) = delete;
  ~host_backend();

  //! Records each op's interval and each blocking wait into `t` (nullptr: stop recording).
  void record_timeline(timeline* t) noexcept { timeline_ = t; }
  //! The budgets and links the backend was built with.
  host_backend_options const& options() const noexcept { return opt_; }
  //! The largest arena an executor was given.
  std::size_t device_peak_bytes() const noexcept { return device_.peak(); }
  //! The largest pinned host arena an executor was given.
  std::size_t host_peak_bytes() const noexcept { return host_.peak(); }
  //! Bytes allocated now: the current arena plus earlier ones that live executors still hold.
  //! The budgets bound these.
  std::size_t device_held_bytes() const { return device_.held_bytes(); }
  //! Host arena bytes allocated now, as `device_held_bytes()`.
  std::size_t host_held_bytes() const { return host_.held_bytes(); }

  //! Reserves both arenas within the budgets (throws `out_of_memory`), sizes events and queues
  //! for the schedule. Throws `error` while a step is enqueued: the workers use what it replaces.
  arenas setup(backend_setup const& s);

  //! `r` itself: host work for stream `r` runs on its worker.
  stream_type stream(stream_role r) const noexcept { return r; }

  //! Records event `e` on `r`: it completes when `r`'s worker reaches it (in a burst of paced
  //! copies, when the burst's last copy is due: at most `burst_us` after its own copy). Throws
  //! `error` when `e` was last recorded on another stream in this step and `r` has not waited for
  //! that record: an event's records complete in order only so (wait for it on `r` first, or record
  //! another event).
  void record(stream_role r, std::uint32_t e) {
    auto& last = last_record_[e];
    // Unordered records on two streams: the later could complete first and the earlier then set
    // the event back, so that a wait for the later waits forever (or, for the earlier, passes too soon).
    if (last.stream != 0 && last.step == step_serial_ && !(last.ordered & stream_bit(r))) throw_unordered_record(e, last.stream, r);
    auto const target = events_[e].recorded + 1;
    push(r, {item::record, e, target});  // first: a push that cannot grow its queue throws and changes nothing
    events_[e].recorded = target;
    last = {step_serial_, stream_bit(r), stream_bit(r)};
  }
  //! Enqueues on `r` a wait for the most recent record of `e`; a no-op for a never-recorded event.
  void wait(stream_role r, std::uint32_t e) {
    auto& last = last_record_[e];
    if (last.stream == 0) return;             // waiting on a never-recorded event is a no-op, as on CUDA
    auto const target = events_[e].recorded;  // the most recent record, as on CUDA
    push(r, {item::wait, e, target});
    last.ordered |= stream_bit(r);  // what `r` records next comes after that record
  }
  //! Enqueues `t` on `r`'s worker.
  void run(stream_role r, std::uint32_t i, op const&, task t) { push(r, {item::run, i, 0, t}); }
  //! Enqueues `t` on `r`'s worker behind a wait for everything enqueued so far on the other
  //! workers (a record of a backend-owned event on each).
  void run_after_all(stream_role r, task t) {
    for (std::size_t k = 0; k < stream_count; ++k) {
      if (k == static_cast<std::size_t>(r)) continue;
      auto const target = joins_[k].recorded + 1;
      push(static_cast<stream_role>(k), {item::record, static_cast<std::uint32_t>(k), target, {}, nullptr, nullptr, 0, nullptr, true});
      joins_[k].recorded = target;  // after the push, which may throw: never a target no record has
      push(r, {item::wait, static_cast<std::uint32_t>(k), target, {}, nullptr, nullptr, 0, nullptr, true});
    }
    push(r, {item::host, 0, 0, t});
  }
  //! Enqueues a `memcpy` on `r`'s worker, paced by the link of the copy's direction; throws
  //! `error` when the link would take longer than `max_copy_us` over it.
  void copy(stream_role r, std::uint32_t i, op const& o, void* dst, void const* src, std::size_t n) {
    item it{item::copy, i};
    it.dst = dst;
    it.src = src;
    it.bytes = n;
    it.pace = o.kind == op_kind::offload ? &opt_.d2h : &opt_.h2d;
    if (it.pace->time_us(n) > max_copy_us) throw_slow_copy(o, n);
    push(r, it);
  }
  //! Enqueues on `r`'s worker the write of a spilled slot from the ring (`src`) to the file.
  void store(stream_role r, std::uint32_t i, op const& o, void const* src) { push_storage(r, i, o, true, const_cast<void*>(src)); }
  //! Enqueues on `r`'s worker the read of a spilled slot from the file into the ring (`dst`).
  void load(stream_role r, std::uint32_t i, op const& o, void* dst) { push_storage(r, i, o, false, dst); }
  //! The storage tier's file (nullptr until a schedule that stores bytes was set up): its path and size.
  spill_file const* storage() const noexcept { return file_ ? &*file_ : nullptr; }

  //! Enqueues `t` on `r`'s worker, where it occupies the stream as an op would.
  void host_task(stream_role r, task t) { push(r, {item::host, 0, 0, t}); }

  //! Starts the step's clock; throws `error` when the previous step was not waited for.
  void begin_step(schedule_view s);
  //! Everything is enqueued; the workers run on.
  void end_step() noexcept {}
  //! Waits until every stream has drained, then hands the recorded intervals to the timeline.
  void wait_step();
  //! Microseconds since the step began, on the clock of the timeline's intervals (the executor
  //! times the turn with it).
  [[nodiscard]] double step_clock_us() const noexcept;

 private:
  // 32-bit counters: libstdc++ waits on those with a futex directly; its proxy wait for 64-bit
  // atomics (GCC 12) was seen to miss wake-ups for milliseconds. Comparisons are wrap-safe.
  struct event {
    std::uint32_t recorded = 0;               // issue side (host thread)
    std::atomic<std::uint32_t> completed{0};  // stream side
    // When the recording stream nominally reached the record (its clock's ticks, stored before
    // `completed`): a paced copy behind a wait starts from it, not from when its worker woke.
    std::atomic<std::int64_t> at{0};
  };
  static bool reached(std::uint32_t value, std::uint32_t target) noexcept {
    return static_cast<std::int32_t>(value - target) >= 0;
  }
  struct item {
    enum kind_t : std::uint8_t { run, copy, record, wait, host, store, load } kind = run;
    std::uint32_t index = 0;  // op index or event index
    std::uint32_t target = 0;
    task fn{};
    void* dst = nullptr;
    void const* src = nullptr;
    std::size_t bytes = 0;
    link_direction const* pace = nullptr;
    bool join = false;  // record/wait: `index` is one of `joins_`, not a schedule event
    std::size_t file_offset = 0;  // store/load
    std::int64_t queued = 0;      // when push enqueued it (the workers' clock's ticks; 0 unless paced)
  };

  void push_storage(stream_role r, std::uint32_t i, op const& o, bool write, void* at);
  // A paced copy and the copies queued right behind it on its link, run with one wake-up
  // (detail/host_backend_impl.hpp); times in the workers' clock's ticks.
  struct burst_item {
    item it;
    std::int64_t start = 0, due = 0;  // on the link's schedule
  };
  static constexpr std::size_t max_burst_items = 64;
  //! The most link time one burst of paced copies takes: how much later than its own copy's due
  //! time a record in the burst can complete.
  static constexpr double burst_us = 250;
  void paced_burst(std::size_t s, item const& first, std::int64_t picked, std::int64_t& ready, double& memcpy_ns_per_byte,
                   double& wake_late_ns);
  [[noreturn]] void throw_slow_copy(op const& o, std::size_t bytes) const;
  [[noreturn]] static void throw_unordered_record(std::uint32_t e, std::uint8_t last, stream_role r);
  static_assert(stream_count <= 8, "last_record::stream and ::ordered hold a bit per stream");
  static constexpr std::uint8_t stream_bit(stream_role r) noexcept { return static_cast<std::uint8_t>(1u << static_cast<unsigned>(r)); }
  // The worker threads, their queues, the step's clock and the paced links' schedule, defined
  // with the member functions that use them (detail/host_backend_impl.hpp): <thread>, <chrono>
  // and <condition_variable> stay off the path of code that only steps a schedule.
  struct workers;

  void stop_workers() noexcept;

  void push(stream_role r, item const& it);

  void work(std::size_t s);

  host_backend_options opt_;
  // Either copy direction paced: only then do items carry when they were enqueued (the nominal
  // timeline serves paced copies alone; an unpaced backend reads no clock per item for it).
  bool paced_ = opt_.d2h.time_us(1) > 0 || opt_.h2d.time_us(1) > 0;
  arena_pool<detail::page_allocator> device_, host_;
  std::vector<event> events_;
  // Issue side: each event's last record, so that record() can refuse an unordered one on another stream.
  struct last_record {
    std::uint64_t step = 0;    // step_serial_ then
    std::uint8_t stream = 0;   // its stream's bit (0: never recorded)
    std::uint8_t ordered = 0;  // the streams whose next record comes after it: its own, and those that waited for it
  };
  std::vector<last_record> last_record_;
  std::uint64_t step_serial_ = 0;  // counts begin_step and wait_step: a drain orders every record before it
  std::array<event, stream_count> joins_;  // run_after_all: each stream's end so far
  std::array<std::vector<op_span>, stream_count> spans_;
  std::array<std::vector<burst_item>, stream_count> burst_;  // each worker's own
  std::array<std::vector<wait_span>, stream_count> wait_spans_;
  timeline* timeline_ = nullptr;
  std::optional<spill_file> file_;
  std::exception_ptr storage_failure_;  // the step's first failed transfer (written by the storage stream's worker)
  std::atomic<bool> storage_failed_{false};
  std::size_t storage_alignment_ = 4096;  // the stepping schedule's: stores and loads move whole padded regions
  std::size_t max_ops_ = 0;
  std::atomic<bool> in_step_{false};
  std::unique_ptr<workers> w_;  // last: the threads start once everything above exists
};

static_assert(storage_backend<host_backend>);

}  // namespace tide

#if TIDE_DEFINITIONS
#include <tide/backends/host/detail/host_backend_impl.hpp>  // the longer member functions
#endif
