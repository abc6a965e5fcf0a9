#pragma once
//! \file
//! The vocabulary every layer shares: placements, stream roles, size sentinels, overflow-checked
//! size arithmetic and fixed strings.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <tuple>

// Designated initializers that leave fields at their defaults on purpose: GCC before 14 warns
// about each such field under -Wextra. Headers that use them bracket their code with these.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 14
#define TIDE_DESIGNATED_INIT_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmissing-field-initializers\"")
#define TIDE_DESIGNATED_INIT_END _Pragma("GCC diagnostic pop")
#else
#define TIDE_DESIGNATED_INIT_BEGIN
#define TIDE_DESIGNATED_INIT_END
#endif

namespace tide {

//! Where an activation slot lives between its forward and its backward.
enum class placement : std::uint8_t {
  keep,     //!< stays in the device arena until backward
  offload,  //!< copied to pinned host memory in forward, prefetched back for backward
  remat,    //!< dropped after forward, recomputed just before backward
  //! written to a storage file through the pinned spill ring in forward, read back and prefetched
  //! for backward (a layer among the ring's last uses stays in the ring and never touches the file)
  spill,
};

//! The placement's name: "keep", "offload", "remat" or "spill".
constexpr std::string_view to_string(placement p) noexcept {
  switch (p) {
    case placement::keep: return "keep";
    case placement::offload: return "offload";
    case placement::remat: return "remat";
    case placement::spill: return "spill";
  }
  return "?";
}

//! The five streams an executor drives: `compute` (the user's lambdas), `d2h` (offloads), `h2d`
//! (prefetches), `comm` (collective hooks) and `storage` (spill writes and reads). With latency
//! hiding off every copy, storage transfers included, runs on `compute`.
enum class stream_role : std::uint8_t { compute = 0, d2h = 1, h2d = 2, comm = 3, storage = 4 };
//! The number of stream roles; `stream_role` values index arrays of this size.
inline constexpr std::size_t stream_count = 5;

//! The stream's name: "compute", "d2h", "h2d", "comm" or "storage".
constexpr std::string_view to_string(stream_role s) noexcept {
  switch (s) {
    case stream_role::compute: return "compute";
    case stream_role::d2h: return "d2h";
    case stream_role::h2d: return "h2d";
    case stream_role::comm: return "comm";
    case stream_role::storage: return "storage";
  }
  return "?";
}

//! A size known only at run time (it depends on batch and sequence length).
inline constexpr std::size_t dynamic_bytes = std::numeric_limits<std::size_t>::max();
//! "Every layer from here on" as a rule's end: a layer index past every layer a stack can have
//! (`rule_spec::last_layer`'s default). A plain index, not a code: `from_end(0)` is the same bound.
inline constexpr std::uint32_t all_layers = std::numeric_limits<std::uint32_t>::max();
//! The most layers `from_end` counts back, and one past the largest layer index a rule may name
//! (a stack has far fewer layers: `max_ops` bounds its program). `all_layers` is the one larger
//! index a rule's end may be.
inline constexpr std::uint32_t max_from_end = std::uint32_t{1} << 30;

//! One bound of a rule's layer range: a layer index, or a count of layers from the end of the
//! stack, so that one rule fits stacks of any depth. Which of the two is a flag, not a range of
//! values: every index is an index (`rule_spec{.first_layer = 3'500'000'000}` names layer
//! 3,500,000,000, which validation refuses as past `max_from_end`), and only `tide::from_end(k)`
//! counts from the end. A plain `std::uint32_t` converts to an index, so `.first_layer = 3` and
//! `tide::layer_range<0, 31>` read as before.
struct layer_bound {
  std::uint32_t value = 0;  //!< the layer index, or with `from_end` the layers counted back from the end
  bool from_end = false;    //!< true: `value` counts back from the end of the stack (1: the last layer)

