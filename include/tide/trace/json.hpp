#pragma once
//! \file
//! JSON text: the one string escaper tide and its examples use for the JSON they write
//! (Chrome traces, result files).

#include <cstdio>
#include <string>
#include <string_view>

namespace tide {

//! `s` as the inside of a JSON string (quotes, backslashes and control characters escaped).
inline std::string json_escaped(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') r.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      r += buf;
    } else {
      r.push_back(c);
    }
  }
  return r;
}

}  // namespace tide
