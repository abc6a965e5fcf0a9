#pragma once
//! \file
//! The generic executor: expands a schedule onto any backend and runs one training step
//! per call, calling the user's forward and backward lambdas and collective hooks.
//!
//! Per op, in issue order: the stream waits for the events the op depends on, the op is
//! enqueued (user work through `backend.run`, copies through `backend.copy`), and its event is
//! recorded if anything waits on it. The host thread never blocks while it enqueues; in-flight
//! limits are expressed as stream waits. `enqueue` returns once everything is enqueued (on CUDA
//! the compute stream then carries the step's completion); `wait` synchronizes once and rethrows
//! the first error (a user exception, a debug check, a backend failure); `step` is both. Nothing
//! is allocated per step.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <tide/core/check.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/executor/backend.hpp>
#include <tide/executor/context.hpp>
#include <tide/executor/detail/debug_checks.hpp>
#include <tide/executor/detail/fit_hint.hpp>
#include <tide/executor/detail/step_args.hpp>
#include <tide/executor/hooks.hpp>
#include <tide/executor/turn.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! How an executor runs: its debug checks (on unless `NDEBUG`), their byte patterns, and where
//! it records timelines.
struct executor_options {
#ifdef NDEBUG
  bool debug_checks = false;  //!< guard bytes, poisoning, use-before-prefetch detection
  bool check_schedule = false;  //!< run tide::check_schedule on construction
#else
  bool debug_checks = true;     //!< guard bytes, poisoning, use-before-prefetch detection
  bool check_schedule = true;   //!< run tide::check_schedule on construction
#endif
  std::byte guard_pattern{0xFD};   //!< written past the end of each slot a lambda writes, checked after it
  std::byte poison_pattern{0xDB};  //!< written over dead buffers, so that reading stale data shows
  //! With `debug_checks`, on backends whose device memory the host reads: a recompute must rebuild
  //! its slots, and an advance its carry out, bitwise as the forward wrote them (off for a forward
  //! that is not deterministic).
  bool check_reproduction = true;
  //! With `debug_checks`, on backends whose device memory the host reads: each forward runs twice,
  //! under two poison patterns (`poison_pattern` and its complement), and a byte of a slot or of
  //! the carry out that differs between the runs was never written (or the forward is not
  //! deterministic); the stack's input is poisoned after each step, and a step whose input was not
  //! written since is refused. Doubles the forward's time; the forward must change nothing outside
  //! its slots and carry out (docs/porting.md, "Side effects").
  bool check_unwritten = false;
  //! With `debug_checks`, on backends whose device memory the host reads: refuse a schedule without
  //! guard bytes (`buffer_spec::guard_bytes`), whose writes past a slot or a carry out no check
  //! could see.
  bool require_guard_bytes = false;
  //! Tells the lambdas that tide is measuring them (`tide::calibrate` sets it): `ctx.calibrating`,
  //! so that a backward can skip what must not run then, such as the optimizer's update.
  bool calibrating = false;
  //! In a stage schedule: what the last stage's turn is told to scale each micro-batch's loss by
  //! before it seeds the gradient (`turn_context::loss_scale`), e.g. 1/M to average M micro-batches
  double loss_scale = 1.0;
  //! Every check on: what docs/porting.md's ports run under (with a schedule built with guard
  //! bytes, e.g. `strategy::buffers.guard_bytes = 64`: the peaks count them).
  [[nodiscard]] static constexpr executor_options checked() noexcept {
    executor_options o;
    o.debug_checks = o.check_schedule = o.check_reproduction = o.check_unwritten = o.require_guard_bytes = true;
    return o;
  }
  //! Where the backend records each step's op intervals and blocking waits (nullptr: nowhere);
  //! `executor::record_timeline` changes it later.
  tide::timeline* timeline = nullptr;
};

//! Runs a schedule on a `Backend`, one training step per `step` (or `enqueue` then `wait`), calling
//! the user's forward and backward lambdas and collective hooks (see the file's description).
template <class Backend>
class executor {
  static_assert(check_backend<Backend>());

