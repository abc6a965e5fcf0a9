#pragma once
//! \file
//! Calibration files: a cost table (what `tide::calibrate` measured, or a hand-written table) as
//! JSON. The schema is `docs/calibration.schema.json`. Needs nlohmann/json (io/json_file.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/error.hpp>
#include <tide/io/json_file.hpp>

namespace tide::io {

//! A cost table as a calibration file (what `tide::calibrate` measured, or a hand-written table).
inline json to_json(cost_table const& t) {
  // What the reader takes, no more: one check of the table (cost_table::check) for both, so a
  // written file always reads back (1.8e308 microseconds was written and then refused).
  static_assert(cost_table::max_time_us == max_time_us, "the readers' time bound is the cost table's");
  t.check();
  // JSON has no NaN or infinity (nlohmann would write null): refuse them here, naming the field.
  auto finite = [](double v, std::string const& what) {
    if (!std::isfinite(v)) throw error("tide: the cost table's " + what + " is " + std::to_string(v) + ": not writable as JSON");
    return v;
  };
  for (std::size_t l = 0; l < t.layers.size(); ++l) {
    auto const& c = t.layers[l];
    auto const at = "layer " + std::to_string(l) + " ";
    finite(c.forward_us, at + "forward_us"), finite(c.backward_us, at + "backward_us");
    if (c.recompute_us) finite(*c.recompute_us, at + "recompute_us");
    finite(c.gather_us, at + "gather_us"), finite(c.reduce_us, at + "reduce_us"), finite(c.regather_us, at + "regather_us");
    for (auto v : c.slot_recompute_us) finite(v, at + "slot_recompute_us");
    finite(c.memory_bound_share, at + "memory_bound_share");
    if (!c.slot_producer.empty() && c.slot_producer.size() != c.slot_recompute_us.size())
      throw error("tide: the cost table's layer " + std::to_string(l) + " has " + std::to_string(c.slot_producer.size()) +
                  " slot producers but " + std::to_string(c.slot_recompute_us.size()) + " slot recompute costs");
  }
  finite(t.hbm_bytes_per_second, "hbm_bytes_per_second");
  finite(t.link.d2h.bytes_per_second, "d2h bandwidth"), finite(t.link.h2d.bytes_per_second, "h2d bandwidth");
  finite(t.link.d2h.latency_us, "d2h latency_us"), finite(t.link.h2d.latency_us, "h2d latency_us");
  finite(t.storage.write.bytes_per_second, "storage write bandwidth"), finite(t.storage.read.bytes_per_second, "storage read bandwidth");
  finite(t.sync_latency_us, "sync_latency_us"), finite(t.op_overhead_us, "op_overhead_us");
  json j;
  j["layers"] = json::array();
  for (auto const& l : t.layers) {
    // recompute_us left out where the table has none ("as forward_us"): it reads back so.
    json x = {{"forward_us", l.forward_us}, {"backward_us", l.backward_us}};
    if (l.recompute_us) x["recompute_us"] = *l.recompute_us;
    if (!l.slot_recompute_us.empty()) x["slot_recompute_us"] = l.slot_recompute_us;
    if (!l.slot_producer.empty()) x["slot_producer"] = l.slot_producer;
    // Left out when +0 (the default); -0.0 is written, so the table reads back bit for bit.
    auto const given = [](double v) { return v != 0 || std::signbit(v); };
    if (given(l.gather_us)) x["gather_us"] = l.gather_us;
    if (given(l.reduce_us)) x["reduce_us"] = l.reduce_us;
    if (given(l.regather_us)) x["regather_us"] = l.regather_us;
    if (given(l.memory_bound_share)) x["memory_bound_share"] = l.memory_bound_share;
    j["layers"].push_back(std::move(x));
  }
  auto dir = [](link_direction const& m) { return json{{"bytes_per_second", m.bytes_per_second}, {"latency_us", m.latency_us}}; };
  j["link"] = {{"d2h", dir(t.link.d2h)}, {"h2d", dir(t.link.h2d)}, {"full_duplex", t.link.full_duplex}};
  // The storage link where it is not the default (unpaced, latency 0): a table with drives read
  // back without them, its spills then priced as free (issue 54).
  if (!(t.storage.unpaced() && t.storage.write.latency_us == 0 && t.storage.read.latency_us == 0 && !t.storage.full_duplex &&
        !std::signbit(t.storage.write.latency_us) && !std::signbit(t.storage.read.latency_us)))
    j["storage"] = {{"write", dir(t.storage.write)}, {"read", dir(t.storage.read)}, {"full_duplex", t.storage.full_duplex}};
  j["sync_latency_us"] = t.sync_latency_us;
  j["op_overhead_us"] = t.op_overhead_us;
  if (t.hbm_bytes_per_second != 0 || std::signbit(t.hbm_bytes_per_second)) j["hbm_bytes_per_second"] = t.hbm_bytes_per_second;
  return j;
}

namespace detail {
inline layer_cost layer_cost_from(node const& n) {
  n.object({"forward_us", "backward_us", "recompute_us", "slot_recompute_us", "slot_producer", "gather_us", "reduce_us",
            "regather_us", "memory_bound_share"});
  layer_cost c;
  c.forward_us = n.at("forward_us").time_us();
  c.backward_us = n.at("backward_us").time_us();
  if (n.has("recompute_us")) c.recompute_us = n.at("recompute_us").time_us();
  if (n.has("slot_recompute_us")) {
    auto const s = n.at("slot_recompute_us");
    for (std::size_t k = 0; k < s.size(); ++k) c.slot_recompute_us.push_back(s.at(k).time_us());
  }
  if (n.has("slot_producer")) {
    auto const p = n.at("slot_producer");
    if (!n.has("slot_recompute_us")) p.fail("slot_producer needs slot_recompute_us beside it (one cost per slot)");
    if (p.size() != c.slot_recompute_us.size())
      p.fail("expected one producer per entry of slot_recompute_us (" + std::to_string(c.slot_recompute_us.size()) + "), found " +
             std::to_string(p.size()));
    for (std::size_t k = 0; k < p.size(); ++k)
      c.slot_producer.push_back(static_cast<std::uint16_t>(p.at(k).unsigned_integer(std::numeric_limits<std::uint16_t>::max())));
  }
  if (n.has("memory_bound_share")) c.memory_bound_share = n.at("memory_bound_share").number(0, 1);
  if (n.has("gather_us")) c.gather_us = n.at("gather_us").time_us();
  if (n.has("reduce_us")) c.reduce_us = n.at("reduce_us").time_us();
  if (n.has("regather_us")) c.regather_us = n.at("regather_us").time_us();
  return c;
}
inline link_direction link_direction_from(node const& n) {
  n.object({"bytes_per_second", "latency_us", "latency_s"});
  link_direction m;
  // 0: unpaced (what `calibrate` writes when it does not measure the link). A positive rate
  // below a byte per second would make a copy's time overflow.
  auto const bw = n.at("bytes_per_second");
  m.bytes_per_second = bw.number();
  if (m.bytes_per_second > 0 && m.bytes_per_second < 1) bw.fail("expected 0 (unpaced) or at least 1 byte per second, found " + bw.value().dump());
  one_spelling(n, "latency_us", "latency_s");
  if (n.has("latency_us")) m.latency_us = n.at("latency_us").time_us();
  // 0.2's seconds, read for one more minor release (deprecated in 0.3).
  if (n.has("latency_s")) m.latency_us = 1e6 * n.at("latency_s").number(0, max_time_us / 1e6);
  return m;
}
}  // namespace detail

//! The cost table a calibration file describes. Throws `json_error`.
inline cost_table cost_table_from_json(json const& j, std::string_view document = "calibration file") {
  detail::node const root(j, document);
  root.object({"layers", "link", "storage", "sync_latency_us", "op_overhead_us", "hbm_bytes_per_second"});
  cost_table t;
  auto const layers = root.at("layers");
  if (layers.size() == 0) layers.fail("expected at least one layer");
  for (std::size_t i = 0; i < layers.size(); ++i) t.layers.push_back(detail::layer_cost_from(layers.at(i)));
  auto const link = root.at("link");
  link.object({"d2h", "h2d", "full_duplex"});
  t.link.d2h = detail::link_direction_from(link.at("d2h"));
  t.link.h2d = detail::link_direction_from(link.at("h2d"));
  if (link.has("full_duplex")) t.link.full_duplex = link.at("full_duplex").boolean();
  if (root.has("storage")) {  // absent: unpaced (tide-plan then takes its hardware preset's drives)
    auto const storage = root.at("storage");
    storage.object({"write", "read", "full_duplex"});
    t.storage.write = detail::link_direction_from(storage.at("write"));
    t.storage.read = detail::link_direction_from(storage.at("read"));
    if (storage.has("full_duplex")) t.storage.full_duplex = storage.at("full_duplex").boolean();
  }
  if (root.has("sync_latency_us")) t.sync_latency_us = root.at("sync_latency_us").time_us();
  if (root.has("op_overhead_us")) t.op_overhead_us = root.at("op_overhead_us").time_us();
  if (root.has("hbm_bytes_per_second")) {
    auto const hbm = root.at("hbm_bytes_per_second");
    t.hbm_bytes_per_second = hbm.number();
    if (t.hbm_bytes_per_second > 0 && t.hbm_bytes_per_second < 1)
      hbm.fail("expected 0 (copies never slow compute) or at least 1 byte per second, found " + hbm.value().dump());
  }
  t.check();  // the one check the writer, the planner and the lower bound run too (never fails after the bounds above)
  return t;
}

//! Writes `t` as a calibration file.
inline void write_calibration_file(std::string const& path, cost_table const& t) { write_json_file(path, to_json(t)); }
//! Reads the calibration file at `path`.
inline cost_table read_calibration_file(std::string const& path) {
  return cost_table_from_json(read_json_file(path, "calibration file"), "calibration file " + path);
}

}  // namespace tide::io
