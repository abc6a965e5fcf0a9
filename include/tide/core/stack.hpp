#pragma once
//! \file
//! The model structure: slots a layer saves for backward, layer types, and stacks of layers.
//!
//! The value types (`slot_spec`, `layer_spec`, `stack_spec`) are what the core works on; they are
//! usable in constant expressions. The type-level spellings (`slot`, `layer`, `repeat`, `stack`)
//! are thin sugar that produce those values.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/vocabulary.hpp>
#include <tide/core/error.hpp>
#include <tide/core/name.hpp>
#include <tide/core/slot_handle.hpp>

namespace tide {

//! One kind of activation a layer saves for backward, e.g. `q_proj`. `bytes` may be
//! `dynamic_bytes`: then it is supplied when the schedule is built (see `slot_sizes`).
struct slot_spec {
  tide::name name{};                  //!< unique within the layer type; rules and lambdas use it
  std::size_t bytes = dynamic_bytes;  //!< the slot's size, or `dynamic_bytes` to give it at build time
  //! The layer's input, which its recompute reads: it may be kept or offloaded, never
  //! rematerialized (only re-running the earlier layers could rebuild it; a stack with a carry
  //! does that: see `carry_spec`).
  bool input = false;
};

//! The carry: the data that flows from each layer to the next (the residual stream of a
//! transformer, the state u_n of a time stepper). Layer i reads carry i and writes carry i+1; the
//! user writes carry 0 (the input) before a step, and the last layer's carry out is the stack's
//! output. Where carries are stored, and which are recomputed from the nearest stored one, is the
//! strategy's `checkpoints`. `bytes == 0`: the stack has no carry.
struct carry_spec {
  tide::name name{};        //!< the carry's name (`slot_sizes` looks a run-time size up by it)
  std::size_t bytes = 0;    //!< bytes of one carry, or `dynamic_bytes`; 0: no carry
};

//! A layer type: a name and the slots each layer of that type saves.
struct layer_spec {
  tide::name name{};               //!< the type's name; layers of one name share one type
  std::vector<slot_spec> slots{};  //!< in declaration order (a slot's index is its position here)
};

//! A sequence of layers, possibly of different types (e.g. 3 dense then 58 MoE).
struct stack_spec {
  std::vector<layer_spec> types{};           //!< the distinct layer types, in order of first use
  std::vector<std::uint32_t> layer_types{};  //!< type index of each layer, in forward order
  carry_spec carry{};                        //!< what flows between layers (none by default)
  //! True when no layer reads another layer's output (each reads data of the user's that outlives
  //! the step). A stack must say where each layer's input comes from, so that nothing
  //! rematerializes it from data that is gone: a carry, an input slot in every layer type that
  //! has slots (`slot_spec::input`), or this.
  bool independent_layers = false;

  //! Appends `count` layers of type `t`. A type with the same name is reused; one with the same
  //! name but other slots throws `schedule_error` (merging them would size the lambdas' spans
  //! for the wrong type).
  constexpr stack_spec& append(layer_spec const& t, std::uint32_t count = 1) {
    std::uint32_t idx = 0;
    for (; idx < types.size(); ++idx)
      if (types[idx].name == t.name) break;
    if (idx == types.size()) types.push_back(t);
    else if (auto const k = first_difference(types[idx], t); k != no_difference) throw_type_conflict(types[idx], t, k);
    for (std::uint32_t i = 0; i < count; ++i) layer_types.push_back(idx);
    return *this;
  }

