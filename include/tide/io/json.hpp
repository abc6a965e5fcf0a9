#pragma once
//! \file
//! Policy files, model descriptions and calibration files as JSON, in the vocabulary of the
//! types: a strategy (policy rules, buffers, pipeline, collectives, checkpoints), a stack with its
//! per-layer costs, a cost table. The schemas are `docs/policy.schema.json`,
//! `docs/model.schema.json` and `docs/calibration.schema.json`.
//!
//! Optional: it needs nlohmann/json (Debian's `nlohmann-json3-dev`, or Meson's `nlohmann_json`
//! wrap), and is not included by `<tide/tide.hpp>`, so the core stays dependency-free. Reading is
//! strict: an unknown key, an unknown slot name, a value of the wrong type or out of range throws
//! `tide::io::json_error` naming the document, the JSON path (a JSON Pointer, e.g.
//! `/rules/0/slots/1`) and what was expected.

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/error.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#include <tide/core/validation.hpp>
#include <tide/plan/hardware.hpp>

namespace tide::io {

//! The JSON value type tide reads and writes: keys keep their order, so written files read in
//! the order of the types' fields.
using json = nlohmann::ordered_json;

namespace detail {
//! `s` as a message quotes it: at most 64 bytes (cut at a UTF-8 boundary), then "..." and the
//! length, so a huge key or name in a file does not make a huge message.
inline std::string echo(std::string_view s, std::size_t limit = 64) {
  if (s.size() <= limit) return std::string(s);
  auto cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "... (" + std::to_string(s.size()) + " bytes)";
}
}  // namespace detail

//! A JSON document that is malformed or does not describe what it should. `what()` names the
//! document, the JSON path and the problem; `path` is the JSON Pointer alone ("" for the root).
struct json_error : error {
  std::string path{};  //!< where in the document, as a JSON Pointer (whole; `what()` shortens a long one)
  //! `document`: what is being read, e.g. "policy file p.json".
  json_error(std::string_view document, std::string p, std::string const& problem)
      : error("tide: " + std::string(document) + ": " + (p.empty() ? std::string("/") : detail::echo(p, 256)) + ": " + problem),
        path(std::move(p)) {}
};

//! The most a time in a file may be, in microseconds (about 11.6 days): far below what would make
//! a step's sum of times overflow, and far above any real layer's.
inline constexpr double max_time_us = 1e12;

namespace detail {

inline std::string pointer_token(std::string_view key) {
  std::string r;
  for (char c : key) r += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return r;
}

inline std::string type_name(json const& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  return "an object";
}

//! A value of a document and its JSON path: every accessor checks the type and names the path
//! when it is wrong.
class node {
 public:
  node(json const& v, std::string_view document, std::string path = {}) : v_(&v), doc_(document), path_(std::move(path)) {}

  json const& value() const noexcept { return *v_; }
  std::string const& path() const noexcept { return path_; }
  [[noreturn]] void fail(std::string const& problem) const { throw json_error(doc_, path_, problem); }

  //! Checks that this is an object whose keys are all in `allowed` (and, at the root, "$schema").
  node const& object(std::initializer_list<std::string_view> allowed) const {
    if (!v_->is_object()) fail("expected an object, found " + type_name(*v_));
    for (auto const& [k, _] : v_->items()) {
      if (k == "$schema" && path_.empty()) continue;
      bool ok = false;
      for (auto a : allowed) ok = ok || a == k;
      if (!ok) {
        std::string list;
        for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        throw json_error(doc_, path_ + "/" + pointer_token(k), "unknown key '" + echo(k) + "' (expected one of: " + list + ")");
      }
    }
    return *this;
  }
  bool has(std::string_view key) const { return v_->is_object() && v_->contains(std::string(key)); }
  node at(std::string_view key) const {
    if (!has(key)) fail("missing key '" + std::string(key) + "'");
    return {(*v_)[std::string(key)], doc_, path_ + "/" + pointer_token(key)};
  }
  std::size_t size() const {
    if (!v_->is_array()) fail("expected an array, found " + type_name(*v_));
    return v_->size();
  }
  node at(std::size_t i) const { return {(*v_)[i], doc_, path_ + "/" + std::to_string(i)}; }

