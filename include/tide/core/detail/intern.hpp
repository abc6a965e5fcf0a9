#pragma once
//! \file
//! `tide::detail::intern`'s definition (core/name.hpp): one table per program, behind a mutex.

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include <tide/core/name.hpp>

namespace tide::detail {

TIDE_INLINE std::string_view intern(std::string_view s) {
  if (s.empty()) return {};
  struct hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const noexcept { return std::hash<std::string_view>{}(v); }
  };
  struct table {
    std::mutex mutex;
    // Node-based: an element (and a short string's inline characters) never moves on a rehash.
    std::unordered_set<std::string, hash, std::equal_to<>> names;
  };
  static table* const t = new table;  // never destroyed: names outlive every static object
  std::lock_guard lock(t->mutex);
  auto it = t->names.find(s);
  if (it == t->names.end()) it = t->names.emplace(s).first;
  return *it;
}

}  // namespace tide::detail
