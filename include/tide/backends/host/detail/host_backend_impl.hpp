#pragma once
// host_backend's longer member functions (the workers' loop, setup, the step's end), out of the
// class: header-only they are inline here; in separate compilation (core/config.hpp) they are
// compiled once, in the library. Included at the end of host_backend.hpp; not on its own.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <tide/backends/host/host_backend.hpp>

namespace tide {

struct host_backend::workers {
  using clock = std::chrono::steady_clock;  // the clock of timeline intervals and copy pacing
  static_assert(sizeof(clock::rep) <= sizeof(std::int64_t), "event::at and item::queued hold this clock's ticks");
  struct queue {
    std::mutex mutex;
    std::condition_variable ready, idle;
    std::vector<item> items;  // ring buffer; grows only when full
    std::size_t head = 0, tail = 0;
    bool busy = false, stop = false;
  };
  std::array<queue, stream_count> queues;
  std::array<std::atomic<clock::rep>, 2> link_free{};  // d2h, h2d: when the paced link is next free
  clock::time_point start{};                           // the step's
  std::array<std::thread, stream_count> threads;
  //! Microseconds from the step's start to `t`.
  [[nodiscard]] double us(clock::time_point t) const noexcept { return std::chrono::duration<double, std::micro>(t - start).count(); }
  [[nodiscard]] double now_us() const noexcept { return us(clock::now()); }
};

namespace detail {

//! The host backend's link, checked before any thread starts: a NaN or negative bandwidth would
//! otherwise read as unpaced, and a latency past `max_copy_us` overflow the pacing's clock.
inline void check_host_backend_link(link_direction const& d, char const* what) {
  auto const num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  if (!(d.bytes_per_second >= 0 && d.bytes_per_second < std::numeric_limits<double>::infinity()))
    throw error(std::string("tide::host_backend: host_backend_options::") + what + ".bytes_per_second is " +
                num(d.bytes_per_second) + ": give a finite bandwidth in bytes per second, or 0 for unpaced copies");
  if (!(d.latency_us >= 0 && d.latency_us <= host_backend::max_copy_us))
    throw error(std::string("tide::host_backend: host_backend_options::") + what + ".latency_us is " + num(d.latency_us) +
                ": give a latency from 0 to 1e12 microseconds");
}

}  // namespace detail

TIDE_INLINE host_backend::host_backend(host_backend_options opt)
    : opt_((detail::check_host_backend_link(opt.d2h, "d2h"), detail::check_host_backend_link(opt.h2d, "h2d"), opt)),
      device_("tide: host backend device arena", opt.device_budget),
      host_("tide: host backend pinned host arena", opt.host_budget),
      w_(std::make_unique<workers>()) {
  for (auto& b : burst_) b.reserve(max_burst_items);  // a worker's burst never allocates
  std::size_t started = 0;
  try {
    for (; started < stream_count; ++started) w_->threads[started] = std::thread([this, s = started] { work(s); });
  } catch (...) {
    stop_workers();  // a thread failed to start: join those that did, then report it
    throw;
  }
}

TIDE_INLINE host_backend::~host_backend() { stop_workers(); }

TIDE_INLINE arenas host_backend::setup(backend_setup const& s) {
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
    last_record_.assign(s.events, {});
  }
  for (auto& q : w_->queues) {
    std::lock_guard lock(q.mutex);
    if (q.items.size() < 4 * s.ops + 16) q.items.resize(4 * s.ops + 16);
  }
  max_ops_ = std::max(max_ops_, s.ops);
  for (auto& t : spans_) t.reserve(s.ops);
  for (auto& t : wait_spans_) t.reserve(s.waits);
  return a;
}

TIDE_INLINE void host_backend::begin_step(schedule_view s) {
  if (in_step_.exchange(true))
    throw error("tide::host_backend: a step is already running on this backend (one executor steps at a time)");
  w_->start = workers::clock::now();
  ++step_serial_;
  storage_failure_ = nullptr;
  storage_failed_.store(false);
  storage_alignment_ = s.buffers.storage_alignment;
  for (auto& t : spans_) t.clear();
  for (auto& t : wait_spans_) t.clear();
}

TIDE_INLINE double host_backend::step_clock_us() const noexcept { return w_->now_us(); }