  //! `first_difference`'s answer for two types with the same slots.
  static constexpr std::size_t no_difference = static_cast<std::size_t>(-1);
  //! The first slot index at which two layer types differ (name, size or presence), or
  //! `no_difference`.
  static constexpr std::size_t first_difference(layer_spec const& a, layer_spec const& b) noexcept {
    auto const n = a.slots.size() < b.slots.size() ? a.slots.size() : b.slots.size();
    for (std::size_t k = 0; k < n; ++k)
      if (a.slots[k].name != b.slots[k].name || a.slots[k].bytes != b.slots[k].bytes || a.slots[k].input != b.slots[k].input)
        return k;
    return a.slots.size() == b.slots.size() ? no_difference : n;
  }
  //! Number of layers (not types).
  constexpr std::uint32_t layer_count() const noexcept {
    return static_cast<std::uint32_t>(layer_types.size());
  }
  //! The type of layer `i`.
  constexpr layer_spec const& layer(std::uint32_t i) const { return types[layer_types[i]]; }
  //! True when the stack declares a carry.
  constexpr bool has_carry() const noexcept { return carry.bytes != 0; }
  //! The size of the largest slot of any layer type.
  constexpr std::size_t largest_slot_bytes() const noexcept {
    std::size_t r = 0;
    for (auto const& t : types)
      for (auto const& s : t.slots) r = s.bytes > r ? s.bytes : r;
    return r;
  }
  //! True when some layer type declares a slot of this name as its input (`slot_spec::input`).
  constexpr bool is_input_slot(std::string_view name) const noexcept {
    for (auto const& t : types)
      for (auto const& s : t.slots)
        if (s.name == name && s.input) return true;
    return false;
  }
  //! The first layer type with slots whose input the stack does not account for (no carry, no
  //! input slot, layers not independent), or null when every one is accounted for.
  constexpr layer_spec const* undeclared_input_type() const noexcept {
    if (has_carry() || independent_layers) return nullptr;
    for (auto const& t : types) {
      bool declared = t.slots.empty();
      for (auto const& s : t.slots) declared = declared || s.input;
      if (!declared) return &t;
    }
    return nullptr;
  }
  //! The index of layer type `name` in `types`; throws `slot_error` listing the types when there is none.
  std::uint32_t type_index(std::string_view name) const {
    for (std::uint32_t t = 0; t < types.size(); ++t)
      if (types[t].name == name) return t;
    throw slot_error("tide: the stack has no layer type '" + std::string(name) + "'; its types are: " + quoted_names(types));
  }
  //! The handle of slot `slot` of layer type `type`, viewed as elements of `T`, for lambdas that
  //! name slots of a stack built at run time: resolved once here, O(1) in `ctx.slot(h)`. Throws
  //! `slot_error` naming the type's slots when it has no such slot. The handle refers to this
  //! stack's strings: it must not outlive the stack.
  template <class T = std::byte>
  slot_handle<T> handle(std::string_view type, std::string_view slot) const {
    auto const& t = types[type_index(type)];
    for (std::size_t k = 0; k < t.slots.size(); ++k)
      if (t.slots[k].name == slot) return {t.name, t.slots[k].name, static_cast<std::uint16_t>(k)};
    throw slot_error("tide: layer type '" + std::string(type) + "' has no slot '" + std::string(slot) +
                     "'; its slots are: " + quoted_names(t.slots));
  }
  //! True when some layer type has a slot of this name.
  constexpr bool has_slot(std::string_view name) const noexcept {
    for (auto const& t : types)
      for (auto const& s : t.slots)
        if (s.name == name) return true;
    return false;
  }

