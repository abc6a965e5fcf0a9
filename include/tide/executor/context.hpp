#pragma once
//! \file
//! What user lambdas receive: the layer, the stream to enqueue on, and the slots as spans.
//!
//! A slot is named three ways, each O(1) per call:
//! - by a handle, the usual way (no `.template` in generic lambdas): resolved at compile time from
//!   a static layer type (a misspelled name does not compile, and the diagnostic shows the layer
//!   type and its slots), `constexpr auto q = tide::slot_handle_of<dense, "q_proj", float>;`, or
//!   once from a run-time stack, `auto const q = stack.handle<float>("dense", "q_proj");` (throws
//!   `slot_error` naming the type's slots); then `ctx.slot(q)`, `ctx.produces(q)`;
//! - by name, for a concrete context type: `ctx.slot<"q_proj", float>()`, `ctx.produces<"q_proj">()`
//!   (resolved once per thread, name and layer type, then cached for up to four layer types);
//! - by index (`ctx.slot(k)`), with `ctx.slot_index(name)` for names known only at run time.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/op.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/slot_handle.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/vocabulary.hpp>

namespace tide {

namespace detail {
template <class Layer, fixed_string Name>
struct slot_not_found {
  // Dependent, so that it fires only when instantiated: the diagnostic shows the layer type (its
  // name and slots) and the name asked for.
  static_assert(sizeof(Layer) == 0, "tide::slot_handle_of<Layer, Name>: Layer has no slot of this name: the "
                                    "instantiation shows Layer's slots and the name asked for");
};
template <class Layer, fixed_string Name>
consteval std::uint16_t slot_index_of() {
  static_assert(requires { typename Layer::tide_layer_tag; },
                "tide::slot_handle_of<Layer, Name>: Layer must be a tide::layer<\"name\", tide::slot<...>...>");
  constexpr std::size_t k = [] {
    std::size_t i = 0;
    while (i < Layer::slots.size() && Layer::slots[i] != Name.view()) ++i;
    return i;
  }();
  if constexpr (k == Layer::slots.size()) {
    [[maybe_unused]] slot_not_found<Layer, Name> report;
    return 0;
  } else {
    return static_cast<std::uint16_t>(k);
  }
}

//! `s` as elements of `T`; throws `slot_error` if its size or alignment does not fit T, naming
//! `what()` (called only then: the views are on the lambdas' path).
template <class T, class Byte, class What>
std::span<T> view_as(std::span<Byte> s, What&& what) {
  if constexpr (sizeof(T) > 1)
    if (reinterpret_cast<std::uintptr_t>(s.data()) % alignof(T) != 0 || s.size() % sizeof(T) != 0)
      throw slot_error("tide: " + std::string(what()) + " (" + std::to_string(s.size()) +
                       " bytes) cannot be viewed as elements of " + std::to_string(sizeof(T)) + " bytes aligned to " +
                       std::to_string(alignof(T)) + ": check its size and the arena alignment");
  return {reinterpret_cast<T*>(s.data()), s.size() / sizeof(T)};
}

// The index of slot `name` of `layer` (of layer type `type`); throws `slot_error` listing its slots.
TIDE_INLINE std::uint16_t find_slot(std::span<slot_binding const> slots, std::uint32_t layer, std::string_view type,
                                    std::string_view name);
#if TIDE_DEFINITIONS
TIDE_INLINE std::uint16_t find_slot(std::span<slot_binding const> slots, std::uint32_t layer, std::string_view type,
                                    std::string_view name) {
  for (std::size_t k = 0; k < slots.size(); ++k)
    if (slots[k].name == name) return static_cast<std::uint16_t>(k);
  std::string names;
  for (auto const& s : slots) names += (names.empty() ? "" : ", ") + std::string(s.name);
  throw slot_error("tide: layer " + std::to_string(layer) + " (" + std::string(type) + ") has no slot '" +
                   std::string(name) + "'; its slots are: " + names);
}
#endif

//! The index of slot `Name` in the layer type of `bindings`, from a small cache per thread and
//! name keyed by the layer type's name: a lambda asking for the same slot of one of up to four
//! layer types pays one or a few comparisons; a miss searches the layer's slots.
template <fixed_string Name>
std::uint16_t cached_slot_index(std::span<slot_binding const> bindings, std::uint32_t layer, std::string_view type) {
  struct entry {
    char const* type = nullptr;
    std::size_t type_size = 0;
    std::uint16_t index = 0;
  };
  thread_local std::array<entry, 4> cache{};
  thread_local std::size_t next = 0;
  for (auto const& e : cache)
    if (e.type == type.data() && e.type_size == type.size() && e.index < bindings.size() &&
        bindings[e.index].name == Name.view())
      return e.index;
  auto const k = find_slot(bindings, layer, type, Name.view());
  cache[next] = {type.data(), type.size(), k};
  next = (next + 1) % cache.size();
  return k;
}
}  // namespace detail

//! The handle of slot `Name` of `Layer` (a `tide::layer<...>`), resolved at compile time.
template <class Layer, fixed_string Name, class T = std::byte>
inline constexpr slot_handle<T> slot_handle_of{Layer::name, Name.view(), detail::slot_index_of<Layer, Name>()};

//! Shared by all contexts: which layer, which stream, the layer's slot bindings.
template <class Stream>
struct layer_context {
  std::uint32_t layer = 0;                   //!< the layer's index in the stack (a stage's: in the stage)
  //! The micro-batch the op works for: in a stage schedule (core/stage_schedule.hpp), its index
  //! among the step's micro-batches; 0 otherwise
  std::uint32_t micro_batch = 0;
  //! Interleaved stages: the stage's chunk the layer is in (`layer` counts the stage's layers over
  //! all its chunks); 0 otherwise
  std::uint32_t chunk = 0;
  Stream stream{};                           //!< the stream to enqueue the layer's work on
  std::span<slot_binding const> bindings{};  //!< the layer's slots: names, sizes, placements, offsets
  tide::name type_name{};                    //!< the name of the layer's type
  std::uint32_t type_index = 0;              //!< the layer's type: an index into `stack_spec::types`
  std::byte* device = nullptr;               //!< the device arena's start: slot offsets are relative to it
  std::byte* carry_in_data = nullptr;        //!< the layer's input carry (a stack with a carry), else null
  std::byte* carry_out_data = nullptr;       //!< where its carry out goes (see the contexts), else null
  std::size_t carry_bytes = 0;               //!< the carry's size (0 when the stack has no carry)
  //! True while `tide::calibrate` runs the step to time it (`executor_options::calibrating`): a
  //! backward that also applies the optimizer skips it then, or the live model trains while tide
  //! measures.
  bool calibrating = false;

