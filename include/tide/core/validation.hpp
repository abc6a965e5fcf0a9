#pragma once
//! \file
//! Validation: what can be wrong with a stack and a strategy, as issue codes; the run-time
//! message of each (`to_message`, thrown by `build_schedule`) and its compile-time diagnostic
//! (`detail::static_check`, the `static_assert`s of `make_schedule`), side by side in one table.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/buffers.hpp>
#include <tide/core/checkpoints.hpp>
#include <tide/core/op.hpp>
#include <tide/core/policy.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/vocabulary.hpp>

namespace tide {

//! What is wrong with a stack and a strategy; `to_message` says it in words.
enum class schedule_issue_code : std::uint8_t {
  none,                       //!< nothing: the composition is valid
  empty_stack,                //!< the stack has no layers
  duplicate_slot,             //!< a layer type names one slot twice
  zero_size_slot,             //!< a slot of zero bytes
  dynamic_size,               //!< a run-time slot or carry size that `slot_sizes` did not give
  unknown_rule_slot,          //!< a rule names a slot no layer has
  empty_rule_range,           //!< a rule's layer range is empty
  unused_rule,                //!< a rule decides no (layer, slot) and unused rules are not allowed
  zero_staging_buffers,       //!< slots are offloaded with latency hiding but there are no staging buffers
  zero_offloads_in_flight,    //!< slots are offloaded with latency hiding but no offload may be in flight
  bad_alignment,              //!< an arena alignment that is not a power of two
  too_many_slots,             //!< a layer type with more slots than `op::slot` can index
  too_many_chunks,            //!< a slot split into more than `max_chunks_per_slot` chunks
  too_many_ops,               //!< a program of more than `max_ops` ops
  size_overflow,              //!< a size or offset that does not fit in `std::size_t`
  remat_of_input,             //!< a rule rematerializes a layer's input slot
  checkpoints_without_carry,  //!< checkpoints other than the default on a stack without a carry
  zero_snapshots,             //!< checkpoints with no device snapshot
  host_tier_needs_reversal,   //!< host snapshots without an explicit reversal
  bad_reversal,               //!< the explicit reversal is not a valid reversal of the stack
  advance_without_gather,     //!< the reversal re-runs layers but the collectives gather weights
  undeclared_layer_input,     //!< a layer type's input is not accounted for (no carry, input slot or independence)
  zero_spill_buffers,         //!< slots are spilled but there are no spill buffers
  disk_tier_needs_reversal,   //!< disk snapshots without an explicit reversal
  rule_layer_out_of_range,    //!< a rule names a layer index of `max_from_end` or more (other than `all_layers`)
};

//! One issue with the names and numbers its message needs; converts to `true` when there is one.
struct schedule_issue {
  schedule_issue_code code = schedule_issue_code::none;  //!< what is wrong
  tide::name type_name{};                                //!< the layer type concerned (or "device"/"host" for alignments)
  tide::name slot_name{};                                //!< the slot concerned, if any
  std::size_t value = 0;                                 //!< the offending number (a count, rule index, layer or alignment), if any
  std::size_t limit = 0;                                 //!< the bound `value` broke, if any
  //! size_overflow: what was being computed; empty_rule_range: how the bounds are spelled ("ii",
  //! "ff", "fi", "if": i an index, f from the end) or "resolved" (both `value` and `limit` are
  //! indices this stack resolved them to)
  std::string_view quantity{};
  //! True when there is an issue (`code != none`).
  constexpr explicit operator bool() const noexcept { return code != schedule_issue_code::none; }
};

//! Most slots one layer type may declare: real layers save tens of tensors; a type of thousands is
//! a generated file gone wrong, and the planner's per-slot searches are quadratic in a layer's slots.
inline constexpr std::size_t max_slots_per_type = 4096;
//! Most chunks one slot's copy may be split into (a 1 GiB slot in 1 KiB chunks).
inline constexpr std::size_t max_chunks_per_slot = std::size_t{1} << 20;
//! Most ops a schedule may have: 8,388,608, about 13 times the program of a 100,000-layer carry
//! stack under Revolve with 20 snapshots. The builder checks it before it reserves anything, so an
//! absurd chunk size is refused by name instead of reserving gigabytes (an op and its share of
//! waits and clocks take about 100 bytes: the limit bounds a program at under 1 GiB).
inline constexpr std::size_t max_ops = std::size_t{1} << 23;
//! Bytes the builder reserves per op (the op, its waits, its vector clock), for messages.
inline constexpr std::size_t reserved_bytes_per_op = 100;

namespace detail {
constexpr schedule_issue issue(schedule_issue_code code, std::string_view type = {}, std::string_view slot = {},
                               std::size_t value = 0, std::size_t limit = 0, std::string_view quantity = {}) {
  return {code, type, slot, value, limit, quantity};
}
//! A slot name that layer type `t` declares twice (the first in declaration order of the
//! repeats), or an empty view. Sorted names for wide types: pairwise comparison took 29 s for a
//! type of 65,000 slots.
constexpr std::string_view duplicate_slot_name(layer_spec const& t) {
  auto const n = t.slots.size();
  if (n <= 64) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (t.slots[i].name == t.slots[j].name) return t.slots[i].name;
    return {};
  }
  std::vector<std::string_view> names;
  names.reserve(n);
  for (auto const& sl : t.slots) names.push_back(sl.name);
  std::sort(names.begin(), names.end());
  for (std::size_t i = 1; i < n; ++i)
    if (names[i] == names[i - 1]) return names[i];
  return {};
}
//! The problems that do not depend on placements: the stack's types, the rules' names and
//! ranges, the arenas' alignments.
constexpr schedule_issue find_structure_issue(stack_spec const& s, policy_spec const& p, buffer_spec const& b,
                                              checkpoint_spec const& k = {}) {
  using c = schedule_issue_code;
  if (s.layer_count() == 0) return detail::issue(c::empty_stack);
  if (s.carry.bytes == dynamic_bytes) return detail::issue(c::dynamic_size, "(the carry)", s.carry.name);
  if (!s.has_carry() && !k.stores_every_carry()) return detail::issue(c::checkpoints_without_carry);
  if (s.has_carry() && k.reversal.empty()) {
    if (k.device_snapshots == 0) return detail::issue(c::zero_snapshots, {}, s.carry.name);
    if (k.host_snapshots > 0) return detail::issue(c::host_tier_needs_reversal, {}, s.carry.name, k.host_snapshots);
    if (k.disk_snapshots > 0) return detail::issue(c::disk_tier_needs_reversal, {}, s.carry.name, k.disk_snapshots);
  }
  for (auto const& t : s.types) {
    if (t.slots.size() > max_slots_per_type) return detail::issue(c::too_many_slots, t.name, {}, t.slots.size(), max_slots_per_type);
    if (auto const dup = duplicate_slot_name(t); !dup.empty()) return detail::issue(c::duplicate_slot, t.name, dup);
    for (auto const& sl : t.slots) {
      if (sl.bytes == dynamic_bytes) return detail::issue(c::dynamic_size, t.name, sl.name);
      if (sl.bytes == 0) return detail::issue(c::zero_size_slot, t.name, sl.name);
    }
  }
  if (auto const* t = s.undeclared_input_type()) return detail::issue(c::undeclared_layer_input, t->name);
  std::size_t slot_count = 0, named = 0;
  for (auto const& t : s.types) slot_count += t.slots.size();
  for (auto const& r : p.rules) named += r.slots.size();
  std::vector<std::string_view> names;  // sorted when rules name many slots of many (the planner's builds: few)
  if (slot_count * named > 4096) {
    for (auto const& t : s.types)
      for (auto const& sl : t.slots) names.push_back(sl.name);
    std::sort(names.begin(), names.end());
  }
  auto known = [&](std::string_view n) {
    return names.empty() ? s.has_slot(n) : std::binary_search(names.begin(), names.end(), n);
  };
  for (std::size_t i = 0; i < p.rules.size(); ++i) {
    auto const& r = p.rules[i];
    for (auto n : r.slots)
      if (!known(n)) return detail::issue(c::unknown_rule_slot, {}, n, i);
    // An index is an index (a flag says "from the end", no range of values does): one past what a
    // rule may name is refused as the policy-file reader refuses it, not read as a count.
    if (!valid_layer_bound(r.first_layer)) return detail::issue(c::rule_layer_out_of_range, {}, {}, i, r.first_layer.value);
    if (!valid_layer_bound(r.last_layer)) return detail::issue(c::rule_layer_out_of_range, {}, {}, i, r.last_layer.value);
    // `quantity` says how the two bounds are spelled (i: an index, f: from the end), so that the
    // message writes them as the rule does ("[1, 3)" was [from_end(1), from_end(3)) in counts).
    if (!ordered_layer_bounds(r.first_layer, r.last_layer)) {
      layer_bound const first(r.first_layer.value, r.first_layer.from_end), last(r.last_layer.value, r.last_layer.from_end);
      return detail::issue(c::empty_rule_range, {}, {}, first.value, last.value,
                           counts_from_end(first) ? (counts_from_end(last) ? "ff" : "fi") : (counts_from_end(last) ? "if" : "ii"));
    }
    // A bound counted from the end: the range must not be empty in this stack.
    if (counts_from_end(r.first_layer) || counts_from_end(r.last_layer)) {
      auto const first = resolve_layer(r.first_layer, s.layer_count()), last = resolve_layer(r.last_layer, s.layer_count());
      if (first >= last) return detail::issue(c::empty_rule_range, {}, {}, first, last, "resolved");
    }
  }
  auto pow2 = [](std::size_t a) { return a > 0 && (a & (a - 1)) == 0; };
  if (!pow2(b.device_alignment)) return detail::issue(c::bad_alignment, "device", {}, b.device_alignment);
  if (!pow2(b.host_alignment)) return detail::issue(c::bad_alignment, "host", {}, b.host_alignment);
  if (!pow2(b.storage_alignment)) return detail::issue(c::bad_alignment, "storage", {}, b.storage_alignment);
  return {};
}
constexpr schedule_issue overflow(std::string_view quantity, std::string_view type = {}, std::string_view slot = {}) {
  return issue(schedule_issue_code::size_overflow, type, slot, 0, 0, quantity);
}
}  // namespace detail

