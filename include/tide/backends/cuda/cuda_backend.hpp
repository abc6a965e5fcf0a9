#pragma once
//! \file
//! The CUDA backend: the executor's four streams are CUDA streams, its events CUDA events,
//! its copies `cudaMemcpyAsync` between one device arena and one pinned host arena allocated at
//! setup. User lambdas run inline on the host thread and enqueue their kernels on `ctx.stream`.
//!
//! Streams: the compute stream is the user's (`cudaStream_t` or `cuda::stream_ref`) or one tide
//! creates; tide creates the device-to-host, host-to-device and communication streams,
//! non-blocking, the host-to-device and communication ones at the device's greatest priority by
//! default. Priorities order kernels only (copy engines ignore them): on the communication stream
//! NCCL's kernels then run ahead of a backward that fills the GPU; on the host-to-device stream
//! they matter only for kernels a user enqueues there (bench/gpu measures whether they do).
//!
//! A step forks the side streams from the compute stream when it begins and joins them back into
//! it when everything is enqueued (`end_step`), so `executor::enqueue` returns with the compute
//! stream carrying the whole step: an optimizer update enqueued there next runs after it.
//! `wait_step` (`executor::wait`) synchronizes and reports the step's first failure.
//!
//! Events are created once, without timing, for ordering only. Timed events are recorded only
//! while a timeline is attached (`record_timeline`). One step may also be captured into a CUDA
//! graph instead of being run (see <tide/backends/cuda/cuda_graph.hpp>).

#include <cuda_runtime_api.h>

#include <cuda/stream_ref>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/backends/cuda/cuda_graph.hpp>
#include <tide/backends/cuda/gpu_direct.hpp>
#include <tide/backends/cuda/detail/device_guard.hpp>
#include <tide/backends/cuda/detail/ring_redirect.hpp>
#include <tide/backends/cuda/detail/sync_wait.hpp>
#include <tide/backends/cuda/memory.hpp>
#include <tide/backends/cuda/nvtx.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/executor/backend.hpp>
#include <tide/storage/spill_file.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! Budgets, streams, memory resources and failure handling of a `cuda_backend`.
struct cuda_backend_options {
  //! Bytes the device arenas may hold at once (arenas that live executors still hold included).
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();
  //! Bytes the pinned arenas may hold at once (arenas that live executors still hold included).
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();
  bool prefetch_priority = true;  //!< host-to-device stream at the greatest priority (kernels only; not copies)
  //! Communication stream at the greatest priority: NCCL's kernels then run ahead of a backward
  //! that fills the GPU instead of waiting behind it (false: the least, as other side streams).
  bool collective_priority = true;
  bool nvtx = true;                               //!< NVTX ranges around every op
  std::optional<resource_ref> device_resource{};  //!< device arena from here (default: cudaMalloc)
  std::optional<resource_ref> host_resource{};    //!< pinned arena from here (default: cudaHostAlloc)
  //! How long a synchronization waits for the streams before the watchers are told it timed out
  //! and it throws: a peer that died leaves this rank's collective kernels spinning for good.
  //! `std::chrono::milliseconds::max()`: no timeout.
  std::chrono::milliseconds sync_timeout = std::chrono::minutes(5);
  //! Accept a user compute stream that synchronizes with the legacy default stream (created
  //! without cudaStreamNonBlocking). Off: such a stream is rejected, since work another thread
  //! puts on the legacy stream then breaks graph capture and stalls tide's step.
  bool allow_blocking_compute_stream = false;
  //! The storage tier spilled slots go to: a file in `storage.directory` (none by default: a
  //! schedule that stores bytes is then refused when its executor is built). Staged through the
  //! pinned spill ring, written and read by host functions in the storage stream's order, unless
  //! GPUDirect Storage moves them (`gpu_direct`).
  storage_options storage{};
  //! GPUDirect Storage for spilled slots: the spill ring then lives in device memory (at the end
  //! of the device arena, so the budget and `device_arena_bytes()` count it), offloads and
  //! prefetches to and from it are device-to-device copies, and stores and loads are cuFile
  //! transfers on the storage stream. Disk snapshots of a chain's carry stay staged (they live in
  //! the host arena). `storage_path()` says which path is used and why.
  gpu_direct_mode gpu_direct = gpu_direct_mode::automatic;
  //! How long opening the cuFile driver may take before GPUDirect Storage counts as unavailable
  //! (`automatic` then stages, `required` throws `storage_error` saying so): without the nvidia-fs
  //! module cuFileDriverOpen has been seen never to return.
  std::chrono::milliseconds gpu_direct_open_timeout = std::chrono::seconds(20);
};


