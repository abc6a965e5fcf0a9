#pragma once
//! \file What user lambdas receive: the layer, the stream to enqueue on, and the slots as spans.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <tide/core/error.hpp>
#include <tide/core/op.hpp>
#include <tide/core/schedule.hpp>

namespace tide {

namespace detail {
inline std::uint16_t find_slot(std::span<slot_binding const> slots, std::uint32_t layer, std::string_view type,
                               std::string_view name) {
  for (std::size_t k = 0; k < slots.size(); ++k)
    if (slots[k].name == name) return static_cast<std::uint16_t>(k);
  std::string names;
  for (auto const& s : slots) names += (names.empty() ? "" : ", ") + std::string(s.name);
  throw slot_error("tide: layer " + std::to_string(layer) + " (" + std::string(type) + ") has no slot '" +
                   std::string(name) + "'; its slots are: " + names);
}
}  // namespace detail

//! Shared by all contexts: which layer, which stream, the layer's slot bindings.
template <class Stream>
struct layer_context {
  std::uint32_t layer = 0;
  Stream stream{};
  std::span<slot_binding const> bindings;
  std::string_view type_name;
  std::byte* device = nullptr;

  std::uint16_t slot_count() const noexcept { return static_cast<std::uint16_t>(bindings.size()); }
  //! Slot `k`'s name; every index-taking member throws `slot_error` when `k >= slot_count()`
  //! (always checked: one comparison, and an unchecked index would hand out another layer's bytes).
  std::string_view slot_name(std::uint16_t k) const { return binding(k).name; }
  placement where(std::uint16_t k) const { return binding(k).where; }
  std::uint16_t slot_index(std::string_view name) const { return detail::find_slot(bindings, layer, type_name, name); }

 protected:
  slot_binding const& binding(std::uint16_t k) const {
    if (k >= bindings.size())
      throw slot_error("tide: slot index " + std::to_string(k) + " is out of range for layer " + std::to_string(layer) +
                       " (" + std::string(type_name) + "), which has " + std::to_string(bindings.size()) + " slot(s)");
    return bindings[k];
  }
  template <class T, class Byte>
  std::span<T> typed(std::span<Byte> s, std::string_view name) const {
    if (reinterpret_cast<std::uintptr_t>(s.data()) % alignof(T) != 0 || s.size() % sizeof(T) != 0)
      throw slot_error("tide: slot '" + std::string(name) + "' of layer " + std::to_string(layer) + " (" +
                       std::to_string(s.size()) + " bytes) cannot be viewed as elements of " +
                       std::to_string(sizeof(T)) + " bytes aligned to " + std::to_string(alignof(T)) +
                       ": check the slot size and the arena alignment");
    return {reinterpret_cast<T*>(s.data()), s.size() / sizeof(T)};
  }
};

//! Given to the forward lambda. In forward mode every slot is to be written; in recompute mode
//! (`recompute == true`) only the remat slots are, and the others hold their saved data.
template <class Stream>
struct forward_context : layer_context<Stream> {
  bool recompute = false;

  //! True when this call must produce slot `k`.
  bool produces(std::uint16_t k) const {
    auto const& b = this->binding(k);  // checked even when not recomputing
    return !recompute || b.where == placement::remat;
  }
  std::span<std::byte> slot(std::uint16_t k) const {
    auto const& b = this->binding(k);
    return {this->device + (recompute ? b.backward_offset : b.forward_offset), b.bytes};
  }
  std::span<std::byte> slot(std::string_view name) const { return slot(this->slot_index(name)); }
  //! Slot `name` as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  std::span<T> slot_as(std::string_view name) const {
    return this->template typed<T>(slot(name), name);
  }
};

//! Given to the backward lambda: every slot of the layer, wherever it was kept, reloaded or
//! recomputed, read-only.
template <class Stream>
struct backward_context : layer_context<Stream> {
  std::span<std::byte const> slot(std::uint16_t k) const {
    auto const& b = this->binding(k);
    return {this->device + b.backward_offset, b.bytes};
  }
  std::span<std::byte const> slot(std::string_view name) const { return slot(this->slot_index(name)); }
  //! Slot `name` as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  std::span<T const> slot_as(std::string_view name) const {
    return this->template typed<T const>(slot(name), name);
  }
};

//! Given to collective hooks: `kind` is `op_kind::gather` (before a layer's forward) or
//! `op_kind::collective` (after its backward).
//!
//! Collective hooks run even after another op of the step failed (`step_failed` is then true),
//! so that a rank can tell its peers instead of leaving them blocked in a collective.
template <class Stream>
struct collective_context {
  std::uint32_t layer = 0;
  Stream stream{};
  op_kind kind = op_kind::collective;
  bool step_failed = false;
};

}  // namespace tide
