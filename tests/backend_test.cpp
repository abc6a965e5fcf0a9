// The host backend's own behaviour: arenas (the budget bounds what is held at once, arenas nobody
// holds are released, an allocation the machine refuses is out_of_memory) and paced copies (data
// becomes visible only when the copy completes on the link's schedule).
#include <gtest/gtest.h>

#include <tide/executor/arena_pool.hpp>
#include <tide/tide.hpp>

#include "workload.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// The huge-allocation test needs a refused allocation to come back as nullptr under the
// sanitizers' allocators too (by default they abort instead); options given in the environment
// still apply on top of these.
extern "C" char const* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" char const* __tsan_default_options() { return "allocator_may_return_null=1"; }

using namespace tide;

namespace {

bool contains(std::string const& s, std::string const& what) { return s.find(what) != std::string::npos; }

constexpr std::size_t mib = std::size_t{1} << 20;

//! One layer, one kept slot of `bytes`: a device arena of about `bytes`.
schedule one_slot(std::size_t bytes) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"l", {{"x", bytes}}}, 1);
  return build_schedule(st, strategy{});
}

//! The synthetic workload's digests on a fresh, unlimited, unpaced backend.
std::vector<std::uint64_t> reference(schedule_view s, int steps = 2) {
  host_backend b;
  return workload::run(b, s, steps);
}

}  // namespace

// The schedule's alignments reach the arenas (they were fixed at 256 and 4096 before): a slot's
// offset is aligned relative to the arena's start, so the start must be aligned as much.
TEST(HostArenas, ScheduleAlignmentsReachTheArenas) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"l", {{"x", 1000}, {"y", 3000}}}, 3);
  buffer_spec b;
  b.device_alignment = std::size_t{1} << 16;
  b.host_alignment = std::size_t{1} << 15;
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"y"}}}, .buffers = b});
  host_backend be;
  executor ex(be, s);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ex.memory().device) % b.device_alignment, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ex.memory().host) % b.host_alignment, 0u);
  for (auto const& sl : s.slots) EXPECT_EQ(sl.forward_offset % b.device_alignment, 0u);
  EXPECT_EQ(workload::run(be, s), reference(s));
}

TEST(HostArenas, ExecutorsInTurnHoldOneArenaAtATime) {
  host_backend_options o;
  o.device_budget = 10 * mib;
  host_backend b(o);
  std::size_t last = 0;
  for (std::size_t i = 1; i <= 10; ++i) {
    auto const s = one_slot(i * mib - 64 * 1024);  // growing; the largest fits the budget
    ASSERT_LE(s.arena.device_bytes, o.device_budget);
    // Each executor is destroyed (inside run) before the next is set up.
    EXPECT_EQ(workload::run(b, s), reference(s)) << "executor " << i;
    // The arena of the executor gone is released by the next setup, which needed more.
    EXPECT_EQ(b.device_held_bytes(), s.arena.device_bytes) << "executor " << i;
    last = s.arena.device_bytes;
  }
  EXPECT_LE(b.device_held_bytes(), o.device_budget);
  EXPECT_EQ(b.device_held_bytes(), last);  // one block: the current one, kept for reuse
  EXPECT_EQ(b.device_peak_bytes(), last);
}

TEST(HostArenas, CapacityBoundsTheArenasOfLiveExecutors) {
  host_backend_options o;
  o.device_budget = 10 * mib;
  host_backend b(o);
  auto const six = one_slot(6 * mib), seven = one_slot(7 * mib);
  std::optional<executor<host_backend>> first;
  first.emplace(b, six);
  try {
    executor<host_backend> second(b, seven);  // needs a larger arena while the first holds its own
    FAIL() << "two live executors hold more than the budget";
  } catch (out_of_memory const& e) {
    EXPECT_EQ(e.requested, six.arena.device_bytes + seven.arena.device_bytes);
    EXPECT_EQ(e.budget, o.device_budget);
    EXPECT_TRUE(contains(e.what(), "tide: host backend device arena")) << e.what();
    EXPECT_TRUE(contains(e.what(), "live executors still hold")) << e.what();
  }
  EXPECT_EQ(b.device_held_bytes(), six.arena.device_bytes);
  // The surviving executor still steps correctly.
  workload::synthetic w(1);
  for (int i = 0; i < 2; ++i, ++w.step)
    first->step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
  EXPECT_EQ(w.digest, reference(six));
  // Once it is gone its arena is not in use: the larger one fits.
  first.reset();
  EXPECT_EQ(workload::run(b, seven), reference(seven));
  EXPECT_EQ(b.device_held_bytes(), seven.arena.device_bytes);
}

