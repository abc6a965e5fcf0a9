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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>

#include <tide/executor/context.hpp>

namespace tide {

//! Given to the turn (`tide::turn{f}`, see `executor::step`): the work between the last layer's
//! forward and the first backward (the head, the loss, the seed of the gradient), on the compute
//! stream, ordered after the last forward and before every recompute and backward. In a stack with
//! a carry, `output()` is the stack's output (the last layer's carry out), read-only: the seed
//! gradient goes into the buffer the backward lambdas pass down (the user's, which tide does not
//! own), e.g. captured by the turn.
template <class Stream>
struct turn_context {
  std::uint32_t layer = 0;                    //!< the last layer: its forward has just run
  Stream stream{};                            //!< the compute stream, to enqueue the turn's work on
  std::byte const* output_data = nullptr;     //!< the stack's output (a stack with a carry), else null
  std::size_t output_bytes = 0;               //!< its size (0 when the stack has no carry)
  bool calibrating = false;                   //!< true while `tide::calibrate` runs the step
  //! In a stage schedule (the last stage's turn runs once per micro-batch): the micro-batch
  std::uint32_t micro_batch = 0;
  //! In a stage schedule: where the turn seeds the micro-batch's gradient (the boundary gradient
  //! its backwards update; the output's size), else null
  std::byte* gradient_data = nullptr;
  //! What the loss is scaled by before its gradient is seeded (`executor_options::loss_scale`;
  //! 1/M averages M micro-batches)
  double loss_scale = 1.0;

  //! The micro-batch's boundary gradient to seed (a stage schedule), else empty.
  [[nodiscard]] std::span<std::byte> gradient() const noexcept { return {gradient_data, gradient_data ? output_bytes : 0}; }
  //! The same as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  [[nodiscard]] std::span<T> gradient() const {
    return detail::view_as<T>(gradient(), [] { return "the micro-batch's boundary gradient (the turn's gradient())"; });
  }

  //! The stack's output (the last layer's carry out), read-only; empty when the stack has no carry.
  [[nodiscard]] std::span<std::byte const> output() const noexcept { return {output_data, output_data ? output_bytes : 0}; }
  //! The same as elements of `T`; throws `slot_error` if the output's size or alignment does not fit T.
  template <class T>
  [[nodiscard]] std::span<T const> output() const {
    return detail::view_as<T const>(output(), [] { return "the stack's output (the turn's output())"; });
  }
};

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