 public:
  using backend_type = Backend;                                           //!< where the steps run
  using stream_type = typename Backend::stream_type;                      //!< what contexts hold as `stream`
  using forward_context_type = tide::forward_context<stream_type>;        //!< what the forward lambda gets
  using backward_context_type = tide::backward_context<stream_type>;      //!< what the backward lambda gets
  using collective_context_type = tide::collective_context<stream_type>;  //!< what collective hooks get
  using step_end_context_type = tide::step_end_context<stream_type>;      //!< what a hook's `agree` gets
  using turn_context_type = tide::turn_context<stream_type>;              //!< what the turn gets
  using transport_context_type = tide::transport_context<stream_type>;    //!< what a transport's send and receive get

  //! Hands the backend the schedule and its sizes (it creates events and arenas) and attaches
  //! `opt.timeline`. `s` must outlive the executor.
  executor(Backend& backend, schedule_view s, executor_options opt = {});
  //! Waits for a step still enqueued (its errors cannot be thrown from here; its hooks, which may
  //! be gone, are not told).
  ~executor() {
    if (pending_) {
      try {
        backend_.wait_step();
      } catch (...) {
      }
      in_step_.store(false);
    }
  }
  executor(executor const&) = delete;
  executor& operator=(executor const&) = delete;

  //! The schedule it runs, as given on construction.
  schedule_view schedule() const noexcept { return s_; }
  //! The arenas the backend set up for it (their lease is held by the executor).
  tide::arenas memory() const noexcept { return arenas_; }
  //! Where the user writes the stack's input (carry 0) before a step, in device memory; empty
  //! when the stack has no carry. Tide never writes it.
  std::span<std::byte> carry_input() const noexcept {
    return s_.carry.present() ? std::span<std::byte>(arenas_.device + s_.carry.input_offset(), s_.carry.bytes) : std::span<std::byte>{};
  }
  //! The same as elements of `T`; throws `slot_error` if the carry's size or alignment does not fit T.
  template <class T>
  std::span<T> carry_input() const {
    return detail::view_as<T>(carry_input(), [] { return "the stack's input carry"; });
  }
  //! The stack's output (the last layer's carry out), valid from the last forward until the next
  //! step; empty when the stack has no carry.
  std::span<std::byte const> carry_output() const noexcept {
    return s_.carry.present() ? std::span<std::byte const>(arenas_.device + s_.carry.output_offset(), s_.carry.bytes)
                              : std::span<std::byte const>{};
  }
  //! The same as elements of `T`; throws `slot_error` if the carry's size or alignment does not fit T.
  template <class T>
  std::span<T const> carry_output() const {
    return detail::view_as<T const>(carry_output(), [] { return "the stack's output carry"; });
  }
  //! The backend it runs on, for calls of its own (e.g. its stream, between steps).
  Backend& backend() noexcept { return backend_; }
  //! Steps completed so far (waited for), failed ones included.
  std::uint64_t steps() const noexcept { return steps_; }
  //! The options in effect (`record_timeline` updates `timeline`).
  executor_options const& options() const noexcept { return opt_; }

  //! Records the following steps' op intervals and blocking waits into `t` (nullptr: stop). A
  //! step still enqueued is waited for first (the backend writes the timeline while it runs).
  void record_timeline(timeline* t) {
    refuse_reentry("record_timeline");
    wait();
    opt_.timeline = t;
    backend_.record_timeline(t);
  }

  //! Runs one step: forward of every layer, then backward in reverse, with copies, recomputes
  //! and collective hooks as scheduled; returns once it has completed, rethrowing its first
  //! error. After the lambdas, optionally `tide::turn{f}` (the work between the last forward and
  //! the first backward: the head, the loss, the seed gradient; see turn.hpp), then optionally
  //! `tide::hooks{...}`. `step(f, b, more...)` is `enqueue(f, b, more...)` then `wait()`.
  template <class Forward, class Backward, class... More>
  void step(Forward&& forward, Backward&& backward, More&&... more) {
    enqueue(forward, backward, more...);
    wait();
  }