TEST(HostArenas, RetiredArenaIsFreedWithItsLastExecutor) {
  host_backend b;
  auto const three = one_slot(3 * mib), five = one_slot(5 * mib);
  std::optional<executor<host_backend>> a, c;
  a.emplace(b, three);
  {
    executor<host_backend> also_three(b, three);  // fits the current arena: shares it
    EXPECT_EQ(also_three.memory().device, a->memory().device);
  }
  EXPECT_EQ(b.device_held_bytes(), three.arena.device_bytes);
  c.emplace(b, five);  // a larger arena; the first is retired, still held by `a`
  EXPECT_EQ(b.device_held_bytes(), three.arena.device_bytes + five.arena.device_bytes);
  EXPECT_NE(a->memory().device, c->memory().device);
  a.reset();  // its last holder: freed now
  EXPECT_EQ(b.device_held_bytes(), five.arena.device_bytes);
  c.reset();  // the current arena stays for the next setup
  EXPECT_EQ(b.device_held_bytes(), five.arena.device_bytes);
  EXPECT_EQ(workload::run(b, three), reference(three));
  EXPECT_EQ(b.device_held_bytes(), five.arena.device_bytes);
}

TEST(HostArenas, AllocationTheMachineRefusesIsOutOfMemory) {
  host_backend b;  // no budget: the machine itself refuses
  constexpr std::size_t huge = std::size_t{1} << 62;
  for (bool device : {true, false}) {
    try {
      b.setup({.ops = 1, .device_bytes = device ? huge : 64, .host_bytes = device ? 64 : huge});
      FAIL() << "expected out_of_memory";
    } catch (out_of_memory const& e) {
      EXPECT_EQ(e.requested, huge);
      EXPECT_TRUE(contains(e.what(), device ? "tide: host backend device arena" : "tide: host backend pinned host arena"))
          << e.what();
      EXPECT_TRUE(contains(e.what(), "needs " + std::to_string(huge) + " bytes")) << e.what();
    }
  }
  // The backend still works.
  auto const s = one_slot(4096);
  EXPECT_EQ(workload::run(b, s), reference(s));
}

namespace {
//! Counts live blocks; refuses requests above 1000 bytes (nullptr), throws `bad_alloc` above 2000.
struct counting_allocator {
  int* live;
  std::byte* allocate(std::size_t n, std::size_t) {
    if (n > 2000) throw std::bad_alloc();
    if (n > 1000) return nullptr;
    ++*live;
    return new std::byte[n];
  }
  void deallocate(std::byte* p, std::size_t, std::size_t) noexcept {
    --*live;
    delete[] p;
  }
};
}  // namespace

TEST(ArenaPool, CapacityCountsOnlyBlocksInUse) {
  int live = 0;
  arena_pool<counting_allocator> pool("test arena", 100, counting_allocator{&live});
  std::shared_ptr<void const> held;
  {
    auto a = pool.reserve(60);
    held = a.lease;
    EXPECT_EQ(pool.reserve(40).data, a.data);  // fits: the same block
  }
  EXPECT_EQ(live, 1);
  try {
    pool.reserve(70);  // 60 still leased + 70
    FAIL() << "expected out_of_memory";
  } catch (out_of_memory const& e) {
    EXPECT_EQ(e.requested, 130u);
    EXPECT_EQ(e.budget, 100u);
    EXPECT_TRUE(contains(e.what(), "test arena (70 bytes, beside 60 bytes")) << e.what();
  }
  EXPECT_EQ(pool.held_bytes(), 60u);
  held.reset();
  auto b = pool.reserve(70);  // nobody holds the 60 any more: released first
  EXPECT_EQ(live, 1);
  EXPECT_EQ(pool.held_bytes(), 70u);
  EXPECT_THROW(pool.reserve(80), out_of_memory);  // b holds the 70: 150 > 100
  b = {};
  EXPECT_EQ(pool.reserve(80).data == nullptr, false);
  EXPECT_EQ(pool.held_bytes(), 80u);
  EXPECT_EQ(live, 1);
}

