#pragma once
//! \file
//! `tide::turn{f}`: the turn of a step, by name: the work between the last layer's forward and the
//! first backward (the head, the loss, the seed of the gradient), passed to `executor::step`:
//!
//!     ex.step(forward, backward, tide::turn{[&](auto const& ctx) {
//!       loss = head(ctx.template output<float>(), targets, grad, ctx.stream);  // seeds grad
//!     }});
//!
//! It runs once per step on the compute stream, ordered after the last forward (whose output it
//! reads) and before every recompute and backward, on every backend (the sim calls no user code,
//! the turn included) and inside a captured CUDA graph (`tide::cuda_graph::capture`).

#include <functional>
#include <type_traits>

#include <tide/executor/context.hpp>

namespace tide {

//! The turn of a step: `run` is called as `run(tide::turn_context<Stream> const&)` once per step,
//! between the last forward and the first backward (see the file's description). It is copied into
//! the `turn` value, as hooks are: a turn that keeps state across steps may be passed as
//! `tide::turn{std::ref(obj)}`.
template <class F>
struct turn {
  F run;  //!< the work: `run(ctx)`, with `ctx` a `tide::turn_context<Stream> const&`
};
//! `tide::turn{f}` deduces `F`.
template <class F>
turn(F) -> turn<F>;

namespace detail {
template <class T>
struct is_turn : std::false_type {};
template <class F>
struct is_turn<turn<F>> : std::true_type {};
//! The absent turn: nothing runs between the last forward and the first backward.
struct no_turn_fn {
  //! Does nothing.
  template <class Ctx>
  void operator()(Ctx const&) const noexcept {}
};
using no_turn = turn<no_turn_fn>;
}  // namespace detail

}  // namespace tide