 private:
  //! The `name`s of `items`, quoted and comma-separated ("none" when empty), for messages.
  template <class Items>
  static std::string quoted_names(Items const& items) {
    std::string r;
    for (auto const& i : items) r += (r.empty() ? "'" : ", '") + std::string(i.name) + "'";
    return r.empty() ? std::string("none") : r;
  }
  static std::string describe_slot(layer_spec const& t, std::size_t k);
  [[noreturn]] static void throw_type_conflict(layer_spec const& first, layer_spec const& again, std::size_t k);
};

//! Run-time sizes for slots declared with `dynamic_bytes`, by slot name (all layer types).
struct slot_sizes {
  std::vector<slot_spec> entries{};  //!< one (name, bytes) per slot or carry name
  //! No sizes.
  constexpr slot_sizes() = default;
  //! The sizes `e`: `tide::slot_sizes{{"q_proj", 1 << 20}, {"residual", 4096}}`.
  constexpr slot_sizes(std::initializer_list<slot_spec> e) : entries(e) {}
  //! Sets the size of `name`, replacing an earlier one; returns `*this` for chaining.
  constexpr slot_sizes& set(std::string_view name, std::size_t bytes) {
    for (auto& e : entries)
      if (e.name == name) return e.bytes = bytes, *this;
    entries.push_back({name, bytes});
    return *this;
  }
  //! The size given for `name`, or `dynamic_bytes` when none was.
  constexpr std::size_t find(std::string_view name) const noexcept {
    for (auto const& e : entries)
      if (e.name == name) return e.bytes;
    return dynamic_bytes;
  }
};

//! Returns `s` with every dynamic size replaced from `sizes`; a name in `sizes` also overrides a
//! static size only when the slot was dynamic. Throws `schedule_error` for a size left unknown.
constexpr stack_spec bind_sizes(stack_spec s, slot_sizes const& sizes) {
  if (s.carry.bytes == dynamic_bytes) {
    s.carry.bytes = sizes.find(s.carry.name);
    if (s.carry.bytes == dynamic_bytes)
      throw schedule_error("the carry '" + std::string(s.carry.name) +
                           "' has a run-time size and none was given: pass it in tide::slot_sizes");
  }
  for (auto& t : s.types)
    for (auto& slot : t.slots)
      if (slot.bytes == dynamic_bytes) {
        slot.bytes = sizes.find(slot.name);
        if (slot.bytes == dynamic_bytes)
          throw schedule_error("slot '" + std::string(slot.name) + "' of layer type '" +
                               std::string(t.name) +
                               "' has a run-time size and none was given: pass it in tide::slot_sizes");
      }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Type-level sugar

//! A slot as a type: `tide::slot<"q_proj", 1 << 20>`; without a size it is sized at run time.
template <fixed_string Name, std::size_t Bytes = dynamic_bytes>
struct slot {
  static constexpr slot_spec value{Name.view(), Bytes};  //!< the `slot_spec` this type spells
  static constexpr std::string_view name = Name.view();  //!< `Name`
  static constexpr std::size_t bytes = Bytes;            //!< `Bytes`
};

//! A slot that is the layer's input (`slot_spec::input`): `tide::input_slot<"x", 1 << 20>`.
template <fixed_string Name, std::size_t Bytes = dynamic_bytes>
struct input_slot {
  static constexpr slot_spec value{Name.view(), Bytes, true};  //!< the `slot_spec` this type spells
  static constexpr std::string_view name = Name.view();        //!< `Name`
  static constexpr std::size_t bytes = Bytes;                  //!< `Bytes`
};

//! The stack's carry as a part of `tide::stack`: `tide::stack<tide::carry<"residual", N>, ...>`
//! (without a size it is sized at run time, by name in `tide::slot_sizes`).
template <fixed_string Name, std::size_t Bytes = dynamic_bytes>
struct carry {
  static_assert(Bytes != 0, "tide::carry<Name, Bytes>: a carry of zero bytes is no carry: drop it");
  using tide_stack_part_tag = void;                      //!< Marks this type as a part of `tide::stack`.
  static constexpr std::string_view name = Name.view();  //!< `Name`
  static constexpr std::size_t bytes = Bytes;            //!< `Bytes`
  //! Sets `s.carry` to this carry.
  static constexpr void append_to(stack_spec& s) { s.carry = {Name.view(), Bytes}; }
};

//! Part of `tide::stack`: no layer reads another's output (`stack_spec::independent_layers`):
//! `tide::stack<tide::independent_layers, tide::repeat<blk, 4>>`.
struct independent_layers {
  using tide_stack_part_tag = void;  //!< Marks this type as a part of `tide::stack`.
  //! Sets `s.independent_layers`.
  static constexpr void append_to(stack_spec& s) { s.independent_layers = true; }
};

namespace detail {
template <class T>
concept slot_type = requires {
  { T::value } -> std::convertible_to<slot_spec>;
};
}  // namespace detail

//! A layer type as a type: `tide::layer<"dense", tide::slot<"q_proj", N>, ...>`.
template <fixed_string Name, class... Slots>
struct layer {
  static_assert((detail::slot_type<Slots> && ...),
                "tide::layer<Name, Slots...>: every argument after the name must be a tide::slot<\"name\", bytes>");
  using tide_layer_tag = void;                           //!< Marks this type as a layer type.
  static constexpr std::string_view name = Name.view();  //!< `Name`
  //! The slot names in declaration order (a slot's index is its position here).
  static constexpr std::array<std::string_view, sizeof...(Slots)> slots{Slots::name...};
  //! The `layer_spec` this type spells.
  static constexpr layer_spec spec() { return layer_spec{Name.view(), {Slots::value...}}; }
};

//! `Count` consecutive layers of type `Layer` inside a `tide::stack`.
template <class Layer, std::uint32_t Count>
struct repeat {
  static_assert(requires { typename Layer::tide_layer_tag; },
                "tide::repeat<Layer, Count>: Layer must be a tide::layer<\"name\", slots...>");
  using tide_stack_part_tag = void;  //!< Marks this type as a part of `tide::stack`.
  //! Appends `Count` layers of type `Layer` to `s`.
  static constexpr void append_to(stack_spec& s) { s.append(Layer::spec(), Count); }
};

namespace detail {
template <class P>
constexpr void append_part(stack_spec& s) {
  if constexpr (requires { typename P::tide_stack_part_tag; })
    P::append_to(s);
  else {
    static_assert(requires { typename P::tide_layer_tag; },
                  "tide::stack<Parts...>: each part must be a tide::layer<...>, a tide::repeat<Layer, N>, a "
                  "tide::carry<\"name\", bytes> or tide::independent_layers");
    s.append(P::spec(), 1);
  }
}
}  // namespace detail

namespace detail {
template <class P>
struct layer_of {
  using type = P;
};
template <class Layer, std::uint32_t Count>
struct layer_of<repeat<Layer, Count>> {
  using type = Layer;
};
//! A carry stands in the name check as a layer type no layer can clash with.
struct carry_part {
  using tide_layer_tag = void;
  static constexpr layer_spec spec() { return {std::string_view("\0carry", 6), {}}; }
};
template <fixed_string Name, std::size_t Bytes>
struct layer_of<carry<Name, Bytes>> {
  using type = carry_part;
};
template <>
struct layer_of<independent_layers> {
  using type = carry_part;
};
template <class P>
inline constexpr int is_carry_part = 0;
template <fixed_string Name, std::size_t Bytes>
inline constexpr int is_carry_part<carry<Name, Bytes>> = 1;
template <class... Parts>
struct stack_parts {};

//! Index pair (i, j), i < j, of two parts whose layer types share a name but not their slots;
//! {0, 0} when there is none.
template <class... Parts>
consteval std::array<std::size_t, 2> conflicting_parts() {
  if constexpr (sizeof...(Parts) < 2) {
    return {0, 0};
  } else {
    layer_spec const specs[] = {layer_of<Parts>::type::spec()...};
    for (std::size_t j = 1; j < sizeof...(Parts); ++j)
      for (std::size_t i = 0; i < j; ++i)
        if (specs[i].name == specs[j].name && stack_spec::first_difference(specs[i], specs[j]) != stack_spec::no_difference)
          return {i, j};
    return {0, 0};
  }
}
template <class First, class Second>
struct layer_name_conflict {
  // Dependent, so that it fires only when instantiated; the diagnostic shows both layer types.
  static_assert(sizeof(First) == 0,
                "tide::stack: the two tide::layer types in this instantiation share a name but declare different "
                "slots; merging them would size the lambdas' slots for the wrong type: give each layer type its own name");
};
template <class... Parts>
constexpr bool check_layer_names() {
  // Parts that are not layers get their own static_assert in append_part.
  if constexpr (!(requires { typename layer_of<Parts>::type::tide_layer_tag; } && ...)) return true;
  else {
  constexpr auto c = conflicting_parts<Parts...>();
  if constexpr (c[0] != c[1]) {
    using parts = std::tuple<typename layer_of<Parts>::type...>;
    [[maybe_unused]] layer_name_conflict<std::tuple_element_t<c[0], parts>, std::tuple_element_t<c[1], parts>> report;
    return false;
  }
  return true;
  }
}
}  // namespace detail

//! A stack as a type: `tide::stack<tide::repeat<dense, 3>, tide::repeat<moe, 58>>`.
template <class... Parts>
struct stack {
  static_assert(detail::check_layer_names<Parts...>());
  static_assert((detail::is_carry_part<Parts> + ... + 0) <= 1,
                "tide::stack<Parts...>: two tide::carry parts: a stack has one carry");
  using tide_stack_tag = void;  //!< Marks this type as a stack for `make_schedule`.
  //! The `stack_spec` the parts spell, in order.
  static constexpr stack_spec spec() {
    stack_spec s;
    (detail::append_part<Parts>(s), ...);
    return s;
  }
};

#if TIDE_DEFINITIONS
TIDE_INLINE std::string stack_spec::describe_slot(layer_spec const& t, std::size_t k) {
  if (k >= t.slots.size()) return "no slot";
  auto const& s = t.slots[k];
  return "'" + std::string(s.name) + "' of " +
         (s.bytes == dynamic_bytes ? std::string("run-time size") : std::to_string(s.bytes) + " bytes") +
         (s.input ? ", the input" : "");
}
TIDE_INLINE void stack_spec::throw_type_conflict(layer_spec const& first, layer_spec const& again, std::size_t k) {
  throw schedule_error("tide: two layer types are named '" + std::string(first.name) +
                       "' but declare different slots (slot " + std::to_string(k) + ": " +
                       describe_slot(first, k) + " in the first, " + describe_slot(again, k) +
                       " in the second): give each layer type its own name");
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide
