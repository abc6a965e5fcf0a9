// The CUDA backend's host-side logic, tested without a GPU (g++, no CUDA call that needs a
// driver): how a device probe is judged, the order of a user resource's checks, the
// synchronization's deadline and pauses (issue 27, items 1, 3, 7 and 12).
#include <gtest/gtest.h>

#include <tide/backends/cuda/detail/call_within.hpp>
#include <tide/backends/cuda/detail/sync_wait.hpp>
#include <tide/backends/cuda/device_probe.hpp>
#include <tide/backends/cuda/memory.hpp>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <string>

using namespace std::chrono_literals;

// A driver older than the runtime is a failure, never "no GPU"; no driver at all (a machine
// without a GPU, as this project's CI) and no device are skips.
TEST(DeviceProbe, OnlyNoDeviceOrNoDriverIsASkip) {
  using status = tide::device_probe::status;
  EXPECT_EQ(tide::classify_device_probe(cudaSuccess, 1, 13000), status::usable);
  EXPECT_EQ(tide::classify_device_probe(cudaSuccess, 0, 13000), status::no_device);
  EXPECT_EQ(tide::classify_device_probe(cudaErrorNoDevice, 0, 13000), status::no_device);
  EXPECT_EQ(tide::classify_device_probe(cudaErrorInsufficientDriver, 0, 0), status::no_device);
  EXPECT_EQ(tide::classify_device_probe(cudaErrorInsufficientDriver, 0, 12040), status::unusable);
  EXPECT_EQ(tide::classify_device_probe(cudaErrorInitializationError, 0, 13000), status::unusable);
  EXPECT_EQ(tide::classify_device_probe(cudaErrorSystemDriverMismatch, 0, 13000), status::unusable);
  tide::device_probe p{.state = status::unusable, .error = cudaErrorInsufficientDriver, .driver_version = 12040,
                       .runtime_version = 13000};
  auto const d = p.describe();
  EXPECT_NE(d.find("cudaErrorInsufficientDriver"), std::string::npos) << d;
  EXPECT_NE(d.find("driver 12.4, runtime 13.0"), std::string::npos) << d;
}

// This machine's probe, whatever it has: a GPU is usable, no GPU a skip; never a crash.
TEST(DeviceProbe, ProbesThisMachine) {
  auto const p = tide::probe_devices();
  EXPECT_EQ(p.state, tide::classify_device_probe(p.error, p.device_count, p.driver_version)) << p.describe();
  EXPECT_NE(p.state, tide::device_probe::status::unusable) << p.describe();  // a GPU the runtime cannot use
  if (p.state == tide::device_probe::status::usable) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the probe leaves no error behind
  }
}

namespace {
// Pageable memory at an offset past a page, as a 147 KB malloc block is (page + 16).
struct pageable_resource {
  void* allocate(std::size_t bytes, std::size_t) {
    auto* base = static_cast<std::byte*>(std::malloc(bytes + 4096 + 16));
    auto* p = base + 16;
    if (reinterpret_cast<std::uintptr_t>(p) % 4096 == 0) p += 16;
    blocks.push_back({base, p});
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) noexcept {
    for (auto& b : blocks)
      if (b.second == p) std::free(std::exchange(b.first, nullptr)), ++freed;
  }
  std::vector<std::pair<std::byte*, std::byte*>> blocks;
  int freed = 0;
};
}  // namespace

// Item 1: a pageable "pinned" resource is reported as pageable memory, not as misaligned: the
// memory kind is checked before the alignment, and the refused block is given back.
TEST(UserResource, TheMemoryKindIsJudgedBeforeTheAlignment) {
  pageable_resource pageable;
  auto const pageable_kind = [](void const*) { throw tide::error("pageable host memory (the kind check)"); };
  tide::detail::memory_block arena("test arena", 1 << 30, {tide::resource_ref(pageable), 1, pageable_kind});
  try {
    (void)arena.reserve(150000, 4096);
    FAIL() << "the pageable block was accepted";
  } catch (tide::error const& e) {
    EXPECT_NE(std::string(e.what()).find("pageable host memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pageable.freed, 1);
  // Without a kind check (tide's own resources) the misalignment is still refused, by name.
  tide::detail::memory_block unchecked("test arena", 1 << 30, {tide::resource_ref(pageable), 1, {}});
  try {
    (void)unchecked.reserve(150000, 4096);
    FAIL() << "the misaligned block was accepted";
  } catch (tide::error const& e) {
    EXPECT_NE(std::string(e.what()).find("aligned to less than the schedule's 4096-byte alignment"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("tide::host_alignment<N>"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pageable.freed, 2);
}

// Item 7: "no timeout" (milliseconds::max()) and huge timeouts saturate instead of wrapping into
// the past, which timed out at once and aborted a healthy communicator.
TEST(Synchronize, DeadlinesSaturate) {
  using clock = std::chrono::steady_clock;
  auto const now = clock::now();
  EXPECT_EQ(tide::detail::deadline_after<clock>(now, std::chrono::milliseconds::max()), clock::time_point::max());
  EXPECT_EQ(tide::detail::deadline_after<clock>(now, std::chrono::milliseconds::max(), 2), clock::time_point::max());
  EXPECT_EQ(tide::detail::deadline_after<clock>(now, std::chrono::hours(24 * 365 * 1000)), clock::time_point::max());
  EXPECT_EQ(tide::detail::deadline_after<clock>(now, 5min), now + 5min);
  EXPECT_EQ(tide::detail::deadline_after<clock>(now, 5min, 2), now + 10min);
  EXPECT_GT(tide::detail::deadline_after<clock>(now, 5min), now);
}

// Item 12: waits up to 2 ms only yield (a copy of 16-64 MiB is seen done within microseconds,
// not 50-100 us late); longer ones sleep at most 1/64 of the time waited, and at most 50 us.
TEST(Synchronize, PausesGrowWithTheWaitAndStayShort) {
  using tide::detail::sync_pause;
  EXPECT_EQ(sync_pause(0us), 0us);
  EXPECT_EQ(sync_pause(1999us), 0us);
  EXPECT_EQ(sync_pause(2ms), 31us);
  EXPECT_EQ(sync_pause(3200us), 50us);
  EXPECT_EQ(sync_pause(10s), 50us);
  for (auto w = 2000us; w < 10s; w += w / 3) EXPECT_LE(sync_pause(w) * 64, w) << w.count();
}

// The bounded call behind the cuFile driver's open: a call that returns in time gives its result
// or rethrows its exception; one that does not is abandoned at the limit (a driver that never
// answers costs the limit, not the rest of the run).
TEST(CallWithin, ReturnsInTimeRethrowsAndAbandonsAtTheLimit) {
  using namespace std::chrono_literals;
  EXPECT_EQ(tide::detail::call_within(5s, [] { return 42; }), 42);
  EXPECT_THROW((void)tide::detail::call_within(5s, []() -> int { throw std::runtime_error("driver said no"); }),
               std::runtime_error);
  auto const t0 = std::chrono::steady_clock::now();
  auto const never = tide::detail::call_within(100ms, [] {
    std::this_thread::sleep_for(2s);  // stands in for a call that does not come back
    return 1;
  });
  auto const waited = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(never.has_value());
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 1500ms);
}
