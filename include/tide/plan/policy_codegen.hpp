#pragma once
//! \file
//! Policy code generation: the fewest rules that reproduce per-(layer, slot) decisions
//! (`policy_from_decisions`), and a strategy printed as the C++ type that spells it
//! (`to_cpp_types`), so a planned schedule can be fixed at compile time.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>

namespace tide {

//! The fewest rules (per slot name: maximal layer ranges; rules with the same placement and range
//! merged) whose first-match decisions equal `decisions`.
TIDE_INLINE policy_spec policy_from_decisions(stack_spec const& stack, std::vector<placement> const& decisions);

//! `s` as a C++ string literal naming the same bytes: quotes and backslashes escaped, every byte
//! outside printable ASCII as a three-digit octal escape (which, unlike `\x`, cannot run into the
//! next character).
inline std::string cpp_string_literal(std::string_view s) {
  std::string r = "\"";
  for (char c : s) {
    auto const u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') r += '\\', r += c;
    else if (u >= 0x20 && u < 0x7f) r += c;
    else r += {'\\', static_cast<char>('0' + (u >> 6)), static_cast<char>('0' + ((u >> 3) & 7)), static_cast<char>('0' + (u & 7))};
  }
  return r + "\"";
}

//! A strategy as one C++ type, for users who want the schedule fixed at compile time:
//! `using <name> = tide::strategy_of<tide::policy<...>, tide::buffers<...>, tide::pipeline<...>>;`
//! (knobs at their defaults are left out). Throws `schedule_error` for checkpoints with a host tier
//! or an explicit reversal, which have no type-level spelling.
TIDE_INLINE std::string to_cpp_types(strategy const& st, std::string_view name = "planned");

#if TIDE_DEFINITIONS
TIDE_INLINE policy_spec policy_from_decisions(stack_spec const& stack, std::vector<placement> const& decisions) {
  auto const L = stack.layer_count();
  std::vector<std::size_t> first(L + 1, 0);
  for (std::uint32_t l = 0; l < L; ++l) first[l + 1] = first[l] + stack.layer(l).slots.size();
  if (decisions.size() != first[L])
    throw schedule_error("tide: " + std::to_string(decisions.size()) + " decisions given for a stack with " +
                         std::to_string(first[L]) + " (layer, slot) pairs");
  // Slot names in order of first appearance (the rules' order), numbered in that order; each
  // type's slots by number. Then each name's occurrences (layer, decision) in layer order, and a
  // rule per run of one action among them: linear in the decisions (a lookup by name per (action,
  // name, layer) made deep stacks slow, and linear scans made them quadratic).
  std::vector<std::pair<std::string_view, std::size_t>> sorted_names;  // (name, position among the types' slots)
  for (auto const& t : stack.types)
    for (auto const& x : t.slots) sorted_names.push_back({x.name, sorted_names.size()});
  std::stable_sort(sorted_names.begin(), sorted_names.end(), [](auto const& a, auto const& b) { return a.first < b.first; });
  std::vector<std::string_view> names;
  std::vector<std::uint32_t> id_at(sorted_names.size());  // each type slot's name number (by position)
  {
    std::vector<std::pair<std::size_t, std::size_t>> firsts;  // (first position, index in sorted_names)
    for (std::size_t i = 0; i < sorted_names.size(); ++i)
      if (i == 0 || sorted_names[i].first != sorted_names[i - 1].first) firsts.push_back({sorted_names[i].second, i});
    std::sort(firsts.begin(), firsts.end());
    std::vector<std::uint32_t> id_of_sorted(sorted_names.size());
    for (std::size_t n = 0; n < firsts.size(); ++n) {
      names.push_back(sorted_names[firsts[n].second].first);
      for (auto i = firsts[n].second; i < sorted_names.size() && sorted_names[i].first == names.back(); ++i)
        id_of_sorted[i] = static_cast<std::uint32_t>(n);
    }
    for (std::size_t i = 0; i < sorted_names.size(); ++i) id_at[sorted_names[i].second] = id_of_sorted[i];
  }
  std::vector<std::size_t> type_first(stack.types.size() + 1, 0);
  for (std::size_t ti = 0; ti < stack.types.size(); ++ti) type_first[ti + 1] = type_first[ti] + stack.types[ti].slots.size();
  struct occurrence {
    std::uint32_t layer;
    placement where;
  };
  std::vector<std::vector<occurrence>> occurrences(names.size());
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const ti = stack.layer_types[l];
    for (std::size_t k = 0; k < stack.types[ti].slots.size(); ++k)
      occurrences[id_at[type_first[ti] + k]].push_back({l, decisions[first[l] + k]});
  }
  policy_spec p;
  std::map<std::tuple<placement, std::uint32_t, std::uint32_t>, std::size_t> rule_of;  // (action, first, last) -> rule
  for (auto action : {placement::offload, placement::remat, placement::spill})
    for (std::size_t n = 0; n < names.size(); ++n) {
      auto const& occ = occurrences[n];
      // A run: consecutive occurrences of `action` (a layer without the slot does not break it).
      for (std::size_t i = 0; i < occ.size();) {
        if (occ[i].where != action) {
          ++i;
          continue;
        }
        auto const begin = occ[i].layer;
        while (i < occ.size() && occ[i].where == action) ++i;
        auto const end = occ[i - 1].layer + 1;  // one past the last matching layer
        auto const last = end == L ? all_layers : end;
        auto const [it, added] = rule_of.try_emplace({action, begin, last}, p.rules.size());
        if (added) p.rules.push_back({.where = action, .slots = {names[n]}, .first_layer = begin, .last_layer = last});
        else p.rules[it->second].slots.push_back(names[n]);
      }
    }
  return p;
}