//! The issue in words: what is wrong, with the names involved, and how to fix it.
TIDE_INLINE std::string to_message(schedule_issue const& i);
#if TIDE_DEFINITIONS
TIDE_INLINE std::string to_message(schedule_issue const& i) {
  using c = schedule_issue_code;
  auto q = [](std::string_view v) {
    std::string r;  // appended piecewise: "'" + std::string(v) trips GCC 12's -Wrestrict (PR 105651)
    r.reserve(v.size() + 2);
    r.append(1, '\'').append(v).append(1, '\'');
    return r;
  };
  switch (i.code) {
    case c::none: return "no issue";
    case c::empty_stack: return "tide: the stack has no layers: add at least one layer";
    case c::duplicate_slot:
      return "tide: layer type " + q(i.type_name) + " names slot " + q(i.slot_name) +
             " twice: give each slot of a layer a distinct name";
    case c::zero_size_slot:
      return "tide: slot " + q(i.slot_name) + " of layer type " + q(i.type_name) +
             " has zero bytes: drop the slot or give it a size";
    case c::dynamic_size:
      return "tide: slot " + q(i.slot_name) + " of layer type " + q(i.type_name) +
             " has a run-time size and none was given: pass it in tide::slot_sizes";
    case c::unknown_rule_slot:
      return "tide: policy rule " + std::to_string(i.value) + " names slot " + q(i.slot_name) +
             " which no layer of the stack has: check the names in the rule's slot selector";
    case c::empty_rule_range: {
      if (i.quantity == "resolved")
        return "tide: a policy rule's layer range, counted from the end, is [" + std::to_string(i.value) + ", " +
               std::to_string(i.limit) + ") in this stack, an empty range: it must select at least one layer of the stacks it is used with";
      auto const spelled = [](std::size_t v, bool end) {
        return end ? "tide::from_end(" + std::to_string(v) + ")" : v == all_layers ? std::string("tide::all_layers") : std::to_string(v);
      };
      bool const first_end = i.quantity.starts_with("f"), last_end = i.quantity.ends_with("f");
      return "tide: a policy rule selects layers [" + spelled(i.value, first_end) + ", " + spelled(i.limit, last_end) +
             "), an empty range: " +
             (first_end && last_end ? "counts from the end descend (the first counts back further: [tide::from_end(" +
                                          std::to_string(i.limit) + "), tide::from_end(" + std::to_string(i.value) + ")) if that is meant)"
              : first_end ? "a count from the end cannot come before an index other than tide::all_layers (the order must "
                            "hold in stacks of any depth): use tide::all_layers as the end"
                          : "use first < last");
    }
    case c::rule_layer_out_of_range:
      return "tide: policy rule " + std::to_string(i.value) + " names layer " + std::to_string(i.limit) +
             ", past the largest layer index a rule may name (" + std::to_string(max_from_end - 1) +
             "): name a layer of the stack, tide::all_layers for the end, or count from the end with tide::from_end(k)";
    case c::unused_rule:
      return "tide: policy rule " + std::to_string(i.value) + " (" + std::string(i.quantity) + " " +
             (i.slot_name.empty() ? std::string("of any slot") : "of slot " + q(i.slot_name) + (i.type_name.empty() ? "" : ", ...")) +
             ") decides no (layer, slot) of this " +
             std::to_string(i.limit) + "-layer stack: it matches none (check its layer range, slot names and minimum size) "
             "or earlier rules decide everything it matches; remove it, or set policy_spec::allow_unused_rules "
             "(tide::policy<tide::allow_unused_rules, ...>)";
    case c::zero_staging_buffers:
      return "tide: the policy offloads slots but the buffers have zero staging buffers: use at least one "
             "(buffer_spec::staging_buffers, tide::staging_buffers<N>)";
    case c::zero_offloads_in_flight:
      return "tide: the policy offloads slots but the pipeline allows zero offloads in flight: use at least one";
    case c::zero_spill_buffers:
      return "tide: the policy spills slots but the buffers have zero spill buffers: use at least one "
             "(buffer_spec::spill_buffers, tide::spill_buffers<N>)";
    case c::bad_alignment:
      return "tide: the " + std::string(i.type_name) + " alignment " + std::to_string(i.value) +
             " is not a power of two";
    case c::too_many_chunks:
      return "tide: slot " + q(i.slot_name) + " of layer type " + q(i.type_name) + " would be copied in " +
             std::to_string(i.value) + " chunks, more than the supported " + std::to_string(i.limit) +
             ": use a larger chunk size";
    case c::too_many_slots:
      return "tide: layer type " + q(i.type_name) + " has " + std::to_string(i.value) +
             " slots, more than the supported " + std::to_string(i.limit) + " (tide::max_slots_per_type)";
    case c::too_many_ops:
      return "tide: the schedule would have " + std::to_string(i.value) + " ops (about " +
             std::to_string(static_cast<std::size_t>(static_cast<double>(i.value) * reserved_bytes_per_op / 1048576.0)) + " MiB of op program), more than the supported " +
             std::to_string(i.limit) + ": use a larger chunk size (pipeline_spec::chunk_bytes), fewer layers or more snapshots";
    case c::remat_of_input:
      return "tide: slot " + q(i.slot_name) + " of layer " + std::to_string(i.value) + " (" + q(i.type_name) +
             ") is the layer's input, which its recompute reads: rematerializing it needs the earlier layers re-run. "
             "Keep or offload it, or declare the stack's carry (stack_spec::carry, tide::carry<\"name\", bytes>) and "
             "store fewer carries with strategy::checkpoints (.device_snapshots = N): tide then recomputes each "
             "dropped carry from the nearest stored one";
    case c::checkpoints_without_carry:
      return "tide: the strategy's checkpoints drop or move carries but the stack declares no carry: declare it "
             "(stack_spec::carry, tide::carry<\"name\", bytes>) or leave strategy::checkpoints at its default";
    case c::zero_snapshots:
      return "tide: the checkpoints store 0 carries of " + q(i.slot_name) +
             " on the device: a reversal needs at least 1 device snapshot (the input's), "
             "set checkpoint_spec::device_snapshots >= 1";
    case c::host_tier_needs_reversal:
      return "tide: the checkpoints ask for " + std::to_string(i.value) + " host snapshot(s) of carry " + q(i.slot_name) +
             " but give no reversal: with a host tier the best reversal depends on the costs; pass "
             "checkpoint_spec::reversal = tide::two_tier_plan(layers, device_snapshots, host_snapshots, costs).actions";
    case c::disk_tier_needs_reversal:
      return "tide: the checkpoints ask for " + std::to_string(i.value) + " disk snapshot(s) of carry " + q(i.slot_name) +
             " but give no reversal: pass checkpoint_spec::reversal = tide::three_tier_plan(layers, "
             "{.device = d, .host = h, .disk = k}, costs).actions";
    case c::bad_reversal:
      return "tide: the checkpoints' reversal (checkpoint_spec::reversal) is invalid at action " + std::to_string(i.value) +
             ": " + std::string(i.quantity);
    case c::advance_without_gather:
      return "tide: the checkpoints re-run layer " + std::to_string(i.value) + " forward (an advance, to rebuild carry " +
             q(i.slot_name) + ") but the strategy's collectives gather before forward or backward, and an advance "
             "runs no gather hook: it would read weights that are not there. Store every carry "
             "(checkpoint_spec::device_snapshots = tide::every_carry) or drop the gather hooks";
    case c::undeclared_layer_input:
      return "tide: layer type " + q(i.type_name) +
             " does not say where its input comes from, so a policy or the planner could rematerialize it from data "
             "that is gone: declare the stack's carry (stack_spec::carry, tide::carry<\"name\", bytes>), mark the slot "
             "that holds the layer's input (slot_spec::input, tide::input_slot<\"name\", bytes>), or, if no layer "
             "reads another's output, set stack_spec::independent_layers (tide::independent_layers)";
    case c::size_overflow:
      return "tide: the " + std::string(i.quantity) +
             (i.slot_name.empty() ? std::string() : " of slot " + q(i.slot_name)) +
             (i.type_name.empty() ? std::string() : " of layer type " + q(i.type_name)) +
             " does not fit in std::size_t: check the slot sizes, guard bytes and alignments";
  }
  return "tide: invalid schedule";
}
#endif