//! A `backend` that runs a schedule on one GPU: CUDA streams, events and asynchronous copies.
class cuda_backend {
 public:
  using tide_backend_tag = void;     //!< opts in to the `backend` concept
  using stream_type = cudaStream_t;  //!< user lambdas enqueue their kernels on this
  //! The device arena is not host memory, so debug guards and poisoning do not run.
  static constexpr bool device_memory_is_host_accessible = false;

  //! tide creates every stream, on the current device.
  explicit cuda_backend(cuda_backend_options opt = {}) : opt_(std::move(opt)) {
    check_options();
    create_streams(std::nullopt);
  }
  //! Runs compute on the user's stream (a `cudaStream_t` converts), so tide slots into existing
  //! code; tide creates the other three on the current device, which must be the stream's.
  explicit cuda_backend(::cuda::stream_ref compute, cuda_backend_options opt = {}) : opt_(std::move(opt)) {
    check_options();
    create_streams(compute.get());
  }
  cuda_backend(cuda_backend const&) = delete;
  cuda_backend& operator=(cuda_backend const&) = delete;
  //! Waits for every stream (at most `sync_timeout`, polling the watchers), then destroys what
  //! tide created. Errors here cannot be thrown; the last step's `wait_step` already reported any
  //! failure of its work.
  ~cuda_backend() {
    try {
      synchronize();
    } catch (...) {
    }
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
    gds_.reset();  // deregisters the storage stream before it is destroyed below
#endif
    for (auto e : events_) static_cast<void>(cudaEventDestroy(e));
    for (auto e : timed_) static_cast<void>(cudaEventDestroy(e));
    for (auto e : fork_join_)
      if (e) static_cast<void>(cudaEventDestroy(e));
    for (auto e : after_all_)
      if (e) static_cast<void>(cudaEventDestroy(e));
    for (std::size_t r = 0; r < stream_count; ++r)
      if (owned_[r]) static_cast<void>(cudaStreamDestroy(streams_[r]));
  }

  //! The options the backend was built with.
  cuda_backend_options const& options() const noexcept { return opt_; }
  //! The device the streams were created on (the current one at construction).
  int device() const noexcept { return device_; }
  //! The stream of role `r`, as a `cuda::stream_ref` for CCCL-style APIs.
  ::cuda::stream_ref stream_ref(stream_role r) const noexcept { return streams_[static_cast<std::size_t>(r)]; }
  //! Bytes of the current arenas (the ones the next setup reuses when it fits).
  std::size_t device_arena_bytes() const noexcept { return device_arena_.size(); }
  //! Bytes of the current pinned host arena, as `device_arena_bytes()`.
  std::size_t host_arena_bytes() const noexcept { return host_arena_.size(); }
  //! Bytes allocated now: the current arenas plus earlier ones that live executors still hold.
  std::size_t device_held_bytes() const { return device_arena_.held_bytes(); }
  //! Pinned host bytes allocated now, as `device_held_bytes()`.
  std::size_t host_held_bytes() const { return host_arena_.held_bytes(); }

  //! Records each op's interval and each wait's blocked time into `t` with timed events
  //! (nullptr: stop). Not recorded while a step is captured into a graph. Creates the timed
  //! events the program needs (once), so that no step creates them.
  void record_timeline(timeline* t) {
    timeline_ = t;
    detail::device_guard const on(device_);
    if (t) create_timed_events();
  }
  //! The next step is captured into a graph instead of run; `end_capture` hands it over.
  void capture_next_step() noexcept { capture_.request(); }
  //! Withdraws a `capture_next_step` that no step took up (a step that threw before starting),
  //! so that the next eager step runs instead of being captured.
  void cancel_capture() noexcept { capture_.cancel(); }
  //! True while a step is being captured into a graph (from its `begin_step` to its `end_step`).
  bool capturing() const noexcept { return capture_.active(); }
  //! Hands over the captured step; throws `error` when no step was captured.
  captured_step end_capture() { return capture_.claim(); }

