#pragma once
//! \file
//! The strategy: one value for everything that decides a schedule besides the stack, that
//! is where each slot lives (policy), how storage is provided (buffers), how copies overlap
//! (pipeline) and which collective hooks it makes room for. `build_schedule` takes it, the planner
//! returns it, `describe` prints it; `tide::strategy_of<parts...>` spells it as a type for
//! `make_schedule`.

#include <tide/core/buffers.hpp>
#include <tide/core/checkpoints.hpp>
#include <tide/core/pipeline.hpp>
#include <tide/core/policy.hpp>

namespace tide {

//! Policy, buffers, pipeline, collectives and checkpoints, by name:
//! `tide::strategy{.policy = p, .pipeline = {.prefetch_distance = 2}}`.
struct strategy {
  policy_spec policy{};           //!< where each slot lives
  buffer_spec buffers{};          //!< how storage is provided
  pipeline_spec pipeline{};       //!< how copies are placed and overlapped
  collective_spec collectives{};  //!< which collective hooks the schedule makes room for
  checkpoint_spec checkpoints{};  //!< where a stack's carries live (a stack with a carry only)
};

//! A strategy as a type, from its parts in any order (each at most once; an absent part is the
//! default: keep everything, default buffers, default pipeline, no collectives):
//! `tide::strategy_of<tide::policy<...>, tide::pipeline<tide::prefetch_distance<2>>>`.
template <class... Parts>
struct strategy_of {
 private:
  template <class P> static constexpr int is_policy = requires { typename P::tide_policy_tag; };
  template <class P> static constexpr int is_buffers = requires { typename P::tide_buffers_tag; };
  template <class P> static constexpr int is_pipeline = requires { typename P::tide_pipeline_tag; };
  template <class P> static constexpr int is_collectives = requires { typename P::tide_collectives_tag; };
  template <class P> static constexpr int is_checkpoints = requires { typename P::tide_checkpoints_tag; };

 public:
  static_assert(((is_policy<Parts> + is_buffers<Parts> + is_pipeline<Parts> + is_collectives<Parts> + is_checkpoints<Parts> ==
                  1) &&
                 ...),
                "tide::strategy_of<...>: each argument must be a tide::policy<...>, tide::buffers<...>, "
                "tide::pipeline<...>, tide::collectives<...> or tide::checkpoints<...>");
  static_assert((is_policy<Parts> + ... + 0) <= 1, "tide::strategy_of<...>: two policies: give one tide::policy<...>");
  static_assert((is_buffers<Parts> + ... + 0) <= 1, "tide::strategy_of<...>: two buffers: give one tide::buffers<...>");
  static_assert((is_pipeline<Parts> + ... + 0) <= 1, "tide::strategy_of<...>: two pipelines: give one tide::pipeline<...>");
  static_assert((is_collectives<Parts> + ... + 0) <= 1,
                "tide::strategy_of<...>: two collectives: give one tide::collectives<...>");
  static_assert((is_checkpoints<Parts> + ... + 0) <= 1,
                "tide::strategy_of<...>: two checkpoints: give one tide::checkpoints<...>");
  using tide_strategy_tag = void;  //!< Marks this type as a strategy for `make_schedule`.

  //! The `strategy` the parts spell; absent parts keep their defaults.
  static constexpr strategy spec() {
    strategy s;
    (set(s, static_cast<Parts*>(nullptr)), ...);
    return s;
  }

 private:
  template <class P>
  static constexpr void set(strategy& s, P*) {
    if constexpr (is_policy<P>) s.policy = P::spec();
    else if constexpr (is_buffers<P>) s.buffers = P::spec();
    else if constexpr (is_pipeline<P>) s.pipeline = P::spec();
    else if constexpr (is_checkpoints<P>) s.checkpoints = P::spec();
    else s.collectives = P::spec();
  }
};

}  // namespace tide