  bool boolean() const {
    if (!v_->is_boolean()) fail("expected true or false, found " + type_name(*v_));
    return v_->get<bool>();
  }
  std::string string() const {
    if (!v_->is_string()) fail("expected a string, found " + type_name(*v_));
    return v_->get<std::string>();
  }
  //! A non-negative integer no larger than `max` (a number such as 1e9 is accepted when whole).
  std::uint64_t unsigned_integer(std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) const {
    std::uint64_t r = 0;
    if (v_->is_number_unsigned()) r = v_->get<std::uint64_t>();
    else if (v_->is_number_integer()) fail("expected a non-negative integer, found " + std::to_string(v_->get<std::int64_t>()));
    else if (v_->is_number_float()) {
      auto const d = v_->get<double>();
      if (!(d >= 0) || d != std::floor(d) || d >= 18446744073709551616.0)
        fail("expected a non-negative integer, found " + v_->dump());
      r = static_cast<std::uint64_t>(d);
    } else fail("expected a non-negative integer, found " + type_name(*v_));
    if (r > max) fail("expected at most " + std::to_string(max) + ", found " + std::to_string(r));
    return r;
  }
  std::uint32_t u32() const { return static_cast<std::uint32_t>(unsigned_integer(std::numeric_limits<std::uint32_t>::max())); }
  std::size_t bytes() const { return static_cast<std::size_t>(unsigned_integer(std::numeric_limits<std::size_t>::max())); }
  //! A slot or carry size: positive, and at most 2^62 (far from `dynamic_bytes`, which would make
  //! the slot's size a run-time one).
  std::size_t slot_bytes() const {
    auto const b = static_cast<std::size_t>(unsigned_integer(std::uint64_t{1} << 62));
    if (b == 0) fail("expected a positive size");
    return b;
  }
  //! A finite number from `min` to `max`.
  double number(double min = 0, double max = std::numeric_limits<double>::max()) const {
    if (!v_->is_number()) fail("expected a number, found " + type_name(*v_));
    auto const d = v_->get<double>();
    if (!std::isfinite(d) || d < min || d > max) {
      auto const g = [](double x) {
        char b[32];
        std::snprintf(b, sizeof b, "%.15g", x);
        return std::string(b);
      };
      fail("expected a finite number " + (max < std::numeric_limits<double>::max() ? "from " + g(min) + " to " + g(max) : "of at least " + g(min)) +
           ", found " + v_->dump());
    }
    return d;
  }
  //! A time in microseconds: from 0 to `max_time_us`.
  double time_us() const { return number(0, max_time_us); }
  //! FLOPs or bytes of work: from 0 to 1e30 (the time it makes is checked on the hardware).
  double work() const { return number(0, 1e30); }
  //! A rule's layer bound: a layer index below `max_from_end`, or a negative count from the end
  //! (-k: `from_end(k)`, k at most `max_from_end`).
  std::uint32_t layer_bound() const {
    std::int64_t x = 0;
    if (v_->is_number_integer()) x = v_->is_number_unsigned() && v_->get<std::uint64_t>() > (std::uint64_t{1} << 62)
                                         ? std::int64_t{1} << 62
                                         : v_->get<std::int64_t>();
    else if (v_->is_number_float() && v_->get<double>() == std::floor(v_->get<double>()) && std::abs(v_->get<double>()) < 4e9)
      x = static_cast<std::int64_t>(v_->get<double>());
    else fail("expected a layer index, found " + (v_->is_number() ? v_->dump() : type_name(*v_)));
    if (x >= static_cast<std::int64_t>(all_layers - max_from_end) || x < -static_cast<std::int64_t>(max_from_end))
      fail("expected a layer index from " + std::to_string(-static_cast<std::int64_t>(max_from_end)) + " (negative: from "
           "the end) to " + std::to_string(all_layers - max_from_end - 1) + ", found " + std::to_string(x));
    return x < 0 ? from_end(static_cast<std::uint32_t>(-x)) : static_cast<std::uint32_t>(x);
  }
  std::int32_t i32_or_minus_one() const {
    std::int64_t x = 0;
    if (v_->is_number_integer()) x = v_->get<std::int64_t>();
    else if (v_->is_number_float() && v_->get<double>() == std::floor(v_->get<double>()) && std::abs(v_->get<double>()) < 4e9)
      x = static_cast<std::int64_t>(v_->get<double>());  // 1.0, 1e3: whole numbers, as JSON Schema's "integer"
    else fail("expected an integer, found " + (v_->is_number() ? v_->dump() : type_name(*v_)));
    if (x < -1 || x > std::numeric_limits<std::int32_t>::max()) fail("expected an integer from -1, found " + std::to_string(x));
    return static_cast<std::int32_t>(x);
  }

