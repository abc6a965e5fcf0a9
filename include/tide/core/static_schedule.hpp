#pragma once
//! \file Compile-time schedules: the run-time builder evaluated in a constant expression and
//! frozen into fixed-size arrays, so `static_assert(s.peak_device_bytes() <= budget)` works.

#include <array>
#include <cstddef>
#include <cstdint>

#include <tide/core/schedule.hpp>

namespace tide {

//! A schedule whose sizes are template arguments; a literal type.
template <std::size_t Layers, std::size_t Slots, std::size_t Ops, std::size_t Waits>
struct static_schedule {
  std::array<layer_binding, Layers> layers{};
  std::array<slot_binding, Slots> slots{};
  std::array<op, Ops> ops{};
  std::array<std::uint32_t, Waits> waits{};
  std::uint32_t event_count = 0;
  arena_layout arena{};
  buffer_spec buffers{};
  pipeline_spec pipeline{};
  collective_spec collectives{};

  constexpr std::size_t peak_device_bytes() const noexcept { return arena.device_bytes; }
  constexpr std::size_t peak_host_bytes() const noexcept { return arena.host_bytes; }
  constexpr std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(Layers); }
  constexpr schedule_view view() const& noexcept {
    return {layers, slots, ops, waits, event_count, arena, buffers, pipeline, collectives};
  }
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

template <class Stack, class Policy, class Buffers, class Pipeline, class Collectives>
constexpr void check_composition() {
  static_assert(requires { typename Stack::tide_stack_tag; },
                "tide::make_schedule: the first argument must be a tide::stack<...>");
  static_assert(requires { typename Policy::tide_policy_tag; },
                "tide::make_schedule: the second argument must be a tide::policy<...>");
  static_assert(requires { typename Buffers::tide_buffers_tag; },
                "tide::make_schedule: the third argument must be a tide::buffers<...>");
  static_assert(requires { typename Pipeline::tide_pipeline_tag; },
                "tide::make_schedule: the fourth argument must be a tide::pipeline<...>");
  static_assert(requires { typename Collectives::tide_collectives_tag; },
                "tide::make_schedule: the fifth argument must be a tide::collectives<...>");
}

//! The first issue and, when there is none, the sizes of the arrays: one build in a constant
//! expression (make_schedule's second build fills the arrays).
struct schedule_probe {
  schedule_issue_code issue;
  schedule_extent extent;
};
template <class Stack, class Policy, class Buffers, class Pipeline, class Collectives>
inline constexpr schedule_probe probe_of = [] {
  schedule s;
  auto const issue =
      try_build_schedule_into(s, Stack::spec(), Policy::spec(), Buffers::spec(), Pipeline::spec(), Collectives::spec());
  return schedule_probe{issue.code, {s.layers.size(), s.slots.size(), s.ops.size(), s.waits.size()}};
}();
}  // namespace detail

//! The compile-time schedule of a type-level composition. Every slot size must be a constant.
//! An invalid composition fails to compile with a message saying what to fix.
template <class Stack, class Policy, class Buffers = buffers<>, class Pipeline = pipeline<>,
          class Collectives = no_collectives>
consteval auto make_schedule() {
  detail::check_composition<Stack, Policy, Buffers, Pipeline, Collectives>();
  using c = schedule_issue_code;
  constexpr auto probe = detail::probe_of<Stack, Policy, Buffers, Pipeline, Collectives>;
  constexpr auto issue = probe.issue;
  // One message per issue code (the run-time message, to_message, also names the slot and type).
  static_assert(issue != c::empty_stack, "tide: the stack has no layers: add at least one layer");
  static_assert(issue != c::duplicate_slot, "tide: a layer type names the same slot twice: give each slot of a layer a distinct name");
  static_assert(issue != c::zero_size_slot, "tide: a slot has zero bytes: drop the slot or give it a size");
  static_assert(issue != c::dynamic_size,
                "tide: a slot has a run-time size: give every tide::slot a byte count, or build the schedule at run "
                "time with tide::build_schedule(stack, tide::slot_sizes{...}, ...)");
  static_assert(issue != c::unknown_rule_slot,
                "tide: a policy rule names a slot that no layer of the stack has: check the names in tide::slots<...>");
  static_assert(issue != c::empty_rule_range, "tide: a policy rule selects an empty layer range: use tide::layers<First, Last> with First < Last");
  static_assert(issue != c::unused_rule,
                "tide: a policy rule decides no (layer, slot) of the stack: it matches none (check its tide::layers "
                "range, slot names and minimum size) or earlier rules decide everything it matches; remove it");
  static_assert(issue != c::zero_staging_buffers,
                "tide: the policy offloads slots but the buffers have zero staging buffers: use tide::staging_ring<N> with N >= 1");
  static_assert(issue != c::zero_offloads_in_flight, "tide: the policy offloads slots but zero offloads may be in flight");
  static_assert(issue != c::bad_alignment, "tide: an arena alignment is not a power of two");
  static_assert(issue != c::too_many_slots, "tide: a layer type has too many slots");
  static_assert(issue != c::too_many_chunks, "tide: the chunk size splits a slot into too many chunks: use a larger one");
  static_assert(issue != c::too_many_ops, "tide: the schedule would have too many ops: use a larger chunk size or fewer layers");
  static_assert(issue != c::size_overflow,
                "tide: a slot size, guard, alignment or arena total does not fit in std::size_t: check the slot sizes, "
                "guard bytes and alignments (tide::build_schedule names the slot and the quantity)");
  if constexpr (issue != c::none) {
    return static_schedule<0, 0, 0, 0>{};
  } else {
    constexpr auto ext = probe.extent;
    auto s = build_schedule(Stack::spec(), Policy::spec(), Buffers::spec(), Pipeline::spec(), Collectives::spec());
    static_schedule<ext.layers, ext.slots, ext.ops, ext.waits> out;
    out.layers = detail::to_array<layer_binding, ext.layers>(s.layers);
    out.slots = detail::to_array<slot_binding, ext.slots>(s.slots);
    out.ops = detail::to_array<op, ext.ops>(s.ops);
    out.waits = detail::to_array<std::uint32_t, ext.waits>(s.waits);
    out.event_count = s.event_count;
    out.arena = s.arena;
    out.buffers = s.buffers;
    out.pipeline = s.pipeline;
    out.collectives = s.collectives;
    return out;
  }
}

//! The same composition built at run time; dynamic slot sizes come from `sizes`.
template <class Stack, class Policy, class Buffers = buffers<>, class Pipeline = pipeline<>,
          class Collectives = no_collectives>
schedule make_runtime_schedule(slot_sizes const& sizes = {}) {
  detail::check_composition<Stack, Policy, Buffers, Pipeline, Collectives>();
  return build_schedule(Stack::spec(), sizes, Policy::spec(), Buffers::spec(), Pipeline::spec(), Collectives::spec());
}

}  // namespace tide