  //! The carry this layer reads (carry `layer`: the stack's input for layer 0), read-only; empty
  //! when the stack has no carry.
  std::span<std::byte const> carry_in() const noexcept { return {carry_in_data, carry_in_data ? carry_bytes : 0}; }
  //! The same as elements of `T`; throws `slot_error` if the carry's size or alignment does not fit T.
  template <class T>
  std::span<T const> carry_in() const {
    return typed_carry<T const>(carry_in());
  }

  //! How many slots the layer has: valid indices are below it.
  std::uint16_t slot_count() const noexcept { return static_cast<std::uint16_t>(bindings.size()); }
  //! Slot `k`'s name; every index-taking member throws `slot_error` when `k >= slot_count()`
  //! (always checked: one comparison, and an unchecked index would hand out another layer's bytes).
  std::string_view slot_name(std::uint16_t k) const { return binding(k).name; }
  //! Slot `k`'s placement: kept on the device, offloaded or rematerialized.
  placement where(std::uint16_t k) const { return binding(k).where; }
  //! The index of a slot whose name is known only at run time (a linear search; throws
  //! `slot_error` listing the layer's slots when there is none).
  std::uint16_t slot_index(std::string_view name) const { return detail::find_slot(bindings, layer, type_name, name); }

 protected:
  //! Slot `k`'s binding, after checking that `k` is in range.
  slot_binding const& binding(std::uint16_t k) const {
    if (k >= bindings.size())
      throw slot_error("tide: slot index " + std::to_string(k) + " is out of range for layer " + std::to_string(layer) +
                       " (" + std::string(type_name) + "), which has " + std::to_string(bindings.size()) + " slot(s)");
    return bindings[k];
  }
  //! The handle's index, after checking that it was made for this layer's type and names the
  //! same slot here (a run-time stack may reuse a type name with another slot order).
  template <class T>
  std::uint16_t index_of(slot_handle<T> h) const {
    // The handle's names and the schedule's are the same objects when the stack was built from
    // the layer type: pointer comparisons.
    auto same = [](std::string_view a, std::string_view b) {
      return (a.data() == b.data() && a.size() == b.size()) || a == b;
    };
    if (!same(h.layer_type, type_name))
      throw slot_error("tide: a slot handle of layer type '" + std::string(h.layer_type) + "' was used in layer " +
                       std::to_string(layer) + ", of type '" + std::string(type_name) +
                       "': take the handle from this layer's type (check ctx.type_name first)");
    if (h.index >= bindings.size() || !same(h.name, bindings[h.index].name))
      throw slot_error("tide: the handle of slot '" + std::string(h.name) + "' (index " + std::to_string(h.index) +
                       ") does not match layer " + std::to_string(layer) + " of type '" + std::string(type_name) +
                       "', whose slots differ from the layer type the handle was made from");
    return h.index;
  }
  //! The index of slot `Name`, from a small per-thread cache.
  template <fixed_string Name>
  std::uint16_t index_of() const {
    return detail::cached_slot_index<Name>(bindings, layer, type_name);
  }
  //! Carry `s` as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T, class Byte>
  std::span<T> typed_carry(std::span<Byte> s) const {
    return detail::view_as<T>(s, [&] { return "the carry of layer " + std::to_string(layer); });
  }
  //! Slot `k`'s bytes `s` as elements of `T`; throws `slot_error` if their size or alignment does
  //! not fit T.
  template <class T, class Byte>
  std::span<T> typed(std::span<Byte> s, std::uint16_t k) const {
    return detail::view_as<T>(s, [&] { return "slot '" + std::string(binding(k).name) + "' of layer " + std::to_string(layer); });
  }
};

//! Why the forward lambda runs (`forward_context::mode`). What each mode may read and write:
//!
//! | mode      | `slot(k)` (writable)                                   | `saved(k)` (read-only)          | `carry_out()`            |
//! |-----------|--------------------------------------------------------|---------------------------------|--------------------------|
//! | forward   | the slot's forward buffer: write every slot            | refused                         | write it all             |
//! | recompute | `produces(k)`: the buffer backward reads: rebuild it;  | the saved data of a slot it     | lent scratch, read by no |
//! |           | otherwise scratch lent by tide, read by no one         | does not rebuild (refused else) | one (`produces_carry()`  |
//! |           |                                                        |                                 | is false)                |
//! | advance   | scratch lent by tide, read by no one                   | refused                         | write it all             |
//!
//! So a layer's unchanged forward (writing every slot and its carry out) runs correctly in every
//! mode, and a recompute that reads what it does not rebuild reads it through `saved(k)`.
enum class forward_mode : std::uint8_t {
  forward,    //!< the step's forward: write every slot (and the carry out)
  recompute,  //!< before the backward: rebuild the remat slots; read the others through `saved()`
  advance,    //!< a segment recomputation of checkpointing: write the carry out; the slots are scratch
};

//! The name of a forward mode, for messages: "forward", "recompute", "advance".
[[nodiscard]] constexpr std::string_view to_string(forward_mode m) noexcept {
  return m == forward_mode::forward ? "forward" : m == forward_mode::recompute ? "recompute" : "advance";
}

//! Given to the forward lambda, in one of three modes (`mode`; the table at `forward_mode` is the
//! contract). In forward mode every slot is to be written; in recompute mode only the remat slots
//! (`produces(k)`), the others' saved data is read through `saved(k)`, and whatever the lambda
//! writes through `slot(k)` or `carry_out()` for the rest lands in scratch tide lends from its
//! arena (counted in the predicted peak) and nobody reads; in an advance the carry out is written
//! and the slots are such scratch. In a stack with a carry the lambda reads `carry_in()` in every
//! mode.
// The deprecated members' implicit uses (the context's copy and default construction) are tide's,
// not the user's: silenced here; a lambda that reads them is still warned.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
template <class Stream>
struct forward_context : layer_context<Stream> {
  forward_mode mode = forward_mode::forward;  //!< forward, recompute or advance
  //! Deprecated (0.3): true in an advance too; ask `mode` instead.
  [[deprecated("use ctx.mode != tide::forward_mode::forward (or == recompute: this is true in an advance too)")]]
  bool recompute = false;
  //! Deprecated (0.3).
  [[deprecated("use ctx.mode == tide::forward_mode::advance")]] bool advance = false;