 private:
  json const* v_;
  std::string_view doc_;
  std::string path_;
};

inline constexpr std::string_view chain_op_names[] = {"advance", "turn",    "store",    "restore",  "free",
                                                      "backward", "offload", "prefetch", "free_host"};

template <class Enum, std::size_t N>
Enum enum_from(node const& n, std::string_view const (&names)[N]) {
  auto const s = n.string();
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<Enum>(i);
  std::string list;
  for (auto x : names) list += (list.empty() ? "" : ", ") + std::string(x);
  n.fail("unknown value '" + echo(s) + "' (expected one of: " + list + ")");
}

inline constexpr std::string_view placement_names[] = {"keep", "offload", "remat"};

inline std::string slot_list(stack_spec const& stack) {
  std::string r;
  std::vector<std::string_view> seen;
  for (auto const& t : stack.types)
    for (auto const& s : t.slots) {
      bool dup = false;
      for (auto x : seen) dup = dup || x == s.name;
      if (dup) continue;
      seen.push_back(s.name);
      r += (r.empty() ? "" : ", ") + std::string(s.name);
    }
  return r.empty() ? "none" : r;
}

//! The stack's own name for `s`, so that a strategy read from a file refers to storage that lives
//! as long as the stack.
inline std::string_view stack_slot_name(stack_spec const& stack, node const& n) {
  auto const s = n.string();
  for (auto const& t : stack.types)
    for (auto const& slot : t.slots)
      if (slot.name == s) return slot.name;
  n.fail("unknown slot '" + echo(s) + "' (the stack's slots: " + slot_list(stack) + ")");
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Files

namespace detail {
//! A first, SAX pass over a document: it keeps the JSON Pointer of the value being read (for
//! errors the parser finds inside a value) and each open object's keys, to refuse a key given
//! twice (nlohmann keeps the last silently). A SAX pass, not the DOM parser's callback: the
//! callback parser's end_object scans its parent, which made a file of 100,000 layer types
//! quadratic (minutes).
class key_checker {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  explicit key_checker(std::string_view document) : doc_(document) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(number_integer_t) { return value(); }
  bool number_unsigned(number_unsigned_t) { return value(); }
  bool number_float(number_float_t, string_t const&) { return value(); }
  bool string(string_t&) { return value(); }
  bool binary(binary_t&) { return value(); }
  bool start_object(std::size_t) {
    levels_.push_back({true, 0, {}, {}});
    return true;
  }
  bool key(string_t& k) {
    auto& top = levels_.back();
    top.key = k;
    if (!top.keys.insert(k).second) throw json_error(doc_, pointer(), "the key '" + echo(k) + "' is given twice in one object");
    return true;
  }
  bool end_object() { return end(); }
  bool start_array(std::size_t) {
    levels_.push_back({false, 0, {}, {}});
    return true;
  }
  bool end_array() { return end(); }
  [[noreturn]] bool parse_error(std::size_t byte, std::string const&, nlohmann::json::exception const& e) {
    if (e.id == 406) {  // out_of_range: a number a double cannot hold (1e400)
      auto const what = std::string_view(e.what());
      auto const at = what.find(']');
      throw json_error(doc_, pointer(), std::string(at == what.npos ? what : what.substr(at + 2)));
    }
    throw json_error(doc_, "", "malformed JSON at byte " + std::to_string(byte) + ": " + e.what());
  }

  //! The JSON Pointer of the value being read.
  std::string pointer() const {
    std::string r;
    for (auto const& l : levels_) r += "/" + (l.object ? pointer_token(l.key) : std::to_string(l.index));
    return r;
  }

 private:
  bool value() {
    if (!levels_.empty() && !levels_.back().object) ++levels_.back().index;
    return true;
  }
  bool end() {
    levels_.pop_back();
    return value();
  }
  struct level {
    bool object;
    std::size_t index;  // arrays: the element being read
    std::string key;    // objects: the last key
    std::unordered_set<std::string> keys;
  };
  std::string_view doc_;
  std::vector<level> levels_;
};
}  // namespace detail

//! Parses `text` as JSON. A syntax error throws `json_error` naming `document` and the byte; a key
//! given twice in one object, or a number past a double's range (1e400), throws `json_error`
//! naming the document and the JSON Pointer.
inline json parse_json(std::string_view text, std::string_view document) {
  detail::key_checker checker(document);
  json::sax_parse(text.begin(), text.end(), &checker);  // throws on every problem
  return json::parse(text.begin(), text.end());
}

//! Reads and parses the JSON file at `path`; `kind` names it in errors ("policy file").
inline json read_json_file(std::string const& path, std::string_view kind) {
  std::ifstream in(path, std::ios::binary);
  auto const document = std::string(kind) + " " + path;
  if (!in) throw json_error(document, "", "cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), document);
}

//! Writes `j` to `path`, indented; throws `tide::error` naming the file when it cannot.
inline void write_json_file(std::string const& path, json const& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << j.dump(2) << '\n';
  out.flush();
  if (!out) throw error("tide: cannot write " + path);
}

// ---------------------------------------------------------------------------------------------
// Policy files: a strategy

//! A strategy as a policy file: `rules` (first match wins, default keep), then every field of
//! `buffers`, `pipeline` and `collectives`, and `checkpoints` when it is not the default.
inline json to_json(strategy const& st) {
  json j;
  j["rules"] = json::array();
  for (auto const& r : st.policy.rules) {
    json rule;
    rule["action"] = std::string(to_string(r.where));
    if (!r.slots.empty()) {
      rule["slots"] = json::array();
      for (auto n : r.slots) rule["slots"].push_back(std::string(n));
    }
    if (r.first_layer != 0 || r.last_layer != all_layers) {
      // A bound counted from the end is negative (-1: the last layer); the end is null.
      auto bound = [](std::uint32_t l) {
        return l == all_layers ? json(nullptr)
               : counts_from_end(l) ? json(-static_cast<std::int64_t>(from_end_count(l)))
                                    : json(l);
      };
      rule["layers"] = {bound(r.first_layer), bound(r.last_layer)};
    }
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
  auto const& p = st.pipeline;
  j["pipeline"] = {{"latency_hiding", p.latency_hiding},
                   {"prefetch_distance", p.prefetch_distance},
                   {"chunk_bytes", p.chunk_bytes},
                   {"max_offloads_in_flight", p.max_offloads_in_flight}};
  auto const& c = st.collectives;
  j["collectives"] = {{"before_forward", c.before_forward}, {"after_backward", c.after_backward}, {"before_backward", c.before_backward}};
  auto const& k = st.checkpoints;
  if (!(k == checkpoint_spec{})) {
    json ck;
    ck["device_snapshots"] = k.device_snapshots == every_carry ? json("every") : json(k.device_snapshots);
    ck["host_snapshots"] = k.host_snapshots;
    if (!k.reversal.empty()) {
      ck["reversal"] = json::array();
      for (auto const& a : k.reversal) {
        json x;
        x["op"] = std::string(detail::chain_op_names[static_cast<std::size_t>(a.op)]);
        if (a.state >= 0) x["state"] = a.state;
        if (a.to >= 0) x["to"] = a.to;
        if (a.slot >= 0) x["slot"] = a.slot;
        if (a.host >= 0) x["host"] = a.host;
        ck["reversal"].push_back(std::move(x));
      }
    }
    j["checkpoints"] = std::move(ck);
  }
  return j;
}

//! The strategy a policy file describes, for `stack`: slot names are checked against the stack
//! and refer to its storage, so `stack` must outlive the result. Absent parts and fields keep
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
      r.object({"action", "slots", "layers", "min_bytes"});
      rule_spec rule;
      rule.where = detail::enum_from<placement>(r.at("action"), detail::placement_names);
      if (r.has("slots")) {
        auto const s = r.at("slots");
        if (s.size() == 0) s.fail("an empty slot list selects nothing: leave \"slots\" out to select every slot");
        for (std::size_t k = 0; k < s.size(); ++k) rule.slots.push_back(detail::stack_slot_name(stack, s.at(k)));
      }
      if (r.has("layers")) {
        auto const l = r.at("layers");
        if (l.size() != 2)
          l.fail("expected [first, last): two entries, last null for every layer from first on, negative counting "
                 "from the end (-1: the last layer)");
        rule.first_layer = l.at(0).layer_bound();
        rule.last_layer = l.at(1).value().is_null() ? all_layers : l.at(1).layer_bound();
        if (rule.first_layer >= rule.last_layer)
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
    b.object({"staging_buffers", "device_alignment", "host_alignment", "guard_bytes", "share_phase_regions"});
    if (b.has("staging_buffers")) st.buffers.staging_buffers = b.at("staging_buffers").u32();
    if (b.has("device_alignment")) st.buffers.device_alignment = power_of_two(b.at("device_alignment"));
    if (b.has("host_alignment")) st.buffers.host_alignment = power_of_two(b.at("host_alignment"));
    if (b.has("guard_bytes")) st.buffers.guard_bytes = b.at("guard_bytes").bytes();
    if (b.has("share_phase_regions")) st.buffers.share_phase_regions = b.at("share_phase_regions").boolean();
  }
  if (root.has("pipeline")) {
    auto const p = root.at("pipeline");
    p.object({"latency_hiding", "prefetch_distance", "chunk_bytes", "max_offloads_in_flight"});
    if (p.has("latency_hiding")) st.pipeline.latency_hiding = p.at("latency_hiding").boolean();
    if (p.has("prefetch_distance")) st.pipeline.prefetch_distance = p.at("prefetch_distance").u32();
    if (p.has("chunk_bytes")) st.pipeline.chunk_bytes = p.at("chunk_bytes").bytes();
    if (p.has("max_offloads_in_flight")) {
      auto const n = p.at("max_offloads_in_flight");
      st.pipeline.max_offloads_in_flight = n.u32();
      if (st.pipeline.max_offloads_in_flight == 0) n.fail("expected at least 1 (each in-flight offload needs a device source buffer)");
    }
  }
  if (root.has("collectives")) {
    auto const c = root.at("collectives");
    c.object({"before_forward", "after_backward", "before_backward"});
    if (c.has("before_forward")) st.collectives.before_forward = c.at("before_forward").boolean();
    if (c.has("after_backward")) st.collectives.after_backward = c.at("after_backward").boolean();
    if (c.has("before_backward")) st.collectives.before_backward = c.at("before_backward").boolean();
  }
  if (root.has("checkpoints")) {
    auto const k = root.at("checkpoints");
    k.object({"device_snapshots", "host_snapshots", "reversal"});
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
    if (k.has("reversal")) {
      auto const rv = k.at("reversal");
      for (std::size_t i = 0; i < rv.size(); ++i) {
        auto const a = rv.at(i);
        a.object({"op", "state", "to", "slot", "host"});
        chain_action x;
        x.op = detail::enum_from<chain_op>(a.at("op"), detail::chain_op_names);
        if (a.has("state")) x.state = a.at("state").i32_or_minus_one();
        if (a.has("to")) x.to = a.at("to").i32_or_minus_one();
        if (a.has("slot")) x.slot = a.at("slot").i32_or_minus_one();
        if (a.has("host")) x.host = a.at("host").i32_or_minus_one();
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

// ---------------------------------------------------------------------------------------------
// Calibration files: a cost table

//! A cost table as a calibration file (what `tide::calibrate` measured, or a hand-written table).
inline json to_json(cost_table const& t) {
  // JSON has no NaN or infinity (nlohmann would write null): refuse them here, naming the field.
  auto finite = [](double v, std::string const& what) {
    if (!std::isfinite(v)) throw error("tide: the cost table's " + what + " is " + std::to_string(v) + ": not writable as JSON");
    return v;
  };
  for (std::size_t l = 0; l < t.layers.size(); ++l) {
    auto const& c = t.layers[l];
    auto const at = "layer " + std::to_string(l) + " ";
    finite(c.forward_us, at + "forward_us"), finite(c.backward_us, at + "backward_us"), finite(c.recompute_us, at + "recompute_us");
    finite(c.gather_us, at + "gather_us"), finite(c.reduce_us, at + "reduce_us"), finite(c.regather_us, at + "regather_us");
    for (auto v : c.slot_recompute_us) finite(v, at + "slot_recompute_us");
  }
  finite(t.link.d2h.bytes_per_second, "d2h bandwidth"), finite(t.link.h2d.bytes_per_second, "h2d bandwidth");
  finite(t.link.d2h.latency_s, "d2h latency"), finite(t.link.h2d.latency_s, "h2d latency");
  finite(t.sync_latency_us, "sync_latency_us"), finite(t.op_overhead_us, "op_overhead_us");
  json j;
  j["layers"] = json::array();
  for (auto const& l : t.layers) {
    json x = {{"forward_us", l.forward_us}, {"backward_us", l.backward_us}, {"recompute_us", l.full_recompute_us()}};
    if (!l.slot_recompute_us.empty()) x["slot_recompute_us"] = l.slot_recompute_us;
    // Left out when +0 (the default); -0.0 is written, so the table reads back bit for bit.
    auto const given = [](double v) { return v != 0 || std::signbit(v); };
    if (given(l.gather_us)) x["gather_us"] = l.gather_us;
    if (given(l.reduce_us)) x["reduce_us"] = l.reduce_us;
    if (given(l.regather_us)) x["regather_us"] = l.regather_us;
    j["layers"].push_back(std::move(x));
  }
  auto dir = [](link_model const& m) { return json{{"bytes_per_second", m.bytes_per_second}, {"latency_s", m.latency_s}}; };
  j["link"] = {{"d2h", dir(t.link.d2h)}, {"h2d", dir(t.link.h2d)}, {"full_duplex", t.link.full_duplex}};
  j["sync_latency_us"] = t.sync_latency_us;
  j["op_overhead_us"] = t.op_overhead_us;
  return j;
}

namespace detail {
inline layer_cost layer_cost_from(node const& n) {
  n.object({"forward_us", "backward_us", "recompute_us", "slot_recompute_us", "gather_us", "reduce_us", "regather_us"});
  layer_cost c;
  c.forward_us = n.at("forward_us").time_us();
  c.backward_us = n.at("backward_us").time_us();
  if (n.has("recompute_us")) c.recompute_us = n.at("recompute_us").time_us();
  if (n.has("slot_recompute_us")) {
    auto const s = n.at("slot_recompute_us");
    for (std::size_t k = 0; k < s.size(); ++k) c.slot_recompute_us.push_back(s.at(k).time_us());
  }
  if (n.has("gather_us")) c.gather_us = n.at("gather_us").time_us();
  if (n.has("reduce_us")) c.reduce_us = n.at("reduce_us").time_us();
  if (n.has("regather_us")) c.regather_us = n.at("regather_us").time_us();
  return c;
}
inline link_model link_model_from(node const& n) {
  n.object({"bytes_per_second", "latency_s"});
  link_model m;
  // 0: unpaced (what `calibrate` writes when it does not measure the link). A positive rate
  // below a byte per second would make a copy's time overflow.
  auto const bw = n.at("bytes_per_second");
  m.bytes_per_second = bw.number();
  if (m.bytes_per_second > 0 && m.bytes_per_second < 1) bw.fail("expected 0 (unpaced) or at least 1 byte per second, found " + bw.value().dump());
  if (n.has("latency_s")) m.latency_s = n.at("latency_s").number(0, max_time_us / 1e6);
  return m;
}
}  // namespace detail

//! The cost table a calibration file describes. Throws `json_error`.
inline cost_table cost_table_from_json(json const& j, std::string_view document = "calibration file") {
  detail::node const root(j, document);
  root.object({"layers", "link", "sync_latency_us", "op_overhead_us"});
  cost_table t;
  auto const layers = root.at("layers");
  if (layers.size() == 0) layers.fail("expected at least one layer");
  for (std::size_t i = 0; i < layers.size(); ++i) t.layers.push_back(detail::layer_cost_from(layers.at(i)));
  auto const link = root.at("link");
  link.object({"d2h", "h2d", "full_duplex"});
  t.link.d2h = detail::link_model_from(link.at("d2h"));
  t.link.h2d = detail::link_model_from(link.at("h2d"));
  if (link.has("full_duplex")) t.link.full_duplex = link.at("full_duplex").boolean();
  if (root.has("sync_latency_us")) t.sync_latency_us = root.at("sync_latency_us").time_us();
  if (root.has("op_overhead_us")) t.op_overhead_us = root.at("op_overhead_us").time_us();
  return t;
}

//! Writes `t` as a calibration file.
inline void write_calibration_file(std::string const& path, cost_table const& t) { write_json_file(path, to_json(t)); }
//! Reads the calibration file at `path`.
inline cost_table read_calibration_file(std::string const& path) {
  return cost_table_from_json(read_json_file(path, "calibration file"), "calibration file " + path);
}

// ---------------------------------------------------------------------------------------------
// Model descriptions: a stack and what its layers cost

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
  double recompute = -1;                       //!< us or FLOPs of a full recompute; below zero: the forward's
  std::vector<double> slot_recompute{};        //!< per slot: us or FLOPs to produce it again (empty: none)
  std::vector<double> slot_recompute_bytes{};  //!< per slot: HBM bytes of that (work only)
  double gather_us = 0;                        //!< the collective before the layer's forward
  double reduce_us = 0;                        //!< the collective after its backward
  double regather_us = 0;                      //!< the collective before its recompute and backward
};

//! A stack and its costs, read from a model file. Slot and type names live in storage shared by
//! copies, so the stack's views stay valid as long as any copy does.
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
  cost_table costs(hardware_spec const& hw, link_spec const& link) const {
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
      lc.recompute_us = c.recompute < 0 ? -1 : time(c.recompute, c.forward_bytes, "recompute");
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
