#pragma once
//! \file
//! Policies: an ordered list of rules, each choosing keep, offload, remat or spill for the slots it
//! selects. The first rule that matches a (layer, slot) wins; the default is keep.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <tide/core/vocabulary.hpp>
#include <tide/core/stack.hpp>

namespace tide {

//! One rule: the slots named in `slots` (empty: any slot) of layers in [first_layer, last_layer)
//! whose size is at least `min_bytes` are placed `where`. Either bound may count from the end of
//! the stack (`tide::from_end(k)`), so one policy fits stacks of any depth.
struct rule_spec {
  placement where = placement::keep;      //!< where the selected slots live
  std::vector<tide::name> slots{};  //!< slot names selected; empty: any slot
  layer_bound first_layer = 0;          //!< first layer selected (an index, or `from_end(k)`)
  layer_bound last_layer = all_layers;  //!< one past the last layer selected (an index, or `from_end(k)`); `all_layers`: to the end
  std::size_t min_bytes = 0;              //!< smallest slot selected, in bytes

  //! True when this rule selects slot `s` of layer `layer` of a stack of `layer_count` layers
  //! (needed only when a bound counts from the end).
  constexpr bool matches(std::uint32_t layer, slot_spec const& s, std::uint32_t layer_count = all_layers) const noexcept {
    if (layer < resolve_layer(first_layer, layer_count) || layer >= resolve_layer(last_layer, layer_count) ||
        s.bytes < min_bytes)
      return false;
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
  std::vector<rule_spec> rules{};   //!< in priority order: the first match wins
  bool allow_unused_rules = false;  //!< accept rules that decide nothing on the stack
  //! No rules: everything is kept.
  constexpr policy_spec() = default;
  //! The rules `r`, in priority order.
  constexpr policy_spec(std::initializer_list<rule_spec> r) : rules(r) {}

  //! `deciding_rule`'s answer when no rule matches.
  static constexpr std::size_t no_rule = static_cast<std::size_t>(-1);
  //! The index of the first rule matching (layer, s) in a stack of `layer_count` layers, or
  //! `no_rule` (the default: keep).
  constexpr std::size_t deciding_rule(std::uint32_t layer, slot_spec const& s,
                                      std::uint32_t layer_count = all_layers) const noexcept {
    for (std::size_t i = 0; i < rules.size(); ++i)
      if (rules[i].matches(layer, s, layer_count)) return i;
    return no_rule;
  }
  //! Where slot `s` of layer `layer` (of `layer_count`) lives: the first matching rule's
  //! placement, or keep.
  constexpr placement decide(std::uint32_t layer, slot_spec const& s, std::uint32_t layer_count = all_layers) const noexcept {
    auto const i = deciding_rule(layer, s, layer_count);
    return i == no_rule ? placement::keep : rules[i].where;
  }
  //! `deciding_rule` of every (layer, slot) of `stack`, layers in order, slots in type order. In
  //! O((pairs + rules) log rules) rather than pairs x rules: a plan for a deep stack has about one
  //! rule per run of layers, so asking each pair in turn was quadratic in the layers.
  constexpr std::vector<std::size_t> deciding_rules(stack_spec const& stack) const;
};

namespace detail {
//! `policy_spec::deciding_rules` by a sweep over the layers (what it does for large inputs).
constexpr std::vector<std::size_t> swept_deciding_rules(policy_spec const& p, stack_spec const& stack);
}  // namespace detail

namespace detail {
//! Per slot name: the rules that can select it (naming it, or any slot), and a sweep over the
//! layers in order: rules enter at their first layer and leave at their last, the active rule of
//! least index decides (unless its `min_bytes` excludes the slot: then the candidates in order).
struct rule_sweep {
  std::vector<std::size_t> by_index;  // candidates, ascending index
  std::vector<std::size_t> by_first;  // the same, by first layer
  std::size_t next = 0;               // next of by_first to enter
  std::vector<std::size_t> active;    // a min-heap of indices (expired ones leave lazily)
};
}  // namespace detail

constexpr std::vector<std::size_t> policy_spec::deciding_rules(stack_spec const& stack) const {
  std::size_t pairs = 0;
  for (auto t : stack.layer_types) pairs += stack.types[t].slots.size();
  // Small inputs (the planner's inner loop builds thousands): asking each pair costs less than
  // the sweep's allocations.
  if (pairs * rules.size() <= 4096) {
    std::vector<std::size_t> out;
    out.reserve(pairs);
    for (std::uint32_t l = 0; l < stack.layer_count(); ++l)
      for (auto const& s : stack.layer(l).slots) out.push_back(deciding_rule(l, s, stack.layer_count()));
    return out;
  }
  return detail::swept_deciding_rules(*this, stack);
}

constexpr std::vector<std::size_t> detail::swept_deciding_rules(policy_spec const& p, stack_spec const& stack) {
  auto const& rules = p.rules;
  constexpr auto no_rule = policy_spec::no_rule;
  // The rules' bounds in this stack (a bound may count from the end).
  auto const layers = stack.layer_count();
  auto first = [&](std::size_t i) { return resolve_layer(rules[i].first_layer, layers); };
  auto last = [&](std::size_t i) { return resolve_layer(rules[i].last_layer, layers); };
  std::vector<std::size_t> out;
  std::vector<std::string_view> names;
  for (auto const& t : stack.types)
    for (auto const& s : t.slots) names.push_back(s.name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  auto id_of = [&](std::string_view n) {
    auto const it = std::lower_bound(names.begin(), names.end(), n);
    return it != names.end() && *it == n ? static_cast<std::size_t>(it - names.begin()) : names.size();
  };
  std::vector<detail::rule_sweep> sweeps(names.size());
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].slots.empty())
      for (auto& sw : sweeps) sw.by_index.push_back(i);
    else
      for (auto n : rules[i].slots)
        if (auto const id = id_of(n); id < names.size() && (sweeps[id].by_index.empty() || sweeps[id].by_index.back() != i))
          sweeps[id].by_index.push_back(i);
  }
  for (auto& sw : sweeps) {
    sw.by_first = sw.by_index;
    std::sort(sw.by_first.begin(), sw.by_first.end(), [&](std::size_t a, std::size_t b) {
      return first(a) != first(b) ? first(a) < first(b) : a < b;
    });
  }
  auto const later = [](std::size_t a, std::size_t b) { return a > b; };  // min-heap of indices
  for (std::uint32_t l = 0; l < stack.layer_count(); ++l)
    for (auto const& s : stack.layer(l).slots) {
      auto& sw = sweeps[id_of(s.name)];
      for (; sw.next < sw.by_first.size() && first(sw.by_first[sw.next]) <= l; ++sw.next) {
        sw.active.push_back(sw.by_first[sw.next]);
        std::push_heap(sw.active.begin(), sw.active.end(), later);
      }
      while (!sw.active.empty() && last(sw.active.front()) <= l) {
        std::pop_heap(sw.active.begin(), sw.active.end(), later);
        sw.active.pop_back();
      }
      // Every candidate selects this name: only the layer range and the size remain to check.
      auto const selects = [&](std::size_t i) {
        return l >= first(i) && l < last(i) && s.bytes >= rules[i].min_bytes;
      };
      auto r = no_rule;
      if (!sw.active.empty()) {
        if (selects(sw.active.front())) r = sw.active.front();
        else
          for (auto i : sw.by_index)
            if (selects(i)) {
              r = i;
              break;
            }
      }
      out.push_back(r);
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Type-level sugar (CUTLASS dispatch-policy style: empty tags exposing static constexpr values).
// A rule takes its selectors in any order: `tide::offload<tide::slot_names<"q_proj">,
// tide::layer_range<0, 31>, tide::min_bytes<(1 << 20)>>`; an absent selector selects everything.

//! Selects slots by name (`rule_spec::slots`).
template <fixed_string... Names>
struct slot_names {
  static_assert(sizeof...(Names) > 0, "tide::slot_names<...>: name at least one slot, or leave the selector out to "
                                      "select every slot");
  using tide_knob_of = rule_spec;                                   //!< Makes this a selector of `rule`.
  static constexpr std::string_view tide_knob_name = "slot_names";  //!< Names the selector in diagnostics.
  //! Appends `Names` to `r.slots`.
  static constexpr void apply(rule_spec& r) { (r.slots.push_back(Names.view()), ...); }
};
//! Selects layers [First, Last) (`rule_spec::first_layer`, `last_layer`).
template <layer_bound First, layer_bound Last = layer_bound{all_layers}>
struct layer_range {
  static_assert(ordered_layer_bounds(First, Last),
                "tide::layer_range<First, Last>: the range is [First, Last) and must not be empty");
  static_assert(valid_layer_bound(First) && valid_layer_bound(Last),
                "tide::layer_range<First, Last>: a layer index is below tide::max_from_end (2^30); count from the end "
                "with tide::from_end(k)");
  using tide_knob_of = rule_spec;                                    //!< Makes this a selector of `rule`.
  static constexpr std::string_view tide_knob_name = "layer_range";  //!< Names the selector in diagnostics.
  //! Sets `r.first_layer` and `r.last_layer`.
  static constexpr void apply(rule_spec& r) noexcept {
    r.first_layer = First;
    r.last_layer = Last;
  }
};
//! Selects slots of at least `Bytes` bytes (`rule_spec::min_bytes`).
template <std::size_t Bytes>
struct min_bytes : detail::field_knob<rule_spec, &rule_spec::min_bytes, Bytes, "min_bytes"> {};

//! One rule: `Where` for what its selectors (any order, each at most once) select.
template <placement Where, class... Selectors>
struct rule {
  static_assert((detail::knob_for<Selectors, rule_spec> && ...),
                "tide::keep/offload/remat/spill<...>: each argument must be a selector: tide::slot_names<\"a\", ...>, "
                "tide::layer_range<First, Last> or tide::min_bytes<N>");
  static_assert(detail::distinct_knobs<Selectors...>(),
                "tide::keep/offload/remat/spill<...>: a selector is given twice: give each selector once");
  using tide_rule_tag = void;  //!< Marks this type as a rule of `tide::policy`.
  //! The `rule_spec` this rule spells.
  static constexpr rule_spec spec() {
    rule_spec r;
    r.where = Where;
    (Selectors::apply(r), ...);
    return r;
  }
};

//! Keeps the selected slots on the device until their backward.
template <class... Selectors>
using keep = rule<placement::keep, Selectors...>;
//! Copies the selected slots to pinned host memory in the forward, prefetched back for the backward.
template <class... Selectors>
using offload = rule<placement::offload, Selectors...>;
//! Drops the selected slots after the forward and recomputes them before the backward.
template <class... Selectors>
using remat = rule<placement::remat, Selectors...>;
//! Writes the selected slots to a storage file in the forward (through the pinned spill ring)
//! and reads them back for the backward.
template <class... Selectors>
using spill = rule<placement::spill, Selectors...>;

//! Lets a policy keep rules that decide nothing on some stack (`policy_spec::allow_unused_rules`):
//! `tide::policy<tide::allow_unused_rules, tide::offload<...>>`.
struct allow_unused_rules {
  using tide_policy_option_tag = void;  //!< Marks this type as an option of `tide::policy`.
};

//! An ordered list of rules; the first match wins, the default is keep.
template <class... Rules>
struct policy {
  static_assert(((requires { typename Rules::tide_rule_tag; } || requires { typename Rules::tide_policy_option_tag; }) && ...),
                "tide::policy<Rules...>: each argument must be a rule such as tide::offload<tide::slot_names<\"q_proj\">>, "
                "or tide::allow_unused_rules");
  using tide_policy_tag = void;  //!< Marks this type as the policy part of `tide::strategy_of`.
  //! The `policy_spec` the rules and options spell.
  static constexpr policy_spec spec() {
    policy_spec p;
    (add(p, static_cast<Rules*>(nullptr)), ...);
    return p;
  }

 private:
  template <class R>
  static constexpr void add(policy_spec& p, R*) {
    if constexpr (requires { typename R::tide_policy_option_tag; }) p.allow_unused_rules = true;
    else p.rules.push_back(R::spec());
  }
};

//! No rules: every slot is kept on the device.
using keep_all = policy<>;

}  // namespace tide
