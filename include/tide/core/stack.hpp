#pragma once
//! \file The model structure: slots a layer saves for backward, layer types, and stacks of layers.
//!
//! The value types (`slot_spec`, `layer_spec`, `stack_spec`) are what the core works on; they are
//! usable in constant expressions. The type-level spellings (`slot`, `layer`, `repeat`, `stack`)
//! are thin sugar that produce those values.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>

namespace tide {

//! One kind of activation a layer saves for backward, e.g. `q_proj`. `bytes` may be
//! `dynamic_bytes`: then it is supplied when the schedule is built (see `slot_sizes`).
struct slot_spec {
  std::string_view name;
  std::size_t bytes = dynamic_bytes;
};

//! A layer type: a name and the slots each layer of that type saves.
struct layer_spec {
  std::string_view name;
  std::vector<slot_spec> slots;
};

//! A sequence of layers, possibly of different types (e.g. 3 dense then 58 MoE).
struct stack_spec {
  std::vector<layer_spec> types;
  std::vector<std::uint32_t> layer_types;  //!< type index of each layer, in forward order

  //! Appends `count` layers of type `t` (a type with the same name is reused).
  constexpr stack_spec& append(layer_spec const& t, std::uint32_t count = 1) {
    std::uint32_t idx = 0;
    for (; idx < types.size(); ++idx)
      if (types[idx].name == t.name) break;
    if (idx == types.size()) types.push_back(t);
    for (std::uint32_t i = 0; i < count; ++i) layer_types.push_back(idx);
    return *this;
  }
  constexpr std::uint32_t layer_count() const noexcept {
    return static_cast<std::uint32_t>(layer_types.size());
  }
  constexpr layer_spec const& layer(std::uint32_t i) const { return types[layer_types[i]]; }
  //! True when some layer type has a slot of this name.
  constexpr bool has_slot(std::string_view name) const noexcept {
    for (auto const& t : types)
      for (auto const& s : t.slots)
        if (s.name == name) return true;
    return false;
  }
};

//! Run-time sizes for slots declared with `dynamic_bytes`, by slot name (all layer types).
struct slot_sizes {
  std::vector<slot_spec> entries;
  constexpr slot_sizes() = default;
  constexpr slot_sizes(std::initializer_list<slot_spec> e) : entries(e) {}
  constexpr slot_sizes& set(std::string_view name, std::size_t bytes) {
    for (auto& e : entries)
      if (e.name == name) return e.bytes = bytes, *this;
    entries.push_back({name, bytes});
    return *this;
  }
  constexpr std::size_t find(std::string_view name) const noexcept {
    for (auto const& e : entries)
      if (e.name == name) return e.bytes;
    return dynamic_bytes;
  }
};

//! Returns `s` with every dynamic size replaced from `sizes`; a name in `sizes` also overrides a
//! static size only when the slot was dynamic. Throws `schedule_error` for a size left unknown.
constexpr stack_spec bind_sizes(stack_spec s, slot_sizes const& sizes) {
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
  static constexpr slot_spec value{Name.view(), Bytes};
  static constexpr std::string_view name = Name.view();
  static constexpr std::size_t bytes = Bytes;
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
  using tide_layer_tag = void;
  static constexpr layer_spec spec() { return layer_spec{Name.view(), {Slots::value...}}; }
};

//! `Count` consecutive layers of type `Layer` inside a `tide::stack`.
template <class Layer, std::uint32_t Count>
struct repeat {
  static_assert(requires { typename Layer::tide_layer_tag; },
                "tide::repeat<Layer, Count>: Layer must be a tide::layer<\"name\", slots...>");
  using tide_stack_part_tag = void;
  static constexpr void append_to(stack_spec& s) { s.append(Layer::spec(), Count); }
};

namespace detail {
template <class P>
constexpr void append_part(stack_spec& s) {
  if constexpr (requires { typename P::tide_stack_part_tag; })
    P::append_to(s);
  else {
    static_assert(requires { typename P::tide_layer_tag; },
                  "tide::stack<Parts...>: each part must be a tide::layer<...> or a tide::repeat<Layer, N>");
    s.append(P::spec(), 1);
  }
}
}  // namespace detail

//! A stack as a type: `tide::stack<tide::repeat<dense, 3>, tide::repeat<moe, 58>>`.
template <class... Parts>
struct stack {
  using tide_stack_tag = void;
  static constexpr stack_spec spec() {
    stack_spec s;
    (detail::append_part<Parts>(s), ...);
    return s;
  }
};

}  // namespace tide
