#pragma once
//! \file
//! The checker's stage passes (core/check.hpp): a stage schedule's boundary sends and receives
//! where they belong, its passes in its stage order, each unit's (micro-batch's; interleaved,
//! (chunk, micro-batch) pair's) boundaries ordered around its forward and backward, groups of
//! transfers posted together whole. Its races and data flow are the general sweep's (each unit's
//! layers are schedule layers of their own, so a slot of one is never taken for another's).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

//! Most boundary transfers posted together: a round's two sends and the next round's two receives.
inline constexpr std::uint16_t max_boundary_group = 4;

//! Send or receive op `i` (kind proven): a stage's, on the communication stream, moving a whole
//! carry or boundary gradient inside `size_t`.
inline void check_boundary_op(schedule_view const& s, std::uint32_t i) {
  auto const& o = s.ops[i];
  auto const what = [&] { return "boundary: op #" + std::to_string(i) + " (" + std::string(to_string(o.kind)) + " L" + std::to_string(o.layer) + ")"; };
  if (!s.stage.present()) check_fail(what() + " is a boundary transfer, but the schedule is no stage's (schedule_view::stage)");
  if (!s.carry.present()) check_fail(what() + " moves a boundary tensor, but the schedule has no carry");
  if (o.slot != carry_slot && o.slot != gradient_slot)
    check_fail(what() + " names slot " + std::to_string(o.slot) + ": a boundary transfer moves the carry or its gradient");
  if (o.stream != stream_role::comm)
    check_fail(what() + " runs on the " + std::string(to_string(o.stream)) + " stream: boundary transfers run on the comm stream");
  if (o.bytes != s.carry.bytes)
    check_fail(what() + " moves " + std::to_string(o.bytes) + " bytes, not the whole carry (" + std::to_string(s.carry.bytes) + ")");
  auto const end = add_or_fail(o.device_offset, o.bytes, [&] { return what() + ": its device range"; });
  add_or_fail(end, s.buffers.guard_bytes, [&] { return what() + ": its device range plus guard"; });
  if (o.chunks == 0 || o.chunks > max_boundary_group || o.chunk >= o.chunks)
    check_fail(what() + " claims place " + std::to_string(o.chunk) + " of " + std::to_string(o.chunks) +
               ": a boundary transfer is alone (1) or one of a group of at most 4 posted together");
}

//! A stage schedule's tables (before any op is looked at: the carry and access passes index them).
inline void check_stage_tables(schedule_view const& s) {
  auto const& st = s.stage;
  auto const str = [](auto v) { return std::to_string(v); };
  if (auto const why = stage_spec_problem(st.spec); !why.empty()) check_fail("stage: " + std::string(why));
  if (!s.carry.present()) check_fail("stage: a stage passes its carry to its neighbours, but the schedule has none");
  auto const M = st.spec.micro_batches, L = st.layers, V = st.spec.virtual_stages, U = st.spec.units();
  if (std::uint64_t{M} * L != s.layers.size())
    check_fail("stage: " + str(s.layers.size()) + " schedule layers are not " + str(M) + " micro-batches of " + str(L) + " layers");
  if (V == 1 ? !st.chunk_first.empty() : st.chunk_first.size() != V + std::size_t{1})
    check_fail("stage: the chunk table has " + str(st.chunk_first.size()) + " entries for " + str(V) +
               " chunks: none for one chunk, else one per chunk and one more");
  for (std::size_t c = 0; c < st.chunk_first.size(); ++c)
    if ((c == 0 && st.chunk_first[c] != 0) || (c + 1 == st.chunk_first.size() && st.chunk_first[c] != L) ||
        (c > 0 && st.chunk_first[c] <= st.chunk_first[c - 1]))
      check_fail("stage: the chunk table's entry " + str(c) + " (" + str(st.chunk_first[c]) +
                 ") does not split the stage's layers into non-empty chunks from 0 to " + str(L));
  if (st.instance_of.size() != U || st.recompute_carry.size() != U || st.gradient.size() != U)
    check_fail("stage: the instance, recompute and gradient tables have " + str(st.instance_of.size()) + ", " +
               str(st.recompute_carry.size()) + " and " + str(st.gradient.size()) + " entries, not one per unit (" + str(U) + ")");
  for (std::uint32_t u = 0; u < U; ++u) {
    if (st.instance_of[u] >= st.instances)
      check_fail("stage: " + unit_name(st, u) + " has instance region " + str(st.instance_of[u]) + " of only " + str(st.instances));
    auto const end = add_or_fail(st.gradient[u], s.carry.bytes, [&] { return "stage: " + unit_name(st, u) + "'s boundary gradient"; });
    add_or_fail(end, s.buffers.guard_bytes, [&] { return "stage: " + unit_name(st, u) + "'s boundary gradient plus guard"; });
  }
}