  //! True when this call must produce slot `k`: every slot in a forward, the remat slots in a
  //! recompute, none in an advance.
  [[nodiscard]] bool produces(std::uint16_t k) const {
    auto const& b = this->binding(k);  // checked in every mode
    return mode == forward_mode::forward || (mode == forward_mode::recompute && b.where == placement::remat);
  }
  //! True when this call must write `carry_out()`: a forward or an advance of a stack with a carry
  //! (a recompute may write it too, into scratch, but need not).
  [[nodiscard]] bool produces_carry() const noexcept {
    return this->carry_out_data != nullptr && mode != forward_mode::recompute;
  }
  //! Where the layer writes its carry out: carry `layer + 1` (for the last layer the stack's
  //! output) in a forward or an advance; in a recompute, scratch lent by tide that nobody reads
  //! (so an unchanged forward may write it); empty when the stack has no carry. Throws
  //! `slot_error` in a recompute of a schedule that lends no carry scratch (written by hand).
  [[nodiscard]] std::span<std::byte> carry_out() const {
    if (this->carry_out_data == nullptr && mode == forward_mode::recompute && this->carry_bytes > 0) this->refuse_carry_out();
    return {this->carry_out_data, this->carry_out_data ? this->carry_bytes : 0};
  }
  //! The same as elements of `T`; throws `slot_error` if the carry's size or alignment does not fit T.
  template <class T>
  [[nodiscard]] std::span<T> carry_out() const {
    return this->template typed_carry<T>(carry_out());
  }
  //! True when this call must produce the slot of handle `h`.
  template <class T>
  [[nodiscard]] bool produces(slot_handle<T> h) const {
    return produces(this->index_of(h));
  }
  //! True when this call must produce slot `Name`.
  template <fixed_string Name>
  [[nodiscard]] bool produces() const {
    return produces(this->template index_of<Name>());
  }

