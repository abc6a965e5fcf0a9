#pragma once
//! \file The generic executor: expands a schedule onto any backend and runs one training step
//! per call, calling the user's forward, backward and collective lambdas.
//!
//! Per op, in issue order: the stream waits for the events the op depends on, the op is
//! enqueued (user work through `backend.run`, copies through `backend.copy`), and its event is
//! recorded if anything waits on it. The host thread never blocks inside a step; in-flight limits
//! are expressed as stream waits. A step ends with one synchronization, after which the first
//! error (a user exception, a debug check, a backend failure) is rethrown. Nothing is allocated
//! per step.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <tide/core/check.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/executor/backend.hpp>
#include <tide/executor/context.hpp>

namespace tide {

struct executor_options {
#ifdef NDEBUG
  bool debug_checks = false;  //!< guard bytes, poisoning, use-before-reload detection
  bool check_schedule = false;  //!< run tide::check_schedule on construction
#else
  bool debug_checks = true;
  bool check_schedule = true;
#endif
  std::byte guard_pattern{0xFD};
  std::byte poison_pattern{0xDB};
};

//! Marks an absent collective hook.
struct no_hook {
  template <class Ctx>
  void operator()(Ctx const&) const noexcept {}
};

template <class Backend>
class executor {
  static_assert(check_backend<Backend>());

 public:
  using backend_type = Backend;
  using stream_type = typename Backend::stream_type;
  using forward_context_type = tide::forward_context<stream_type>;
  using backward_context_type = tide::backward_context<stream_type>;
  using collective_context_type = tide::collective_context<stream_type>;

  //! Binds the backend to `s` when it has `bind`, then sets it up (events, arenas). `s` must
  //! outlive the executor.
  executor(Backend& backend, schedule_view s, executor_options opt = {})
      : backend_(backend), s_(s), opt_(opt), reloads_(s.slots.size()), first_prefetch_(s.slots.size(), 0) {
    if (opt_.check_schedule) check_schedule(s_);
    for (std::uint32_t i = static_cast<std::uint32_t>(s_.ops.size()); i-- > 0;) {
      auto const& o = s_.ops[i];
      if (o.kind == op_kind::prefetch) first_prefetch_[s_.layers[o.layer].first_slot + o.slot] = i;
    }
    // The backend sees the schedule whatever the caller did (the sim checks its cost table here).
    if constexpr (requires { backend_.bind(s_); }) backend_.bind(s_);
    // `arenas_` holds the lease on the blocks for as long as this executor lives.
    arenas_ = backend_.setup({.ops = s_.ops.size(),
                              .events = s_.event_count,
                              .device_bytes = s_.arena.device_bytes,
                              .host_bytes = s_.arena.host_bytes,
                              .waits = s_.waits.size(),
                              .device_alignment = s_.buffers.device_alignment,
                              .host_alignment = s_.buffers.host_alignment});
  }
  executor(executor const&) = delete;
  executor& operator=(executor const&) = delete;

  schedule_view schedule() const noexcept { return s_; }
  tide::arenas memory() const noexcept { return arenas_; }
  Backend& backend() noexcept { return backend_; }
  std::uint64_t steps() const noexcept { return steps_; }
  executor_options const& options() const noexcept { return opt_; }

  //! Runs one step: forward of every layer, then backward in reverse, with copies, recomputes
  //! and collectives as scheduled. Rethrows the first error after every stream has drained.
  template <class Forward, class Backward, class Gather = no_hook, class Collective = no_hook>
  void step(Forward&& forward, Backward&& backward, Gather&& gather = {}, Collective&& collective = {}) {
    static_assert(std::is_invocable_v<Forward&, forward_context_type const&>,
                  "tide::executor::step: the forward lambda must be callable as f(tide::forward_context<Stream> const&)");
    static_assert(std::is_invocable_v<Backward&, backward_context_type const&>,
                  "tide::executor::step: the backward lambda must be callable as f(tide::backward_context<Stream> const&)");
    static_assert(std::is_invocable_v<Gather&, collective_context_type const&>,
                  "tide::executor::step: the gather hook must be callable as f(tide::collective_context<Stream> const&)");
    static_assert(std::is_invocable_v<Collective&, collective_context_type const&>,
                  "tide::executor::step: the collective hook must be callable as f(tide::collective_context<Stream> const&)");
    if (in_step_.exchange(true))
      throw error("tide::executor::step: a step of this executor is already running (steps are neither reentrant "
                  "nor concurrent)");
    struct leave {
      std::atomic<bool>& flag;
      ~leave() { flag.store(false); }
    } guard{in_step_};
    forward_ = erase<forward_context_type>(forward);
    backward_ = erase<backward_context_type>(backward);
    gather_ = erase<collective_context_type>(gather);
    collective_ = erase<collective_context_type>(collective);
    try {
      issue();
    } catch (...) {
      // This step's own error comes first; the hooks still close their step (and would only
      // report the same failure, agreed with the peers).
      try {
        finish_hooks(gather, collective);
      } catch (...) {
      }
      throw;
    }
    finish_hooks(gather, collective);
  }

