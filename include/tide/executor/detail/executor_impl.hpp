#pragma once
// executor's longer member functions (the step's issue loop, an op's run, the hooks' checks), out
// of the class so that <tide/executor/executor.hpp> reads as API. Included at its end; not to be
// included on its own.

#include <tide/executor/executor.hpp>

namespace tide {

template <class Backend>
executor<Backend>::executor(Backend& backend, schedule_view s, executor_options opt)
    : backend_(backend), s_(s), opt_(opt), checks_(s, opt.guard_pattern, opt.poison_pattern, opt.check_reproduction) {
  if (opt_.check_schedule) check_schedule(s_);
  if constexpr (Backend::device_memory_is_host_accessible)
    if (opt_.debug_checks && (opt_.guard_pattern == opt_.poison_pattern || (opt_.check_unwritten && opt_.guard_pattern == ~opt_.poison_pattern)))
      throw debug_check_error("tide::executor: executor_options::guard_pattern is the poison pattern" +
                              std::string(opt_.guard_pattern == opt_.poison_pattern ? "" : "'s complement (check_unwritten's second pattern)") +
                              ": the debug checks could not tell a guard byte from poison; give them different bytes (the defaults are 0xFD and 0xDB)");
  if constexpr (Backend::device_memory_is_host_accessible)
    if (opt_.debug_checks && opt_.require_guard_bytes && s_.buffers.guard_bytes == 0)
      throw debug_check_error(
          "tide::executor: executor_options::require_guard_bytes is on, but the schedule has no guard bytes, so no check "
          "could see a write past a slot or a carry out: build it with buffer_spec::guard_bytes > 0 (strategy::buffers = "
          "{.guard_bytes = 64}, or tide::debug_buffers; the peaks count them), or turn require_guard_bytes off");
  if constexpr (!storage_backend<Backend>)
    if (s_.arena.storage_bytes > 0)
      throw error("tide::executor: the schedule stores " + std::to_string(s_.arena.storage_bytes) +
                  " bytes of spilled slots or disk snapshots in a file, but this backend has no storage tier "
                  "(tide::storage_backend): run it on host_backend, cuda_backend or sim_backend, or spill nothing");
  if (opt_.timeline) backend_.record_timeline(opt_.timeline);
  // `arenas_` holds the lease on the blocks for as long as this executor lives.
  try {
    arenas_ = backend_.setup(backend_setup::of(s_));
  } catch (out_of_memory const& e) {
    // Say how to fit: the carry's share, then each way (offload, remat, carries, spill, the
    // planner) with what it would take on this stack.
    std::string more;
    if (s_.carry.present()) {
      auto const& c = s_.carry;
      more = "; the carry '" + std::string(c.name) + "' (" + std::to_string(c.bytes) + " bytes) takes " +
             std::to_string(s_.arena.carry_bytes) + " device bytes in " + std::to_string(c.device_buffers) +
             " buffers and " + std::to_string(s_.arena.host_carry_bytes) + " host bytes in " + std::to_string(c.host_snapshots) +
             " snapshots: store fewer carries (checkpoint_spec::device_snapshots, host_snapshots)";
    }
    // Which arena: the pools name theirs ("... pinned host arena"); the room is the budget less
    // what other live executors hold (the request counts them).
    bool const host = std::string_view(e.what()).find("host arena") != std::string_view::npos;
    auto const mine = host ? s_.arena.host_bytes : s_.arena.device_bytes;
    auto const others = e.requested > mine ? e.requested - mine : 0;
    auto const room = e.budget > others ? e.budget - others : 0;
    throw out_of_memory(e, more + detail::fit_hint(s_, host, room, storage_backend<Backend>));
  }
  checks_.attach(arenas_.device, arenas_.host, &failed_, this, &report_debug);
  if constexpr (Backend::device_memory_is_host_accessible) {
    checks_.enable_unwritten(opt_.debug_checks && opt_.check_unwritten);
    checks_.poison_input();
  }
}

// Each hook the schedule makes room for must be given, and each hook given must have room:
// otherwise gradients would go unreduced (or weights ungathered) without a word.
template <class Backend>
template <class Gather, class Regather, class Reduce>
void executor<Backend>::check_hooks() const {
  auto const& c = s_.collectives;
  auto check = [](bool room, bool given, char const* name, char const* what) {
    if (room && !given)
      throw error(std::string("tide::executor: the schedule makes room for a ") + what + " hook (collective_spec::" +
                  name + ") but the step was given none: pass it, tide::hooks{." + name +
                  " = ...}, or build the schedule without it");
    if (!room && given)
      throw error(std::string("tide::executor: the step was given a ") + what + " hook (hooks::" + name +
                  ") but the schedule makes no room for it, so it would never be called: build the schedule with "
                  "collective_spec::" + name + " (tide::collectives<tide::" + name + ">), or drop the hook");
  };
  check(c.before_forward, !std::is_same_v<std::remove_cv_t<Gather>, no_hook>, "before_forward", "gather");
  check(c.before_backward, !std::is_same_v<std::remove_cv_t<Regather>, no_hook>, "before_backward", "regather");
  check(c.after_backward, !std::is_same_v<std::remove_cv_t<Reduce>, no_hook>, "after_backward", "reduce");
}

template <class Backend>
template <class Transport>
void executor<Backend>::check_transport_given() const {
  bool const given = !std::is_same_v<std::remove_cv_t<Transport>, no_hook>;
  if (s_.stage.present() && !given)
    throw error("tide::executor: the schedule is a pipeline stage's (build_stage_schedule), whose boundary tensors and "
                "gradients go through a transport, but the step was given none: pass tide::hooks{.transport = t} "
                "(tide::mpi_transport, or your own with send(ctx) and receive(ctx))");
  if (!s_.stage.present() && given)
    throw error("tide::executor: the step was given a transport (hooks::transport), but the schedule is no pipeline "
                "stage's, so it would never be called: build it with tide::build_stage_schedule, or drop the transport");
}

template <class Backend>
void executor<Backend>::wait() {
  refuse_reentry("wait");
  if (!pending_) return;
  pending_ = false;
  step_flag guard{in_step_};
  finishing_hooks_on_error([&] { complete(); });
  finish_();
}

template <class Backend>
void executor<Backend>::agree_at_step_end() noexcept {
  for (std::uint32_t k = 0; k < agreers_; ++k) {
    try {
      backend_.run_after_all(stream_role::comm, task{&run_agree, this, k});
    } catch (...) {
      fail(std::current_exception());
    }
  }
}

template <class Backend>
void executor<Backend>::issue() {
  error_ = nullptr;
  debug_failure_ = {};
  failed_.store(false, std::memory_order_relaxed);
  checks_.begin_step();
  turn_timed_.reset();
  backend_.begin_step(s_);
  std::exception_ptr issue_error;
  bool earlier_failure = false;  // a lambda or debug check had failed when issuing failed
  auto const n = static_cast<std::uint32_t>(s_.ops.size());
  std::uint32_t issued = 0;
  hook_enqueued_ = n;
  try {
    for (; issued < n; ++issued) issue_op(issued);
  } catch (...) {
    issue_error = std::current_exception();  // still drain what was enqueued
    {
      std::lock_guard lock(error_mutex_);
      earlier_failure = error_ || debug_failure_.kind != debug_failure::none;
    }
    failed_.store(true, std::memory_order_relaxed);
    // Collective hooks of ops never issued still run, told that the step failed, so that
    // distributed peers waiting in a collective learn of it instead of hanging. They go
    // through the backend in stream order (without their waits: the step is abandoned), so
    // the one synchronization below also covers what they enqueue: nothing still runs when
    // the error reaches the caller.
    // The failing op's own hook counts as issued once the backend took it.
    for (std::uint32_t i = hook_enqueued_ == issued ? issued + 1 : issued; i < n; ++i) {
      auto const& o = s_.ops[i];
      if (!is_collective(o.kind) && !is_boundary(o.kind)) continue;
      try {
        backend_.run(o.stream, i, o, task{&run_op, this, i});
      } catch (...) {
        fail(std::current_exception());
      }
    }
  }
  agree_at_step_end();
  try {
    backend_.end_step();
  } catch (...) {
    if (!issue_error) issue_error = std::current_exception();
  }
  if (issue_error) {
    // Nothing may still run when the error reaches the caller.
    try {
      backend_.wait_step();
    } catch (...) {
    }
    ++steps_;
    // The root cause first, as in `complete`: a lambda that threw (or a debug check that
    // failed) before the backend's call failed is what the caller must see; on CUDA the
    // backend's error is often its aftermath (a faulted kernel makes later calls fail).
    if (earlier_failure && error_) issue_error = std::exchange(error_, nullptr);
    else if (earlier_failure && debug_failure_.kind != debug_failure::none) throw_debug_failure();
    error_ = nullptr;
    std::rethrow_exception(issue_error);
  }
}

template <class Backend>
void executor<Backend>::complete() {
  std::exception_ptr backend_error;
  try {
    backend_.wait_step();
  } catch (...) {
    backend_error = std::current_exception();
  }
  // The user writes the next step's input: what is not written then shows (check_unwritten).
  if constexpr (Backend::device_memory_is_host_accessible) checks_.poison_input();
  if (opt_.timeline && turn_timed_) {  // the turn as its own interval, out of the last forward's
    opt_.timeline->turn = turn_timed_;
    for (auto& sp : opt_.timeline->ops)
      if (auto const& o = s_.ops[sp.op]; o.kind == op_kind::forward && o.layer + 1 == s_.layer_count())
        sp.end_us = std::min(sp.end_us, turn_timed_->begin_us);
  }
  ++steps_;
  // The step's own first failure comes before what the backend reports about its aftermath.
  if (error_) {
    auto e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
  if (debug_failure_.kind != debug_failure::none) throw_debug_failure();
  if (backend_error) std::rethrow_exception(backend_error);
}

template <class Backend>
void executor<Backend>::issue_op(std::uint32_t i) {
  auto const& o = s_.ops[i];
  auto const role = o.stream;
  for (auto w : s_.waits_of(o)) backend_.wait(role, static_cast<std::uint32_t>(s_.ops[w].event));
  bool const debug = opt_.debug_checks;
  if (debug) checks_.before(backend_, role, o, i);
  switch (o.kind) {
    case op_kind::forward:
    case op_kind::recompute:
    case op_kind::advance:
    case op_kind::backward:
    case op_kind::gather:
    case op_kind::regather:
    case op_kind::reduce:
    case op_kind::send:
    case op_kind::receive:
      backend_.run(role, i, o, task{&run_op, this, i});
      hook_enqueued_ = i;
      break;
    case op_kind::offload:
      backend_.copy(role, i, o, arenas_.host + o.host_offset, arenas_.device + o.device_offset, o.bytes);
      break;
    case op_kind::prefetch:
      backend_.copy(role, i, o, arenas_.device + o.device_offset, arenas_.host + o.host_offset, o.bytes);
      break;
    case op_kind::store:
      if constexpr (storage_backend<Backend>) backend_.store(role, i, o, arenas_.host + o.host_offset);
      break;
    case op_kind::load:
      if constexpr (storage_backend<Backend>) backend_.load(role, i, o, arenas_.host + o.host_offset);
      break;
  }
  if (debug) checks_.after(backend_, role, o, i);
  if (o.event >= 0) backend_.record(role, static_cast<std::uint32_t>(o.event));
}

template <class Backend>
void executor<Backend>::run(std::uint32_t i) noexcept {
  auto const& o = s_.ops[i];
  bool const failed = failed_.load(std::memory_order_relaxed);
  // Drain: skip user work after a failure, but still call collective hooks (told so), so a
  // distributed peer is informed rather than left waiting.
  if (failed && !is_collective(o.kind) && !is_boundary(o.kind)) return;
  callback_scope scope(this);
  try {
    switch (o.kind) {
      case op_kind::forward:
      case op_kind::recompute:
      case op_kind::advance: {
        auto c = layer_ctx<forward_context_type>(o);
        c.mode = o.kind == op_kind::forward     ? forward_mode::forward
                 : o.kind == op_kind::recompute ? forward_mode::recompute
                                                : forward_mode::advance;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        c.recompute = o.kind != op_kind::forward;  // the 0.2 spellings, until they go
        c.advance = o.kind == op_kind::advance;
#pragma GCC diagnostic pop
        forward_.call(forward_.obj, c);
        if constexpr (Backend::device_memory_is_host_accessible)
          if (o.kind == op_kind::forward && opt_.debug_checks && opt_.check_unwritten)
            checks_.unwritten_rerun(i, [&] { forward_.call(forward_.obj, c); });
        // The turn: right after the last forward, in its op (on the compute stream, before
        // every recompute and backward), so that it needs no op of its own in the program.
        if (turn_.call && o.kind == op_kind::forward && (s_.stage.present() ? s_.stage.ends_model(o.layer) : s_.last_layer(o.layer))) {
          turn_context_type t{c.layer, c.stream, c.carry_out_data, s_.carry.bytes, opt_.calibrating};
          t.micro_batch = c.micro_batch;
          t.loss_scale = opt_.loss_scale;
          if (s_.stage.present()) t.gradient_data = arenas_.device + s_.stage.gradient_at(s_.stage.unit_of(o.layer));
          // Timed on its own where the backend's step clock can be read (`complete` moves it into
          // the timeline and ends the last forward's interval where the turn began).
          if constexpr (requires { backend_.step_clock_us(); }) {
            if (opt_.timeline) {
              auto const begin = backend_.step_clock_us();
              turn_.call(turn_.obj, t);
              turn_timed_ = turn_span{begin, backend_.step_clock_us()};
              break;
            }
          }
          turn_.call(turn_.obj, t);
        }
        break;
      }
      case op_kind::backward: {
        auto c = layer_ctx<backward_context_type>(o);
        backward_.call(backward_.obj, c);
        break;
      }
      case op_kind::gather:
      case op_kind::regather:
      case op_kind::reduce: {
        collective_context_type c{o.layer, backend_.stream(o.stream), o.kind, failed};
        auto const& hook = o.kind == op_kind::gather ? gather_ : o.kind == op_kind::regather ? regather_ : reduce_;
        hook.call(hook.obj, c);
        break;
      }
      case op_kind::send:
      case op_kind::receive: {
        auto const m = s_.stage.micro_batch_of(o.layer);
        auto const pair = o.chunks < 2 ? 0 : o.chunk + 1 < o.chunks ? 1 : 2;
        transport_context_type c{backend_.stream(o.stream), o.kind, o.slot == gradient_slot, m, s_.stage.spec.stage,
                                 s_.stage.spec.stages, arenas_.device + o.device_offset, o.bytes,
                                 static_cast<std::uint8_t>(pair), failed, &failed_};
        c.chunk = s_.stage.chunk_of(o.layer);
        c.virtual_stages = s_.stage.spec.virtual_stages;
        auto const& t = o.kind == op_kind::send ? send_ : receive_;
        t.call(t.obj, c);
        break;
      }
      default: break;
    }
  } catch (...) {
    fail(std::current_exception());
  }
}
}  // namespace tide
