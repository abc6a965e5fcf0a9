#pragma once
// cuda_backend's longer member functions, out of the class so that its header reads as API
// (included at the end of <tide/backends/cuda/cuda_backend.hpp>; not to be included on its own).

#include <tide/backends/cuda/cuda_backend.hpp>

namespace tide {

inline void cuda_backend::synchronize() {
  using clock = std::chrono::steady_clock;
  detail::first_failure f;
  std::exception_ptr watched;
  auto const begin = clock::now();
  auto deadline = detail::deadline_after<clock>(begin, opt_.sync_timeout);
  auto next_watch = begin;
  bool told_timeout = false;
  for (std::size_t r = 0; r < stream_count; ++r) {
    for (;;) {
      auto const e = cudaStreamQuery(streams_[r]);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) {
        TIDE_CUDA_NOTE(f, e);
        break;
      }
      auto const now = clock::now();
      bool const late = now > deadline;
      if (!watched && (late || now >= next_watch)) {
        next_watch = now + detail::watch_interval;
        try {
          watching_ = true;
          for (auto const& w : watchers_) w.second(late);
          watching_ = false;
        } catch (...) {
          watching_ = false;
          watched = std::current_exception();
          deadline = detail::deadline_after<clock>(clock::now(), opt_.sync_timeout, 2);  // the watcher made the streams drain
          continue;
        }
      }
      if (late) {
        if (watched) std::rethrow_exception(watched);
        if (!told_timeout && !watchers_.empty()) {  // they were told: give them one more round
          told_timeout = true;
          continue;
        }
        throw error("tide: cuda_backend: the " + std::string(to_string(static_cast<stream_role>(r))) +
                    " stream did not finish within " + std::to_string(opt_.sync_timeout.count()) +
                    " ms (a collective waiting for a peer that died never ends: watch its communicator, "
                    "see cuda_backend::watch, or raise cuda_backend_options::sync_timeout)");
      }
      // Yield while the wait is short (it ends within microseconds of the work), then sleep a
      // little, growing with the wait (detail::sync_pause).
      detail::pause_while_waiting(std::chrono::duration_cast<std::chrono::microseconds>(now - begin));
    }
  }
  if (watched) std::rethrow_exception(watched);
  f.raise();
}

inline arenas cuda_backend::setup(backend_setup const& s) {
  detail::device_guard const on(device_);  // events and arenas belong to the backend's device
  // Nothing may still use an arena when a larger one replaces it (and frees it if unheld).
  synchronize();
  // A user resource's blocks are checked for their kind as they are allocated, before their
  // alignment (resource_allocator::check_kind; see expect_memory).
  // The file first: a full disk or a bad directory is found before any arena is taken.
  if (s.storage_bytes > 0) detail::prepare_spill_file(file_, opt_.storage, s.storage_bytes, s.storage_alignment, "cuda_backend");
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  gds_.reset();  // before the arena it registered may be freed
#endif
  // GPUDirect Storage: the spill ring goes at the end of the device arena.
  auto const ring = s.schedule.arena.spill_ring_bytes;
  std::string why_not = ring == 0 || s.storage_bytes == 0 ? "" : gpu_direct_blocker();
  bool const direct = ring > 0 && s.storage_bytes > 0 && why_not.empty();
  // The ring starts on a 4 KiB boundary of the device address space (cuFile's direct path moves
  // aligned blocks; elsewhere it bounces), whatever the arena's own alignment: room for it.
  constexpr std::size_t ring_alignment = 4096;
  std::size_t with_ring = s.device_bytes;
  if (direct && (!checked_add(with_ring, ring, with_ring) || !checked_add(with_ring, ring_alignment, with_ring)))
    throw out_of_memory("tide: CUDA backend device arena with the spill ring of GPUDirect Storage", s.device_bytes,
                        std::numeric_limits<std::size_t>::max());
  auto d = reserve_device(with_ring, s.device_alignment);
  auto h = host_arena_.reserve(s.host_bytes, s.host_alignment);  // throws out_of_memory above the budget
  if (file_ && s.storage_bytes > 0) file_->register_memory({h.data, s.host_bytes});
  redirect_ = {};
  if (direct) {
    auto const end = reinterpret_cast<std::uintptr_t>(d.data) + s.device_bytes;
    auto* const device_ring = static_cast<std::byte*>(d.data) + (align_up(end, ring_alignment) - reinterpret_cast<std::uintptr_t>(d.data));
    why_not = attach_gpu_direct(static_cast<std::byte*>(h.data) + s.schedule.arena.spill_area, device_ring, ring);
  }
  if (ring > 0 && s.storage_bytes > 0) say_storage_path(why_not);
  if (transfer_at_.size() < s.ops) transfer_at_.resize(s.ops);
  arenas a{d.data, h.data, joint_lease(std::move(d.lease), std::move(h.lease))};
  while (events_.size() < s.events) {
    cudaEvent_t e = nullptr;
    TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  for (auto& e : fork_join_)
    if (!e) TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& e : after_all_)
    if (!e) TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  op_marks_.reserve(s.ops);
  wait_marks_.reserve(s.waits);
  // A traced step records two timed events per op and wait, plus its origin: created here, so
  // that tracing creates no event mid-step.
  timed_needed_ = std::max(timed_needed_, 2 * (s.ops + s.waits) + 1);
  if (timeline_) create_timed_events();
  return a;
}