namespace detail {
//! A name an issue concerns, as a structural value: a template argument of the failing
//! `static_check`, which compilers print with the diagnostic (GCC: `slot = tide::detail::issue_name{"q_prj"}`).
struct issue_name {
  char text[64]{};  //!< the name, cut at 63 characters
  //! `s`, cut at 63 characters.
  static constexpr issue_name of(std::string_view s) noexcept {
    issue_name r{};
    for (std::size_t i = 0; i < s.size() && i + 1 < sizeof r.text; ++i) r.text[i] = s[i];
    return r;
  }
};
//! The compile-time diagnostic of each issue code (`make_schedule`): the messages above. The
//! names the run-time message has (the layer type, the slot) are the template arguments
//! `layer_type` and `slot` of the failing instantiation, which the compiler shows beside it.
template <schedule_issue_code issue, issue_name layer_type = issue_name{}, issue_name slot = issue_name{}>
consteval void static_check() {
  using c = schedule_issue_code;
  static_assert(issue != c::empty_stack, "tide: the stack has no layers: add at least one layer");
  static_assert(issue != c::duplicate_slot, "tide: a layer type names the same slot twice: give each slot of a layer a distinct name");
  static_assert(issue != c::zero_size_slot, "tide: a slot has zero bytes: drop the slot or give it a size");
  static_assert(issue != c::dynamic_size,
                "tide: a slot has a run-time size: give every tide::slot a byte count, or build the schedule at run "
                "time with tide::build_schedule(stack, tide::slot_sizes{...}, strategy)");
  static_assert(issue != c::unknown_rule_slot,
                "tide: a policy rule names a slot that no layer of the stack has: check the names in tide::slot_names<...>");
  static_assert(issue != c::empty_rule_range,
                "tide: a policy rule selects an empty layer range: use tide::layer_range<First, Last> with First < Last");
  static_assert(issue != c::rule_layer_out_of_range,
                "tide: a policy rule names a layer index of tide::max_from_end (2^30) or more: name a layer of the "
                "stack, tide::all_layers for the end, or count from the end with tide::from_end(k)");
  static_assert(issue != c::unused_rule,
                "tide: a policy rule decides no (layer, slot) of the stack: it matches none (check its "
                "tide::layer_range, slot names and minimum size) or earlier rules decide everything it matches; "
                "remove it, or allow it: tide::policy<tide::allow_unused_rules, ...>");
  static_assert(issue != c::zero_staging_buffers,
                "tide: the policy offloads slots but the buffers have zero staging buffers: use tide::staging_buffers<N> with N >= 1");
  static_assert(issue != c::zero_offloads_in_flight, "tide: the policy offloads slots but zero offloads may be in flight");
  static_assert(issue != c::zero_spill_buffers,
                "tide: the policy spills slots but the buffers have zero spill buffers: use tide::spill_buffers<N> with N >= 1");
  static_assert(issue != c::bad_alignment, "tide: an arena alignment is not a power of two");
  static_assert(issue != c::too_many_slots, "tide: a layer type has too many slots");
  static_assert(issue != c::too_many_chunks, "tide: the chunk size splits a slot into too many chunks: use a larger one");
  static_assert(issue != c::too_many_ops, "tide: the schedule would have too many ops: use a larger chunk size or fewer layers");
  static_assert(issue != c::remat_of_input,
                "tide: a policy rematerializes a layer's input slot (tide::input_slot), which its recompute reads: keep "
                "or offload it, or declare the stack's carry (tide::carry<\"name\", bytes>) and store fewer carries");
  static_assert(issue != c::checkpoints_without_carry,
                "tide: the strategy's checkpoints drop or move carries but the stack declares no carry: add "
                "tide::carry<\"name\", bytes> to the stack");
  static_assert(issue != c::zero_snapshots, "tide: the checkpoints store 0 carries on the device: use at least 1");
  static_assert(issue != c::host_tier_needs_reversal,
                "tide: host snapshots need an explicit reversal (tide::two_tier_plan(...).actions)");
  static_assert(issue != c::disk_tier_needs_reversal,
                "tide: disk snapshots need an explicit reversal (tide::three_tier_plan(...).actions)");
  static_assert(issue != c::bad_reversal, "tide: the checkpoints' reversal is invalid (tide::build_schedule names the action)");
  static_assert(issue != c::advance_without_gather,
                "tide: the checkpoints re-run layers (advances) but the collectives gather before forward or backward, "
                "and an advance runs no gather hook: store every carry (tide::every_carry) or drop the gather hooks");
  static_assert(issue != c::undeclared_layer_input,
                "tide: a layer type does not say where its input comes from, so a policy could rematerialize it "
                "from data that is gone: add tide::carry<\"name\", bytes> to the stack, declare the slot holding the "
                "layer's input as tide::input_slot<\"name\", bytes>, or add tide::independent_layers to the stack if no "
                "layer reads another's output");
  static_assert(issue != c::size_overflow,
                "tide: a slot size, guard, alignment or arena total does not fit in std::size_t: check the slot sizes, "
                "guard bytes and alignments (tide::build_schedule names the slot and the quantity)");
}
}  // namespace detail

}  // namespace tide
