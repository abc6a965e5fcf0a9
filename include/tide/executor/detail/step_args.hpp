#pragma once
//! \file
//! What `executor::step` and `executor::enqueue` accept after the forward and backward lambdas:
//! nothing, `tide::turn{f}`, `tide::hooks{...}`, or both in that order; and the compile-time
//! checks of every callable, each failing with a `static_assert` that says what to write instead.

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>

#include <tide/executor/context.hpp>
#include <tide/executor/hooks.hpp>
#include <tide/executor/turn.hpp>

namespace tide::detail {

//! `h` itself, or the object a `std::reference_wrapper` refers to.
template <class T>
auto& unwrap_ref(T& h) noexcept {
  if constexpr (is_reference_wrapper<std::remove_cv_t<T>>::value) return h.get();
  else return h;
}

//! Calls `f(turn, hooks)` with the arguments after the lambdas (`more`), the absent ones as
//! `no_turn` and `tide::hooks<>`; refuses anything else by name.
template <class F, class... More>
decltype(auto) with_step_args(F&& f, More&... more) {
  static constexpr no_turn absent_turn{};
  static constexpr tide::hooks<> absent_hooks{};
  static_assert(sizeof...(More) <= 2, "tide::executor: step(forward, backward[, tide::turn{f}][, tide::hooks{...}]) takes at "
                                      "most a turn and hooks after the lambdas");
  if constexpr (sizeof...(More) == 0) {
    return f(absent_turn, absent_hooks);
  } else if constexpr (sizeof...(More) == 1) {
    auto& x = std::get<0>(std::tie(more...));
    using X = std::remove_cv_t<std::remove_reference_t<decltype(x)>>;
    if constexpr (is_turn<X>::value) {
      return f(x, absent_hooks);
    } else {
      static_assert(is_hooks<X>::value,
                    "tide::executor: the third argument must be tide::hooks{.before_forward = ..., .after_backward = ...} "
                    "(collective hooks, by name) or tide::turn{f} (the work between the last forward and the first "
                    "backward, called as f(tide::turn_context<Stream> const&)): name it");
      return f(absent_turn, x);
    }
  } else {
    auto& t = std::get<0>(std::tie(more...));
    auto& h = std::get<1>(std::tie(more...));
    static_assert(is_turn<std::remove_cv_t<std::remove_reference_t<decltype(t)>>>::value,
                  "tide::executor: step(forward, backward, turn, hooks): the third argument must be tide::turn{f}, "
                  "the turn comes before the hooks");
    static_assert(is_hooks<std::remove_cv_t<std::remove_reference_t<decltype(h)>>>::value,
                  "tide::executor: step(forward, backward, turn, hooks): the fourth argument must be "
                  "tide::hooks{.before_forward = ..., .after_backward = ...}");
    return f(t, h);
  }
}

//! The compile-time checks of one step's callables, as `executor::enqueue` calls them: the
//! lambdas, the turn (`Turn`: a `tide::turn<F>`, const or not) and each hook (as called: const
//! when the hooks object is and the hook is not a `std::ref`).
template <class Stream, class Forward, class Backward, class Turn, class Gather, class Regather, class Reduce>
consteval bool check_step_callables() {
  using turn_fn = std::remove_reference_t<decltype(unwrap_ref(std::declval<Turn&>().run))>;
  static_assert(std::is_invocable_v<Forward&, forward_context<Stream> const&>,
                "tide::executor: the forward lambda must be callable as f(tide::forward_context<Stream> const&)");
  static_assert(std::is_invocable_v<Backward&, backward_context<Stream> const&>,
                "tide::executor: the backward lambda must be callable as f(tide::backward_context<Stream> const&)");
  static_assert(std::is_invocable_v<std::remove_const_t<turn_fn>&, turn_context<Stream> const&>,
                "tide::executor: the turn must be callable as f(tide::turn_context<Stream> const&): write "
                "tide::turn{[&](auto const& ctx) { ... ctx.output() ... }}");
  static_assert(!std::is_invocable_v<std::remove_const_t<turn_fn>&, turn_context<Stream> const&> ||
                    std::is_invocable_v<turn_fn&, turn_context<Stream> const&>,
                "tide::executor: the turn's call operator is not const but the tide::turn object is: pass it by "
                "std::ref (tide::turn{std::ref(f)}), or the turn object non-const");
  using ctx = collective_context<Stream>;
  static_assert(std::is_invocable_v<std::remove_const_t<Gather>&, ctx const&>,
                "tide::executor: hooks::before_forward must be callable as h(tide::collective_context<Stream> const&)");
  static_assert(std::is_invocable_v<std::remove_const_t<Regather>&, ctx const&>,
                "tide::executor: hooks::before_backward must be callable as h(tide::collective_context<Stream> const&)");
  static_assert(std::is_invocable_v<std::remove_const_t<Reduce>&, ctx const&>,
                "tide::executor: hooks::after_backward must be callable as h(tide::collective_context<Stream> const&)");
  static_assert(std::is_invocable_v<Gather&, ctx const&> && std::is_invocable_v<Regather&, ctx const&> &&
                    std::is_invocable_v<Reduce&, ctx const&>,
                "tide::executor: a hook's call operator is not const but the tide::hooks object is: pass the hook "
                "by std::ref, or the hooks object non-const");
  static_assert(finish_callable<Gather> && finish_callable<Regather> && finish_callable<Reduce>,
                "tide::executor: a hook's finish_step() is not const but the tide::hooks object is, so it could "
                "not be told that the step ended: pass the hook by std::ref, or the hooks object non-const");
  static_assert(agree_callable<Gather, Stream> && agree_callable<Regather, Stream> && agree_callable<Reduce, Stream>,
                "tide::executor: a hook's agree(ctx) is not const but the tide::hooks object is, so the step-end "
                "agreement could not run: pass the hook by std::ref, or the hooks object non-const");
  return true;
}

//! The compile-time check of a transport (`hooks::transport`), as called.
template <class Stream, class Transport>
consteval bool check_transport() {
  if constexpr (!std::is_same_v<std::remove_cv_t<Transport>, no_hook>) {
    using ctx = transport_context<Stream>;
    static_assert(requires(Transport& t, ctx const& c) {
      t.send(c);
      t.receive(c);
    }, "tide::executor: hooks::transport must have send(tide::transport_context<Stream> const&) and "
       "receive(tide::transport_context<Stream> const&), callable as given (pass a transport with state by std::ref, "
       "or the hooks object non-const)");
  }
  return true;
}

}  // namespace tide::detail
