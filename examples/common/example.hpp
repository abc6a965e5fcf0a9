#pragma once
// What the examples (mlp, plan, cuda_stack, mpi_data_parallel) share besides tide: their command
// line and the tables they print, as text and as JSON. Not part of tide; header-only, and
// compiled by nvcc too (examples/cuda_stack/main.cu).
//
//   example::cli cli("mlp");
//   cli.flag("--json", o.json, "print the results as JSON")
//       .option("--steps", o.steps, "N", "steps per policy");
//   cli.parse(argc, argv);
//   if (o.steps < 2) cli.fail("need --steps >= 2");
//
//   example::table t({{"policy", -36}, {"step ms", 9}, {"grad checksum", 0, 2}});
//   t.row({"keep-all", example::fixed(24.04, 2), example::hex(sum)});
//   t.note("keep-all under budget", error_text);  // the name, then free text
//   t.print();
//
//   example::json_object j;
//   j.field("layers", 16).field("policy", name).raw("runs", example::json_array(runs));

#include <tide/trace/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace example {

// ---- command line ------------------------------------------------------------------------------

//! The command line of an example: each option names the variable it sets. `parse` prints the
//! usage and exits 0 on `--help`; on an unknown argument, a missing value or a value that does
//! not parse whole (`--layers 12x`, `--steps -1` into an unsigned) it says what is wrong, prints
//! the usage to stderr and exits 2. Options left out keep the values they had.
class cli {
 public:
  explicit cli(std::string program) : program_(std::move(program)) {}

  //! `--name` alone sets `target` to true.
  cli& flag(std::string name, bool& target, std::string help = {}) {
    entries_.push_back({std::move(name), {}, std::move(help), [&target](std::string_view) {
                          target = true;
                          return true;
                        }});
    return *this;
  }

  //! `--name VALUE` sets `target` (an integer, a floating-point number or a string);
  //! `metavar` names the value in the usage (`N`, `FILE`).
  template <class T>
  cli& option(std::string name, T& target, std::string metavar, std::string help = {}) {
    entries_.push_back({std::move(name), std::move(metavar), std::move(help),
                        [&target](std::string_view v) { return parse_value(v, target); }});
    return *this;
  }

  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      std::string_view const a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s", help().c_str());
        std::exit(0);
      }
      auto const e = std::find_if(entries_.begin(), entries_.end(), [&](entry const& x) { return x.name == a; });
      if (e == entries_.end()) fail("unknown argument '" + std::string(a) + "'");
      if (e->metavar.empty()) {
        e->set({});
        continue;
      }
      if (i + 1 >= argc) fail(e->name + " needs a value (" + e->metavar + ")");
      std::string_view const v = argv[++i];
      if (!e->set(v)) fail(e->name + ": cannot use '" + std::string(v) + "' as " + e->metavar);
    }
  }

  //! Reports a bad command line (also for checks after `parse`): the message and the usage on
  //! stderr, exit code 2.
  [[noreturn]] void fail(std::string const& message) const {
    std::fprintf(stderr, "%s: %s\n%s", program_.c_str(), message.c_str(), usage().c_str());
    std::exit(2);
  }

  //! One line: `usage: mlp [--json] [--steps N] ...`.
  std::string usage() const {
    std::string u = "usage: " + program_;
    for (auto const& e : entries_) u += " [" + e.name + (e.metavar.empty() ? "" : " " + e.metavar) + "]";
    return u + "\n";
  }

  //! The usage and one line per option (what `--help` prints).
  std::string help() const {
    std::string h = usage();
    std::size_t width = 0;
    for (auto const& e : entries_) width = std::max(width, spelled(e).size());
    for (auto const& e : entries_) {
      if (e.help.empty()) continue;
      auto const s = spelled(e);
      h += "  " + s + std::string(width - s.size() + 2, ' ') + e.help + "\n";
    }
    return h;
  }

 private:
  struct entry {
    std::string name, metavar, help;  // no metavar: a flag
    std::function<bool(std::string_view)> set;
  };

  static std::string spelled(entry const& e) { return e.metavar.empty() ? e.name : e.name + " " + e.metavar; }

  static bool parse_value(std::string_view v, std::string& out) {
    out = std::string(v);
    return true;
  }
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  static bool parse_value(std::string_view v, T& out) {
    T x{};
    auto const [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc{} || end != v.data() + v.size()) return false;
    out = x;
    return true;
  }
  //! An optional value: set when given (no in-band "not given").
  template <class T>
  static bool parse_value(std::string_view v, std::optional<T>& out) {
    T x{};
    if (!parse_value(v, x)) return false;
    out = x;
    return true;
  }
  template <std::floating_point T>
  static bool parse_value(std::string_view v, T& out) {
    std::string const s(v);
    char* end = nullptr;
    errno = 0;
    double const x = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(x)) return false;
    out = static_cast<T>(x);
    return true;
  }

  std::string program_;
  std::vector<entry> entries_;
};