  //! Slot `k`'s bytes to write: its forward buffer in a forward; in a recompute, the buffer its
  //! backward reads when `produces(k)`, else scratch lent by tide (counted in the peak) that
  //! nobody reads; in an advance, such scratch. Never the saved bytes: read those with `saved(k)`.
  [[nodiscard]] std::span<std::byte> slot(std::uint16_t k) const {
    auto const& b = this->binding(k);
    std::size_t at = b.forward_offset;
    if (mode == forward_mode::advance) {
      at = b.advance_offset;
    } else if (mode == forward_mode::recompute) {
      at = b.where == placement::remat ? b.backward_offset : b.recompute_offset;
      if (at == slot_binding::no_scratch) this->refuse_scratch(k);
    }
    return {this->device + at, b.bytes};
  }
  //! The slot as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  [[nodiscard]] std::span<T> slot(slot_handle<T> h) const {
    auto const k = this->index_of(h);
    return this->template typed<T>(slot(k), k);
  }
  //! Slot `Name` as elements of `T` (resolved once per thread and layer type, then cached).
  template <fixed_string Name, class T = std::byte>
  [[nodiscard]] std::span<T> slot() const {
    auto const k = this->template index_of<Name>();
    return this->template typed<T>(slot(k), k);
  }
  //! Slot `k` as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  [[nodiscard]] std::span<T> slot_as(std::uint16_t k) const {
    return this->template typed<T>(slot(k), k);
  }

  //! The saved data of slot `k`, read-only, in a recompute that does not rebuild it (kept, or
  //! prefetched back): what a selective recompute reads instead of recomputing it. Throws
  //! `slot_error` naming the layer, the slot and the mode elsewhere: in a forward or an advance
  //! (nothing is saved yet, or it belongs to a later backward) and for a slot this recompute
  //! rebuilds (`produces(k)`: write it through `slot(k)`).
  [[nodiscard]] std::span<std::byte const> saved(std::uint16_t k) const {
    auto const& b = this->binding(k);
    if (mode != forward_mode::recompute || b.where == placement::remat) this->refuse_saved(k);
    return {this->device + b.backward_offset, b.bytes};
  }
  //! The saved data of the slot of handle `h` as elements of `T` (see `saved(k)`).
  template <class T>
  [[nodiscard]] std::span<T const> saved(slot_handle<T> h) const {
    auto const k = this->index_of(h);
    return this->template typed<T const>(saved(k), k);
  }
  //! The saved data of slot `Name` as elements of `T` (see `saved(k)`).
  template <fixed_string Name, class T = std::byte>
  [[nodiscard]] std::span<T const> saved() const {
    auto const k = this->template index_of<Name>();
    return this->template typed<T const>(saved(k), k);
  }
  //! The saved data of slot `k` as elements of `T` (see `saved(k)`).
  template <class T>
  [[nodiscard]] std::span<T const> saved_as(std::uint16_t k) const {
    return this->template typed<T const>(saved(k), k);
  }

 private:
  [[noreturn]] void refuse_saved(std::uint16_t k) const {
    throw slot_error("tide: layer " + std::to_string(this->layer) + " (" + std::string(this->type_name) + "), slot '" +
                     std::string(this->slot_name(k)) + "', " + std::string(to_string(mode)) +
                     " mode: saved() reads the saved data of a slot a recompute does not rebuild, " +
                     (mode == forward_mode::recompute
                          ? std::string("and this recompute rebuilds it (produces() is true): write it through slot()")
                          : std::string("and only a recompute has any: in a forward or an advance use slot()")));
  }
  [[noreturn]] void refuse_scratch(std::uint16_t k) const {
    throw slot_error("tide: layer " + std::to_string(this->layer) + " (" + std::string(this->type_name) + "), slot '" +
                     std::string(this->slot_name(k)) +
                     "', recompute mode: the recompute does not rebuild this slot and the schedule lends no scratch "
                     "for it (slot_binding::recompute_offset, set by build_schedule): read its saved data with "
                     "ctx.saved(k), and write it only when ctx.produces(k)");
  }
  [[noreturn]] void refuse_carry_out() const {
    throw slot_error("tide: layer " + std::to_string(this->layer) + " (" + std::string(this->type_name) +
                     "), recompute mode: the schedule lends no carry scratch to a recompute "
                     "(arena_layout::recompute_carry_offset, set by build_schedule): write ctx.carry_out() only when "
                     "ctx.produces_carry()");
  }
};
#pragma GCC diagnostic pop