  //! Called while the backend waits for its streams, with `timed_out` true once `sync_timeout`
  //! has passed. A watcher throws to report a failure it found (an NCCL asynchronous error, a dead
  //! peer), after making the streams drain (e.g. by aborting its communicator); the wait then
  //! ends and that exception is thrown. Registered once; nothing is allocated per step.
  using watcher = std::function<void(bool timed_out)>;
  //! Registers `w` for every later synchronization (see `watcher`); returns its id for `unwatch`.
  std::size_t watch(watcher w) {
    watchers_.push_back({++last_watch_, std::move(w)});
    return last_watch_;
  }
  //! Unregisters the watcher `watch` returned `id` for (a communicator aborted and replaced must
  //! not be polled again); false when there is none. Not from inside a watcher.
  bool unwatch(std::size_t id) {
    if (watching_)
      throw error("tide: cuda_backend::unwatch was called from inside a watcher: unregister it after the "
                  "synchronization");
    auto const it = std::find_if(watchers_.begin(), watchers_.end(), [&](auto const& w) { return w.first == id; });
    if (it == watchers_.end()) return false;
    watchers_.erase(it);
    return true;
  }

  //! Waits for every stream, polling the watchers, for at most `sync_timeout` (then twice that
  //! for streams to drain after a watcher threw); throws the first failure of the work they ran,
  //! a watcher's exception, or `error` on a timeout.
  void synchronize();

  // ---- tide::backend ----------------------------------------------------------------------

  //! Creates the events and reserves the arenas.
  arenas setup(backend_setup const& s);

  //! The CUDA stream of role `r`.
  stream_type stream(stream_role r) const noexcept { return streams_[static_cast<std::size_t>(r)]; }

  //! Records event `e` on the stream of `r` (`cudaEventRecord`).
  void record(stream_role r, std::uint32_t e) { TIDE_CUDA_CHECK(cudaEventRecord(events_[e], stream(r))); }

  //! Waits for the most recent record of `e` (a never-recorded event is complete: no wait).
  void wait(stream_role r, std::uint32_t e) {
    if (!timing()) {
      TIDE_CUDA_CHECK(cudaStreamWaitEvent(stream(r), events_[e], 0));
      return;
    }
    auto const begin = mark(r);
    TIDE_CUDA_CHECK(cudaStreamWaitEvent(stream(r), events_[e], 0));
    wait_marks_.push_back({e, r, begin, mark(r)});
  }

  //! Runs the task inline: it calls the user's lambda, which enqueues on `stream(r)`.
  void run(stream_role r, std::uint32_t i, op const& o, task t) {
    nvtx_op_range const range(opt_.nvtx, o);
    if (!timing()) {
      t();
      return;
    }
    auto const begin = mark(r);
    t();
    op_marks_.push_back({i, r, begin, mark(r)});
  }

  //! Runs the task inline once the stream of `r` waits for everything enqueued so far on the
  //! other streams (an event recorded on each): what the task enqueues on `stream(r)` runs after
  //! all of the step's work. Captured like the rest of the step.
  void run_after_all(stream_role r, task t) {
    for (std::size_t k = 0; k < stream_count; ++k) {
      if (k == static_cast<std::size_t>(r)) continue;
      TIDE_CUDA_CHECK(cudaEventRecord(after_all_[k], streams_[k]));
      TIDE_CUDA_CHECK(cudaStreamWaitEvent(stream(r), after_all_[k], 0));
    }
    t();
  }

  //! A `cudaMemcpyAsync` on the stream of `r`, in the direction of the op's kind.
  void copy(stream_role r, std::uint32_t i, op const& o, void* dst, void const* src, std::size_t n);

  //! Writes a spilled slot from the spill ring (`src`, as the schedule names it) to the file: a
  //! cuFile write on the stream of `r` from the device ring (GPUDirect Storage), or a host
  //! function on it that writes from the pinned ring (staged).
  void store(stream_role r, std::uint32_t i, op const& o, void const* src) { transfer(r, i, o, const_cast<void*>(src)); }
  //! Reads a spilled slot from the file into the spill ring (`dst`), as `store` the other way.
  void load(stream_role r, std::uint32_t i, op const& o, void* dst) { transfer(r, i, o, dst); }
  //! The storage tier's file (nullptr until a schedule that stores bytes was set up).
  spill_file const* storage() const noexcept { return file_ ? &*file_ : nullptr; }
  //! How the last schedule set up moves spilled slots: "GPUDirect Storage (cuFile ...), device
  //! ring of N bytes" or "staged through the pinned ring (why): " and the spill file's path
  //! (empty until a schedule that spills was set up).
  [[nodiscard]] std::string const& storage_path() const noexcept { return storage_path_; }
  //! Bytes of device memory the spill ring takes under GPUDirect Storage (0: staged, or nothing spilled).
  [[nodiscard]] std::size_t gpu_direct_ring_bytes() const noexcept { return redirect_.bytes; }

