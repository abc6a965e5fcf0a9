#pragma once
// A call that may never return, bounded: for driver entry points that block forever where their
// kernel module is missing (cuFileDriverOpen without nvidia-fs, seen spinning for 9 minutes).

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace tide::detail {

//! Runs `f` on a thread of its own and waits at most `limit`: its result (an exception it threw
//! is rethrown here), or nothing when it did not return in time. The thread is then left to end on
//! its own; it owns its task, so nothing of the caller's is touched after this returns.
template <class F>
[[nodiscard]] std::optional<std::invoke_result_t<F>> call_within(std::chrono::milliseconds limit, F f) {
  using result = std::invoke_result_t<F>;
  static_assert(!std::is_void_v<result>, "call_within: the call must return its status");
  auto task = std::make_shared<std::packaged_task<result()>>(std::move(f));
  auto done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (done.wait_for(limit) != std::future_status::ready) return std::nullopt;
  return done.get();
}

}  // namespace tide::detail
