#pragma once
//! \file
//! Compile-time schedules: the builder evaluated in a constant expression and frozen into
//! fixed-size arrays, so `static_assert(s.peak_device_bytes() <= budget)` works.

#include <array>
#include <cstddef>
#include <cstdint>

#include <tide/core/build.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/strategy.hpp>
#include <tide/core/validation.hpp>

namespace tide {

//! A schedule whose sizes are template arguments; a literal type. `MicroBatches` > 0: a pipeline
//! stage's step (`make_stage_schedule`, core/static_stage_schedule.hpp), with its stage tables.
template <std::size_t Layers, std::size_t Slots, std::size_t Ops, std::size_t Waits, std::size_t MicroBatches = 0>
struct static_schedule {
  std::array<layer_binding, Layers> layers{};  //!< one per layer, in forward order
  std::array<slot_binding, Slots> slots{};     //!< every layer's slots, each layer's contiguous
  std::array<op, Ops> ops{};                   //!< the op program, in host issue order
  std::array<std::uint32_t, Waits> waits{};    //!< indices of the ops each op waits for (`op::wait_begin`)
  std::uint32_t event_count = 0;               //!< events the program records (`op::event` < this)
  arena_layout arena{};                        //!< the static buffer assignment and peaks
  buffer_spec buffers{};                       //!< the buffers the schedule was built with
  pipeline_spec pipeline{};                    //!< the pipeline the schedule was built with
  collective_spec collectives{};               //!< the collective hooks it makes room for
  carry_binding carry{};                       //!< where the carries live
  //! A stage's step: its spec, layers and instances (the tables below are what `view()` spans)
  stage_binding stage{};
  std::array<std::size_t, MicroBatches> stage_recompute_carry{};  //!< storage of `stage_binding::recompute_carry`
  std::array<std::uint32_t, MicroBatches> stage_instance_of{};    //!< storage of `stage_binding::instance_of`
  std::array<std::size_t, MicroBatches> stage_gradient{};         //!< storage of `stage_binding::gradient`

  //! Predicted device peak: the whole device arena.
  constexpr std::size_t peak_device_bytes() const noexcept { return arena.device_bytes; }
  //! Predicted pinned host peak: the whole host arena.
  constexpr std::size_t peak_host_bytes() const noexcept { return arena.host_bytes; }
  //! Number of layers.
  constexpr std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(Layers); }
  //! A view of this schedule, valid while it lives.
  constexpr schedule_view view() const& noexcept {
    schedule_view v{layers, slots, ops, waits, event_count, arena, buffers, pipeline, collectives, carry};
    if constexpr (MicroBatches > 0) {
      v.stage = stage;
      v.stage.recompute_carry = stage_recompute_carry;
      v.stage.instance_of = stage_instance_of;
      v.stage.gradient = stage_gradient;
    }
    return v;
  }
  //! Same as `view()`, so a static schedule passes where a `schedule_view` is taken.
  constexpr operator schedule_view() const& noexcept { return view(); }
  schedule_view view() const&& = delete;  // a view of a temporary would dangle
  operator schedule_view() const&& = delete;
};

namespace detail {
struct schedule_extent {
  std::size_t layers, slots, ops, waits;
};

template <class T, std::size_t N>
constexpr std::array<T, N> to_array(std::vector<T> const& v) {
  std::array<T, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = v[i];
  return a;
}

template <class Stack, class Strategy>
constexpr void check_composition() {
  static_assert(requires { typename Stack::tide_stack_tag; },
                "tide::make_schedule<Stack, Strategy>: the first argument must be a tide::stack<...>");
  static_assert(requires { typename Strategy::tide_strategy_tag; },
                "tide::make_schedule<Stack, Strategy>: the second argument must be a tide::strategy_of<...> (for "
                "example tide::strategy_of<tide::policy<...>, tide::pipeline<...>>)");
}

//! `s` in fixed-size arrays, its sizes `E` (and, for a stage, `M` micro-batches' tables).
template <schedule_extent E, std::size_t M = 0>
constexpr static_schedule<E.layers, E.slots, E.ops, E.waits, M> freeze(schedule const& s) {
  static_schedule<E.layers, E.slots, E.ops, E.waits, M> out;
  out.layers = to_array<layer_binding, E.layers>(s.layers);
  out.slots = to_array<slot_binding, E.slots>(s.slots);
  out.ops = to_array<op, E.ops>(s.ops);
  out.waits = to_array<std::uint32_t, E.waits>(s.waits);
  out.event_count = s.event_count;
  out.arena = s.arena;
  out.buffers = s.buffers;
  out.pipeline = s.pipeline;
  out.collectives = s.collectives;
  out.carry = s.carry;
  if constexpr (M > 0) {
    out.stage = {.spec = s.stage.spec, .layers = s.stage.layers, .instances = s.stage.instances};
    out.stage_recompute_carry = to_array<std::size_t, M>(s.stage_recompute_carry);
    out.stage_instance_of = to_array<std::uint32_t, M>(s.stage_instance_of);
    out.stage_gradient = to_array<std::size_t, M>(s.stage_gradient);
  }
  return out;
}

//! The first issue and, when there is none, the sizes of the arrays: one build in a constant
//! expression (make_schedule's second build fills the arrays).
struct schedule_probe {
  schedule_issue_code issue;
  schedule_extent extent;
  issue_name layer_type{};  // the names the issue concerns, copied (the build's strings do not outlive it)
  issue_name slot{};
};
template <class Stack, class Strategy>
inline constexpr schedule_probe probe_of = [] {
  schedule s;
  auto const issue = try_build_schedule_into(s, Stack::spec(), Strategy::spec());
  return schedule_probe{issue.code, {s.layers.size(), s.slots.size(), s.ops.size(), s.waits.size()},
                        issue_name::of(issue.type_name), issue_name::of(issue.slot_name)};
}();
}  // namespace detail

//! The compile-time schedule of a stack under a type-level strategy. Every slot size must be a
//! constant. An invalid composition fails to compile with a message saying what to fix.
template <class Stack, class Strategy = strategy_of<>>
consteval auto make_schedule() {
  detail::check_composition<Stack, Strategy>();
  constexpr auto probe = detail::probe_of<Stack, Strategy>;
  detail::static_check<probe.issue, probe.layer_type, probe.slot>();
  if constexpr (probe.issue != schedule_issue_code::none) {
    return static_schedule<0, 0, 0, 0>{};
  } else {
    return detail::freeze<probe.extent>(build_schedule(Stack::spec(), Strategy::spec()));
  }
}

//! The same schedule built at run time; run-time slot sizes come from `sizes`.
template <class Stack, class Strategy = strategy_of<>>
schedule make_runtime_schedule(slot_sizes const& sizes = {}) {
  detail::check_composition<Stack, Strategy>();
  return build_schedule(Stack::spec(), sizes, Strategy::spec());
}

}  // namespace tide