 private:
  //! A hook with `finish_step()` is told once the step has synchronized; it may throw (the NCCL
  //! hooks throw there when a peer's step failed). One object passed as both hooks is told once.
  template <class Gather, class Collective>
  static void finish_hooks(Gather& gather, Collective& collective) {
    if constexpr (requires { gather.finish_step(); }) gather.finish_step();
    if constexpr (requires { collective.finish_step(); }) {
      if constexpr (std::is_same_v<std::remove_cvref_t<Gather>, std::remove_cvref_t<Collective>>) {
        if (static_cast<void const*>(std::addressof(gather)) == static_cast<void const*>(std::addressof(collective)))
          return;
      }
      collective.finish_step();
    }
  }

  template <class Ctx>
  struct erased {
    void* obj = nullptr;
    void (*call)(void*, Ctx const&) = nullptr;
  };
  template <class Ctx, class F>
  static erased<Ctx> erase(F& f) {
    return {const_cast<void*>(static_cast<void const*>(std::addressof(f))),
            [](void* p, Ctx const& c) { (*static_cast<F*>(p))(c); }};
  }

  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(error_mutex_);
    if (!error_ && debug_failure_.kind == debug_failure::none) error_ = std::move(e);
    failed_.store(true, std::memory_order_relaxed);
  }

  //! A debug check's failure, recorded without allocating: checks run as host tasks (on CUDA,
  //! on the runtime's callback thread, where an exception would terminate); the message is
  //! formatted on the calling thread once the step has synchronized.
  struct debug_failure {
    enum kind_t : std::uint8_t { none, guard, reload } kind = none;
    std::uint32_t op = 0;
    std::uint32_t slot = 0;  //!< index into the schedule's slot bindings
    std::size_t detail = 0;  //!< guard: the overwritten byte; reload: the first prefetch op
  };
  void fail_debug(debug_failure f) noexcept {
    std::lock_guard lock(error_mutex_);
    if (!error_ && debug_failure_.kind == debug_failure::none) debug_failure_ = f;
    failed_.store(true, std::memory_order_relaxed);
  }
  [[noreturn]] void throw_debug_failure() {
    auto const f = std::exchange(debug_failure_, {});
    auto const& o = s_.ops[f.op];
    auto const& b = s_.slots[f.slot];
    if (f.kind == debug_failure::guard)
      throw debug_check_error("tide: the " + std::string(to_string(o.kind)) + " lambda of layer " +
                              std::to_string(o.layer) + " wrote past the end of slot '" + std::string(b.name) + "' (" +
                              std::to_string(b.bytes) + " bytes): guard byte " + std::to_string(f.detail) +
                              " was overwritten");
    throw debug_check_error("tide: op #" + std::to_string(f.op) + " (" + std::string(to_string(o.kind)) + " of layer " +
                            std::to_string(o.layer) + ") reads slot '" + std::string(b.name) +
                            "' whose reload has not completed (op #" + std::to_string(f.detail) + " prefetch, " +
                            std::to_string(s_.ops[f.detail].chunks) + " chunk(s)): the program lacks a wait on it");
  }

