#pragma once
//! \file
//! Reading JSON documents (io/json_file.hpp): a value with its JSON path whose accessors check
//! types and ranges and name the path when they fail (`node`), the SAX pass that refuses a key
//! given twice, the names of enumerations in files, and `parse_json`, `read_json_file` and
//! `write_json_file`.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <tide/core/error.hpp>
#include <tide/core/reversal.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/vocabulary.hpp>
#include <tide/io/json_file.hpp>

namespace tide::io {

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
  //! (-k: `from_end(k)`, k at most `max_from_end`); the same bounds `find_schedule_issue` puts on
  //! a `rule_spec` built in C++.
  tide::layer_bound layer_bound() const {
    std::int64_t x = 0;
    if (v_->is_number_integer()) x = v_->is_number_unsigned() && v_->get<std::uint64_t>() > (std::uint64_t{1} << 62)
                                         ? std::int64_t{1} << 62
                                         : v_->get<std::int64_t>();
    else if (v_->is_number_float() && v_->get<double>() == std::floor(v_->get<double>()) && std::abs(v_->get<double>()) < 4e9)
      x = static_cast<std::int64_t>(v_->get<double>());
    else fail("expected a layer index, found " + (v_->is_number() ? v_->dump() : type_name(*v_)));
    if (x >= static_cast<std::int64_t>(max_from_end) || x < -static_cast<std::int64_t>(max_from_end))
      fail("expected a layer index from " + std::to_string(-static_cast<std::int64_t>(max_from_end)) + " (negative: from "
           "the end) to " + std::to_string(max_from_end - 1) + ", found " + std::to_string(x));
    return x < 0 ? from_end(static_cast<std::uint32_t>(-x)) : tide::layer_bound{static_cast<std::uint32_t>(x)};
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

inline constexpr std::string_view chain_op_names[] = {"advance", "turn",     "store",     "restore", "free",
                                                      "backward", "offload",  "prefetch",  "free_host", "spill",
                                                      "load",     "free_disk"};
static_assert(std::size(chain_op_names) == static_cast<std::size_t>(chain_op::free_disk) + 1, "a chain_op without its file name");

template <class Enum, std::size_t N>
Enum enum_from(node const& n, std::string_view const (&names)[N]) {
  auto const s = n.string();
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<Enum>(i);
  std::string list;
  for (auto x : names) list += (list.empty() ? "" : ", ") + std::string(x);
  n.fail("unknown value '" + echo(s) + "' (expected one of: " + list + ")");
}

inline constexpr std::string_view placement_names[] = {"keep", "offload", "remat", "spill"};

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

//! Fails, naming the old key, when an object gives both a key and its deprecated 0.2 spelling.
inline void one_spelling(node const& n, char const* key, char const* old) {
  if (n.has(key) && n.has(old))
    n.at(old).fail(std::string("give \"") + key + "\" alone (\"" + old + "\" is its deprecated 0.2 spelling)");
}
}  // namespace detail

inline json parse_json(std::string_view text, std::string_view document) {
  detail::key_checker checker(document);
  json::sax_parse(text.begin(), text.end(), &checker);  // throws on every problem
  return json::parse(text.begin(), text.end());
}

inline json read_json_file(std::string const& path, std::string_view kind) {
  std::ifstream in(path, std::ios::binary);
  auto const document = std::string(kind) + " " + path;
  if (!in) throw json_error(document, "", "cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), document);
}

inline void write_json_file(std::string const& path, json const& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << j.dump(2) << '\n';
  out.flush();
  if (!out) throw error("tide: cannot write " + path);
}

}  // namespace tide::io