TIDE_INLINE void host_backend::wait_step() {
  for (auto& q : w_->queues) {
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
  ++step_serial_;  // everything recorded so far has completed: any stream may record an event next
  in_step_.store(false);
  if (storage_failure_) std::rethrow_exception(std::exchange(storage_failure_, nullptr));
}

TIDE_INLINE void host_backend::push_storage(stream_role r, std::uint32_t i, op const& o, bool write, void* at) {
  if (!file_) throw error("tide::host_backend: a store or load without a storage file (the schedule was set up without one)");
  item it{write ? item::store : item::load, i};
  it.dst = at;
  it.bytes = align_up(o.bytes, storage_alignment_);  // the slot's region, padded as the schedule laid it out
  it.file_offset = o.file_offset;
  push(r, it);
}

TIDE_INLINE void host_backend::throw_slow_copy(op const& o, std::size_t bytes) const {
  bool const d2h = o.kind == op_kind::offload;
  auto const& d = d2h ? opt_.d2h : opt_.h2d;
  char b[256];
  std::snprintf(b, sizeof b, "%zu bytes at %.17g bytes per second and %.17g us of latency would take %.6g s", bytes,
                d.bytes_per_second, d.latency_us, d.time_us(bytes) / 1e6);
  throw error(std::string("tide::host_backend: a paced ") + (d2h ? "offload" : "prefetch") + " of " + b +
              ", more than max_copy_us (1e12 us): give host_backend_options::" + (d2h ? "d2h" : "h2d") +
              " a bandwidth that moves it in time, or 0 for unpaced copies");
}

TIDE_INLINE void host_backend::throw_unordered_record(std::uint32_t e, std::uint8_t last, stream_role r) {
  auto const before = static_cast<stream_role>(std::countr_zero(last));  // `last` holds one stream's bit
  auto const on = std::string(to_string(r));
  throw error("tide::host_backend: event " + std::to_string(e) + " recorded on stream " + on + " after its record on stream " +
              std::string(to_string(before)) + " in the same step, which " + on +
              " has not waited for: an event's records complete in order only when each stream that records it waited "
              "for the record before (this one could complete first, and a wait for it pass too soon or never); wait "
              "for the event on " + on + " first, or record another event there");
}

TIDE_INLINE void host_backend::stop_workers() noexcept {
  for (auto& q : w_->queues) {
    std::lock_guard lock(q.mutex);
    q.stop = true;
    q.ready.notify_all();
  }
  for (auto& t : w_->threads)
    if (t.joinable()) t.join();
}

TIDE_INLINE void host_backend::push(stream_role r, item const& it) {
  auto& q = w_->queues[static_cast<std::size_t>(r)];
  std::unique_lock lock(q.mutex);
  // The worker sleeps only on an empty queue (it looks under this lock first): a push onto a queue
  // that holds items wakes no one, so enqueuing a step costs a wake-up per stream, not per item.
  bool const was_empty = q.head == q.tail;
  if (q.tail - q.head == q.items.size()) {  // full: grow (only before steady state)
    std::vector<item> bigger(q.items.size() * 2 + 16);
    for (std::size_t i = q.head; i < q.tail; ++i) bigger[i - q.head] = q.items[i % q.items.size()];
    q.tail -= q.head;
    q.head = 0;
    q.items.swap(bigger);
  }
  auto& slot = q.items[q.tail++ % q.items.size()];
  slot = it;
  if (paced_) slot.queued = workers::clock::now().time_since_epoch().count();
  lock.unlock();  // the woken worker takes the lock at once
  if (was_empty) q.ready.notify_one();
}

// A paced copy, with the copies on the same link queued right behind it (and the records between
// them, and waits already passed) as one burst: one sleep and one wake-up for all of them, as a
// copy engine runs its queue without waking for each copy. Each copy keeps its place on the link's
// schedule (it starts when it was ready and the link free, and takes `time_us` of its bytes); the
// burst's bytes all move in the second half of its last copy's time, and its records complete
// when its last copy is due, none before its own copy is. A burst is at most `burst_us` of link
// time, so a record completes at most that late. Without bursts, a step of many small copies pays
// a wake-up or two per copy (docs/performance.md, "Pipeline stages").
TIDE_INLINE void host_backend::paced_burst(std::size_t s, item const& first, std::int64_t picked_ticks, std::int64_t& ready_ticks,
                                           double& memcpy_ns_per_byte, double& wake_late_ns) {
  using clock = workers::clock;
  auto const at = [](std::int64_t t) { return clock::time_point(clock::duration(t)); };
  auto const picked = at(picked_ticks);
  auto const ready_at = at(ready_ticks);
  auto const role = static_cast<stream_role>(s);
  auto& q = w_->queues[s];
  auto const dur = [](item const& c) {
    return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::micro>(c.pace->time_us(c.bytes)));
  };
  auto const ns = [](clock::duration d) { return std::chrono::duration<double, std::nano>(d).count(); };
  auto& link = w_->link_free[first.pace == &opt_.d2h ? 0 : 1];
  auto& b = burst_[s];
  b.clear();
  // The first copy starts when it was ready (queued, its waits done) and the link free, not when
  // this thread's sleep happened to end: wake-up lateness does not add up to a slower link.
  auto const begin = std::max(ready_at, at(link.load(std::memory_order_relaxed)));
  auto last_start = begin, due = begin + dur(first);
  auto ready = due;  // when this stream could go on after the burst so far, nominally
  std::size_t bytes = first.bytes;
  auto const tick = [](clock::time_point t) { return static_cast<std::int64_t>(t.time_since_epoch().count()); };
  b.push_back({first, tick(begin), tick(due)});
  {
    std::lock_guard lock(q.mutex);
    while (q.head != q.tail && b.size() < max_burst_items) {
      auto const& nx = q.items[q.head % q.items.size()];
      auto const queued = at(nx.queued);
      if (nx.kind == item::copy) {
        if (nx.pace != first.pace) break;
        auto const start = std::max({ready, queued, due});
        auto const end = start + dur(nx);
        if (end - begin > std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::micro>(burst_us))) break;
        b.push_back({nx, tick(start), tick(end)});
        last_start = start;
        ready = due = end;
        bytes += nx.bytes;
      } else if (nx.kind == item::record) {
        ready = std::max(ready, queued);  // as work() takes an item's enqueue time
        b.push_back({nx, tick(ready), tick(ready)});
      } else if (nx.kind == item::wait) {
        auto const& e = (nx.join ? joins_.data() : events_.data())[nx.index];
        if (!reached(e.completed.load(std::memory_order_acquire), nx.target)) break;
        ready = std::max({ready, queued, at(e.at.load(std::memory_order_relaxed))});
      } else {
        break;
      }
      ++q.head;
    }
  }
  // The memcpys start before `due` by what this worker's memcpys and wake-ups have lately taken,
  // so that the burst is not late by both; but not before the second half of its last copy: a
  // reader that misses a wait sees the old bytes until then (a source overwritten during a copy
  // shows too).
  auto const lead = std::chrono::duration_cast<clock::duration>(
      std::chrono::duration<double, std::nano>(memcpy_ns_per_byte * static_cast<double>(bytes) + wake_late_ns));
  auto const wake = std::max(last_start + (due - last_start) / 2, due - lead);
  bool const slept = clock::now() < wake;  // not when the worker is behind: that is no wake-up's lateness
  if (slept) std::this_thread::sleep_until(wake);
  auto const moving = clock::now();
  for (auto const& x : b)
    if (x.it.kind == item::copy) std::memcpy(x.it.dst, x.it.src, x.it.bytes);
  auto const copied = clock::now();
  if (bytes >= (64u << 10))  // per byte, from copies large enough that memcpy's fixed cost is small
    memcpy_ns_per_byte = 0.75 * memcpy_ns_per_byte + 0.25 * ns(copied - moving) / static_cast<double>(bytes);
  if (slept) wake_late_ns = 0.75 * wake_late_ns + 0.25 * ns(moving - wake);
  if (copied < due) {
    // Complete at `due`: a sleep ends late by a wake-up, so the last stretch (at most 100 us) is spun.
    auto const nap = due - std::chrono::duration_cast<clock::duration>(
                               std::chrono::duration<double, std::nano>(std::min(wake_late_ns, 100e3)));
    if (copied < nap) std::this_thread::sleep_until(nap);
    while (clock::now() < due) {
    }
  }
  auto const done = clock::now();
  auto const end = std::max(due, last_start + (copied - moving));
  link.store(end.time_since_epoch().count(), std::memory_order_relaxed);
  for (std::size_t k = 0; k < b.size(); ++k) {
    auto const& x = b[k];
    if (x.it.kind == item::record) {
      auto& e = (x.it.join ? joins_.data() : events_.data())[x.it.index];
      e.at.store(x.due, std::memory_order_relaxed);
      e.completed.store(x.it.target, std::memory_order_release);
      e.completed.notify_all();
    } else if (timeline_) {
      // From when this stream was on the copy to its due time on the link; the burst's last copy
      // to when the burst's bytes became visible.
      auto const from = std::max(at(x.start), picked);
      bool const last = std::none_of(b.begin() + static_cast<std::ptrdiff_t>(k) + 1, b.end(), [](auto const& y) { return y.it.kind == item::copy; });
      spans_[s].push_back({x.it.index, role, w_->us(from), w_->us(last ? done : std::max(from, at(x.due)))});
    }
  }
  ready_ticks = tick(std::max(end, ready));
}