inline void cuda_backend::copy(stream_role r, std::uint32_t i, op const& o, void* dst, void const* src, std::size_t n) {
  nvtx_op_range const range(opt_.nvtx, o, slot_name(o));
  auto kind = o.kind == op_kind::offload    ? cudaMemcpyDeviceToHost
              : o.kind == op_kind::prefetch ? cudaMemcpyHostToDevice
                                            : cudaMemcpyDefault;
  if (redirect_.active()) {  // a spilled slot to or from the device ring (GPUDirect Storage)
    if (o.kind == op_kind::offload && redirect_.offset_of(dst) >= 0) dst = redirect_(dst, n), kind = cudaMemcpyDeviceToDevice;
    if (o.kind == op_kind::prefetch && redirect_.offset_of(src) >= 0) src = redirect_(src, n), kind = cudaMemcpyDeviceToDevice;
  }
  if (!timing()) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream(r)));
    return;
  }
  auto const begin = mark(r);
  TIDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream(r)));
  op_marks_.push_back({i, r, begin, mark(r)});
}

inline void cuda_backend::begin_step(schedule_view s) {
  if (!waited_)
    throw error("tide::cuda_backend: a step is already enqueued on this backend: wait for it (executor::wait) "
                "before the next");
  names_ = s;
  storage_failure_ = nullptr;
  storage_failed_.store(false);
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  if (gds_) gds_->prepare(s.ops.size());
#endif
  tasks_.reset();
  op_marks_.clear();
  wait_marks_.clear();
  timed_used_ = 0;
  start_ = nullptr;
  if (capture_.take_request()) {
    // A replayed graph's host functions would read the storage records of whatever step ran
    // last, and nothing would report their failures: refused until they get records of their own.
    if (s.arena.storage_bytes > 0)
      throw error("tide::cuda_backend: a step that stores spilled slots cannot be captured into a CUDA graph yet: "
                  "run it eagerly, or spill nothing");
    capture_.begin(streams_, fork_join_);
  } else {
    // Fork: the side streams start after everything already queued on the compute stream
    // (the previous step's optimizer update, the user's input copies), traced or not. This is
    // also the common origin of a traced step's timeline.
    auto fork = fork_join_[0];
    if (timeline_) fork = start_ = timed_event();
    detail::first_failure f;
    detail::fork_side_streams(streams_, fork, f);
    f.raise();
  }
  if (opt_.nvtx) nvtx_push(capture_.active() ? "tide step (capture)" : "tide step");
  waited_ = false;  // only once the step has begun: a begin that threw leaves the backend free
}

inline void cuda_backend::end_step() {
  if (opt_.nvtx) nvtx_pop();
  if (capture_.active()) {
    waited_ = true;  // nothing ran: nothing to wait for
    capture_.finish(streams_, fork_join_);
    return;
  }
  // A failed kernel launch is reported only as the calling thread's last error: collected
  // here, on the thread that issued the step, since `wait_step` may run on another.
  launch_error_ = cudaGetLastError();
  detail::first_failure f;
  detail::join_side_streams(streams_, fork_join_, f);
  f.raise();
}