TEST(ArenaPool, RetiredBlocksLiveWithTheirLeases) {
  int live = 0;
  std::shared_ptr<void const> outlives;
  {
    arena_pool<counting_allocator> pool("test arena", 1000, counting_allocator{&live});
    auto a = pool.reserve(100);
    auto b = pool.reserve(200);  // a retired, still leased
    EXPECT_EQ(live, 2);
    EXPECT_EQ(pool.held_bytes(), 300u);
    a = {};  // its last lease: freed now
    EXPECT_EQ(live, 1);
    EXPECT_EQ(pool.held_bytes(), 200u);
    outlives = b.lease;
    EXPECT_EQ(pool.size(), 200u);
    EXPECT_EQ(pool.peak(), 200u);
  }
  EXPECT_EQ(live, 0);  // the pool frees what leases still hold when it goes
  outlives.reset();    // and a lease released later does nothing
  EXPECT_EQ(live, 0);
}

TEST(ArenaPool, RefusedAllocationIsOutOfMemoryAndLeavesThePoolUsable) {
  int live = 0;
  arena_pool<counting_allocator> pool("test arena", std::size_t(-1), counting_allocator{&live});
  auto a = pool.reserve(100);
  for (std::size_t n : {1500u, 2500u}) {  // nullptr, then std::bad_alloc
    try {
      pool.reserve(n);
      FAIL() << "expected out_of_memory";
    } catch (out_of_memory const& e) {
      EXPECT_EQ(e.requested, n);
      EXPECT_TRUE(contains(e.what(), "test arena (the allocation failed")) << e.what();
    }
  }
  EXPECT_EQ(pool.reserve(50).data, a.data);  // the current block is still there
  EXPECT_EQ(pool.held_bytes(), 100u);
  EXPECT_EQ(live, 1);
}

// ---- events ------------------------------------------------------------------------------------

