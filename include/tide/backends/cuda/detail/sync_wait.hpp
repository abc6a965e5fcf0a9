#pragma once
//! \file
//! How `cuda_backend::synchronize` waits for its streams: its deadline and its pauses between
//! polls. Host-only arithmetic, tested without a GPU (tests/cuda/cuda_host_test.cpp).

#include <algorithm>
#include <chrono>
#include <thread>

namespace tide::detail {

//! `now + factor * timeout`, or the clock's end when that would overflow
//! (`std::chrono::milliseconds::max()` is "no timeout", not a deadline in the past).
template <class Clock>
[[nodiscard]] constexpr typename Clock::time_point deadline_after(typename Clock::time_point now,
                                                                  std::chrono::milliseconds timeout, int factor = 1) noexcept {
  using duration = typename Clock::duration;
  auto const room = Clock::time_point::max() - now;  // what can still be added
  if (timeout.count() <= 0) return now;
  auto const limit = std::chrono::duration_cast<std::chrono::milliseconds>(room) / factor;
  if (timeout >= limit) return Clock::time_point::max();
  return now + std::chrono::duration_cast<duration>(timeout) * factor;
}

//! The pause after a poll that found a stream busy, by the time waited so far: none (a yield)
//! for the first 2 ms, so that the copies and step tails that make up most waits are seen done
//! within microseconds; then a sleep of 1/64 of the time waited, at most 50 us, so that a longer
//! wait ends at most about 1.6% late and a hung step does not hold a core.
[[nodiscard]] constexpr std::chrono::microseconds sync_pause(std::chrono::microseconds waited) noexcept {
  using std::chrono::microseconds;
  if (waited < std::chrono::milliseconds(2)) return microseconds(0);
  return std::clamp(waited / 64, microseconds(1), microseconds(50));
}

//! Pauses after a poll that found the work unfinished, `waited` into the wait (`sync_pause`).
inline void pause_while_waiting(std::chrono::microseconds waited) {
  auto const pause = sync_pause(waited);
  if (pause.count() == 0) std::this_thread::yield();
  else std::this_thread::sleep_for(pause);
}

//! Watchers (an NCCL communicator's error query takes a lock) are polled at most this often
//! while the streams are busy, and once more on a timeout.
inline constexpr std::chrono::milliseconds watch_interval{1};

}  // namespace tide::detail