  //! Enqueues one step and returns without waiting for it; `wait()` completes it. On CUDA the
  //! step's work is ordered before whatever is enqueued on the compute stream afterwards. The
  //! lambdas, the turn and the hooks are used until `wait()` returns (the host backend calls them
  //! on its workers), so they are taken by lvalue reference and must outlive it. A step still
  //! pending is waited for first (its error is thrown here). An error while enqueueing drains what
  //! was enqueued and is thrown here.
  template <class Forward, class Backward, class... More>
  void enqueue(Forward& forward, Backward& backward, More&... more) {
    detail::with_step_args([&](auto& turn, auto& hooks) { enqueue_step(forward, backward, turn, hooks); }, more...);
  }

  //! Completes the step `enqueue` started: one synchronization, then the first error of the
  //! step (a user exception, a debug check, a backend failure) is rethrown, then hooks with
  //! `finish_step()` are told. Nothing to do when no step is pending.
  void wait();

  //! True between `enqueue` and `wait`.
  bool pending() const noexcept { return pending_; }

 private:
  template <class Forward, class Backward, class Turn, class Hooks>
  void enqueue_step(Forward& forward, Backward& backward, Turn& turn, Hooks& hooks) {
    // As called: const when the hooks object is (and the hook is not a std::ref).
    using gather_t = std::remove_reference_t<decltype(unwrap(hooks.before_forward))>;
    using regather_t = std::remove_reference_t<decltype(unwrap(hooks.before_backward))>;
    using reduce_t = std::remove_reference_t<decltype(unwrap(hooks.after_backward))>;
    using transport_t = std::remove_reference_t<decltype(unwrap(hooks.transport))>;
    static_assert(detail::check_step_callables<stream_type, Forward, Backward, Turn, gather_t, regather_t, reduce_t>());
    static_assert(detail::check_transport<stream_type, transport_t>());
    refuse_reentry("enqueue");
    check_hooks<gather_t, regather_t, reduce_t>();
    check_transport_given<transport_t>();
    if (pending_) wait();
    if constexpr (Backend::device_memory_is_host_accessible)
      if (opt_.debug_checks) checks_.check_input();
    if (in_step_.exchange(true))
      throw error("tide::executor: a step of this executor is already running (steps are neither reentrant nor "
                  "concurrent)");
    step_flag guard{in_step_};
    auto& gather = unwrap(hooks.before_forward);
    auto& regather = unwrap(hooks.before_backward);
    auto& reduce = unwrap(hooks.after_backward);
    auto& transport = unwrap(hooks.transport);
    forward_ = erase<forward_context_type>(forward);
    backward_ = erase<backward_context_type>(backward);
    if constexpr (std::is_same_v<std::remove_cv_t<Turn>, detail::no_turn>) turn_ = {};
    else turn_ = erase<turn_context_type>(unwrap(turn.run));
    gather_ = erase<collective_context_type>(gather);
    regather_ = erase<collective_context_type>(regather);
    reduce_ = erase<collective_context_type>(reduce);
    if constexpr (!std::is_same_v<std::remove_cv_t<transport_t>, no_hook>) {
      send_ = {std::addressof(transport), [](void* p, transport_context_type const& c) { static_cast<transport_t*>(p)->send(c); }};
      receive_ = {std::addressof(transport), [](void* p, transport_context_type const& c) { static_cast<transport_t*>(p)->receive(c); }};
    } else {
      send_ = receive_ = {};
    }
    finish_ = {{finisher(gather), finisher(regather), finisher(reduce), finisher(transport)}};
    agreers_ = 0;
    add_agreer(gather);
    add_agreer(regather);
    add_agreer(reduce);
    add_agreer(transport);
    finishing_hooks_on_error([&] { issue(); });
    pending_ = true;
    guard.armed = false;
  }

  //! A step, `wait` or `record_timeline` from inside one of this executor's own lambdas or hooks
  //! would wait for the step that is running it: refuse it (the error fails the outer step).
  void refuse_reentry(char const* call) const {
    if (detail::running_callbacks_of == this)
      throw error(std::string("tide::executor: ") + call +
                  " was called from inside one of this executor's own lambdas or hooks, while its step runs: a "
                  "step cannot start or wait for a step from inside itself; return from the lambda and call it "
                  "after wait()");
  }