  void issue() {
    error_ = nullptr;
    debug_failure_ = {};
    failed_.store(false, std::memory_order_relaxed);
    for (auto& r : reloads_) r.store(0, std::memory_order_relaxed);
    backend_.begin_step();
    std::exception_ptr issue_error;
    auto const n = static_cast<std::uint32_t>(s_.ops.size());
    std::uint32_t issued = 0;
    hook_enqueued_ = n;
    try {
      for (; issued < n; ++issued) issue_op(issued);
    } catch (...) {
      issue_error = std::current_exception();  // still drain what was enqueued
      failed_.store(true, std::memory_order_relaxed);
      // Collective hooks of ops never issued still run, told that the step failed, so that
      // distributed peers waiting in a collective learn of it instead of hanging. They go
      // through the backend in stream order (without their waits: the step is abandoned), so
      // the one synchronization below also covers what they enqueue: nothing still runs when
      // the error reaches the caller.
      // The failing op's own hook counts as issued once the backend took it.
      for (std::uint32_t i = hook_enqueued_ == issued ? issued + 1 : issued; i < n; ++i) {
        auto const& o = s_.ops[i];
        if (o.kind != op_kind::gather && o.kind != op_kind::collective) continue;
        try {
          backend_.run(o.stream, i, o, task{&run_op, this, i});
        } catch (...) {
          fail(std::current_exception());
        }
      }
    }
    backend_.end_step();
    ++steps_;
    if (issue_error) std::rethrow_exception(issue_error);
    if (error_) {
      auto e = std::exchange(error_, nullptr);
      std::rethrow_exception(e);
    }
    if (debug_failure_.kind != debug_failure::none) throw_debug_failure();
  }

  void issue_op(std::uint32_t i) {
    auto const& o = s_.ops[i];
    auto const role = o.stream;
    for (auto w : s_.waits_of(o)) backend_.wait(role, static_cast<std::uint32_t>(s_.ops[w].event));
    bool const debug = opt_.debug_checks;
    if (debug) debug_before(role, o, i);
    switch (o.kind) {
      case op_kind::forward:
      case op_kind::recompute:
      case op_kind::backward:
      case op_kind::gather:
      case op_kind::collective:
        backend_.run(role, i, o, task{&run_op, this, i});
        hook_enqueued_ = i;
        break;
      case op_kind::offload:
        backend_.copy(role, i, o, arenas_.host + o.host_offset, arenas_.device + o.device_offset, o.bytes);
        break;
      case op_kind::prefetch:
        backend_.copy(role, i, o, arenas_.device + o.device_offset, arenas_.host + o.host_offset, o.bytes);
        break;
    }
    if (debug) debug_after(role, o, i);
    if (o.event >= 0) backend_.record(role, static_cast<std::uint32_t>(o.event));
  }

  template <class Ctx>
  Ctx layer_ctx(std::uint32_t layer, stream_role role) {
    Ctx c;
    c.layer = layer;
    c.stream = backend_.stream(role);
    c.bindings = s_.slots_of(layer);
    c.type_name = s_.layers[layer].type_name;
    c.device = arenas_.device;
    return c;
  }

