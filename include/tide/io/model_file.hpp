#pragma once
//! \file
//! Model descriptions: a stack and what its layers cost (as time, or as work that a
//! `hardware_spec` turns into time), as JSON. The schema is `docs/model.schema.json`. Needs
//! nlohmann/json (io/json_file.hpp).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/collectives.hpp>
#include <tide/core/error.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/validation.hpp>
#include <tide/io/json_file.hpp>
#include <tide/plan/hardware.hpp>

namespace tide::io {

//! What a layer costs: either in time (`*_us`) or as work (`*_flops` of matrix products
//! plus `*_bytes` streamed through HBM), turned into time on a `hardware_spec` by
//! `model_description::costs`.
struct type_cost {
  bool given = false;                          //!< false: the file gives no cost (a calibration file must)
  bool as_work = false;                        //!< FLOPs and bytes (true) or microseconds (false)
  double forward = 0;                          //!< us, or FLOPs
  double forward_bytes = 0;                    //!< HBM bytes of the forward (work only)
  double backward = 0;                         //!< us, or FLOPs
  double backward_bytes = 0;                   //!< HBM bytes of the backward (work only)
  std::optional<double> recompute;             //!< us or FLOPs of a full recompute; empty: the forward's
  std::vector<double> slot_recompute{};        //!< per slot: us or FLOPs to produce it again (empty: none)
  std::vector<double> slot_recompute_bytes{};  //!< per slot: HBM bytes of that (work only)
  double gather_us = 0;                        //!< the collective before the layer's forward
  double reduce_us = 0;                        //!< the collective after its backward
  double regather_us = 0;                      //!< the collective before its recompute and backward
};

//! A stack and its costs, read from a model file. Its names are `tide::name`s (interned: valid
//! after the description is gone); `names` keeps the strings it read, as before.
struct model_description {
  std::string name{};                                                                            //!< what the file calls the model
  stack_spec stack{};                                                                            //!< the layer types and the layer sequence
  std::vector<type_cost> layer_costs{};                                                          //!< one per layer of `stack`: its own cost or its type's
  std::size_t resident_bytes = 0;                                                                //!< what the device holds besides activations
  precision matmul = precision::bf16;                                                            //!< the precision of the FLOPs in work costs
  std::string document = "model file";                                                           //!< what errors call the file ("model file m.json")
  std::shared_ptr<std::deque<std::string>> names = std::make_shared<std::deque<std::string>>();  //!< owns the names

  //! True when every layer has a cost.
  bool has_costs() const noexcept {
    for (auto const& c : layer_costs)
      if (!c.given) return false;
    return !layer_costs.empty();
  }
  //! The collectives the costs ask for (a hook wherever some layer has a time for it).
  collective_spec collectives() const noexcept {
    collective_spec c;
    for (auto const& t : layer_costs) {
      c.before_forward = c.before_forward || t.gather_us > 0;
      c.after_backward = c.after_backward || t.reduce_us > 0;
      c.before_backward = c.before_backward || t.regather_us > 0;
    }
    return c;
  }
  //! The per-layer cost table on `hw` with `link` as the host link. Throws `cost_model_error`
  //! naming a layer type without a cost.
  cost_table costs(hardware_spec const& hw, host_link const& link) const {
    cost_table t;
    t.link = link;
    for (std::uint32_t l = 0; l < stack.layer_count(); ++l) {
      auto const& c = layer_costs[l];
      if (!c.given)
        throw cost_model_error("tide: layer " + std::to_string(l) + " (type '" + std::string(stack.layer(l).name) +
                               "') of the model file has no cost: give \"cost\" in the file, or a calibration file");
      // Work becomes time on `hw`; a time past `max_time_us` (work no GPU finishes) is refused
      // here, so that no step time overflows.
      auto time = [&](double x, double bytes, char const* what) {
        double const us = c.as_work ? 1e6 * (hw.matmul_seconds(x, matmul) + hw.memory_seconds(bytes)) : x;
        if (!(us <= max_time_us))
          throw cost_model_error("tide: " + document + ": layer " + std::to_string(l) + " (type '" + std::string(stack.layer(l).name) +
                                 "'): its " + what + " takes " + json(us).dump() + " us on " + std::string(hw.name) + ", more than " +
                                 json(max_time_us).dump() + " us: give work a GPU can do in a step");
        return us;
      };
      layer_cost lc;
      lc.forward_us = time(c.forward, c.forward_bytes, "forward");
      lc.backward_us = time(c.backward, c.backward_bytes, "backward");
      if (c.recompute) lc.recompute_us = time(*c.recompute, c.forward_bytes, "recompute");
      for (std::size_t k = 0; k < c.slot_recompute.size(); ++k)
        lc.slot_recompute_us.push_back(time(c.slot_recompute[k], c.as_work ? c.slot_recompute_bytes[k] : 0, "slot recompute"));
      lc.gather_us = c.gather_us;
      lc.reduce_us = c.reduce_us;
      lc.regather_us = c.regather_us;
      t.layers.push_back(std::move(lc));
    }
    return t;
  }

