#pragma once
//! \file
//! Compile-time stage schedules: `build_stage_schedule` (core/stage_schedule.hpp) evaluated in a
//! constant expression and frozen into a `static_schedule`, as `make_schedule` freezes a stack's,
//! so that a stage's predicted peaks, with every micro-batch it holds in flight, are constants:
//!
//!     using offload_held = tide::held_policy<tide::policy<tide::offload<>>>;
//!     constexpr auto s = tide::make_stage_schedule<net, tide::strategy_of<>,
//!                                                  tide::stage_spec{.stage = 0, .stages = 4, .micro_batches = 8},
//!                                                  offload_held>();
//!     static_assert(s.peak_device_bytes() <= (64u << 20));
//!
//! The micro-batches' policies come from a rule type (`held_policy`, `warmup_policy`,
//! `strategy_policy`, or a type of the user's with a `static constexpr tide::stage_policies
//! of(tide::stage_spec const&)`). Like `make_schedule`, this parses the builder: include it where a
//! compile-time stage is wanted (it is not in the umbrella header).

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include <tide/core/detail/build_stage.hpp>
#include <tide/core/stage_order.hpp>
#include <tide/core/stage_policies.hpp>
#include <tide/core/static_schedule.hpp>

namespace tide {

//! A rule that gives a stage's micro-batches their policies at compile time.
template <class R>
concept stage_policy_rule = requires(stage_spec const& s) {
  { R::of(s) } -> std::same_as<stage_policies>;
};

//! Every micro-batch under the strategy's policy.
struct strategy_policy {
  //! No policies of its own: the strategy's for every micro-batch.
  [[nodiscard]] static constexpr stage_policies of(stage_spec const&) { return {}; }
};

//! `Held` for every micro-batch held while another pass runs, `Steady` for the others
//! (`held_policies`); both are policy types (`tide::policy<...>`).
template <class Held, class Steady = keep_all>
struct held_policy {
  //! `held_policies(s, Held::spec(), Steady::spec())`.
  [[nodiscard]] static constexpr stage_policies of(stage_spec const& s) { return held_policies(s, Held::spec(), Steady::spec()); }
};

//! `Warmup` for the stage's warm-up micro-batches, `Steady` for the others (`warmup_policies`).
template <class Warmup, class Steady = keep_all>
struct warmup_policy {
  //! `warmup_policies(s, Warmup::spec(), Steady::spec())`.
  [[nodiscard]] static constexpr stage_policies of(stage_spec const& s) { return warmup_policies(s, Warmup::spec(), Steady::spec()); }
};

namespace detail {

//! What a rule's policies get wrong before any build: 0 nothing, 1 `of_micro_batch` of another
//! length, 2 an index past `policies`, 3 indices without policies.
constexpr int stage_rule_problem(stage_policies const& p, std::uint32_t micro_batches) {
  if (!p.of_micro_batch.empty() && p.of_micro_batch.size() != micro_batches) return 1;
  if (p.policies.empty() && !p.of_micro_batch.empty()) return 3;
  for (auto i : p.of_micro_batch)
    if (i >= (p.policies.empty() ? 1 : p.policies.size())) return 2;
  return 0;
}

// Queries of the stack and strategy, each in a lambda of its own: Clang 14 counts a temporary
// `spec()` (its vectors) in a condition as memory the constant expression leaked.
template <class Stack>
inline constexpr bool stack_has_carry = [] { return Stack::spec().has_carry(); }();
template <class Strategy>
inline constexpr bool strategy_has_collectives = [] {
  auto const c = Strategy::spec().collectives;
  return c.before_forward || c.before_backward || c.after_backward;
}();

struct stage_probe {
  int rule = 0;                   // stage_rule_problem
  schedule_issue_code issue{};    // the first issue of a policy's build, or none
  issue_name layer_type{}, slot{};
  schedule_extent extent{};
};

//! Each policy's own build first (its issue is what `static_check` names), then the stage's.
template <class Stack, class Strategy, stage_spec S, class Rule>
inline constexpr stage_probe stage_probe_of = [] {
  stage_probe r;
  auto const pol = Rule::of(S);
  r.rule = stage_rule_problem(pol, S.micro_batches);
  if (r.rule != 0) return r;
  auto const how = Strategy::spec();
  // With the strategy's phase regions, and unshared (as the stage builds where a policy copies).
  for (std::size_t k = 0; k < 2 * (pol.policies.empty() ? 1 : pol.policies.size()); ++k) {
    auto const p = k / 2;
    strategy h = how;
    if (!pol.policies.empty()) h.policy = pol.policies[p];
    if (k % 2 == 1) {
      if (!h.buffers.share_phase_regions) continue;
      h.buffers.share_phase_regions = false;
    }
    schedule s;
    auto const issue = try_build_schedule_into(s, Stack::spec(), h);
    if (issue.code != schedule_issue_code::none) {
      r.issue = issue.code;
      r.layer_type = issue_name::of(issue.type_name);
      r.slot = issue_name::of(issue.slot_name);
      return r;
    }
  }
  auto const s = build_stage(Stack::spec(), how, S, pol);
  r.extent = {s.layers.size(), s.slots.size(), s.ops.size(), s.waits.size()};
  return r;
}();

}  // namespace detail

//! The compile-time schedule of stage `Stage`'s step: `Stack` (the stage's layers, with a carry)
//! for each micro-batch in the stage order, under `Strategy`, each micro-batch placed by the policy
//! `Rule` gives it. Every slot size must be a constant. What `build_stage_schedule` refuses fails
//! to compile with a message saying what to fix.
template <class Stack, class Strategy, stage_spec Stage, class Rule = strategy_policy>
consteval auto make_stage_schedule() {
  detail::check_composition<Stack, Strategy>();
  static_assert(stage_policy_rule<Rule>,
                "tide::make_stage_schedule<Stack, Strategy, Stage, Rule>: Rule must give the micro-batches' policies: "
                "tide::held_policy<P>, tide::warmup_policy<P>, tide::strategy_policy, or a type with "
                "static constexpr tide::stage_policies of(tide::stage_spec const&)");
  static_assert(detail::stage_spec_problem(Stage).empty(),
                "tide::make_stage_schedule: the stage_spec is refused (tide::check_stage names why; 1F1B needs "
                "micro_batches >= stages)");
  static_assert(Stage.virtual_stages == 1,
                "tide::make_stage_schedule: interleaved stages (virtual_stages > 1) are built at run time: call "
                "tide::build_stage_schedule(stack, how, stage, policies, chunks)");
  static_assert(detail::stack_has_carry<Stack>,
                "tide::make_stage_schedule: the stack has no carry: a stage passes its carry (the boundary tensor) to the "
                "next stage and its gradient back; give the stack one (tide::carry<...>)");
  static_assert(!detail::strategy_has_collectives<Strategy>,
                "tide::make_stage_schedule: collective hooks are not taken in a stage schedule yet: reduce a "
                "data-parallel stage's gradients after the step, and build the stage without them");
  if constexpr (stage_policy_rule<Rule> && detail::stage_spec_problem(Stage).empty() && detail::stack_has_carry<Stack> &&
                !detail::strategy_has_collectives<Strategy>) {
    constexpr auto probe = detail::stage_probe_of<Stack, Strategy, Stage, Rule>;
    static_assert(probe.rule != 1, "tide::make_stage_schedule: the rule's stage_policies::of_micro_batch has not one entry "
                                   "per micro-batch: give one per micro-batch, or none");
    static_assert(probe.rule != 2, "tide::make_stage_schedule: the rule's stage_policies::of_micro_batch names a policy "
                                   "past stage_policies::policies");
    static_assert(probe.rule != 3, "tide::make_stage_schedule: the rule's stage_policies::of_micro_batch is given but "
                                   "stage_policies::policies is empty: list the policies it indexes");
    detail::static_check<probe.issue, probe.layer_type, probe.slot>();
    if constexpr (probe.rule != 0 || probe.issue != schedule_issue_code::none) {
      return static_schedule<0, 0, 0, 0>{};
    } else {
      return detail::freeze<probe.extent, Stage.micro_batches>(
          detail::build_stage(Stack::spec(), Strategy::spec(), Stage, Rule::of(Stage)));
    }
  } else {
    return static_schedule<0, 0, 0, 0>{};
  }
}

}  // namespace tide
