#pragma once
//! \file Policies: an ordered list of rules, each choosing keep, offload or remat for the slots it
//! selects. The first rule that matches a (layer, slot) wins; the default is keep.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/stack.hpp>

namespace tide {

//! One rule: `action` applies to slots named in `slots` (empty: any slot) of layers in
//! [first_layer, last_layer) whose size is at least `min_bytes`.
struct rule_spec {
  placement action = placement::keep;
  std::vector<std::string_view> slots;
  std::uint32_t first_layer = 0;
  std::uint32_t last_layer = all_layers;
  std::size_t min_bytes = 0;

  constexpr bool matches(std::uint32_t layer, slot_spec const& s) const noexcept {
    if (layer < first_layer || layer >= last_layer || s.bytes < min_bytes) return false;
    if (slots.empty()) return true;
    for (auto n : slots)
      if (n == s.name) return true;
    return false;
  }
};

//! A run-time policy value. The planner produces these; `tide::policy<...>` types yield them.
//!
//! A rule that decides no (layer, slot) of the stack (it matches none, or an earlier rule decides
//! everything it matches) is almost always a typo, so building a schedule rejects it, naming the
//! rule; set `allow_unused_rules` to share one policy between stacks it only partly fits.
struct policy_spec {
  std::vector<rule_spec> rules;
  bool allow_unused_rules = false;
  constexpr policy_spec() = default;
  constexpr policy_spec(std::initializer_list<rule_spec> r) : rules(r) {}

  static constexpr std::size_t no_rule = static_cast<std::size_t>(-1);
  //! The index of the first rule matching (layer, s), or `no_rule` (the default: keep).
  constexpr std::size_t deciding_rule(std::uint32_t layer, slot_spec const& s) const noexcept {
    for (std::size_t i = 0; i < rules.size(); ++i)
      if (rules[i].matches(layer, s)) return i;
    return no_rule;
  }
  constexpr placement decide(std::uint32_t layer, slot_spec const& s) const noexcept {
    auto const i = deciding_rule(layer, s);
    return i == no_rule ? placement::keep : rules[i].action;
  }
};

// ---------------------------------------------------------------------------------------------
// Type-level sugar (CUTLASS dispatch-policy style: empty tags exposing static constexpr values)

//! Selects slots by name.
template <fixed_string... Names>
struct slots {
  using tide_slot_selector_tag = void;
  static constexpr void fill(std::vector<std::string_view>& out) { (out.push_back(Names.view()), ...); }
};
//! Selects every slot.
struct any_slot {
  using tide_slot_selector_tag = void;
  static constexpr void fill(std::vector<std::string_view>&) {}
};
//! Selects layers [First, Last).
template <std::uint32_t First, std::uint32_t Last = all_layers>
struct layers {
  static_assert(First < Last, "tide::layers<First, Last>: the range is [First, Last) and must not be empty");
  using tide_layer_selector_tag = void;
  static constexpr std::uint32_t first = First;
  static constexpr std::uint32_t last = Last;
};

template <placement Action, class SlotSel = any_slot, class LayerSel = layers<0>, std::size_t MinBytes = 0>
struct rule {
  static_assert(requires { typename SlotSel::tide_slot_selector_tag; },
                "tide::rule: the second argument must be tide::slots<\"a\", \"b\"> or tide::any_slot");
  static_assert(requires { typename LayerSel::tide_layer_selector_tag; },
                "tide::rule: the third argument must be tide::layers<First, Last>");
  using tide_rule_tag = void;
  static constexpr rule_spec spec() {
    rule_spec r{Action, {}, LayerSel::first, LayerSel::last, MinBytes};
    SlotSel::fill(r.slots);
    return r;
  }
};

template <class SlotSel = any_slot, class LayerSel = layers<0>, std::size_t MinBytes = 0>
using keep = rule<placement::keep, SlotSel, LayerSel, MinBytes>;
template <class SlotSel = any_slot, class LayerSel = layers<0>, std::size_t MinBytes = 0>
using offload = rule<placement::offload, SlotSel, LayerSel, MinBytes>;
template <class SlotSel = any_slot, class LayerSel = layers<0>, std::size_t MinBytes = 0>
using remat = rule<placement::remat, SlotSel, LayerSel, MinBytes>;

//! An ordered list of rules; the first match wins, the default is keep.
template <class... Rules>
struct policy {
  static_assert((requires { typename Rules::tide_rule_tag; } && ...),
                "tide::policy<Rules...>: each argument must be a rule such as tide::offload<tide::slots<\"q_proj\">>");
  using tide_policy_tag = void;
  static constexpr policy_spec spec() { return policy_spec{Rules::spec()...}; }
};

using keep_all = policy<>;

}  // namespace tide
