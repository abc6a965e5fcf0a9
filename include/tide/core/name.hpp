#pragma once
//! \file
//! `tide::name`: the name of a slot, a layer type or a carry, as the specs and schedules hold it.
//! A name built at run time is interned: it views tide's own copy of the characters, which lives
//! until the process ends, so a stack, a strategy or a schedule built from strings that die first
//! (`std::string`s read from a file, formatted in a loop) never holds a view of freed memory. A
//! name built in a constant expression views its literal (static storage) and allocates nothing,
//! so compile-time schedules stay literal types.

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include <tide/core/config.hpp>

namespace tide {

namespace detail {
//! tide's process-lifetime copy of `s` (the same view for equal strings; empty for an empty one).
//! Thread-safe; the copies are never freed, so names stay valid during static destruction.
TIDE_INLINE std::string_view intern(std::string_view s);
}  // namespace detail

//! A name that owns its characters (through tide's intern table, see the file's description); it
//! is a `std::string_view` to read, compare and print.
class name : public std::string_view {
 public:
  //! The empty name.
  constexpr name() noexcept = default;
  //! Interns `s` (in a constant expression: views it; it must be a literal there).
  constexpr name(std::string_view s) : std::string_view(keep(s)) {}
  //! Interns `s` (in a constant expression: views it; it must be a literal there).
  constexpr name(char const* s) : name(std::string_view(s)) {}
  //! Interns `s`: the name stays valid after `s` is gone.
  name(std::string const& s) : std::string_view(detail::intern(s)) {}
  //! The characters as a `std::string_view` (the name itself converts implicitly too).
  [[nodiscard]] constexpr std::string_view view() const noexcept { return *this; }

 private:
  static constexpr std::string_view keep(std::string_view s) {
    if (std::is_constant_evaluated()) return s;
    return detail::intern(s);
  }
};

}  // namespace tide

#if TIDE_DEFINITIONS
#include <tide/core/detail/intern.hpp>
#endif
