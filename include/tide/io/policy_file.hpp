#pragma once
//! \file
//! Policy files: a strategy (policy rules, buffers, pipeline, collectives, checkpoints) as JSON.
//! The schema is `docs/policy.schema.json`. Needs nlohmann/json (io/json_file.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <tide/core/reversal.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#include <tide/io/json_file.hpp>

namespace tide::io {

//! A strategy as a policy file: `rules` (first match wins, default keep), then every field of
//! `buffers`, `pipeline` and `collectives`, and `checkpoints` when it is not the default.
inline json to_json(strategy const& st) {
  json j;
  j["rules"] = json::array();
  for (auto const& r : st.policy.rules) {
    json rule;
    rule["where"] = std::string(to_string(r.where));
    if (!r.slots.empty()) {
      rule["slots"] = json::array();
      for (auto n : r.slots) rule["slots"].push_back(std::string(n));
    }
    // A bound counted from the end is negative (-1: the last layer); the end is the default. Each
    // in its one spelling (fields set by hand: 0 back is the end, a count past max_from_end is
    // max_from_end), which the reader takes back ("last_layer": 0 and -2,000,000,000 were written).
    auto const spelled = [](layer_bound l) { return layer_bound(l.value, l.from_end); };
    auto bound = [](layer_bound l) {
      return counts_from_end(l) ? json(-static_cast<std::int64_t>(from_end_count(l))) : json(l.value);
    };
    if (spelled(r.first_layer) != 0) rule["first_layer"] = bound(spelled(r.first_layer));
    if (spelled(r.last_layer) != all_layers) rule["last_layer"] = bound(spelled(r.last_layer));
    if (r.min_bytes != 0) rule["min_bytes"] = r.min_bytes;
    j["rules"].push_back(std::move(rule));
  }
  if (st.policy.allow_unused_rules) j["allow_unused_rules"] = true;
  auto const& b = st.buffers;
  j["buffers"] = {{"staging_buffers", b.staging_buffers},
                  {"device_alignment", b.device_alignment},
                  {"host_alignment", b.host_alignment},
                  {"guard_bytes", b.guard_bytes},
                  {"share_phase_regions", b.share_phase_regions}};
  // Written only when not the default: 0.3.0 readers read the rest.
  if (b.spill_buffers != buffer_spec{}.spill_buffers) j["buffers"]["spill_buffers"] = b.spill_buffers;
  if (b.storage_alignment != buffer_spec{}.storage_alignment) j["buffers"]["storage_alignment"] = b.storage_alignment;
  if (!b.lend_recompute_scratch) j["buffers"]["lend_recompute_scratch"] = false;
  auto const& p = st.pipeline;
  j["pipeline"] = {{"latency_hiding", p.latency_hiding},
                   {"prefetch_distance", p.prefetch_distance},
                   {"chunk_bytes", p.chunk_bytes},
                   {"max_offloads_in_flight", p.max_offloads_in_flight}};
  auto const& c = st.collectives;
  j["collectives"] = {{"before_forward", c.before_forward}, {"before_backward", c.before_backward}, {"after_backward", c.after_backward}};
  if (!c.overlap) j["collectives"]["overlap"] = false;  // written only when off: 0.3.0 readers read the rest
  auto const& k = st.checkpoints;
  if (!(k == checkpoint_spec{})) {
    json ck;
    ck["device_snapshots"] = k.device_snapshots == every_carry ? json("every") : json(k.device_snapshots);
    ck["host_snapshots"] = k.host_snapshots;
    if (k.disk_snapshots > 0) ck["disk_snapshots"] = k.disk_snapshots;  // written only when used: a 0.3.0 reader reads the rest
    if (!k.reversal.empty()) {
      ck["reversal"] = json::array();
      for (auto const& a : k.reversal) {
        json x;
        x["op"] = std::string(detail::chain_op_names[static_cast<std::size_t>(a.op)]);
        if (a.carry >= 0) x["carry"] = a.carry;
        if (a.to >= 0) x["to"] = a.to;
        if (a.snapshot >= 0) x["snapshot"] = a.snapshot;
        if (a.host_snapshot >= 0) x["host_snapshot"] = a.host_snapshot;
        if (a.disk_snapshot >= 0) x["disk_snapshot"] = a.disk_snapshot;
        ck["reversal"].push_back(std::move(x));
      }
    }
    j["checkpoints"] = std::move(ck);
  }
  return j;
}

//! The strategy a policy file describes, for `stack`: slot names are checked against the stack
//! (they are `tide::name`s: the result does not refer to the stack or the document). Absent parts and fields keep
//! their defaults. Throws `json_error`; `document` names the file in the message. A plan written
//! and read back builds the same schedule (from `tests/io/json_test.cpp`):
//! \snippet io/json_test.cpp policy_round_trip
inline strategy strategy_from_json(json const& j, stack_spec const& stack, std::string_view document = "policy file") {
  detail::node const root(j, document);
  root.object({"rules", "allow_unused_rules", "buffers", "pipeline", "collectives", "checkpoints"});
  strategy st;
  if (root.has("rules")) {
    auto const rules = root.at("rules");
    for (std::size_t i = 0; i < rules.size(); ++i) {
      auto const r = rules.at(i);
      // The keys are the C++ fields' names; 0.2's "action" and "layers" are read for one more
      // minor release (deprecated in 0.3), never mixed with their replacements.
      r.object({"where", "slots", "first_layer", "last_layer", "min_bytes", "action", "layers"});
      detail::one_spelling(r, "where", "action");
      detail::one_spelling(r, "first_layer", "layers");
      detail::one_spelling(r, "last_layer", "layers");
      rule_spec rule;
      rule.where = detail::enum_from<placement>(r.at(r.has("action") ? "action" : "where"), detail::placement_names);
      if (r.has("slots")) {
        auto const s = r.at("slots");
        if (s.size() == 0) s.fail("an empty slot list selects nothing: leave \"slots\" out to select every slot");
        for (std::size_t k = 0; k < s.size(); ++k) rule.slots.push_back(detail::stack_slot_name(stack, s.at(k)));
      }
      if (r.has("first_layer")) rule.first_layer = r.at("first_layer").layer_bound();
      if (r.has("last_layer")) {
        auto const l = r.at("last_layer");
        rule.last_layer = l.value().is_null() ? all_layers : l.layer_bound();
        if (rule.last_layer == 0) l.fail("a range that ends before layer 0 selects nothing");
      }
      if (!ordered_layer_bounds(rule.first_layer, rule.last_layer))
        r.fail("the layer range [first_layer, last_layer) is empty: the last layer is excluded");
      if (r.has("layers")) {
        auto const l = r.at("layers");
        if (l.size() != 2)
          l.fail("expected [first, last): two entries, last null for every layer from first on, negative counting "
                 "from the end (-1: the last layer)");
        rule.first_layer = l.at(0).layer_bound();
        rule.last_layer = l.at(1).value().is_null() ? all_layers : l.at(1).layer_bound();
        if (!ordered_layer_bounds(rule.first_layer, rule.last_layer))
          l.fail("the range [" + l.at(0).value().dump() + ", " + l.at(1).value().dump() +
                 ") is empty: the last layer is excluded");
      }
      if (r.has("min_bytes")) rule.min_bytes = r.at("min_bytes").bytes();
      st.policy.rules.push_back(std::move(rule));
    }
  }
  if (root.has("allow_unused_rules")) st.policy.allow_unused_rules = root.at("allow_unused_rules").boolean();
  auto power_of_two = [](detail::node const& n) {
    auto const v = n.bytes();
    if (v == 0 || (v & (v - 1)) != 0) n.fail("expected a power of two, found " + std::to_string(v));
    return v;
  };
  if (root.has("buffers")) {
    auto const b = root.at("buffers");
    b.object({"staging_buffers", "device_alignment", "host_alignment", "guard_bytes", "share_phase_regions", "spill_buffers",
              "storage_alignment", "lend_recompute_scratch"});
    if (b.has("staging_buffers")) st.buffers.staging_buffers = b.at("staging_buffers").u32();
    if (b.has("device_alignment")) st.buffers.device_alignment = power_of_two(b.at("device_alignment"));
    if (b.has("host_alignment")) st.buffers.host_alignment = power_of_two(b.at("host_alignment"));
    if (b.has("guard_bytes")) st.buffers.guard_bytes = b.at("guard_bytes").bytes();
    if (b.has("share_phase_regions")) st.buffers.share_phase_regions = b.at("share_phase_regions").boolean();
    if (b.has("spill_buffers")) st.buffers.spill_buffers = b.at("spill_buffers").u32();
    if (b.has("storage_alignment")) st.buffers.storage_alignment = power_of_two(b.at("storage_alignment"));
    if (b.has("lend_recompute_scratch")) st.buffers.lend_recompute_scratch = b.at("lend_recompute_scratch").boolean();
  }
  if (root.has("pipeline")) {
    auto const p = root.at("pipeline");
    p.object({"latency_hiding", "prefetch_distance", "chunk_bytes", "max_offloads_in_flight"});
    if (p.has("latency_hiding")) st.pipeline.latency_hiding = p.at("latency_hiding").boolean();
    if (p.has("prefetch_distance")) st.pipeline.prefetch_distance = p.at("prefetch_distance").u32();
    if (p.has("chunk_bytes")) st.pipeline.chunk_bytes = p.at("chunk_bytes").bytes();
    // 0 reads as written: the builder refuses it where an offload runs with latency hiding
    // (`zero_offloads_in_flight`) and accepts it elsewhere, so a strategy it built reads back.
    if (p.has("max_offloads_in_flight")) st.pipeline.max_offloads_in_flight = p.at("max_offloads_in_flight").u32();
  }
  if (root.has("collectives")) {
    auto const c = root.at("collectives");
    c.object({"before_forward", "after_backward", "before_backward", "overlap"});
    if (c.has("before_forward")) st.collectives.before_forward = c.at("before_forward").boolean();
    if (c.has("after_backward")) st.collectives.after_backward = c.at("after_backward").boolean();
    if (c.has("before_backward")) st.collectives.before_backward = c.at("before_backward").boolean();
    if (c.has("overlap")) st.collectives.overlap = c.at("overlap").boolean();
  }
  if (root.has("checkpoints")) {
    auto const k = root.at("checkpoints");
    k.object({"device_snapshots", "host_snapshots", "disk_snapshots", "reversal"});
    if (k.has("device_snapshots")) {
      auto const d = k.at("device_snapshots");
      if (d.value().is_string()) {
        if (d.string() != "every") d.fail("expected a positive integer or \"every\", found \"" + d.string() + "\"");
        st.checkpoints.device_snapshots = every_carry;
      } else {
        st.checkpoints.device_snapshots = d.u32();
        if (st.checkpoints.device_snapshots == 0) d.fail("expected at least 1 (the input's snapshot)");
      }
    }
    if (k.has("host_snapshots")) st.checkpoints.host_snapshots = k.at("host_snapshots").u32();
    if (k.has("disk_snapshots")) st.checkpoints.disk_snapshots = k.at("disk_snapshots").u32();
    if (k.has("reversal")) {
      auto const rv = k.at("reversal");
      for (std::size_t i = 0; i < rv.size(); ++i) {
        auto const a = rv.at(i);
        // 0.2's "state", "slot" and "host" are read too (deprecated in 0.3).
        a.object({"op", "carry", "to", "snapshot", "host_snapshot", "disk_snapshot", "state", "slot", "host"});
        detail::one_spelling(a, "carry", "state");
        detail::one_spelling(a, "snapshot", "slot");
        detail::one_spelling(a, "host_snapshot", "host");
        chain_action x;
        x.op = detail::enum_from<chain_op>(a.at("op"), detail::chain_op_names);
        auto field = [&](char const* key, char const* old, std::int32_t& to) {
          if (a.has(key)) to = a.at(key).i32_or_minus_one();
          else if (a.has(old)) to = a.at(old).i32_or_minus_one();
        };
        field("carry", "state", x.carry);
        field("to", "to", x.to);
        field("snapshot", "slot", x.snapshot);
        field("host_snapshot", "host", x.host_snapshot);
        field("disk_snapshot", "disk_snapshot", x.disk_snapshot);
        st.checkpoints.reversal.push_back(x);
      }
    }
  }
  return st;
}

//! Writes `st` as a policy file.
inline void write_policy_file(std::string const& path, strategy const& st) { write_json_file(path, to_json(st)); }
//! Reads the policy file at `path` for `stack` (which must outlive the result).
inline strategy read_policy_file(std::string const& path, stack_spec const& stack) {
  auto const document = "policy file " + path;
  return strategy_from_json(read_json_file(path, "policy file"), stack, document);
}

}  // namespace tide::io