TIDE_INLINE void host_backend::work(std::size_t s) {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1UL);  // paced copies wake at their deadline, not up to 50 us late
#endif
  auto& q = w_->queues[s];
  using clock = workers::clock;
  auto const role = static_cast<stream_role>(s);
  // When this stream's next item could nominally start: after the previous item (a paced copy
  // counts as done at its due time, not when this thread woke up) and after any blocking.
  auto ready_at = clock::now();
  // Paced copies: what a memcpy takes per byte and how late a sleep ends, recent averages.
  double memcpy_ns_per_byte = 0, wake_late_ns = 0;
  for (;;) {
    item it;
    {
      std::unique_lock lock(q.mutex);
      q.busy = false;
      if (q.head == q.tail) {
        q.idle.notify_all();
        q.ready.wait(lock, [&] { return q.stop || q.head != q.tail; });
      }
      if (q.head == q.tail) return;
      it = q.items[q.head++ % q.items.size()];
      q.busy = true;
    }
    // An item that found this worker idle is nominally ready when it was enqueued, not when
    // the worker woke up to it.
    ready_at = std::max(ready_at, clock::time_point(clock::duration(it.queued)));
    switch (it.kind) {
      case item::run: {
        auto const b = w_->now_us();
        it.fn();
        ready_at = clock::now();
        if (timeline_) spans_[s].push_back({it.index, role, b, w_->now_us()});
        break;
      }
      case item::copy: {
        auto const picked = clock::now();
        if (it.pace->time_us(it.bytes) > 0) {
          auto ready = static_cast<std::int64_t>(ready_at.time_since_epoch().count());
          paced_burst(s, it, static_cast<std::int64_t>(picked.time_since_epoch().count()), ready, memcpy_ns_per_byte, wake_late_ns);
          ready_at = clock::time_point(clock::duration(ready));
        } else {
          std::memcpy(it.dst, it.src, it.bytes);
          ready_at = clock::now();
          if (timeline_) spans_[s].push_back({it.index, role, w_->us(picked), w_->us(ready_at)});
        }
        break;
      }
      case item::record: {
        auto& e = (it.join ? joins_.data() : events_.data())[it.index];
        e.at.store(ready_at.time_since_epoch().count(), std::memory_order_relaxed);
        e.completed.store(it.target, std::memory_order_release);
        e.completed.notify_all();
        break;
      }
      case item::wait: {
        auto& e = (it.join ? joins_.data() : events_.data())[it.index];
        auto v = e.completed.load(std::memory_order_acquire);
        if (!reached(v, it.target)) {
          auto const b = w_->now_us();
          while (!reached(v, it.target)) {
            e.completed.wait(v, std::memory_order_acquire);
            v = e.completed.load(std::memory_order_acquire);
          }
          if (timeline_ && !it.join) wait_spans_[s].push_back({role, it.index, b, w_->now_us()});
        }
        // Nominally this stream goes on when the record was reached, as a GPU's would: how late
        // this worker woke (a futex on a busy core) does not delay a paced copy behind the wait.
        // `at` is of the latest record reached: never earlier than the one waited for, as an
        // event's records complete in the order they were made (record() refuses any other).
        ready_at = std::max(ready_at, clock::time_point(clock::duration(e.at.load(std::memory_order_relaxed))));
        break;
      }
      case item::store:
      case item::load: {
        auto const b = w_->now_us();
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
        if (timeline_) spans_[s].push_back({it.index, role, b, w_->now_us()});
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

}  // namespace tide