  //! A host function in stream order (`cudaLaunchHostFunc`); it must not call CUDA.
  void host_task(stream_role r, task t) {
    auto* p = (capture_.active() ? capture_.tasks() : tasks_).acquire(t);
    TIDE_CUDA_CHECK(cudaLaunchHostFunc(stream(r), &detail::run_host_task, p));
  }

  //! Forks the side streams from the compute stream (or begins a capture). One step at a time:
  //! the previous one must have been waited for (its host tasks still use the task pool). The
  //! step's schedule labels the NVTX ranges of its copies.
  void begin_step(schedule_view s);

  //! Everything of the step is enqueued: the compute stream waits for the side streams (join),
  //! so work enqueued on it afterwards (an optimizer update) runs after the step; nothing blocks.
  //! A captured step ends its capture here.
  void end_step();

  //! Waits for the step's work (every stream, see `synchronize`) and reports its first failure.
  void wait_step();

 private:
  //! The options no CUDA call checks: a timeout of 0 or less timed out at once (a synchronization
  //! failed every step; cuFile was marked timed out for the process).
  void check_options() const {
    if (opt_.sync_timeout <= std::chrono::milliseconds::zero())
      throw error("tide::cuda_backend: cuda_backend_options::sync_timeout is " + std::to_string(opt_.sync_timeout.count()) +
                  " ms: give a positive time (std::chrono::milliseconds::max() for none)");
    if (opt_.gpu_direct_open_timeout <= std::chrono::milliseconds::zero())
      throw error("tide::cuda_backend: cuda_backend_options::gpu_direct_open_timeout is " +
                  std::to_string(opt_.gpu_direct_open_timeout.count()) + " ms: give a positive time");
  }
  // Why GPUDirect Storage cannot be used for this backend's spill file ("": it can be tried).
  std::string gpu_direct_blocker() const {
    if (opt_.gpu_direct == gpu_direct_mode::off) return "gpu_direct_mode::off";
    if (!gpu_direct_built()) return "this build has no cuFile: install the toolkit's cuFile or the nvidia-cufile wheel and reconfigure";
    if (!file_ || !file_->direct()) return "the spill file is not open with O_DIRECT (the file system refuses it)";
    return {};
  }
  // Registers the file, the device ring and the storage stream with cuFile; returns why not ("": done).
  std::string attach_gpu_direct(std::byte const* host_ring, std::byte* device_ring, std::size_t bytes);
  // Records (and, unless quiet or already said, prints once) which path spilled slots take.
  void say_storage_path(std::string const& why_not);

  void transfer(stream_role r, std::uint32_t i, op const& o, void* at);
  // On the runtime's callback thread: an exception must not leave it. The first failure is kept
  // for wait_step; the step's later transfers are skipped (what they would read was never written).
  static void run_transfer(void* self, std::uint32_t i) noexcept;

  struct op_mark {
    std::uint32_t index;  // op index or event index
    stream_role role;
    cudaEvent_t begin, end;
  };

  void create_streams(std::optional<cudaStream_t> user_compute);

  //! The user's compute stream must be usable for ordering and capture: not the legacy default
  //! stream, on this backend's device, and (unless allowed) non-blocking.
  void check_user_stream(cudaStream_t s) const;

  //! Throws when `p` (from a user resource) is not the kind of memory its arena needs, or is
  //! device memory of another device. A user resource is trusted for nothing: pageable
  //! "pinned" memory would make every copy staged and synchronous without any error, and host
  //! memory as the device arena would fault.
  void expect_memory(void const* p, cudaMemoryType want, char const* option, char const* what) const;
  //! The kind check of a user resource's blocks (none for tide's own resources: known good).
  std::function<void(void const*)> kind_check(bool user, cudaMemoryType want) const {
    if (!user) return {};
    if (want == cudaMemoryTypeDevice)
      return [this](void const* p) {
        expect_memory(p, cudaMemoryTypeDevice, "device_resource", "device memory (cudaMalloc, a device pool)");
      };
    return [this](void const* p) {
      expect_memory(p, cudaMemoryTypeHost, "host_resource",
                    "page-locked host memory (cudaHostAlloc, or cudaHostRegister'ed memory)");
    };
  }