inline void cuda_backend::wait_step() {
  if (std::exchange(waited_, true)) return;
  synchronize();
  // A failed launch (bad configuration, missing kernel image) is reported only as the
  // runtime's last error of the thread that launched: the issuing thread's, collected by
  // end_step, or this one's.
  auto e = std::exchange(launch_error_, cudaSuccess);
  if (auto const here = cudaGetLastError(); e == cudaSuccess) e = here;
  if (e != cudaSuccess)
    detail::throw_cuda_error(e, "a kernel launch or CUDA call during the step (reported by cudaGetLastError())",
                             __FILE__, __LINE__);
  if (timeline_ && start_) fill_timeline();
  if (storage_failure_) std::rethrow_exception(std::exchange(storage_failure_, nullptr));
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  if (gds_) gds_->check_step();
#endif
}

inline std::string cuda_backend::attach_gpu_direct(std::byte const* host_ring, std::byte* device_ring, std::size_t bytes) {
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  try {
    // Registered anew at every setup, even at the same address: an arena freed and allocated
    // again there is other memory (setup dropped the old registration before reserving).
    gds_.emplace(file_->native_handle(), "the spill file in '" + file_->directory() + "'", opt_.gpu_direct_open_timeout);
    gds_->register_stream(stream(stream_role::storage));
    gds_->register_buffer(device_ring, bytes);
    redirect_ = {host_ring, device_ring, bytes};
    return {};
  } catch (storage_error const& e) {
    gds_.reset();
    return e.what();
  }
#else
  (void)host_ring, (void)device_ring, (void)bytes;
  return "this build has no cuFile";
#endif
}

inline void cuda_backend::say_storage_path(std::string const& why_not) {
  std::string path;
  if (why_not.empty()) {
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
    path = gds_->description() + ", device ring of " + std::to_string(redirect_.bytes) + " bytes";
#endif
  } else {
    path = "staged through the pinned ring (" + why_not + "): " + file_->description();
  }
  if (opt_.gpu_direct == gpu_direct_mode::required && !why_not.empty())
    throw storage_error("tide::cuda_backend: gpu_direct_mode::required, but GPUDirect Storage cannot be used: " + why_not, ENOTSUP);
  if (!why_not.empty() && opt_.gpu_direct == gpu_direct_mode::automatic && !opt_.storage.quiet && path != storage_path_)
    std::fprintf(stderr, "tide: cuda_backend: spilled slots %s\n", path.c_str());
  storage_path_ = std::move(path);
}

inline void cuda_backend::transfer(stream_role r, std::uint32_t i, op const& o, void* at) {
  if (!file_) throw error("tide::cuda_backend: a store or load without a storage file (the schedule was set up without one)");
  nvtx_op_range const range(opt_.nvtx, o, slot_name(o));
#if defined(TIDE_HAVE_CUFILE) && TIDE_HAVE_CUFILE
  if (auto const off = redirect_.offset_of(at); gds_ && off >= 0) {
    auto const bytes = align_up(o.bytes, names_.buffers.storage_alignment);  // the region, padded as laid out
    (void)redirect_(at, bytes);  // inside the ring, or a schedule_error
    auto const begin = timing() ? mark(r) : nullptr;
    if (o.kind == op_kind::store) gds_->write_async(i, redirect_.device, static_cast<std::size_t>(off), o.file_offset, bytes, stream(r));
    else gds_->read_async(i, redirect_.device, static_cast<std::size_t>(off), o.file_offset, bytes, stream(r));
    if (begin) op_marks_.push_back({i, r, begin, mark(r)});
    return;
  }
#endif
  transfer_at_[i] = at;
  host_task(r, task{&run_transfer, this, i});
}

inline void cuda_backend::run_transfer(void* self, std::uint32_t i) noexcept {
  auto& b = *static_cast<cuda_backend*>(self);
  if (b.storage_failed_.load(std::memory_order_acquire)) return;
  auto const& o = b.names_.ops[i];
  auto const bytes = align_up(o.bytes, b.names_.buffers.storage_alignment);  // the region, padded as laid out
  try {
    if (o.kind == op_kind::store) b.file_->write(b.transfer_at_[i], o.file_offset, bytes);
    else b.file_->read(b.transfer_at_[i], o.file_offset, bytes);
  } catch (...) {
    b.storage_failure_ = std::current_exception();
    b.storage_failed_.store(true, std::memory_order_release);
  }
}

