#pragma once
//! \file
//! The checker's stage passes (core/check.hpp): a stage schedule's boundary sends and receives
//! where they belong, its passes in its stage order, each micro-batch's boundaries ordered around
//! its forward and backward. Its races and data flow are the general sweep's (each micro-batch's
//! layers are schedule layers of their own, so a slot of one is never taken for another's).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <tide/core/detail/check_common.hpp>
#include <tide/core/schedule.hpp>

namespace tide::detail {

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
  if (o.chunks == 0 || o.chunks > 2 || o.chunk >= o.chunks)
    check_fail(what() + " claims place " + std::to_string(o.chunk) + " of " + std::to_string(o.chunks) +
               ": a boundary transfer is alone (1) or one of a send and receive pair (2)");
}

//! A stage schedule's tables (before any op is looked at: the carry and access passes index them).
inline void check_stage_tables(schedule_view const& s) {
  auto const& st = s.stage;
  auto const str = [](auto v) { return std::to_string(v); };
  if (auto const why = stage_spec_problem(st.spec); !why.empty()) check_fail("stage: " + std::string(why));
  if (!s.carry.present()) check_fail("stage: a stage passes its carry to its neighbours, but the schedule has none");
  auto const M = st.spec.micro_batches, L = st.layers;
  if (std::uint64_t{M} * L != s.layers.size())
    check_fail("stage: " + str(s.layers.size()) + " schedule layers are not " + str(M) + " micro-batches of " + str(L) + " layers");
  if (st.instance_of.size() != M || st.recompute_carry.size() != M || st.gradient.size() != M)
    check_fail("stage: the instance, recompute and gradient tables have " + str(st.instance_of.size()) + ", " +
               str(st.recompute_carry.size()) + " and " + str(st.gradient.size()) + " entries, not one per micro-batch (" +
               str(M) + ")");
  for (std::uint32_t m = 0; m < M; ++m) {
    if (st.instance_of[m] >= st.instances)
      check_fail("stage: micro-batch " + str(m) + " has instance region " + str(st.instance_of[m]) + " of only " + str(st.instances));
    auto const end = add_or_fail(st.gradient[m], s.carry.bytes, [&] { return "stage: micro-batch " + str(m) + "'s boundary gradient"; });
    add_or_fail(end, s.buffers.guard_bytes, [&] { return "stage: micro-batch " + str(m) + "'s boundary gradient plus guard"; });
  }
}