  void create_timed_events();

  arena_block reserve_device(std::size_t bytes, std::size_t alignment);

  bool timing() const noexcept { return start_ != nullptr; }

  cudaEvent_t timed_event() {
    if (timed_used_ == timed_.size()) {  // not reached: setup and record_timeline created them all
      cudaEvent_t e = nullptr;
      TIDE_CUDA_CHECK(cudaEventCreate(&e));
      timed_.push_back(e);
    }
    return timed_[timed_used_++];
  }
  cudaEvent_t mark(stream_role r) {
    auto const e = timed_event();
    TIDE_CUDA_CHECK(cudaEventRecord(e, stream(r)));
    return e;
  }

  void fill_timeline();

  std::string_view slot_name(op const& o) const noexcept {
    if (!opt_.nvtx) return {};
    if (o.slot == carry_slot) return names_.carry.name;
    if (o.layer >= names_.layers.size()) return {};
    auto const slots = names_.slots_of(o.layer);
    return o.slot < slots.size() ? slots[o.slot].name.view() : std::string_view{};
  }

  cuda_backend_options opt_;
  int device_ = 0;
  std::array<cudaStream_t, stream_count> streams_{};
  std::array<bool, stream_count> owned_{};
  std::vector<cudaEvent_t> events_;
  std::array<cudaEvent_t, stream_count> fork_join_{};  // [0]: fork from compute; [r]: join of stream r
  std::array<cudaEvent_t, stream_count> after_all_{};  // [k]: stream k's end, for run_after_all
  // The pools keep a reference to their resource: the defaults are declared first, so that
  // they outlive the pools (which free every block when they go).
  device_memory_resource default_device_;
  pinned_memory_resource default_host_;
  // The alignment floors: what cudaMalloc and cudaHostAlloc give whatever is asked (256 bytes, a
  // page). A user's pinned pool is held only to the schedule's host alignment: a pool of
  // 256-byte blocks is fine.
  detail::memory_block device_arena_{
      "tide: CUDA backend device arena", opt_.device_budget,
      {opt_.device_resource ? *opt_.device_resource : resource_ref(default_device_), 256,
       kind_check(opt_.device_resource.has_value(), cudaMemoryTypeDevice)}};
  detail::memory_block host_arena_{
      "tide: CUDA backend pinned host arena", opt_.host_budget,
      {opt_.host_resource ? *opt_.host_resource : resource_ref(default_host_), opt_.host_resource ? 1u : 4096u,
       kind_check(opt_.host_resource.has_value(), cudaMemoryTypeHost)}};
  detail::task_pool tasks_;
  // tracing
  timeline* timeline_ = nullptr;
  std::vector<cudaEvent_t> timed_;
  std::size_t timed_used_ = 0, timed_needed_ = 0;
  cudaEvent_t start_ = nullptr;  // set while the current step is timed
  std::vector<op_mark> op_marks_, wait_marks_;
  schedule_view names_{};
  std::optional<spill_file> file_;
  detail::ring_redirect redirect_;  // the spill ring in device memory (GPUDirect Storage), or inactive
  std::string storage_path_;
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  std::optional<gds_file> gds_;  // after file_: deregistered before the file closes
#endif
  std::vector<void*> transfer_at_;  // per op: the ring address of its store or load
  std::exception_ptr storage_failure_;  // the step's first failed transfer (from the callback thread)
  std::atomic<bool> storage_failed_{false};
  detail::stream_capture capture_;
  bool waited_ = true;  // the last step was waited for, or captured (nothing to wait for)
  cudaError_t launch_error_ = cudaSuccess;  // the issuing thread's last error, from end_step
  std::vector<std::pair<std::size_t, watcher>> watchers_;  // (id, watcher)
  std::size_t last_watch_ = 0;
  bool watching_ = false;  // inside the watchers' loop
};

static_assert(storage_backend<cuda_backend>);

}  // namespace tide

#include <tide/backends/cuda/detail/cuda_backend_impl.hpp>  // the longer member functions
