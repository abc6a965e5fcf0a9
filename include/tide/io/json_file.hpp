#pragma once
//! \file
//! JSON documents and files, shared by the policy, model and calibration files
//! (`io/policy_file.hpp`, `io/model_file.hpp`, `io/calibration_file.hpp`): the value type, the
//! error that names where a document is wrong, and parsing, reading and writing JSON files.
//!
//! Optional: it needs nlohmann/json (Debian's `nlohmann-json3-dev`, or Meson's `nlohmann_json`
//! wrap), and is not included by `<tide/tide.hpp>`, so the core stays dependency-free. Reading is
//! strict: an unknown key, an unknown slot name, a value of the wrong type or out of range throws
//! `tide::io::json_error` naming the document, the JSON path (a JSON Pointer, e.g.
//! `/rules/0/slots/1`) and what was expected. The reading helpers are in
//! `io/detail/json_reader.hpp`, included at the end of this header.

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include <tide/core/error.hpp>

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

// ---------------------------------------------------------------------------------------------
// Files

//! Parses `text` as JSON. A syntax error throws `json_error` naming `document` and the byte; a key
//! given twice in one object, or a number past a double's range (1e400), throws `json_error`
//! naming the document and the JSON Pointer.
inline json parse_json(std::string_view text, std::string_view document);

//! Reads and parses the JSON file at `path`; `kind` names it in errors ("policy file").
inline json read_json_file(std::string const& path, std::string_view kind);

//! Writes `j` to `path`, indented; throws `tide::error` naming the file when it cannot.
inline void write_json_file(std::string const& path, json const& j);

}  // namespace tide::io

// The definitions, after the declarations above: json_reader.hpp includes this header first, so
// that it compiles on its own too.
#include <tide/io/detail/json_reader.hpp>