// An event's records complete in the order they were made only when each stream that records it
// waited for the record before: an unordered record on another stream in the same step is refused
// by name (a wait for it could see the earlier record complete last and wait forever). Records on
// one stream, on a stream that waited, and on any stream after a drain are taken, and complete.
TEST(HostEvents, UnorderedRecordOnAnotherStreamIsRefused) {
  host_backend b;
  (void)b.setup({.ops = 16, .events = 2});
  std::atomic<int> ran{0};
  auto const count = [](void* d, std::uint32_t) noexcept { static_cast<std::atomic<int>*>(d)->fetch_add(1); };
  b.begin_step({});
  b.record(stream_role::compute, 1);
  b.record(stream_role::compute, 1);  // again on the same stream: in order
  b.wait(stream_role::d2h, 1);
  b.record(stream_role::d2h, 1);  // after a wait for the last record: in order
  try {
    b.record(stream_role::h2d, 1);  // h2d waited for nothing
    ADD_FAILURE() << "an unordered record of event 1 on h2d was taken";
  } catch (error const& e) {
    std::string const what = e.what();
    EXPECT_NE(what.find("event 1 recorded on stream h2d after its record on stream d2h in the same step, which h2d has "
                        "not waited for"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("wait for the event on h2d first, or record another event there"), std::string::npos) << what;
  }
  b.wait(stream_role::compute, 1);  // for d2h's record, the latest: it completes
  b.host_task(stream_role::compute, {count, &ran, 0});
  b.record(stream_role::compute, 1);  // compute waited for d2h's record
  b.end_step();
  b.wait_step();  // nothing was enqueued for the refused record: the step drains
  EXPECT_EQ(ran.load(), 1);
  b.begin_step({});
  b.record(stream_role::h2d, 1);  // in the next step: any stream
  b.wait(stream_role::compute, 1);
  b.host_task(stream_role::compute, {count, &ran, 0});
  b.end_step();
  b.wait_step();
  EXPECT_EQ(ran.load(), 2);
}

// ---- paced copies -------------------------------------------------------------------------------

namespace {
using blk = layer<"l", slot<"x", 1 << 16>>;
using three = stack<independent_layers, repeat<blk, 3>>;
constexpr double prefetch_s = 0.05;  // each paced prefetch takes 50 ms (latency) + 64 KiB at 1 GB/s

host_backend_options paced() {
  host_backend_options o;
  o.h2d = {.bytes_per_second = 1e9, .latency_us = prefetch_s * 1e6};
  return o;
}

//! Layer 1's backward is slow, so that layer 0's (next on the compute stream) runs well after its
//! prefetch started and well before it completes.
std::vector<std::uint64_t> run_slow_middle(host_backend& b, schedule_view s, executor_options o) {
  executor exec(b, s, o);
  workload::synthetic w(s.layer_count());
  exec.step([&](auto const& c) { w.forward(c); },
            [&](auto const& c) {
              if (c.layer == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
              w.backward(c);
            });
  return w.digest;
}
}  // namespace

TEST(HostPacedCopies, ProgramAsBuiltIsBitwiseEqualWithTruthfulSpans) {
  auto const s = build_schedule(three::spec(), {.policy = policy<offload<>>::spec(), .pipeline = {.prefetch_distance = 1}});
  auto const keep = build_schedule(three::spec(), {.policy = keep_all::spec()});
  auto const want = reference(keep, 1);
  host_backend b(paced());
  timeline t;
  EXPECT_EQ(run_slow_middle(b, s, {.timeline = &t}), want);
  std::vector<op_span> h2d;
  for (auto const& sp : t.ops)
    if (s.ops[sp.op].kind == op_kind::prefetch) h2d.push_back(sp);
  ASSERT_EQ(h2d.size(), 3u);
  std::sort(h2d.begin(), h2d.end(), [](auto const& x, auto const& y) { return x.begin_us < y.begin_us; });
  // A span starts when its worker picked the copy up: on a loaded machine that may be after the
  // copy's nominal start on the link, which shortens the span by the lateness (8 ms was seen with
  // the suite running beside it). A span of the memcpy alone would be microseconds; the link's
  // pace shows between consecutive copies, which the link serializes.
  for (std::size_t i = 0; i < h2d.size(); ++i) {
    EXPECT_GE(h2d[i].end_us - h2d[i].begin_us, 0.5 * prefetch_s * 1e6) << i;
    if (i > 0) {
      EXPECT_GE(h2d[i].begin_us, h2d[i - 1].end_us) << i;  // one link: one copy at a time
      EXPECT_GE(h2d[i].end_us - h2d[i - 1].end_us, 0.75 * prefetch_s * 1e6) << i;  // less a late wake-up
    }
  }
}

// A copy completes on the link's schedule, never before: the paced memcpy starts early to make
// up for this worker's memcpy and wake-up times, and must still not complete early. Copies back to
// back on one stream, each followed on that stream by a host task that stamps the time: stamp i
// is after copy i completed, which is at least i + 1 link times after the first was enqueued.
TEST(HostPacedCopies, CopiesCompleteNoEarlierThanTheLinkAllows) {
  using clock = std::chrono::steady_clock;
  constexpr std::uint32_t copies = 16;
  constexpr std::size_t bytes = 256 << 10;
  host_backend_options o;
  o.h2d = {.bytes_per_second = 1e9, .latency_us = 2000};  // 2.26 ms a copy, of which 0.26 ms moves bytes
  host_backend b(o);
  auto const a = b.setup({.ops = copies, .events = 1, .device_bytes = bytes, .host_bytes = bytes});
  op const prefetch{.kind = op_kind::prefetch, .stream = stream_role::h2d};
  std::array<clock::time_point, copies> stamps{};
  auto const stamp = [](void* d, std::uint32_t i) noexcept { static_cast<clock::time_point*>(d)[i] = clock::now(); };
  for (int step = 0; step < 2; ++step) {  // the second after the worker has learnt its memcpy and wake-up times
    auto const t0 = clock::now();
    b.begin_step({});
    for (std::uint32_t i = 0; i < copies; ++i) {
      b.copy(stream_role::h2d, i, prefetch, a.device, a.host, bytes);
      b.host_task(stream_role::h2d, {stamp, stamps.data(), i});
    }
    b.end_step();
    b.wait_step();
    for (std::uint32_t i = 0; i < copies; ++i) {
      // Less 1 ns a copy: each copy's time is truncated to the clock's ticks.
      auto const link = std::chrono::duration<double, std::micro>((i + 1) * (o.h2d.time_us(bytes) - 1e-3));
      EXPECT_GE(stamps[i] - t0, link) << "step " << step << ", copy " << i << " completed "
                                      << std::chrono::duration<double, std::micro>(link - (stamps[i] - t0)).count()
                                      << " us early";
    }
  }
}

// Small copies queued back to back on one link run as a burst, with one wake-up (host_backend's
// `burst_us`): each copy's event still completes no earlier than the link allows, every copy's
// bytes arrive, and a wait that has not passed between two copies ends the burst (the copy after
// it starts no earlier than the record it waits for).
TEST(HostPacedCopies, BurstsOfSmallCopiesCompleteNoEarlierThanTheLinkAllows) {
  using clock = std::chrono::steady_clock;
  constexpr std::uint32_t copies = 24;
  constexpr std::size_t bytes = 4 << 10;
  static constexpr auto hold = std::chrono::milliseconds(20);  // the comm stream's task before the gate
  host_backend_options o;
  o.h2d = {.bytes_per_second = 1e8, .latency_us = 0};  // 41 us a copy: about six to a burst
  host_backend b(o);
  std::uint32_t const gate = copies;  // the event the second half of the copies waits for
  auto const a = b.setup({.ops = 4 * copies, .events = copies + 1, .device_bytes = copies * bytes, .host_bytes = copies * bytes});
  op const prefetch{.kind = op_kind::prefetch, .stream = stream_role::h2d};
  std::array<clock::time_point, copies> stamps{};
  auto const stamp = [](void* d, std::uint32_t i) noexcept { static_cast<clock::time_point*>(d)[i] = clock::now(); };
  auto const sleep = [](void*, std::uint32_t) noexcept { std::this_thread::sleep_for(hold); };
  for (int step = 0; step < 2; ++step) {
    auto* const host = reinterpret_cast<unsigned char*>(a.host);
    auto* const device = reinterpret_cast<unsigned char*>(a.device);
    for (std::uint32_t i = 0; i < copies; ++i) std::memset(host + i * bytes, static_cast<int>(i + 1 + step), bytes);
    std::memset(device, 0, copies * bytes);
    auto const t0 = clock::now();
    b.begin_step({});
    b.host_task(stream_role::comm, {sleep, nullptr, 0});
    b.record(stream_role::comm, gate);
    for (std::uint32_t i = 0; i < copies; ++i) {
      if (i == copies / 2) b.wait(stream_role::h2d, gate);
      b.copy(stream_role::h2d, i, prefetch, device + i * bytes, host + i * bytes, bytes);
      b.record(stream_role::h2d, i);
      b.wait(stream_role::compute, i);
      b.host_task(stream_role::compute, {stamp, stamps.data(), i});
    }
    b.end_step();
    b.wait_step();
    auto const link_us = o.h2d.time_us(bytes) - 1e-3;  // less 1 ns a copy: times are truncated to the clock's ticks
    for (std::uint32_t i = 0; i < copies; ++i) {
      auto const after = i < copies / 2 ? std::chrono::duration<double, std::micro>((i + 1) * link_us)
                                        : std::chrono::duration<double, std::micro>(hold) +
                                              std::chrono::duration<double, std::micro>((i + 1 - copies / 2) * link_us);
      EXPECT_GE(stamps[i] - t0, after) << "step " << step << ", copy " << i << " completed "
                                       << std::chrono::duration<double, std::micro>(after - (stamps[i] - t0)).count() << " us early";
      for (std::size_t k = 0; k < bytes; k += 512) ASSERT_EQ(device[i * bytes + k], static_cast<unsigned char>(i + 1 + step)) << i;
    }
  }
}

// A link the pacing cannot honour is refused by name: a NaN or negative bandwidth would read as
// unpaced, and a copy past max_copy_us would overflow the clock arithmetic (undefined behaviour).
TEST(HostPacedCopies, RefusesALinkItCannotPace) {
  auto const refused = [](host_backend_options o, std::string const& want) {
    try {
      host_backend b(o);
      ADD_FAILURE() << "accepted; wanted: " << want;
    } catch (error const& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  double const nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -1.0}) {
    host_backend_options o;
    o.d2h.bytes_per_second = bad;
    refused(o, "host_backend_options::d2h.bytes_per_second is ");
  }
  for (double bad : {nan, inf, -1.0, 2e12}) {
    host_backend_options o;
    o.h2d.latency_us = bad;
    refused(o, "host_backend_options::h2d.latency_us is ");
  }
  host_backend_options edge;  // the limits themselves are accepted
  edge.d2h = {.bytes_per_second = 0, .latency_us = host_backend::max_copy_us};
  EXPECT_NO_THROW(host_backend{edge});
}

// A copy the link would take more than max_copy_us over fails its step with an error naming the
// copy and the link, before anything is enqueued for it; nothing hangs, and the backend steps on.
TEST(HostPacedCopies, RefusesACopyLongerThanTheClockAllows) {
  auto const s = build_schedule(three::spec(), {.policy = policy<offload<>>::spec()});
  host_backend_options o;
  o.d2h = {.bytes_per_second = 1e-3};  // 64 KiB in about 2 years
  host_backend b(o);
  {
    executor exec(b, s);
    workload::synthetic w(s.layer_count());
    try {
      exec.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
      ADD_FAILURE() << "a copy of 2 years was enqueued";
    } catch (error const& e) {
      std::string const what = e.what();
      EXPECT_NE(what.find("a paced offload of 65536 bytes at 0.001 bytes per second"), std::string::npos) << what;
      EXPECT_NE(what.find("host_backend_options::d2h"), std::string::npos) << what;
    }
  }
  // The refused step was drained: the same backend runs a schedule without offloads.
  auto const keep = build_schedule(three::spec(), {.policy = keep_all::spec()});
  executor exec(b, keep);
  workload::synthetic w(keep.layer_count());
  exec.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
  EXPECT_EQ(w.digest, reference(keep, 1));
}

TEST(HostPacedCopies, MissingWaitReadsStaleBytesOnAPacedLink) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the program this test runs lacks a wait on purpose: ThreadSanitizer reports its race";
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the program this test runs lacks a wait on purpose: ThreadSanitizer reports its race";
#endif
#endif
  auto const s = build_schedule(three::spec(), {.policy = policy<offload<>>::spec(), .pipeline = {.prefetch_distance = 1}});
  auto const keep = build_schedule(three::spec(), {.policy = keep_all::spec()});
  auto const want = reference(keep, 1);
  // Drop the wait of layer 0's backward on its prefetch: on a paced link the backward must read
  // what the staging buffer held before (layer 2's bytes), not data that arrived early.
  schedule broken = s;
  int dropped = 0;
  for (auto& o : broken.ops) {
    if (o.kind != op_kind::backward || o.layer != 0) continue;
    auto const first = broken.waits.begin() + o.wait_begin, last = first + o.wait_count;
    auto const kept = std::remove_if(first, last, [&](std::uint32_t w) {
      return broken.ops[w].kind == op_kind::prefetch && broken.ops[w].layer == 0;
    });
    dropped += static_cast<int>(last - kept);
    o.wait_count -= static_cast<std::uint32_t>(last - kept);
  }
  ASSERT_EQ(dropped, 1);
  host_backend b(paced());
  auto const got = run_slow_middle(b, broken, {.debug_checks = false, .check_schedule = false});
  EXPECT_NE(got, want);
  EXPECT_NE(got[0], want[0]);  // layer 0 read stale bytes
  EXPECT_EQ(got[1], want[1]);
  EXPECT_EQ(got[2], want[2]);
}
