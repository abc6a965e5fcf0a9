#pragma once
//! \file
//! The checker's shared parts (core/check.hpp): how a pass fails, overflow-checked sums, a byte
//! access and the program the structural pass proves, and the names its messages use.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

[[noreturn]] inline void check_fail(std::string const& m) { throw schedule_error("tide::check_schedule: " + m); }

//! `a + b`, or a failure: the checker takes hostile programs, whose offsets may sit near SIZE_MAX.
template <class Message>
std::size_t add_or_fail(std::size_t a, std::size_t b, Message const& what) {
  if (a > std::numeric_limits<std::size_t>::max() - b) check_fail(what() + " overflows size_t");
  return a + b;
}

//! The address spaces the checker follows: the device arena, the pinned host arena, the storage file.
enum space : std::uint8_t { device_space = 0, host_space = 1, storage_space = 2 };
inline constexpr std::size_t space_count = 3;

struct access {
  std::uint32_t op;
  std::uint8_t host;  //!< the access's `space` (named for its first two: device 0, host 1)
  bool write;
  std::size_t begin, end;
  std::uint32_t layer;
  std::uint16_t slot;
  std::uint64_t shift{};  //!< slot-relative offset of a byte minus its address (mod 2^64): equal shifts, same bytes
  //! The guard bytes after `slot`, written by the executor's debug checks around the op: data of
  //! their own, never the slot's (no read has it). Also a spilled region's padding to the storage
  //! alignment, which a store or load moves with the slot's bytes.
  bool guard = false;
  //! A write that also reads the data it overwrites (a backward's update of its micro-batch's
  //! boundary gradient, in place): ordered as a write, and its data checked as a read's.
  bool rmw = false;
  bool same_data(access const& o) const noexcept {
    return layer == o.layer && slot == o.slot && shift == o.shift && guard == o.guard;
  }
};

//! What the structural pass proved and the later passes use.
struct checked_program {
  std::span<op const> ops;
  std::vector<std::array<std::int32_t, stream_count>> clock{};  //!< per op: latest op per stream ordered before it
  std::vector<access> accesses{};                               //!< in op order
  std::vector<std::uint32_t> first_access{};                    //!< per op (and one past): its accesses
  //! `a` happens before `b`.
  constexpr bool before(std::uint32_t a, std::uint32_t b) const noexcept {
    return a != b && clock[b][static_cast<std::size_t>(ops[a].stream)] >= static_cast<std::int64_t>(a);
  }
};

//! The carry state op layer `v`'s carry out holds: the next layer's input, or, for the last layer
//! of a unit in a stage schedule, that unit's output (its own state after every layer's, so that
//! it is never taken for the next unit's input).
constexpr std::uint32_t carry_out_state(schedule_view const& s, std::uint32_t v) {
  if (s.stage.present() && s.last_layer(v))
    return static_cast<std::uint32_t>(s.layers.size()) + s.stage.unit_of(v);
  return v + 1;
}

//! "micro-batch 3", or interleaved "micro-batch 3 of chunk 1": unit `u` of stage binding `b`.
inline std::string unit_name(stage_binding const& b, std::uint32_t u) {
  auto const M = b.spec.micro_batches == 0 ? 1 : b.spec.micro_batches;
  return "micro-batch " + std::to_string(u % M) + (b.chunk_first.empty() ? std::string() : " of chunk " + std::to_string(u / M));
}

inline std::string slot_label(schedule_view const& s, std::uint32_t layer, std::size_t k) {
  if (k == gradient_slot) return "the boundary gradient of " + unit_name(s.stage, layer);
  if (k == carry_slot && s.stage.present() && layer >= s.layers.size())
    return "the output of " + unit_name(s.stage, static_cast<std::uint32_t>(layer - s.layers.size())) + " ('" + std::string(s.carry.name) + "')";
  if (k == carry_slot && s.stage.present())
    return "carry " + std::to_string(layer) + " ('" + std::string(s.carry.name) + "', the input of layer " +
           std::to_string(s.stage.layer_of(layer)) + " of " + unit_name(s.stage, s.stage.unit_of(layer)) + ")";
  if (k == carry_slot) return "carry " + std::to_string(layer) + " ('" + std::string(s.carry.name) + "', the input of layer " + std::to_string(layer) + ")";
  return "slot '" + std::string(s.slots[s.layers[layer].first_slot + k].name) + "' of layer " + std::to_string(layer);
}

//! Only for ops whose layer and slot are proven in range.
inline std::string op_name(schedule_view const& s, std::uint32_t i) {
  auto const& o = s.ops[i];
  return "op #" + std::to_string(i) + " (" + op_label(s, o) + " on " + std::string(to_string(o.stream)) + ")";
}

inline std::string space_name(std::uint8_t space) {
  return space == host_space ? "host" : space == storage_space ? "storage file" : "device";
}
inline std::string bytes_text(std::size_t b, std::size_t e) {
  // Appended piecewise: "[" + std::to_string(b) trips GCC 12's -Wrestrict (PR 105651).
  std::string r(1, '[');
  r.append(std::to_string(b)).append(", ").append(std::to_string(e)).append(1, ')');
  return r;
}

}  // namespace tide::detail