//! Given to the backward lambda: every slot of the layer, wherever it was kept, prefetched or
//! recomputed, read-only; in a stack with a carry, `carry_in()` is the layer's input and, for the
//! last layer, `output()` the stack's output (to seed the loss gradient).
template <class Stream>
struct backward_context : layer_context<Stream> {
  //! In a stage schedule: the micro-batch's boundary gradient, which the backward updates in place
  //! (it comes in as the gradient of the stage's output, received or seeded by the last stage's
  //! turn, and leaves, after layer 0's backward, as the gradient of the stage's input); else null
  std::byte* gradient_data = nullptr;
  //! The micro-batch's boundary gradient (a stage schedule; the carry's size), else empty.
  std::span<std::byte> gradient() const noexcept { return {gradient_data, gradient_data ? this->carry_bytes : 0}; }
  //! The same as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  std::span<T> gradient() const {
    return detail::view_as<T>(gradient(), [] { return "the micro-batch's boundary gradient (gradient())"; });
  }
  //! The stack's output (the last layer's carry out) in the last layer's backward; else empty.
  std::span<std::byte const> output() const noexcept {
    return {this->carry_out_data, this->carry_out_data ? this->carry_bytes : 0};
  }
  //! The same as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  std::span<T const> output() const {
    return this->template typed_carry<T const>(output());
  }
  //! Slot `k`'s bytes, read-only: wherever it was kept, they are back on the device now.
  std::span<std::byte const> slot(std::uint16_t k) const {
    auto const& b = this->binding(k);
    return {this->device + b.backward_offset, b.bytes};
  }
  //! The slot as elements of `T`; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  std::span<T const> slot(slot_handle<T> h) const {
    auto const k = this->index_of(h);
    return this->template typed<T const>(slot(k), k);
  }
  //! Slot `Name` as elements of `T` (resolved once per thread and layer type, then cached).
  template <fixed_string Name, class T = std::byte>
  std::span<T const> slot() const {
    auto const k = this->template index_of<Name>();
    return this->template typed<T const>(slot(k), k);
  }
  //! Slot `k` as elements of `T`, read-only; throws `slot_error` if its size or alignment does not fit T.
  template <class T>
  std::span<T const> slot_as(std::uint16_t k) const {
    return this->template typed<T const>(slot(k), k);
  }
};

//! Given to collective hooks: `kind` is `op_kind::gather` (before a layer's forward),
//! `op_kind::regather` (before its recompute and backward) or `op_kind::reduce` (after its backward).
//!
//! Collective hooks run even after another op of the step failed (`step_failed` is then true),
//! so that a rank can tell its peers instead of leaving them blocked in a collective.
template <class Stream>
struct collective_context {
  std::uint32_t layer = 0;         //!< the layer the collective is for
  Stream stream{};                 //!< the communication stream to enqueue the collective on
  op_kind kind = op_kind::reduce;  //!< `gather`, `regather` or `reduce`
  bool step_failed = false;        //!< an op of this step failed: tell the peers rather than exchange data
};

//! Given once per step to a hook object with `agree(ctx)` (see `tide::hooks`): the communication
//! stream, ordered after everything the step enqueued on every stream, and whether an op of this
//! step failed on this rank. A distributed adapter agrees there with its peers on whether any rank
//! failed (the NCCL hooks all-reduce one flag), so a failure after the step's last collective is
//! not missed: the step's result is then discarded on every rank, never on only some.
template <class Stream>
struct step_end_context {
  Stream stream{};           //!< the communication stream, after every stream's work of the step
  bool step_failed = false;  //!< an op of this step failed on this rank (lambdas, hooks, debug checks)
};

}  // namespace tide