//! A stage schedule's own invariants (structure, clocks and completeness proven; `fwd` and `bwd`
//! give each schedule layer's forward and backward).
inline void check_stage_program(schedule_view const& s, checked_program const& p, std::vector<std::uint32_t> const& fwd,
                                std::vector<std::uint32_t> const& bwd) {
  auto const& st = s.stage;
  auto const str = [](auto v) { return std::to_string(v); };
  auto const M = st.spec.micro_batches, L = st.layers, V = st.spec.virtual_stages, U = st.spec.units();
  auto const last_stage = st.spec.stage + 1 == st.spec.stages;
  // Unit u's first and last schedule layers.
  auto const first_of = [&](std::uint32_t u) { return (u % M) * L + st.chunk_begin(u / M); };
  auto const last_of = [&](std::uint32_t u) { return (u % M) * L + st.chunk_end(u / M) - 1; };
  auto const ends_model = [&](std::uint32_t u) { return last_stage && u / M + 1 == V; };

  // The passes run in the stage order on the compute stream.
  std::uint32_t prev = std::numeric_limits<std::uint32_t>::max();
  for (std::uint32_t k = 0; k < 2 * U; ++k) {
    auto const e = stage_step_at(st.spec, k);
    auto const u = stage_unit(st.spec, e.chunk, e.micro_batch);
    auto const first = e.pass == stage_pass::forward ? fwd[first_of(u)] : bwd[last_of(u)];
    auto const last = e.pass == stage_pass::forward ? fwd[last_of(u)] : bwd[first_of(u)];
    if (prev != std::numeric_limits<std::uint32_t>::max() && !p.before(prev, first))
      check_fail("stage: " + op_name(s, first) + " is not ordered after " + op_name(s, prev) + ": the stage order (" +
                 std::string(to_string(st.spec.order)) + ") runs the " + std::string(e.pass == stage_pass::forward ? "forward" : "backward") +
                 " of " + unit_name(st, u) + " there");
    prev = last;
  }

  // Boundaries: one of each where it belongs, ordered around the forward and backward; a group's
  // members consecutive on the comm stream, none but its last waited for.
  constexpr auto absent = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> seen(4 * std::size_t{U}, absent);  // per unit: recv act, send act, recv grad, send grad
  std::uint32_t prev_comm = absent;
  std::vector<std::uint32_t> members;  // the open group's transfers so far
  auto const open = [&](std::uint32_t j) {  // op j is a boundary transfer with members after it
    return j != absent && is_boundary(s.ops[j].kind) && s.ops[j].chunks >= 2 && s.ops[j].chunk + 1 < s.ops[j].chunks;
  };
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    if (o.stream == stream_role::comm && open(prev_comm) &&
        !(is_boundary(o.kind) && o.chunks == s.ops[prev_comm].chunks && o.chunk == s.ops[prev_comm].chunk + 1))
      check_fail("boundary: " + op_name(s, prev_comm) + " is place " + str(s.ops[prev_comm].chunk) + " of a group of " +
                 str(s.ops[prev_comm].chunks) + ", but the next op on the comm stream, " + op_name(s, i) +
                 ", is not the group's next transfer");
    if (!is_boundary(o.kind)) {
      if (o.stream == stream_role::comm) prev_comm = i;
      continue;
    }
    if (o.chunks >= 2) {
      if (o.chunk + 1 < o.chunks && o.event >= 0)
        check_fail("boundary: " + op_name(s, i) + " is place " + str(o.chunk) + " of a group of " + str(o.chunks) +
                   " but records an event: it is posted, not completed, when it returns, so nothing may wait on it "
                   "(wait on the group's last transfer, which completes them all)");
      if (o.chunk > 0 && !open(prev_comm))
        check_fail("boundary: " + op_name(s, i) + " is place " + str(o.chunk) + " of a group, but the op before it on the comm "
                   "stream opens none");
    }
    // A group's transfers are in flight together: none may write bytes another reads or writes.
    if (o.chunks < 2 || o.chunk == 0) members.clear();
    for (auto j : members) {
      auto const& x = s.ops[j];
      if ((x.kind == op_kind::receive || o.kind == op_kind::receive) && x.device_offset < o.device_offset + o.bytes &&
          o.device_offset < x.device_offset + x.bytes)
        check_fail("boundary: " + op_name(s, j) + " and " + op_name(s, i) + " are posted together (one group) but touch the same "
                   "device bytes, one of them writing: a group's transfers run at once");
    }
    if (o.chunks >= 2) members.push_back(i);
    prev_comm = i;
    auto const u = st.unit_of(o.layer);
    bool const grad = o.slot == gradient_slot, send = o.kind == op_kind::send;
    auto const want = (grad == send) ? first_of(u) : last_of(u);
    if (o.layer != want)
      check_fail("boundary: " + op_name(s, i) + " names layer " + str(st.layer_of(o.layer)) + " of " + unit_name(st, u) + ": a " +
                 std::string(to_string(o.kind)) + " of the " + (grad ? "gradient" : "boundary tensor") + " belongs to layer " +
                 str(st.layer_of(want)));
    if (ends_model(u) && (grad != send))
      check_fail("boundary: " + op_name(s, i) + " is a " + std::string(to_string(o.kind)) + " of the " +
                 (grad ? "output's gradient" : "output") + " of the model's last layers, whose turn consumes the output and "
                 "seeds its gradient");
    if (grad && o.device_offset != st.gradient_at(u))
      check_fail("boundary: " + op_name(s, i) + " moves device bytes at " + str(o.device_offset) + ", not " + unit_name(st, u) +
                 "'s boundary gradient (at " + str(st.gradient_at(u)) + "), which its backwards update");
    auto& at = seen[4 * std::size_t{u} + (grad ? 2 : 0) + (send ? 1 : 0)];
    if (at != absent) check_fail("completeness: " + op_name(s, at) + " and " + op_name(s, i) + " move the same boundary twice");
    at = i;
  }
  if (open(prev_comm))
    check_fail("boundary: " + op_name(s, prev_comm) + " is place " + str(s.ops[prev_comm].chunk) + " of a group of " +
               str(s.ops[prev_comm].chunks) + ", but the program ends before the group does");
  auto const ordered = [&](std::uint32_t a, std::uint32_t b, char const* what) {
    if (!p.before(a, b)) check_fail("ordering: " + op_name(s, b) + " is not ordered after " + op_name(s, a) + " (" + what + ")");
  };
  for (std::uint32_t u = 0; u < U; ++u) {
    auto const* q = &seen[4 * std::size_t{u}];
    auto const missing = [&](char const* what) { check_fail("completeness: " + unit_name(st, u) + " has no " + what + " op"); };
    if (q[0] == absent) missing("receive of its input");
    if (q[3] == absent) missing("send of its input's gradient");
    if (!ends_model(u) && q[1] == absent) missing("send of its output");
    if (!ends_model(u) && q[2] == absent) missing("receive of its output's gradient");
    ordered(q[0], fwd[first_of(u)], "a unit's first forward reads the input it received");
    ordered(bwd[first_of(u)], q[3], "the input's gradient is sent after the unit's first layer's backward");
    if (!ends_model(u)) {
      ordered(fwd[last_of(u)], q[1], "the output is sent after the unit's last forward");
      ordered(q[2], bwd[last_of(u)], "the output's gradient is received before the unit's last layer's backward");
    }
  }
}

}  // namespace tide::detail
