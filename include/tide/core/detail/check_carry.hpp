#pragma once
//! \file
//! The checker's carry passes (core/check.hpp): each op's carry fields, and one op's device
//! accesses disjoint, the user's input and output buffers written only where they may be.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

//! The carry fields of op `i` (layer and stream proven in range): present exactly where the
//! executor hands the lambdas a carry, at the fixed input and output buffers where the user
//! writes and reads them, and inside `size_t`.
inline void check_carry_fields(schedule_view const& s, std::uint32_t i) {
  auto const& o = s.ops[i];
  auto const& c = s.carry;
  auto const L = static_cast<std::uint32_t>(s.layers.size());
  auto const what = [&] { return "carry: op #" + std::to_string(i) + " (" + std::string(to_string(o.kind)) + " L" + std::to_string(o.layer) + ")"; };
  bool const copy = is_copy(o.kind) && o.slot == carry_slot;
  if (!c.present()) {
    if (o.carry_in != no_carry || o.carry_out != no_carry || o.kind == op_kind::advance || copy)
      check_fail(what() + " reads, writes or copies a carry, but the schedule has none");
    if (o.kind == op_kind::recompute && s.arena.recompute_carry_offset != no_carry)
      check_fail(what() + " is lent carry scratch (arena_layout::recompute_carry_offset), but the schedule has no carry");
    return;
  }
  auto const fits = [&](std::size_t at, char const* which) {
    add_or_fail(at, c.bytes, [&] { return what() + ": its " + which + " range"; });
  };
  if (copy) {
    if (o.chunks != 1 || o.chunk != 0 || o.bytes != c.bytes)
      check_fail(what() + " must copy the whole carry (" + std::to_string(c.bytes) + " bytes) in one chunk");
    if (o.layer >= L) check_fail(what() + " copies carry " + std::to_string(o.layer) + ", the output: no layer's input");
    fits(o.device_offset, "device");
    fits(o.host_offset, "host");
    return;
  }
  if (is_boundary(o.kind)) {
    if (o.carry_in != no_carry || o.carry_out != no_carry) check_fail(what() + " is a boundary transfer but names a carry");
    return;
  }
  bool const layer_op = o.kind == op_kind::forward || o.kind == op_kind::advance || o.kind == op_kind::recompute ||
                        o.kind == op_kind::backward;
  if (!layer_op) {
    if (o.carry_in != no_carry || o.carry_out != no_carry) check_fail(what() + " is no layer op but names a carry");
    return;
  }
  bool const wants_out = o.kind == op_kind::forward || o.kind == op_kind::advance ||
                         (o.kind == op_kind::backward && s.last_layer(o.layer));
  if (o.carry_in == no_carry) check_fail(what() + " reads no carry: the layer's input would be missing");
  if (wants_out != (o.carry_out != no_carry))
    check_fail(what() + (wants_out ? " has no carry out"
                                   : " names a carry out, which only forwards and advances write and only the last "
                                     "layer's backward reads"));
  fits(o.carry_in, "carry in");
  if (wants_out) fits(o.carry_out, "carry out");
  if (o.kind == op_kind::recompute && s.recompute_carry_offset(o.layer) != no_carry)
    fits(s.recompute_carry_offset(o.layer), "recompute carry scratch");
  if (s.stage.present()) return;  // a stage's inputs and outputs are per micro-batch: the data flow proves them
  if (o.kind == op_kind::forward && o.layer == 0 && o.carry_in != c.input_offset())
    check_fail(what() + " reads carry 0 at device offset " + std::to_string(o.carry_in) + ", not at the input buffer (" +
               std::to_string(c.input_offset()) + ") the user writes");
  bool const output = (o.kind == op_kind::forward || o.kind == op_kind::backward) && o.layer == L - 1;
  if (output && o.carry_out != c.output_offset())
    check_fail(what() + " writes or reads the stack's output at device offset " + std::to_string(o.carry_out) +
               ", not at the output buffer (" + std::to_string(c.output_offset()) + ") the user reads");
}

//! One op's device accesses do not overlap (its carries among its slots), no op writes the input
//! buffer, which is the user's, and only the last layer's forward writes the output buffer, which
//! the user reads after the step. Only for schedules with a carry (without one, check_bindings and
//! check_layout prove the first).
inline void check_disjoint_accesses(schedule_view const& s, checked_program const& p) {
  auto const in_begin = s.carry.input_offset(), in_end = in_begin + s.carry.bytes;  // no overflow: proven
  auto const out_begin = s.carry.output_offset(), out_end = out_begin + s.carry.bytes;
  auto const last = static_cast<std::uint32_t>(s.layers.size()) - 1;
  std::vector<access const*> mine;
  for (std::uint32_t i = 0; i + 1 < p.first_access.size(); ++i) {
    mine.clear();
    for (auto j = p.first_access[i]; j < p.first_access[i + 1]; ++j) {
      auto const& a = p.accesses[j];
      if (a.host) continue;
      if (s.stage.present()) {  // a stage's receives write its inputs, per micro-batch: the data flow proves them
        mine.push_back(&a);
        continue;
      }
      if (a.write && a.begin < in_end && in_begin < a.end)
        check_fail("carry: " + op_name(s, i) + " writes device bytes " + bytes_text(std::max(a.begin, in_begin), std::min(a.end, in_end)) +
                   " of the input buffer, which holds the user's carry 0");
      if (a.write && a.begin < out_end && out_begin < a.end && !(s.ops[i].kind == op_kind::forward && s.ops[i].layer == last))
        check_fail("carry: " + op_name(s, i) + " writes device bytes " + bytes_text(std::max(a.begin, out_begin), std::min(a.end, out_end)) +
                   " of the output buffer, which only the last layer's forward writes (the user reads it after the step)");
      mine.push_back(&a);
    }
    std::sort(mine.begin(), mine.end(), [](auto x, auto y) { return x->begin < y->begin; });
    for (std::size_t k = 1; k < mine.size(); ++k)
      if (mine[k - 1]->end > mine[k]->begin)
        check_fail("carry: " + op_name(s, i) + " touches " + slot_label(s, mine[k - 1]->layer, mine[k - 1]->slot) + " and " +
                   slot_label(s, mine[k]->layer, mine[k]->slot) + " at overlapping device bytes " +
                   bytes_text(mine[k]->begin, std::min(mine[k - 1]->end, mine[k]->end)));
  }
}

}  // namespace tide::detail
