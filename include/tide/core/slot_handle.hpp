#pragma once
//! \file
//! `tide::slot_handle<T>`: a slot of a layer type, resolved once (at compile time from a static
//! layer type, `tide::slot_handle_of<Layer, "name", T>`; at run time from a run-time stack,
//! `stack.handle<T>("type", "name")`), then used in the lambdas in O(1): `ctx.slot(h)`.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tide/core/name.hpp>

namespace tide {

//! Slot `index` (named `name`) of layer type `layer_type`, viewed as elements of `T`.
template <class T = std::byte>
struct slot_handle {
  using element_type = T;         //!< what the slot's bytes are viewed as
  tide::name layer_type{};        //!< the layer type's name, checked against the context's `type_name`
  tide::name name{};              //!< the slot's name, checked against the layer's slot at `index`
  std::uint16_t index = 0;        //!< the slot's position among its layer's slots
};

}  // namespace tide