  //! Each hook the schedule makes room for must be given, and each hook given must have room:
  //! otherwise gradients would go unreduced (or weights ungathered) without a word.
  template <class Gather, class Regather, class Reduce>
  void check_hooks() const;
  //! A stage schedule moves its boundaries through the transport: it must be given, and only there.
  template <class Transport>
  void check_transport_given() const;

  //! Marks this thread as running one of this executor's callbacks for the scope's duration.
  struct callback_scope {
    void const* saved;
    explicit callback_scope(void const* self) noexcept : saved(std::exchange(detail::running_callbacks_of, self)) {}
    ~callback_scope() { detail::running_callbacks_of = saved; }
  };

  //! Runs `f`; when it throws, the hooks still close their step before the error goes on (this
  //! step's own error comes first: they would only report the same failure, agreed with peers).
  template <class F>
  void finishing_hooks_on_error(F&& f) {
    try {
      f();
    } catch (...) {
      try {
        finish_();
      } catch (...) {
      }
      throw;
    }
  }

  //! Clears the "a step is running" flag on scope exit unless disarmed.
  struct step_flag {
    std::atomic<bool>& flag;
    bool armed = true;
    ~step_flag() {
      if (armed) flag.store(false);
    }
  };

  template <class T>
  static auto& unwrap(T& h) noexcept {
    return detail::unwrap_ref(h);
  }

  //! Tells hooks with `finish_step()` that the step has synchronized; they may throw (the NCCL
  //! hooks throw there when a peer's step failed). One object passed as several hooks is told once.
  struct finisher_of {
    void const* obj = nullptr;
    void const* type = nullptr;  // one tag per hook type (const or not): an object is told once
    void (*call)(void const*) = nullptr;  // null: no finish_step()
  };
  template <class T>
  static constexpr char type_tag = 0;
  template <class Hook>
  static finisher_of finisher(Hook& h) {
    if constexpr (requires { h.finish_step(); })
      return {std::addressof(h), &type_tag<std::remove_cv_t<Hook>>,
              [](void const* p) { const_cast<Hook*>(static_cast<Hook const*>(p))->finish_step(); }};
    else
      return {};
  }
  struct finish_hooks {
    std::array<finisher_of, 4> hooks{};
    void operator()() const {
      for (std::size_t i = 0; i < hooks.size(); ++i) {
        if (!hooks[i].call) continue;
        bool told = false;
        for (std::size_t j = 0; j < i; ++j) told |= hooks[j].obj == hooks[i].obj && hooks[j].type == hooks[i].type;
        if (!told) hooks[i].call(hooks[i].obj);
      }
    }
  };