  //! Layer 0.
  constexpr layer_bound() = default;
  //! The layer index `index` (`all_layers`: past every layer, the end).
  constexpr layer_bound(std::uint32_t index) noexcept : value(index) {}  // NOLINT(google-explicit-constructor): 3 reads as layer 3
  //! Both fields: `layer_bound(k, true)` is `from_end(k)` (0 back is the end, `all_layers`; counts
  //! above `max_from_end` are `max_from_end`: one spelling per bound, which a policy file can
  //! write and read back). Also what nvcc's front end writes when it passes a `layer_bound`
  //! template argument on to the host compiler (`{k, true}`), so that
  //! `tide::layer_range<tide::from_end(1)>` compiles in .cu files too.
  constexpr layer_bound(std::uint32_t v, bool counted_from_end) noexcept
      : value(!counted_from_end ? v : v == 0 ? all_layers : v < max_from_end ? v : max_from_end),
        from_end(counted_from_end && v != 0) {}
  //! `k` layers back from the end of the stack (`tide::from_end(k)` says it shorter).
  [[nodiscard]] static constexpr layer_bound counted_from_end(std::uint32_t k) noexcept { return {k, true}; }
  //! True when this bound counts from the end of the stack.
  [[nodiscard]] constexpr bool counts_from_end() const noexcept { return from_end; }
  //! The layer index it names in a stack of `layer_count` layers: an index as it is, a count from
  //! the end resolved (counts past the first layer resolve to 0).
  [[nodiscard]] constexpr std::uint32_t resolve(std::uint32_t layer_count) const noexcept {
    if (!from_end) return value;
    return value >= layer_count ? 0 : layer_count - value;
  }
  //! Equal when both are the same index or the same count from the end.
  friend constexpr bool operator==(layer_bound, layer_bound) noexcept = default;
};

//! A layer bound counted from the end of the stack, for rules that must follow the stack's depth:
//! `from_end(1)` is the last layer, `from_end(0)` the end (the index `all_layers`); a rule of layers
//! `[from_end(2), all_layers)` selects the last two. Counts past the first layer select from 0;
//! counts above `max_from_end` are taken as `max_from_end`.
constexpr layer_bound from_end(std::uint32_t k) noexcept { return layer_bound::counted_from_end(k); }
//! True when bound `l` counts from the end (`from_end(k)` with k > 0).
constexpr bool counts_from_end(layer_bound l) noexcept { return l.counts_from_end(); }
//! How many layers from the end `l` counts (`counts_from_end(l)` must hold).
constexpr std::uint32_t from_end_count(layer_bound l) noexcept { return l.value; }
//! Bound `l` in a stack of `layer_count` layers: from the end resolved, indices as they are.
constexpr std::uint32_t resolve_layer(layer_bound l, std::uint32_t layer_count) noexcept { return l.resolve(layer_count); }
//! False when [first, last) is empty in every stack: two indices not ascending, two counts from the
//! end not descending, or a count from the end before an index other than `all_layers` (which a
//! rule may not name: the order must hold in stacks of any depth). Which layers a range selects in
//! a given stack is `resolve_layer`'s.
constexpr bool ordered_layer_bounds(layer_bound first, layer_bound last) noexcept {
  // In their one spelling (fields set by hand: 0 back is the end), as a policy file writes them.
  first = layer_bound(first.value, first.from_end), last = layer_bound(last.value, last.from_end);
  if (first.from_end == last.from_end) return first.from_end ? first.value > last.value : first.value < last.value;
  return !first.from_end || last.value == all_layers;
}
//! True when `l` is a layer index a rule may name: below `max_from_end`, or `all_layers` (the end);
//! any count from the end is.
constexpr bool valid_layer_bound(layer_bound l) noexcept {
  return l.from_end || l.value < max_from_end || l.value == all_layers;
}

//! `n` rounded up to a multiple of `a` (unchecked: see `checked_align_up`).
constexpr std::size_t align_up(std::size_t n, std::size_t a) noexcept { return (n + a - 1) / a * a; }

//! Overflow-checked size arithmetic: every size and offset tide derives from user input goes
//! through these, so a sum past `SIZE_MAX` is reported instead of wrapping. Usable in constant
//! expressions; they return false (leaving `out` unspecified) when the result does not fit.
//! This one: `out = a + b`.
constexpr bool checked_add(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  out = a + b;  // unsigned: wraps, never undefined
  return out >= a;
}
//! `out = a * b`, or false when it overflows.
constexpr bool checked_mul(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  out = a * b;
  return a == 0 || out / a == b;
}
//! `out = n` rounded up to a multiple of `a`, or false when it overflows or `a` is 0.
constexpr bool checked_align_up(std::size_t n, std::size_t a, std::size_t& out) noexcept {
  if (a == 0 || !checked_add(n, a - 1, out)) return false;
  out = out / a * a;
  return true;
}
//! `bytes / chunk` rounded up, without the overflow of `(bytes + chunk - 1) / chunk`.
constexpr std::size_t ceil_div(std::size_t bytes, std::size_t chunk) noexcept {
  return bytes / chunk + (bytes % chunk != 0);
}

//! A string usable as a template argument: `tide::slot<"q_proj", 4096>`.
template <std::size_t N>
struct fixed_string {
  char data[N]{};  //!< the characters and the terminating null
  //! Copies the literal `s` (implicit, so a literal converts where a `fixed_string` is expected).
  constexpr fixed_string(char const (&s)[N]) noexcept { std::copy_n(s, N, data); }
  //! The string without its terminating null.
  constexpr std::string_view view() const noexcept { return {data, N - 1}; }
  //! Same as `view()`.
  constexpr operator std::string_view() const noexcept { return view(); }
};

namespace detail {
//! Order-free type-level knobs (`tide::pipeline<tide::prefetch_distance<2>>`): a knob names
//! itself, says which spec it sets and sets it. `knob_for<Spec, K>` is how a composite checks its
//! arguments; `distinct_knobs<K...>()` that none is given twice.
template <class K, class Spec>
concept knob_for = requires(Spec& s) {
  typename K::tide_knob_of;
  { K::tide_knob_name } -> std::convertible_to<std::string_view>;
  K::apply(s);
} && std::same_as<typename K::tide_knob_of, Spec>;

//! The index of the first knob whose kind is given again later, or sizeof...(K) if none is.
template <class... K>
constexpr std::size_t repeated_knob() noexcept {
  if constexpr (sizeof...(K) < 2) {
    return sizeof...(K);
  } else {
    std::string_view const names[] = {K::tide_knob_name...};
    for (std::size_t i = 0; i < sizeof...(K); ++i)
      for (std::size_t j = i + 1; j < sizeof...(K); ++j)
        if (names[i] == names[j]) return i;
    return sizeof...(K);
  }
}
template <class K>
struct knob_given_twice {
  // Dependent, so that it fires only when instantiated: the diagnostic shows the knob.
  static_assert(sizeof(K) == 0, "tide: this knob (the template argument of knob_given_twice) is given twice: "
                                "give each knob once");
  static constexpr bool value = false;
};
//! True when no knob is given twice; otherwise a diagnostic naming the first repeated one.
template <class... K>
constexpr bool distinct_knobs() noexcept {
  constexpr auto i = repeated_knob<K...>();
  if constexpr (i == sizeof...(K)) return true;
  else return knob_given_twice<std::tuple_element_t<i, std::tuple<K...>>>::value;
}
//! A knob that sets one field of `Spec` to `Value`: each public knob derives from one, so a knob
//! is one line.
template <class Spec, auto Field, auto Value, fixed_string Name>
struct field_knob {
  using tide_knob_of = Spec;
  static constexpr std::string_view tide_knob_name = Name.view();
  static constexpr void apply(Spec& s) noexcept { s.*Field = Value; }
};
template <class Spec, class... K>
constexpr Spec apply_knobs() {
  Spec s{};
  (K::apply(s), ...);
  return s;
}
}  // namespace detail

}  // namespace tide
