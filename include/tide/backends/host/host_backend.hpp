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
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sys/prctl.h>
#endif

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
  using clock = std::chrono::steady_clock;  //!< the clock of timeline intervals and copy pacing

  //! Starts one worker thread per stream; throws if a thread cannot start.
  explicit host_backend(host_backend_options opt = {})
      : opt_(opt),
        device_("tide: host backend device arena", opt.device_budget),
        host_("tide: host backend pinned host arena", opt.host_budget) {
    std::size_t started = 0;
    try {
      for (; started < stream_count; ++started) workers_[started] = std::thread([this, s = started] { work(s); });
    } catch (...) {
      stop_workers();  // a thread failed to start: join those that did, then report it
      throw;
    }
  }
  host_backend(host_backend const&) = delete;
  host_backend& operator=(host_backend const&) = delete;
  ~host_backend() { stop_workers(); }

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
  arenas setup(backend_setup const& s) {
    // The workers use the events and queues that setup may replace.
    if (in_step_.load())
      throw error("tide::host_backend: setup while a step is enqueued on this backend: wait for it "
                  "(executor::wait) before creating another executor on the backend");
    // The file first: a full disk or a bad directory is found before any arena is taken.
    if (s.storage_bytes > 0) detail::prepare_spill_file(file_, opt_.storage, s.storage_bytes, s.storage_alignment, "host_backend");
    auto d = device_.reserve(s.device_bytes, s.device_alignment);
    auto h = host_.reserve(s.host_bytes, s.host_alignment);
    if (file_ && s.storage_bytes > 0) file_->register_memory({h.data, s.host_bytes});
    arenas a{d.data, h.data, joint_lease(std::move(d.lease), std::move(h.lease))};
    if (events_.size() < s.events) {
      std::vector<event> e(s.events);
      events_.swap(e);
      recorded_.assign(s.events, false);
    }
    for (auto& q : queues_) {
      std::lock_guard lock(q.mutex);
      if (q.items.size() < 4 * s.ops + 16) q.items.resize(4 * s.ops + 16);
    }
    max_ops_ = std::max(max_ops_, s.ops);
    for (auto& t : spans_) t.reserve(s.ops);
    for (auto& t : wait_spans_) t.reserve(s.waits);
    return a;
  }

  //! `r` itself: host work for stream `r` runs on its worker.
  stream_type stream(stream_role r) const noexcept { return r; }

  //! Records event `e` on `r`: it completes when `r`'s worker reaches it.
  void record(stream_role r, std::uint32_t e) {
    recorded_[e] = true;
    auto const target = ++events_[e].recorded;
    push(r, {item::record, e, target});
  }
  //! Enqueues on `r` a wait for the most recent record of `e`; a no-op for a never-recorded event.
  void wait(stream_role r, std::uint32_t e) {
    if (!recorded_[e]) return;                // waiting on a never-recorded event is a no-op, as on CUDA
    auto const target = events_[e].recorded;  // the most recent record, as on CUDA
    push(r, {item::wait, e, target});
  }
  //! Enqueues `t` on `r`'s worker.
  void run(stream_role r, std::uint32_t i, op const&, task t) { push(r, {item::run, i, 0, t}); }
  //! Enqueues `t` on `r`'s worker behind a wait for everything enqueued so far on the other
  //! workers (a record of a backend-owned event on each).
  void run_after_all(stream_role r, task t) {
    for (std::size_t k = 0; k < stream_count; ++k) {
      if (k == static_cast<std::size_t>(r)) continue;
      auto const target = ++joins_[k].recorded;
      push(static_cast<stream_role>(k), {item::record, static_cast<std::uint32_t>(k), target, {}, nullptr, nullptr, 0, nullptr, true});
      push(r, {item::wait, static_cast<std::uint32_t>(k), target, {}, nullptr, nullptr, 0, nullptr, true});
    }
    push(r, {item::host, 0, 0, t});
  }
  //! Enqueues a `memcpy` on `r`'s worker, paced by the link of the copy's direction.
  void copy(stream_role r, std::uint32_t i, op const& o, void* dst, void const* src, std::size_t n) {
    item it{item::copy, i};
    it.dst = dst;
    it.src = src;
    it.bytes = n;
    it.pace = o.kind == op_kind::offload ? &opt_.d2h : &opt_.h2d;
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
  void begin_step(schedule_view s) {
    if (in_step_.exchange(true))
      throw error("tide::host_backend: a step is already running on this backend (one executor steps at a time)");
    start_ = clock::now();
    storage_failure_ = nullptr;
    storage_failed_.store(false);
    storage_alignment_ = s.buffers.storage_alignment;
    for (auto& t : spans_) t.clear();
    for (auto& t : wait_spans_) t.clear();
  }
  //! Everything is enqueued; the workers run on.
  void end_step() noexcept {}
  //! Waits until every stream has drained, then hands the recorded intervals to the timeline.
  void wait_step() {
    for (auto& q : queues_) {
      std::unique_lock lock(q.mutex);
      q.idle.wait(lock, [&] { return q.head == q.tail && !q.busy; });
    }
    if (timeline_) {
      timeline_->clear();
      // Sized once for the whole program: how many waits block varies from step to step.
      timeline_->reserve(max_ops_);
      for (auto& t : spans_) timeline_->ops.insert(timeline_->ops.end(), t.begin(), t.end());
      for (auto& t : wait_spans_) timeline_->waits.insert(timeline_->waits.end(), t.begin(), t.end());
    }
    in_step_.store(false);
    if (storage_failure_) std::rethrow_exception(std::exchange(storage_failure_, nullptr));
  }

 private:
  // 32-bit counters: libstdc++ waits on those with a futex directly; its proxy wait for 64-bit
  // atomics (GCC 12) was seen to miss wake-ups for milliseconds. Comparisons are wrap-safe.
  struct event {
    std::uint32_t recorded = 0;               // issue side (host thread)
    std::atomic<std::uint32_t> completed{0};  // stream side
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
  };

  void push_storage(stream_role r, std::uint32_t i, op const& o, bool write, void* at) {
    if (!file_) throw error("tide::host_backend: a store or load without a storage file (the schedule was set up without one)");
    item it{write ? item::store : item::load, i};
    it.dst = at;
    it.bytes = align_up(o.bytes, storage_alignment_);  // the slot's region, padded as the schedule laid it out
    it.file_offset = o.file_offset;
    push(r, it);
  }
  struct queue {
    std::mutex mutex;
    std::condition_variable ready, idle;
    std::vector<item> items;  // ring buffer; grows only when full
    std::size_t head = 0, tail = 0;
    bool busy = false, stop = false;
  };

  void stop_workers() noexcept {
    for (auto& q : queues_) {
      std::lock_guard lock(q.mutex);
      q.stop = true;
      q.ready.notify_all();
    }
    for (auto& w : workers_)
      if (w.joinable()) w.join();
  }

  void push(stream_role r, item const& it) {
    auto& q = queues_[static_cast<std::size_t>(r)];
    std::lock_guard lock(q.mutex);
    if (q.tail - q.head == q.items.size()) {  // full: grow (only before steady state)
      std::vector<item> bigger(q.items.size() * 2 + 16);
      for (std::size_t i = q.head; i < q.tail; ++i) bigger[i - q.head] = q.items[i % q.items.size()];
      q.tail -= q.head;
      q.head = 0;
      q.items.swap(bigger);
    }
    q.items[q.tail++ % q.items.size()] = it;
    q.ready.notify_one();
  }

  double us(clock::time_point t) const noexcept { return std::chrono::duration<double, std::micro>(t - start_).count(); }
  double now_us() const noexcept { return us(clock::now()); }

  void work(std::size_t s) {
#ifdef __linux__
    prctl(PR_SET_TIMERSLACK, 1UL);  // paced copies wake at their deadline, not up to 50 us late
#endif
    auto& q = queues_[s];
    auto const role = static_cast<stream_role>(s);
    // When this stream's next item could nominally start: after the previous item (a paced copy
    // counts as done at its due time, not when this thread woke up) and after any blocking.
    auto ready_at = clock::now();
    for (;;) {
      item it;
      {
        std::unique_lock lock(q.mutex);
        q.busy = false;
        if (q.head == q.tail) {
          q.idle.notify_all();
          q.ready.wait(lock, [&] { return q.stop || q.head != q.tail; });
          ready_at = std::max(ready_at, clock::now());
        }
        if (q.head == q.tail) return;
        it = q.items[q.head++ % q.items.size()];
        q.busy = true;
      }
      switch (it.kind) {
        case item::run: {
          auto const b = now_us();
          it.fn();
          ready_at = clock::now();
          if (timeline_) spans_[s].push_back({it.index, role, b, now_us()});
          break;
        }
        case item::copy: {
          auto const picked = clock::now();
          if (auto const copy_us = it.pace->time_us(it.bytes); copy_us > 0) {
            // Pace against the link's own schedule, as a copy engine would run: a copy that was
            // ready (queued, its waits done) when the link became free starts then, not when this
            // thread's sleep happened to end, so wake-up lateness does not add up to a slower link.
            auto& link = link_free_[it.pace == &opt_.d2h ? 0 : 1];
            auto const start =
                std::max(ready_at, clock::time_point(clock::duration(link.load(std::memory_order_relaxed))));
            auto const due = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::micro>(copy_us));
            // The data becomes visible only when the copy completes on the link's schedule, as on a
            // GPU: a reader that misses a wait sees the old bytes, and the source is read at the
            // end, so one overwritten during the copy shows too.
            std::this_thread::sleep_until(due);
            auto const moving = clock::now();
            std::memcpy(it.dst, it.src, it.bytes);
            auto const done = clock::now();
            // The link stands for the memcpy: it is free again at `due`, unless moving the bytes
            // took longer than the link's time (never faster than the copy really took).
            auto const end = std::max(due, start + (done - moving));
            link.store(end.time_since_epoch().count(), std::memory_order_relaxed);
            ready_at = end;
            // The span: from when this stream was on the copy to when its data became visible.
            if (timeline_) spans_[s].push_back({it.index, role, us(std::max(start, picked)), us(done)});
          } else {
            std::memcpy(it.dst, it.src, it.bytes);
            ready_at = clock::now();
            if (timeline_) spans_[s].push_back({it.index, role, us(picked), us(ready_at)});
          }
          break;
        }
        case item::record: {
          auto& e = (it.join ? joins_.data() : events_.data())[it.index].completed;
          e.store(it.target, std::memory_order_release);
          e.notify_all();
          break;
        }
        case item::wait: {
          auto& e = (it.join ? joins_.data() : events_.data())[it.index].completed;
          auto v = e.load(std::memory_order_acquire);
          if (reached(v, it.target)) break;
          auto const b = now_us();
          while (!reached(v, it.target)) {
            e.wait(v, std::memory_order_acquire);
            v = e.load(std::memory_order_acquire);
          }
          ready_at = std::max(ready_at, clock::now());
          if (timeline_ && !it.join) wait_spans_[s].push_back({role, it.index, b, now_us()});
          break;
        }
        case item::store:
        case item::load: {
          auto const b = now_us();
          // After a failed transfer the step is lost: skip the rest rather than read back what
          // was never written. The first failure is thrown by wait_step.
          if (!storage_failed_.load(std::memory_order_acquire)) {
            try {
              if (it.kind == item::store) file_->write(it.dst, it.file_offset, it.bytes);
              else file_->read(it.dst, it.file_offset, it.bytes);
            } catch (...) {
              storage_failure_ = std::current_exception();  // only this worker writes it during a step
              storage_failed_.store(true, std::memory_order_release);
            }
          }
          ready_at = clock::now();
          if (timeline_) spans_[s].push_back({it.index, role, b, now_us()});
          break;
        }
        case item::host:
          // A host task occupies its stream as on a GPU: a paced copy behind it cannot nominally
          // start before it ends (a debug poisoning memset would otherwise shorten the copy).
          it.fn();
          ready_at = clock::now();
          break;
      }
    }
  }

  host_backend_options opt_;
  arena_pool<detail::page_allocator> device_, host_;
  std::array<std::atomic<clock::rep>, 2> link_free_{};  // d2h, h2d: when the paced link is next free
  std::vector<event> events_;
  std::vector<bool> recorded_;  // issue side: ever recorded
  std::array<event, stream_count> joins_;  // run_after_all: each stream's end so far
  std::array<queue, stream_count> queues_;
  std::array<std::vector<op_span>, stream_count> spans_;
  std::array<std::vector<wait_span>, stream_count> wait_spans_;
  timeline* timeline_ = nullptr;
  std::optional<spill_file> file_;
  std::exception_ptr storage_failure_;  // the step's first failed transfer (written by the storage stream's worker)
  std::atomic<bool> storage_failed_{false};
  std::size_t storage_alignment_ = 4096;  // the stepping schedule's: stores and loads move whole padded regions
  std::size_t max_ops_ = 0;
  std::atomic<bool> in_step_{false};
  clock::time_point start_{};
  std::array<std::thread, stream_count> workers_;
};

static_assert(storage_backend<host_backend>);

}  // namespace tide