  static void run_op(void* self, std::uint32_t i) noexcept { static_cast<executor*>(self)->run(i); }
  void run(std::uint32_t i) noexcept {
    auto const& o = s_.ops[i];
    bool const failed = failed_.load(std::memory_order_relaxed);
    // Drain: skip user work after a failure, but still call collective hooks (told so), so a
    // distributed peer is informed rather than left waiting.
    if (failed && o.kind != op_kind::gather && o.kind != op_kind::collective) return;
    try {
      switch (o.kind) {
        case op_kind::forward:
        case op_kind::recompute: {
          auto c = layer_ctx<forward_context_type>(o.layer, o.stream);
          c.recompute = o.kind == op_kind::recompute;
          forward_.call(forward_.obj, c);
          break;
        }
        case op_kind::backward: {
          auto c = layer_ctx<backward_context_type>(o.layer, o.stream);
          backward_.call(backward_.obj, c);
          break;
        }
        case op_kind::gather:
        case op_kind::collective: {
          collective_context_type c{o.layer, backend_.stream(o.stream), o.kind, failed};
          (o.kind == op_kind::gather ? gather_ : collective_).call((o.kind == op_kind::gather ? gather_ : collective_).obj, c);
          break;
        }
        default: break;
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // ---- debug checks, run as host tasks in stream order ------------------------------------
  static constexpr bool host_visible = Backend::device_memory_is_host_accessible;

  void debug_before(stream_role role, op const& o, std::uint32_t i) {
    if (o.kind == op_kind::backward || o.kind == op_kind::recompute) backend_.host_task(role, task{&check_reloads, this, i});
    if constexpr (host_visible)
      if (s_.buffers.guard_bytes > 0 && (o.kind == op_kind::forward || o.kind == op_kind::recompute))
        backend_.host_task(role, task{&write_guards, this, i});
  }
  void debug_after(stream_role role, op const& o, std::uint32_t i) {
    if (o.kind == op_kind::prefetch) backend_.host_task(role, task{&count_reload, this, i});
    if constexpr (host_visible) {
      if (s_.buffers.guard_bytes > 0 && (o.kind == op_kind::forward || o.kind == op_kind::recompute))
        backend_.host_task(role, task{&check_guards, this, i});
      if (o.kind == op_kind::forward || o.kind == op_kind::backward || o.kind == op_kind::offload)
        backend_.host_task(role, task{&poison, this, i});
    }
  }

  bool guarded(op const& o, slot_binding const& b) const {
    return o.kind == op_kind::forward || b.where == placement::remat;
  }
  std::size_t offset_for(op const& o, slot_binding const& b) const {
    return o.kind == op_kind::forward ? b.forward_offset : b.backward_offset;
  }
  static void write_guards(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<executor*>(self);
    auto const& o = e.s_.ops[i];
    for (auto const& b : e.s_.slots_of(o.layer))
      if (e.guarded(o, b))
        std::memset(e.arenas_.device + e.offset_for(o, b) + b.bytes, static_cast<int>(e.opt_.guard_pattern),
                    e.s_.buffers.guard_bytes);
  }
  static void check_guards(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<executor*>(self);
    auto const& o = e.s_.ops[i];
    for (auto const& b : e.s_.slots_of(o.layer)) {
      if (!e.guarded(o, b)) continue;
      auto const* g = e.arenas_.device + e.offset_for(o, b) + b.bytes;
      for (std::size_t k = 0; k < e.s_.buffers.guard_bytes; ++k)
        if (g[k] != e.opt_.guard_pattern) {
          e.fail_debug({debug_failure::guard, i, static_cast<std::uint32_t>(&b - e.s_.slots.data()), k});
          return;
        }
    }
  }
  static void count_reload(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<executor*>(self);
    auto const& o = e.s_.ops[i];
    e.reloads_[e.s_.layers[o.layer].first_slot + o.slot].fetch_add(1, std::memory_order_release);
  }
  static void check_reloads(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<executor*>(self);
    auto const& o = e.s_.ops[i];
    auto const first = e.s_.layers[o.layer].first_slot;
    auto const slots = e.s_.slots_of(o.layer);
    for (std::uint32_t k = 0; k < slots.size(); ++k) {
      if (slots[k].where != placement::offload) continue;
      auto const p = e.first_prefetch_[first + k];
      auto const chunks = e.s_.ops[p].chunks;
      if (e.reloads_[first + k].load(std::memory_order_acquire) < chunks) {
        e.fail_debug({debug_failure::reload, i, first + k, p});
        return;
      }
    }
  }
  static void poison(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<executor*>(self);
    // After a failure (a reload check among them) the program may no longer be ordered: poison
    // nothing rather than race with a copy still running.
    if (e.failed_.load(std::memory_order_relaxed)) return;
    auto const& o = e.s_.ops[i];
    auto const p = static_cast<int>(e.opt_.poison_pattern);
    if (o.kind == op_kind::offload) {  // the source chunk is dead once copied out
      std::memset(e.arenas_.device + o.device_offset, p, o.bytes);
      return;
    }
    for (auto const& b : e.s_.slots_of(o.layer)) {
      if (o.kind == op_kind::forward && b.where == placement::remat)
        std::memset(e.arenas_.device + b.forward_offset, p, b.bytes);  // forward scratch is dead
      if (o.kind == op_kind::backward) std::memset(e.arenas_.device + b.backward_offset, p, b.bytes);
    }
  }

  Backend& backend_;
  schedule_view s_;
  executor_options opt_;
  tide::arenas arenas_;
  std::vector<std::atomic<std::uint32_t>> reloads_;
  std::vector<std::uint32_t> first_prefetch_;
  erased<forward_context_type> forward_;
  erased<backward_context_type> backward_;
  erased<collective_context_type> gather_;
  erased<collective_context_type> collective_;
  std::mutex error_mutex_;
  std::exception_ptr error_;
  debug_failure debug_failure_;
  std::uint32_t hook_enqueued_ = 0;  // the last op handed to backend.run (issue thread only)
  std::atomic<bool> failed_{false};
  std::atomic<bool> in_step_{false};
  std::uint64_t steps_ = 0;
};

}  // namespace tide