//! A stage schedule's own invariants (structure, clocks and completeness proven; `fwd` and `bwd`
//! give each schedule layer's forward and backward).
inline void check_stage_program(schedule_view const& s, checked_program const& p, std::vector<std::uint32_t> const& fwd,
                                std::vector<std::uint32_t> const& bwd) {
  auto const& st = s.stage;
  auto const str = [](auto v) { return std::to_string(v); };
  auto const M = st.spec.micro_batches, L = st.layers;
  auto const last_stage = st.spec.stage + 1 == st.spec.stages;

  // The passes run in the stage order on the compute stream.
  std::uint32_t prev = std::numeric_limits<std::uint32_t>::max();
  for (std::uint32_t k = 0; k < 2 * M; ++k) {
    auto const e = stage_step_at(st.spec, k);
    auto const base = e.micro_batch * L;
    auto const first = e.pass == stage_pass::forward ? fwd[base] : bwd[base + L - 1];
    auto const last = e.pass == stage_pass::forward ? fwd[base + L - 1] : bwd[base];
    if (prev != std::numeric_limits<std::uint32_t>::max() && !p.before(prev, first))
      check_fail("stage: " + op_name(s, first) + " is not ordered after " + op_name(s, prev) + ": the stage order (" +
                 std::string(to_string(st.spec.order)) + ") runs the " + std::string(e.pass == stage_pass::forward ? "forward" : "backward") +
                 " of micro-batch " + str(e.micro_batch) + " there");
    prev = last;
  }

  // Boundaries: one of each where it belongs, ordered around the forward and backward; a pair's
  // send right before its receive on the comm stream, waited for by nothing.
  constexpr auto absent = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> seen(4 * std::size_t{M}, absent);  // per micro-batch: recv act, send act, recv grad, send grad
  std::uint32_t prev_comm = absent;
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    if (o.stream == stream_role::comm && prev_comm != absent && s.ops[prev_comm].chunks == 2 && s.ops[prev_comm].chunk == 0 &&
        is_boundary(s.ops[prev_comm].kind) && !(is_boundary(o.kind) && o.kind == op_kind::receive && o.chunks == 2 && o.chunk == 1))
      check_fail("boundary: " + op_name(s, prev_comm) + " is the first of a pair, but the next op on the comm stream, " +
                 op_name(s, i) + ", is not the receive that completes it");
    if (!is_boundary(o.kind)) {
      if (o.stream == stream_role::comm) prev_comm = i;
      continue;
    }
    if (o.chunks == 2) {
      if (o.chunk == 0 && o.kind != op_kind::send) check_fail("boundary: " + op_name(s, i) + " opens a pair but is no send");
      if (o.chunk == 0 && o.event >= 0)
        check_fail("boundary: " + op_name(s, i) + " opens a pair but records an event: it is posted, not completed, when it "
                   "returns, so nothing may wait on it (wait on the receive that completes the pair)");
      if (o.chunk == 1 && !(prev_comm != absent && is_boundary(s.ops[prev_comm].kind) && s.ops[prev_comm].chunks == 2 &&
                            s.ops[prev_comm].chunk == 0))
        check_fail("boundary: " + op_name(s, i) + " closes a pair, but the op before it on the comm stream is no send opening one");
    }
    prev_comm = i;
    auto const m = st.micro_batch_of(o.layer), l = st.layer_of(o.layer);
    bool const grad = o.slot == gradient_slot, send = o.kind == op_kind::send;
    auto const want_layer = (grad == send) ? 0u : L - 1;
    if (l != want_layer)
      check_fail("boundary: " + op_name(s, i) + " names layer " + str(l) + " of micro-batch " + str(m) + ": a " +
                 std::string(to_string(o.kind)) + " of the " + (grad ? "gradient" : "boundary tensor") + " belongs to layer " +
                 str(want_layer));
    if (last_stage && (grad != send))
      check_fail("boundary: " + op_name(s, i) + " is a " + std::string(to_string(o.kind)) + " of the " +
                 (grad ? "output's gradient" : "output") + " on the last stage, whose turn consumes its output and seeds its gradient");
    if (grad && o.device_offset != st.gradient_at(m))
      check_fail("boundary: " + op_name(s, i) + " moves device bytes at " + str(o.device_offset) + ", not micro-batch " + str(m) +
                 "'s boundary gradient (at " + str(st.gradient_at(m)) + "), which its backwards update");
    auto& at = seen[4 * std::size_t{m} + (grad ? 2 : 0) + (send ? 1 : 0)];
    if (at != absent) check_fail("completeness: " + op_name(s, at) + " and " + op_name(s, i) + " move the same boundary twice");
    at = i;
  }
  auto const ordered = [&](std::uint32_t a, std::uint32_t b, char const* what) {
    if (!p.before(a, b)) check_fail("ordering: " + op_name(s, b) + " is not ordered after " + op_name(s, a) + " (" + what + ")");
  };
  for (std::uint32_t m = 0; m < M; ++m) {
    auto const base = m * L;
    auto const* q = &seen[4 * std::size_t{m}];
    auto const missing = [&](char const* what) {
      check_fail("completeness: micro-batch " + str(m) + " has no " + what + " op");
    };
    if (q[0] == absent) missing("receive of its input");
    if (q[3] == absent) missing("send of its input's gradient");
    if (!last_stage && q[1] == absent) missing("send of its output");
    if (!last_stage && q[2] == absent) missing("receive of its output's gradient");
    ordered(q[0], fwd[base], "a micro-batch's first forward reads the input it received");
    ordered(bwd[base], q[3], "the input's gradient is sent after the micro-batch's first layer's backward");
    if (!last_stage) {
      ordered(fwd[base + L - 1], q[1], "the output is sent after the micro-batch's last forward");
      ordered(q[2], bwd[base + L - 1], "the output's gradient is received before the micro-batch's last layer's backward");
    }
  }
}

}  // namespace tide::detail