  template <class Ctx>
  struct erased {
    void* obj = nullptr;
    void (*call)(void*, Ctx const&) = nullptr;
    void const* type = nullptr;  // agreers: one tag per hook type, so an object is called once
  };
  template <class Ctx, class F>
  static erased<Ctx> erase(F& f) {
    return {const_cast<void*>(static_cast<void const*>(std::addressof(f))),
            [](void* p, Ctx const& c) { (*static_cast<F*>(p))(c); }};
  }
  //! Notes `h` for the step-end agreement when it has `agree(ctx)`, once per object.
  template <class Hook>
  void add_agreer(Hook& h) {
    if constexpr (detail::agrees_at_step_end<Hook, stream_type>) {
      erased<step_end_context_type> a{const_cast<void*>(static_cast<void const*>(std::addressof(h))),
                                      [](void* p, step_end_context_type const& c) { static_cast<std::remove_const_t<Hook>*>(p)->agree(c); },
                                      &type_tag<std::remove_cv_t<Hook>>};
      for (std::size_t k = 0; k < agreers_; ++k)
        if (agree_[k].obj == a.obj && agree_[k].type == a.type) return;
      agree_[agreers_++] = a;
    }
  }
  //! The step-end agreement: each hook object with `agree` runs on the communication stream after
  //! everything the step enqueued (the rest of a failed step's drain included), told whether this
  //! rank's step failed. Its own failure fails the step.
  void agree_at_step_end() noexcept;
  static void run_agree(void* self, std::uint32_t k) noexcept {
    auto& e = *static_cast<executor*>(self);
    callback_scope scope(&e);
    step_end_context_type c{e.backend_.stream(stream_role::comm), e.failed_.load(std::memory_order_relaxed)};
    try {
      e.agree_[k].call(e.agree_[k].obj, c);
    } catch (...) {
      e.fail(std::current_exception());
    }
  }

  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(error_mutex_);
    if (!error_ && debug_failure_.kind == debug_failure::none) error_ = std::move(e);
    failed_.store(true, std::memory_order_relaxed);
  }

  using debug_failure = detail::debug_failure;
  void fail_debug(debug_failure f) noexcept {
    std::lock_guard lock(error_mutex_);
    if (!error_ && debug_failure_.kind == debug_failure::none) debug_failure_ = f;
    failed_.store(true, std::memory_order_relaxed);
  }
  [[noreturn]] void throw_debug_failure() { checks_.throw_failure(std::exchange(debug_failure_, {})); }
  static void report_debug(void* self, debug_failure f) noexcept { static_cast<executor*>(self)->fail_debug(f); }

  void issue();

  void complete();

  void issue_op(std::uint32_t i);

  template <class Ctx>
  Ctx layer_ctx(std::uint32_t layer, stream_role role) {
    Ctx c;
    c.layer = s_.stage.layer_of(layer);
    c.micro_batch = s_.stage.micro_batch_of(layer);
    c.chunk = s_.stage.chunk_of(layer);
    c.stream = backend_.stream(role);
    c.bindings = s_.slots_of(layer);
    c.type_name = s_.layers[layer].type_name;
    c.type_index = s_.layers[layer].type_index;
    c.device = arenas_.device;
    c.calibrating = opt_.calibrating;
    return c;
  }
  template <class Ctx>
  Ctx layer_ctx(op const& o) {
    auto c = layer_ctx<Ctx>(o.layer, o.stream);
    if (o.carry_in != no_carry) c.carry_in_data = arenas_.device + o.carry_in;
    if (o.carry_out != no_carry) c.carry_out_data = arenas_.device + o.carry_out;
    // A recompute's carry out is scratch tide lends (nobody reads it), so a forward runs unchanged.
    if (o.kind == op_kind::recompute && s_.carry.present() && s_.recompute_carry_offset(o.layer) != no_carry)
      c.carry_out_data = arenas_.device + s_.recompute_carry_offset(o.layer);
    c.carry_bytes = s_.carry.bytes;
    if constexpr (requires { c.gradient_data; })
      if (s_.stage.present()) c.gradient_data = arenas_.device + s_.stage.gradient_at(s_.stage.unit_of(o.layer));
    return c;
  }

  static void run_op(void* self, std::uint32_t i) noexcept { static_cast<executor*>(self)->run(i); }
  void run(std::uint32_t i) noexcept;

  Backend& backend_;
  schedule_view s_;
  executor_options opt_;
  tide::arenas arenas_;
  detail::debug_checks checks_;
  erased<forward_context_type> forward_;
  erased<backward_context_type> backward_;
  erased<turn_context_type> turn_;  // call == nullptr: no turn
  std::optional<turn_span> turn_timed_;  // this step's turn, where the backend's step clock times it
  erased<collective_context_type> gather_;
  erased<collective_context_type> regather_;
  erased<collective_context_type> reduce_;
  finish_hooks finish_;
  std::array<erased<step_end_context_type>, 4> agree_{};  // hook objects with agree(ctx), once each
  erased<transport_context_type> send_;     // the transport's send, or null
  erased<transport_context_type> receive_;  // its receive
  std::uint32_t agreers_ = 0;
  bool pending_ = false;  // enqueued, not yet waited for
  std::mutex error_mutex_;
  std::exception_ptr error_;
  debug_failure debug_failure_;
  std::uint32_t hook_enqueued_ = 0;  // the last op handed to backend.run (issue thread only)
  std::atomic<bool> failed_{false};
  std::atomic<bool> in_step_{false};
  std::uint64_t steps_ = 0;
};

}  // namespace tide

#include <tide/executor/detail/executor_impl.hpp>  // the longer member functions
