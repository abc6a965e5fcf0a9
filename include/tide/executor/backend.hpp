#pragma once
//! \file
//! The backend concept: what the generic executor needs from a place to run a schedule.
//!
//! It is shaped after CUDA streams and events, so that the CUDA backend is a direct mapping:
//! five streams addressed by role, events addressed by index (recorded after an op, waited on by
//! another stream), user work enqueued on a stream, asynchronous copies, two arenas that stay at
//! stable addresses across steps, and one synchronization per step, apart from the enqueueing. The host backend runs the
//! same calls on worker threads with real data; the sim backend in virtual time.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <tide/core/op.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/vocabulary.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! Work a backend runs on a stream: a plain function pointer and its argument, so enqueueing
//! allocates nothing. `fn` must not throw; the executor catches user exceptions itself.
struct task {
  //! The work, called as `fn(self, arg)`.
  void (*fn)(void* self, std::uint32_t arg) noexcept = nullptr;
  void* self = nullptr;   //!< the object `fn` acts on (the executor)
  std::uint32_t arg = 0;  //!< `fn`'s argument (the op's index)
  //! Runs the work: `fn(self, arg)`.
  void operator()() const noexcept { fn(self, arg); }
};

//! The two arenas a backend hands the executor. Addresses are stable across steps.
struct arenas {
  std::byte* device = nullptr;  //!< the device arena's start: the schedule's device offsets are relative to it
  std::byte* host = nullptr;    //!< the host arena's start: the schedule's host offsets are relative to it
  //! Keeps the blocks `device` and `host` point into alive while held (the executor holds it
  //! for its lifetime); empty where nothing needs keeping (the sim). See arena_pool.hpp.
  std::shared_ptr<void const> lease = {};
};

//! What the executor hands a backend once, before the first step: the schedule it will run
//! (the sim costs recomputes per rematted slot and checks its cost table against it; the CUDA
//! backend names its NVTX ranges from it; a backend may throw to reject it) and the sizes derived
//! from it. The schedule outlives the backend's use of it: the executor holds it.
struct backend_setup {
  schedule_view schedule{};            //!< the schedule to run (held by the executor)
  std::size_t ops = 0;                 //!< ops in the program (timelines reserve for them)
  std::uint32_t events = 0;            //!< events to create, addressed as `0` to `events - 1`
  std::size_t device_bytes = 0;        //!< the device arena's size
  std::size_t host_bytes = 0;          //!< the host arena's size
  std::size_t waits = 0;               //!< cross-stream waits in the program (timelines reserve for them)
  std::size_t device_alignment = 256;  //!< the schedule's: the device arena starts on this boundary
  //! The schedule's, or its storage alignment when it spills (the spill ring's regions are aligned
  //! to it relative to the arena's start): the host arena starts on this boundary
  std::size_t host_alignment = 64;
  std::size_t storage_bytes = 0;        //!< the storage file's size (0: nothing is stored)
  std::size_t storage_alignment = 4096; //!< the schedule's: every store and load moves whole blocks of this size

  //! The setup of `s`: its sizes, alignments and the view itself.
  static constexpr backend_setup of(schedule_view s) noexcept {
    auto const spills = s.arena.spill_buffers > 0;
    return {.schedule = s,
            .ops = s.ops.size(),
            .events = s.event_count,
            .device_bytes = s.arena.device_bytes,
            .host_bytes = s.arena.host_bytes,
            .waits = s.waits.size(),
            .device_alignment = s.buffers.device_alignment,
            .host_alignment = spills && s.buffers.storage_alignment > s.buffers.host_alignment ? s.buffers.storage_alignment
                                                                                             : s.buffers.host_alignment,
            .storage_bytes = s.arena.storage_bytes,
            .storage_alignment = s.buffers.storage_alignment};
  }
};

//! A backend opts in with `using tide_backend_tag = void;` and provides:
//! - `stream_type`: what user lambdas receive as the stream to enqueue on (`cudaStream_t` on CUDA);
//! - `static constexpr bool device_memory_is_host_accessible` (debug guard and poison checks);
//! - `setup(backend_setup)`: take the schedule, create events, reserve queues, allocate arenas
//!   (throws `out_of_memory` naming the request and the budget; the budget bounds the bytes held
//!   at once, arenas still leased by live executors included);
//! - `record_timeline(timeline*)`: record each op's interval and each blocking wait of the
//!   following steps into the timeline (nullptr: stop); the executor passes
//!   `executor_options::timeline` on construction;
//! - `stream(role)`; `record(role, event)`; `wait(role, event)` (waits for the most recent record);
//! - `run(role, op_index, op, task)`: user compute or a collective; the backend decides when
//!   the task runs (inline on CUDA, on the stream's worker on host, not at all in the sim);
//! - `copy(role, op_index, op, dst, src, bytes)`: an asynchronous copy on a stream;
//! - `run_after_all(role, task)`: as `run`, once everything enqueued so far on every stream is
//!   complete (the step-end agreement of distributed hooks; the sim only advances the stream);
//! - `host_task(role, task)`: a host function in stream order (debug checks);
//! - `begin_step(schedule_view)`: a step of this schedule begins (backends shared by several
//!   executors key per-schedule state on it; one step at a time per backend: a backend may throw
//!   when the previous step was not waited for); `end_step()`: everything of the step is enqueued: must not block on the
//!   step's work (CUDA joins the side streams into the compute stream, so that work enqueued
//!   there after the step is ordered after it); `wait_step()`: blocks until the step's work has
//!   completed and rethrows the backend's errors.
template <class B>
concept backend = requires(B& b, stream_role r, std::uint32_t i, op const& o, task t, void* dst, void const* src,
                           std::size_t n, backend_setup const& setup, timeline* tl) {
  typename B::tide_backend_tag;
  typename B::stream_type;
  { B::device_memory_is_host_accessible } -> std::convertible_to<bool>;
  { b.setup(setup) } -> std::same_as<arenas>;
  b.record_timeline(tl);
  { b.stream(r) } -> std::same_as<typename B::stream_type>;
  b.record(r, i);
  b.wait(r, i);
  b.run(r, i, o, t);
  b.copy(r, i, o, dst, src, n);
  b.run_after_all(r, t);
  b.host_task(r, t);
  b.begin_step(setup.schedule);
  b.end_step();
  b.wait_step();
};
//! A backend with a storage tier (spilled slots) also provides, for schedules whose
//! `backend_setup::storage_bytes` is not 0 (`setup` then opens a file of that size, or throws):
//! - `store(role, op_index, op, src)`: writes `op.bytes` rounded up to the storage alignment from
//!   pinned host memory `src` to the file at `op.file_offset`, in stream order;
//! - `load(role, op_index, op, dst)`: the reverse.
//! A failed transfer fails the step (`wait_step` throws `storage_error` naming the file, the
//! offset and the bytes).
template <class B>
concept storage_backend = backend<B> && requires(B& b, stream_role r, std::uint32_t i, op const& o, void* dst, void const* src) {
  b.store(r, i, o, src);
  b.load(r, i, o, dst);
};

//! Fails with a message that says what to do when `B` is not a backend.
template <class B>
constexpr bool check_backend() {
  static_assert(requires { typename B::tide_backend_tag; },
                "tide: this type is not a tide backend: declare `using tide_backend_tag = void;` and implement the "
                "members listed in <tide/executor/backend.hpp>");
  static_assert(backend<B>, "tide: this type declares tide_backend_tag but misses members of tide::backend: see "
                            "<tide/executor/backend.hpp> for the list");
  return true;
}

}  // namespace tide