  //! Keeps `s` alive with the description; returns a view of it.
  std::string_view intern(std::string s) { return names->emplace_back(std::move(s)); }
};

namespace detail {
//! A `cost` object: time (`*_us`) or work (`*_flops`, `*_bytes`).
inline type_cost cost_from(node const& co) {
  co.object({"forward_us", "backward_us", "recompute_us", "forward_flops", "forward_bytes", "backward_flops",
             "backward_bytes", "recompute_flops", "gather_us", "reduce_us", "regather_us"});
  type_cost c;
  c.given = true;
  c.as_work = co.has("forward_flops") || co.has("forward_bytes") || co.has("backward_flops") || co.has("backward_bytes") ||
              co.has("recompute_flops");
  if (c.as_work) {
    if (co.has("forward_us") || co.has("backward_us") || co.has("recompute_us"))
      co.fail("give times (forward_us, ...) or work (forward_flops, ...), not both");
    c.forward = co.at("forward_flops").work();
    if (co.has("forward_bytes")) c.forward_bytes = co.at("forward_bytes").work();
    // A backward computes two products per forward one (input and weight gradients).
    c.backward = co.has("backward_flops") ? co.at("backward_flops").work() : 2 * c.forward;
    c.backward_bytes = co.has("backward_bytes") ? co.at("backward_bytes").work() : 2 * c.forward_bytes;
    if (co.has("recompute_flops")) c.recompute = co.at("recompute_flops").work();
  } else {
    if (co.has("forward_bytes") || co.has("backward_flops") || co.has("backward_bytes") || co.has("recompute_flops"))
      co.fail("give times (forward_us, ...) or work (forward_flops, ...), not both");
    c.forward = co.at("forward_us").time_us();
    c.backward = co.at("backward_us").time_us();
    if (co.has("recompute_us")) c.recompute = co.at("recompute_us").time_us();
  }
  if (co.has("gather_us")) c.gather_us = co.at("gather_us").time_us();
  if (co.has("reduce_us")) c.reduce_us = co.at("reduce_us").time_us();
  if (co.has("regather_us")) c.regather_us = co.at("regather_us").time_us();
  return c;
}
}  // namespace detail

//! The model a model file describes. Throws `json_error`.
inline model_description model_from_json(json const& j, std::string_view document = "model file") {
  detail::node const root(j, document);
  root.object({"name", "layer_types", "layers", "carry", "independent_layers", "resident_bytes", "precision"});
  model_description m;
  m.document = std::string(document);
  if (root.has("name")) m.name = root.at("name").string();
  // Where a layer's input comes from, when no slot is an input and there is no carry.
  if (root.has("independent_layers")) m.stack.independent_layers = root.at("independent_layers").boolean();
  if (root.has("resident_bytes")) m.resident_bytes = root.at("resident_bytes").bytes();
  if (root.has("precision")) {
    static constexpr std::string_view names[] = {"bf16", "fp8"};
    m.matmul = detail::enum_from<precision>(root.at("precision"), names);
  }
  auto const types = root.at("layer_types");
  if (types.size() == 0) types.fail("expected at least one layer type");
  std::vector<layer_spec> specs;
  std::vector<type_cost> type_costs;
  // Names by hash: 100,000 types (or thousands of slots) compared pairwise took minutes.
  std::unordered_map<std::string_view, std::size_t> type_index;
  for (std::size_t i = 0; i < types.size(); ++i) {
    auto const t = types.at(i);
    t.object({"name", "slots", "cost"});
    layer_spec ls;
    ls.name = m.intern(t.at("name").string());
    if (!type_index.try_emplace(ls.name, specs.size()).second)
      t.at("name").fail("a second layer type named '" + detail::echo(ls.name) + "'");
    auto const slots = t.at("slots");
    if (slots.size() == 0) slots.fail("expected at least one slot");
    if (slots.size() > max_slots_per_type)
      slots.fail(std::to_string(slots.size()) + " slots, more than the supported " + std::to_string(max_slots_per_type) +
                 " (tide::max_slots_per_type)");
    std::unordered_set<std::string_view> slot_names;
    type_cost c;
    bool any_slot_cost = false, all_slot_cost = true;
    std::vector<double> slot_cost, slot_bytes;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      auto const s = slots.at(k);
      s.object({"name", "bytes", "input", "recompute_us", "recompute_flops", "recompute_bytes"});
      slot_spec sp;
      sp.name = m.intern(s.at("name").string());
      if (!slot_names.insert(sp.name).second)
        s.at("name").fail("a second slot named '" + detail::echo(sp.name) + "' in layer type '" + detail::echo(ls.name) + "'");
      sp.bytes = s.at("bytes").slot_bytes();
      if (s.has("input")) sp.input = s.at("input").boolean();
      ls.slots.push_back(sp);
      bool const has_us = s.has("recompute_us"), has_flops = s.has("recompute_flops");
      if (has_us && has_flops) s.fail("give recompute_us or recompute_flops, not both");
      any_slot_cost = any_slot_cost || has_us || has_flops;
      all_slot_cost = all_slot_cost && (has_us || has_flops || sp.input);  // an input is never rematerialized
      slot_cost.push_back(has_us ? s.at("recompute_us").time_us() : has_flops ? s.at("recompute_flops").work() : 0);
      slot_bytes.push_back(s.has("recompute_bytes") ? s.at("recompute_bytes").work() : 0);
      if (!has_flops && s.has("recompute_bytes")) s.at("recompute_bytes").fail("recompute_bytes goes with recompute_flops");
    }
    if (any_slot_cost && !all_slot_cost)
      slots.fail("some slots give a recompute cost and some do not: give one for every slot of the type (but its input), "
                 "or none");
    if (t.has("cost")) {
      c = detail::cost_from(t.at("cost"));
      if (any_slot_cost) {
        for (std::size_t k = 0; k < slots.size(); ++k) {
          auto const s = slots.at(k);
          if (c.as_work ? s.has("recompute_us") : s.has("recompute_flops"))
            s.fail(c.as_work ? "the type's cost is work: give recompute_flops" : "the type's cost is time: give recompute_us");
        }
        c.slot_recompute = slot_cost;
        c.slot_recompute_bytes = slot_bytes;
      }
    } else if (any_slot_cost) {
      slots.fail("slot recompute costs need the type's \"cost\"");
    }
    specs.push_back(std::move(ls));
    type_costs.push_back(std::move(c));
  }
  auto const layers = root.at("layers");
  if (layers.size() == 0) layers.fail("expected at least one entry");
  constexpr auto no_type = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> stack_type(specs.size(), no_type);  // a file type's index in m.stack.types
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto const e = layers.at(i);
    e.object({"type", "count", "cost"});
    auto const tn = e.at("type").string();
    auto const found = type_index.find(tn);
    std::size_t const ti = found == type_index.end() ? specs.size() : found->second;
    if (ti == specs.size()) {
      std::string list;
      for (auto const& s : specs) list += (list.empty() ? "" : ", ") + std::string(s.name);
      e.at("type").fail("unknown layer type '" + detail::echo(tn) + "' (the file's types: " + list + ")");
    }
    std::uint32_t count = 1;
    if (e.has("count")) {
      count = e.at("count").u32();
      if (count == 0) e.at("count").fail("expected at least 1");
    }
    if (static_cast<std::uint64_t>(m.stack.layer_count()) + count > 100000) e.at("count").fail("more than 100000 layers in all");
    // These layers' own cost, or their type's; slot recompute costs are always the type's.
    auto c = type_costs[ti];
    if (e.has("cost")) {
      auto const co = e.at("cost");
      auto own = detail::cost_from(co);
      if (!c.slot_recompute.empty() && own.as_work != c.as_work)
        co.fail(std::string("the type's slot recompute costs are ") + (c.as_work ? "work: give this cost as work too" : "times: give this cost as times too"));
      own.slot_recompute = c.slot_recompute;
      own.slot_recompute_bytes = c.slot_recompute_bytes;
      c = std::move(own);
    }
    // As stack_spec::append (types in order of first use), without its search by name.
    if (stack_type[ti] == no_type) {
      stack_type[ti] = static_cast<std::uint32_t>(m.stack.types.size());
      m.stack.types.push_back(specs[ti]);
    }
    m.stack.layer_types.insert(m.stack.layer_types.end(), count, stack_type[ti]);
    m.layer_costs.insert(m.layer_costs.end(), count, c);
  }
  if (root.has("carry")) {
    auto const c = root.at("carry");
    c.object({"name", "bytes"});
    m.stack.carry.name = m.intern(c.at("name").string());
    m.stack.carry.bytes = c.at("bytes").slot_bytes();
  }
  return m;
}

//! Reads the model file at `path`.
inline model_description read_model_file(std::string const& path) {
  return model_from_json(read_json_file(path, "model file"), "model file " + path);
}

}  // namespace tide::io