// ---- cells -------------------------------------------------------------------------------------

//! `v` with `decimals` digits after the point ("24.04").
inline std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

//! A fraction as a whole percentage ("92%").
inline std::string percent(double fraction) { return fixed(fraction * 100, 0) + "%"; }

//! 16 hexadecimal digits: a checksum.
inline std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---- text tables -------------------------------------------------------------------------------

//! A text table: a header row, then one line per row. Each column has a header, a width (negative:
//! left-aligned, 0: unpadded) and the spaces before it (`gap`; ignored for the first column). A
//! row with fewer cells than columns prints its last cell unpadded: a name, then an error message.
class table {
 public:
  struct column {
    std::string header;
    int width = 0;
    int gap = 1;
  };

  explicit table(std::vector<column> columns, std::string indent = {})
      : columns_(std::move(columns)), indent_(std::move(indent)) {}

  table& row(std::vector<std::string> cells) {
    rows_.push_back(std::move(cells));
    return *this;
  }
  //! A row of a name and free text (an error instead of the measurements).
  table& note(std::string name, std::string text) { return row({std::move(name), std::move(text)}); }

  std::string str() const {
    std::vector<std::string> headers;
    for (auto const& c : columns_) headers.push_back(c.header);
    std::string out = line(headers);
    for (auto const& r : rows_) out += line(r);
    return out;
  }
  void print(std::FILE* to = stdout) const { std::fputs(str().c_str(), to); }

 private:
  std::string line(std::vector<std::string> const& cells) const {
    std::string out = indent_;
    for (std::size_t i = 0; i < cells.size() && i < columns_.size(); ++i) {
      auto const& c = columns_[i];
      if (i > 0) out.append(static_cast<std::size_t>(std::max(c.gap, 0)), ' ');
      bool const last = i + 1 == cells.size();
      std::size_t const w = static_cast<std::size_t>(c.width < 0 ? -c.width : c.width);
      std::size_t const pad = last && cells.size() < columns_.size() ? 0 : w - std::min(w, cells[i].size());
      if (c.width > 0) out.append(pad, ' ');
      out += cells[i];
      if (c.width < 0 && !last) out.append(pad, ' ');
    }
    return out + "\n";
  }

  std::vector<column> columns_;
  std::string indent_;
  std::vector<std::vector<std::string>> rows_;
};

// ---- JSON --------------------------------------------------------------------------------------

//! A JSON object built field by field, strings escaped by `tide::json_escaped`; a number that is
//! not finite is written as null.
class json_object {
 public:
  json_object& field(std::string_view key, std::string_view text) {
    return raw(key, "\"" + tide::json_escaped(text) + "\"");
  }
  json_object& field(std::string_view key, char const* text) { return field(key, std::string_view(text)); }
  json_object& field(std::string_view key, std::string const& text) { return field(key, std::string_view(text)); }
  json_object& field(std::string_view key, bool v) { return raw(key, v ? "true" : "false"); }
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  json_object& field(std::string_view key, T v) {
    return raw(key, std::to_string(v));
  }
  json_object& field(std::string_view key, double v, int decimals = 6) {
    return raw(key, std::isfinite(v) ? fixed(v, decimals) : "null");
  }
  //! `json` as the value, as is (a nested object or array).
  json_object& raw(std::string_view key, std::string_view json) {
    text_ += (text_.empty() ? "\"" : ",\"") + tide::json_escaped(key) + "\":" + std::string(json);
    return *this;
  }
  std::string str() const { return "{" + text_ + "}"; }

 private:
  std::string text_;
};

//! `[item,item,...]`; `one_per_line` puts each item on a line of its own.
inline std::string json_array(std::vector<json_object> const& items, bool one_per_line = false) {
  std::string r = "[";
  for (std::size_t i = 0; i < items.size(); ++i) r += (i ? "," : "") + std::string(one_per_line ? "\n" : "") + items[i].str();
  return r + (one_per_line && !items.empty() ? "\n]" : "]");
}

}  // namespace example
