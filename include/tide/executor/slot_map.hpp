#pragma once
//! \file
//! `tide::slot_map<T, N>`: the slots of a run-time stack by the user's own index (an enum of the
//! tensors its layers save, say), resolved once from the stack's names into handles; then, in
//! the lambdas, every slot of the context's layer in one call, indexed the user's way:
//!
//!     tide::slot_map<float, tensor_count> slots(stack, [](std::size_t i) { return name(tensor(i)); });
//!     auto fwd = [&](auto const& ctx) { layer_forward(ctx.layer, slots.spans(ctx), ...); };
//!
//! A slot of the stack that no index names is an error when the map is made (its data would be
//! written by no lambda), and so is a name two indices share.

#include <array>
#include <bitset>
#include <cstddef>
#include <span>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/slot_handle.hpp>
#include <tide/core/stack.hpp>
#include <tide/executor/context.hpp>

namespace tide {

//! The slots of every layer type of a stack, as elements of `T`, by indices `0 .. N-1` that the
//! user names (`name_of(i)`); an index whose name a layer type lacks is empty in that type's layers.
template <class T, std::size_t N>
class slot_map {
 public:
  //! Which indices: a bit per index, as the user's own set type (`std::bitset<N>`).
  using index_set = std::bitset<N>;

  //! Resolves every slot of every layer type of `stack` to the index `i < N` with
  //! `name_of(i) == slot name`. Throws `slot_error` naming the slot when no index names it, and
  //! naming both indices when two share a name.
  template <class NameOf>
  slot_map(stack_spec const& stack, NameOf&& name_of) : types_(stack.types.size()) {
    std::array<std::string, N> names{};  // copies: name_of may return temporaries
    for (std::size_t i = 0; i < N; ++i) {
      names[i] = std::string(std::string_view(name_of(i)));
      for (std::size_t j = 0; j < i; ++j)
        if (!names[i].empty() && names[i] == names[j])
          throw slot_error("tide::slot_map: indices " + std::to_string(j) + " and " + std::to_string(i) +
                           " are both named '" + std::string(names[i]) + "'");
    }
    for (std::uint32_t t = 0; t < stack.types.size(); ++t) {
      auto const& type = stack.types[t];
      for (auto const& s : type.slots) {
        std::size_t i = 0;
        while (i < N && names[i] != s.name) ++i;
        if (i == N)
          throw slot_error("tide::slot_map: slot '" + std::string(s.name) + "' of layer type '" + std::string(type.name) +
                           "' has no index: name_of(i) names none of the " + std::to_string(N) +
                           " indices so, and no lambda would write or read it");
        types_[t].entries.push_back({stack.handle<T>(type.name, s.name), static_cast<std::uint32_t>(i)});
        types_[t].bound.set(i);
      }
    }
  }

  //! Every slot of `ctx`'s layer, span `i` the slot index `i` names (empty when the layer's type
  //! has none): writable in a forward context (in its mode's buffers), read-only in a backward one.
  template <class Ctx>
  [[nodiscard]] auto spans(Ctx const& ctx) const {
    std::array<decltype(ctx.slot(slot_handle<T>{})), N> out{};
    for (auto const& e : of(ctx).entries) out[e.index] = ctx.slot(e.handle);
    return out;
  }
  //! In a recompute, the saved data of every slot of `ctx`'s layer that it does not rebuild,
  //! read-only (`ctx.saved`), span `i` the slot index `i` names; empty for the slots it rebuilds,
  //! for those the layer's type lacks, and in a forward or an advance (nothing saved to read).
  template <class Ctx>
  [[nodiscard]] std::array<std::span<T const>, N> saved(Ctx const& ctx) const {
    std::array<std::span<T const>, N> out{};
    if (ctx.mode != forward_mode::recompute) return out;
    for (auto const& e : of(ctx).entries)
      if (!ctx.produces(e.handle)) out[e.index] = ctx.saved(e.handle);
    return out;
  }
  //! The indices this forward call must produce (`ctx.produces`).
  template <class Ctx>
  [[nodiscard]] index_set produced(Ctx const& ctx) const {
    index_set r;
    for (auto const& e : of(ctx).entries) r.set(e.index, ctx.produces(e.handle));
    return r;
  }
  //! The indices `ctx`'s layer type has slots for.
  template <class Ctx>
  [[nodiscard]] index_set bound(Ctx const& ctx) const {
    return of(ctx).bound;
  }
  //! The handle of index `i` in layer type `type_index`; throws `slot_error` when that type has none.
  [[nodiscard]] slot_handle<T> handle(std::uint32_t type_index, std::size_t i) const {
    if (type_index < types_.size())
      for (auto const& e : types_[type_index].entries)
        if (e.index == i) return e.handle;
    throw slot_error("tide::slot_map: layer type " + std::to_string(type_index) + " has no slot of index " + std::to_string(i));
  }

 private:
  struct entry {
    slot_handle<T> handle{};
    std::uint32_t index = 0;
  };
  struct type_slots {
    std::vector<entry> entries{};
    index_set bound{};
  };
  template <class Ctx>
  type_slots const& of(Ctx const& ctx) const {
    if (ctx.type_index >= types_.size())
      throw slot_error("tide::slot_map: layer " + std::to_string(ctx.layer) + " is of type " + std::to_string(ctx.type_index) +
                       " ('" + std::string(ctx.type_name) + "'), and the map was made from a stack of " +
                       std::to_string(types_.size()) + " type(s): make it from the stack the schedule was built of");
    return types_[ctx.type_index];
  }
  std::vector<type_slots> types_;
};

}  // namespace tide