inline void cuda_backend::create_streams(std::optional<cudaStream_t> user_compute) {
  TIDE_CUDA_CHECK(cudaGetDevice(&device_));
  if (user_compute) check_user_stream(*user_compute);
  int least = 0, greatest = 0;
  TIDE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Constructed piecewise so that a failure part-way still destroys what was created.
  try {
    for (std::size_t r = 0; r < stream_count; ++r) {
      auto const role = static_cast<stream_role>(r);
      if (role == stream_role::compute && user_compute) {
        streams_[r] = *user_compute;
        continue;
      }
      bool const first = (role == stream_role::h2d && opt_.prefetch_priority) ||
                         (role == stream_role::comm && opt_.collective_priority);
      int const priority = first ? greatest : least;
      TIDE_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[r], cudaStreamNonBlocking, priority));
      owned_[r] = true;
    }
  } catch (...) {
    for (std::size_t r = 0; r < stream_count; ++r)
      if (owned_[r]) static_cast<void>(cudaStreamDestroy(streams_[r]));
    throw;
  }
}

inline void cuda_backend::check_user_stream(cudaStream_t s) const {
  if (s == nullptr || s == cudaStreamLegacy)
    throw error("tide: cuda_backend: the compute stream is the legacy default stream, which cannot be captured "
                "and orders against every blocking stream: create one with cudaStreamCreateWithFlags(&s, "
                "cudaStreamNonBlocking)");
  int dev = -1;
  TIDE_CUDA_CHECK(cudaStreamGetDevice(s, &dev));
  if (dev != device_)
    throw error("tide: cuda_backend: the compute stream belongs to device " + std::to_string(dev) +
                " but the current device is " + std::to_string(device_) +
                ": call cudaSetDevice(" + std::to_string(dev) + ") before constructing the backend");
  unsigned flags = 0;
  TIDE_CUDA_CHECK(cudaStreamGetFlags(s, &flags));
  if (!(flags & cudaStreamNonBlocking) && !opt_.allow_blocking_compute_stream)
    throw error("tide: cuda_backend: the compute stream synchronizes with the legacy default stream (it was "
                "created without cudaStreamNonBlocking, or is cudaStreamPerThread): create it with "
                "cudaStreamNonBlocking, or set cuda_backend_options::allow_blocking_compute_stream");
}

inline void cuda_backend::expect_memory(void const* p, cudaMemoryType want, char const* option, char const* what) const {
  cudaPointerAttributes attr{};
  TIDE_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  if (attr.type != want)
    throw error(std::string("tide: cuda_backend: cuda_backend_options::") + option + " returned " +
                (attr.type == cudaMemoryTypeUnregistered ? "pageable host memory"
                 : attr.type == cudaMemoryTypeManaged  ? "managed memory"
                 : attr.type == cudaMemoryTypeHost     ? "pinned host memory"
                                                       : "device memory") +
                "; the arena needs " + what);
  if (want == cudaMemoryTypeDevice && attr.device != device_)
    throw error(std::string("tide: cuda_backend: cuda_backend_options::") + option + " returned memory of device " +
                std::to_string(attr.device) + ", but the backend runs on device " + std::to_string(device_));
}

inline void cuda_backend::create_timed_events() {
  while (timed_.size() < timed_needed_) {
    cudaEvent_t e = nullptr;
    TIDE_CUDA_CHECK(cudaEventCreate(&e));
    timed_.push_back(e);
  }
}

inline arena_block cuda_backend::reserve_device(std::size_t bytes, std::size_t alignment) {
  if (opt_.device_resource) return device_arena_.reserve(bytes, alignment);
  try {
    return device_arena_.reserve(bytes, alignment);  // throws out_of_memory above the budget
  } catch (cuda_error const& e) {
    if (e.code != cudaErrorMemoryAllocation) throw;
    std::size_t free = 0, total = 0;
    static_cast<void>(cudaMemGetInfo(&free, &total));
    throw out_of_memory("tide: CUDA backend device arena (cudaMalloc failed; the budget is the device's free "
                        "memory)",
                        bytes, free);
  }
}

inline void cuda_backend::fill_timeline() {
  timeline_->clear();
  auto us = [&](cudaEvent_t e) {
    float ms = 0;
    TIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, e));
    return 1000.0 * static_cast<double>(ms);
  };
  for (auto const& m : op_marks_) timeline_->ops.push_back({m.index, m.role, us(m.begin), us(m.end)});
  for (auto const& m : wait_marks_) {
    auto const b = us(m.begin), e = us(m.end);
    if (e > b) timeline_->waits.push_back({m.role, m.index, b, e});  // only waits that blocked
  }
}
}  // namespace tide
