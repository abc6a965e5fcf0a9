#pragma once
//! \file
//! `tide::hooks`: the collective hooks of a step, by name, in the order they run
//! (`before_forward`, `before_backward`, `after_backward`), and what the executor asks of them.

#include <functional>
#include <type_traits>

#include <tide/core/collectives.hpp>
#include <tide/executor/context.hpp>
#include <tide/executor/transport.hpp>

namespace tide {

//! An absent collective hook.
struct no_hook {
  //! Does nothing.
  template <class Ctx>
  void operator()(Ctx const&) const noexcept {}
};

//! The collective hooks of a step, by name: `tide::hooks{.after_backward = reduce_grads}`. Each is
//! called as `h(tide::collective_context<Stream> const&)` on the communication stream, where the
//! schedule's `collective_spec` made room for it: `before_forward` (a gather), `before_backward`
//! (a regather before the layer's recompute and backward), `after_backward` (a reduce). A hook that
//! keeps state across the step (an NCCL adapter) is passed as `std::ref(h)`. A hook object with
//! `agree(tide::step_end_context<Stream> const&)` is called once per step on the communication
//! stream after all of the step's work, even after a failure (it agrees with its peers on whether
//! any rank failed); one with `finish_step()` is told once the step has synchronized. One object
//! passed as several hooks is called once for each.
//! Fields are declared in the order the hooks run in a layer's life (0.3: `before_backward` moved
//! before `after_backward`; designated initializers must follow this order).
//!
//! `transport` moves a pipeline stage's boundary tensor and its gradient (a stage schedule's
//! `send` and `receive` ops, core/stage_schedule.hpp): called as `t.send(ctx)` and
//! `t.receive(ctx)` with a `tide::transport_context<Stream> const&` on the communication stream,
//! as a collective hook is (with `agree` and `finish_step` too); `tide::mpi_transport`
//! (collectives/mpi_transport.hpp) is one.
template <class BeforeForward = no_hook, class BeforeBackward = no_hook, class AfterBackward = no_hook, class Transport = no_hook>
struct hooks {
  //! Called before a layer's forward (`op_kind::gather`).
  BeforeForward before_forward{};
  //! Called before a layer's recompute and backward (`op_kind::regather`).
  BeforeBackward before_backward{};
  //! Called after a layer's backward (`op_kind::reduce`).
  AfterBackward after_backward{};
  //! Moves a stage's boundary tensor and its gradient (`op_kind::send`, `op_kind::receive`).
  Transport transport{};
};
namespace detail {
//! The executor whose lambda or hook this thread is running (null outside of one): a step,
//! `wait` or `record_timeline` of that executor from inside it would wait for itself.
inline thread_local void const* running_callbacks_of = nullptr;
template <class T>
struct is_hooks : std::false_type {};
template <class F, class B, class A, class T>
struct is_hooks<hooks<F, B, A, T>> : std::true_type {};
//! Calls `f(tide::hooks{...})` with `h` as each hook `c` makes room for and `no_hook` elsewhere:
//! hooks that match a schedule known only at run time (the sim's, a test's).
template <class Hook, class F>
void with_hooks_for(collective_spec const& c, Hook const& h, F&& f) {
  auto run = [&](auto gather, auto regather, auto reduce) {
    tide::hooks<decltype(gather), decltype(regather), decltype(reduce)> hs{gather, regather, reduce};
    f(hs);
  };
  auto with_reduce = [&](auto g, auto rg) { c.after_backward ? run(g, rg, h) : run(g, rg, no_hook{}); };
  auto with_regather = [&](auto g) { c.before_backward ? with_reduce(g, h) : with_reduce(g, no_hook{}); };
  c.before_forward ? with_regather(h) : with_regather(no_hook{});
}
template <class T>
struct is_reference_wrapper : std::false_type {};
template <class T>
struct is_reference_wrapper<std::reference_wrapper<T>> : std::true_type {};
//! False when `H` (as called: const when the hooks object is) has a `finish_step()` only on a
//! non-const object, which could then not be told that the step ended.
template <class H>
concept finish_callable = !(requires(std::remove_const_t<H>& h) { h.finish_step(); } && !requires(H& h) { h.finish_step(); });
//! True when `H` has `agree(step_end_context<Stream> const&)`, the step-end agreement.
template <class H, class Stream>
concept agrees_at_step_end = requires(std::remove_const_t<H>& h, step_end_context<Stream> const& c) { h.agree(c); };
//! False when `H` (as called) has `agree(ctx)` only on a non-const object.
template <class H, class Stream>
concept agree_callable = !(agrees_at_step_end<H, Stream> && !requires(H& h, step_end_context<Stream> const& c) { h.agree(c); });
}  // namespace detail

}  // namespace tide