TIDE_INLINE std::string to_cpp_types(strategy const& st, std::string_view name) {
  std::string r = "using " + std::string(name) + " = tide::strategy_of<\n    tide::policy<";
  if (st.policy.allow_unused_rules) r += "\n        tide::allow_unused_rules";
  for (std::size_t i = 0; i < st.policy.rules.size(); ++i) {
    auto const& rule = st.policy.rules[i];
    r += i == 0 && !st.policy.allow_unused_rules ? "\n        " : ",\n        ";
    r += "tide::" + std::string(to_string(rule.where)) + "<";
    std::vector<std::string> sel;
    if (!rule.slots.empty()) {
      std::string n = "tide::slot_names<";
      for (std::size_t k = 0; k < rule.slots.size(); ++k) n += (k ? ", " : "") + cpp_string_literal(rule.slots[k]);
      sel.push_back(n + ">");
    }
    if (rule.first_layer != 0 || rule.last_layer != all_layers) {
      auto bound = [](layer_bound l) {
        return counts_from_end(l) ? "tide::from_end(" + std::to_string(from_end_count(l)) + ")"
               : l == all_layers  ? std::string("tide::all_layers")
                                  : std::to_string(l.value);
      };
      sel.push_back("tide::layer_range<" + bound(rule.first_layer) +
                    (rule.last_layer == all_layers ? std::string() : ", " + bound(rule.last_layer)) + ">");
    }
    if (rule.min_bytes) sel.push_back("tide::min_bytes<" + std::to_string(rule.min_bytes) + ">");
    for (std::size_t k = 0; k < sel.size(); ++k) r += (k ? ", " : "") + sel[k];
    r += ">";
  }
  r += ">";
  auto knobs = [&](std::string_view what, std::vector<std::string> const& k) {
    if (k.empty()) return;
    r += ",\n    tide::" + std::string(what) + "<";
    for (std::size_t i = 0; i < k.size(); ++i) r += (i ? ", " : "") + k[i];
    r += ">";
  };
  buffer_spec const b0;
  auto const& b = st.buffers;
  std::vector<std::string> bk;
  if (b.staging_buffers != b0.staging_buffers) bk.push_back("tide::staging_buffers<" + std::to_string(b.staging_buffers) + ">");
  if (b.device_alignment != b0.device_alignment) bk.push_back("tide::device_alignment<" + std::to_string(b.device_alignment) + ">");
  if (b.host_alignment != b0.host_alignment) bk.push_back("tide::host_alignment<" + std::to_string(b.host_alignment) + ">");
  if (b.guard_bytes != b0.guard_bytes) bk.push_back("tide::guard_bytes<" + std::to_string(b.guard_bytes) + ">");
  if (b.share_phase_regions != b0.share_phase_regions)
    bk.push_back(std::string("tide::share_phase_regions<") + (b.share_phase_regions ? "true" : "false") + ">");
  if (b.spill_buffers != b0.spill_buffers) bk.push_back("tide::spill_buffers<" + std::to_string(b.spill_buffers) + ">");
  if (b.lend_recompute_scratch != b0.lend_recompute_scratch)
    bk.push_back(std::string("tide::lend_recompute_scratch<") + (b.lend_recompute_scratch ? "true" : "false") + ">");
  if (b.storage_alignment != b0.storage_alignment)
    bk.push_back("tide::storage_alignment<" + std::to_string(b.storage_alignment) + ">");
  knobs("buffers", bk);
  pipeline_spec const p0;
  auto const& p = st.pipeline;
  std::vector<std::string> pk;
  if (p.latency_hiding != p0.latency_hiding) pk.push_back(std::string("tide::latency_hiding<") + (p.latency_hiding ? "true" : "false") + ">");
  if (p.prefetch_distance != p0.prefetch_distance) pk.push_back("tide::prefetch_distance<" + std::to_string(p.prefetch_distance) + ">");
  if (p.chunk_bytes != p0.chunk_bytes) pk.push_back("tide::chunk_bytes<" + std::to_string(p.chunk_bytes) + ">");
  if (p.max_offloads_in_flight != p0.max_offloads_in_flight)
    pk.push_back("tide::max_offloads_in_flight<" + std::to_string(p.max_offloads_in_flight) + ">");
  knobs("pipeline", pk);
  std::vector<std::string> ck;
  if (st.collectives.before_forward) ck.push_back("tide::before_forward");
  if (st.collectives.before_backward) ck.push_back("tide::before_backward");
  if (st.collectives.after_backward) ck.push_back("tide::after_backward");
  if (!st.collectives.overlap) ck.push_back("tide::overlap_collectives<false>");
  knobs("collectives", ck);
  auto const& k = st.checkpoints;
  if (k.host_snapshots > 0 || !k.reversal.empty())
    throw schedule_error("tide::to_cpp_types: checkpoints with a host tier or an explicit reversal have no type-level "
                         "spelling (the reversal is made at run time): build the schedule from the strategy value");
  if (k.device_snapshots != every_carry)
    knobs("checkpoints", {"tide::device_snapshots<" + std::to_string(k.device_snapshots) + ">"});
  return r + ">;\n";
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide
