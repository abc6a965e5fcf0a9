// The checker: it proves programs complete (every layer's forward and backward once, a recompute
// exactly where a slot is rematerialized, every offloaded slot copied out and back), rejects
// malformed tables and hostile offsets without reading out of bounds or wrapping, scales to
// large programs, and agrees with the quadratic reference algorithm it replaced.
#include <gtest/gtest.h>

#include <tide/tide.hpp>
// The checker's passes, tested one by one (their own headers: separate compilation hides them).
#include <tide/core/detail/check_layout.hpp>
#include <tide/core/detail/check_peaks.hpp>
#include <tide/core/detail/check_races.hpp>
#include <tide/core/detail/check_structure.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace tide;

namespace {

// ---- helpers -------------------------------------------------------------------------------

std::string check_error(schedule const& s) {
  try {
    check_schedule(s);
  } catch (schedule_error const& e) {
    return e.what();
  }
  return "no error";
}

// Every substring must appear in the checker's message.
void expect_rejected(schedule const& s, std::vector<std::string> const& parts) {
  auto const m = check_error(s);
  EXPECT_EQ(m.rfind("tide::check_schedule: ", 0), 0u) << m;
  for (auto const& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "expected '" << p << "' in: " << m;
}

std::uint32_t find_op(schedule const& s, op_kind kind, std::uint32_t layer, std::uint32_t chunk = 0) {
  for (std::uint32_t i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].kind == kind && s.ops[i].layer == layer && s.ops[i].chunk == chunk) return i;
  ADD_FAILURE() << "no " << to_string(kind) << " of layer " << layer;
  return 0;
}

// Rebuilds ops and waits, dropping op `victim` (and every wait on it) and renumbering the rest;
// with `insert`, adds `extra` at index `at` (its waits `deps` are indices of the old program).
void edit_program(schedule& s, std::int64_t victim, std::int64_t at = -1, op extra = {},
                  std::vector<std::uint32_t> const& deps = {}) {
  auto const old_ops = s.ops;
  auto const old_waits = s.waits;
  auto renumber = [&](std::uint32_t w) {
    std::int64_t r = w;
    if (victim >= 0 && w > victim) --r;
    if (at >= 0 && w >= at) ++r;
    return static_cast<std::uint32_t>(r);
  };
  s.ops.clear();
  s.waits.clear();
  auto push = [&](op o, std::vector<std::uint32_t> const& ws) {
    o.wait_begin = static_cast<std::uint32_t>(s.waits.size());
    for (auto w : ws)
      if (w != victim) s.waits.push_back(renumber(w));
    o.wait_count = static_cast<std::uint32_t>(s.waits.size()) - o.wait_begin;
    s.ops.push_back(o);
  };
  for (std::uint32_t i = 0; i <= old_ops.size(); ++i) {
    if (i == at) push(extra, deps);
    if (i == old_ops.size()) break;
    if (i == victim) continue;
    auto const& o = old_ops[i];
    push(o, std::vector<std::uint32_t>(old_waits.begin() + o.wait_begin, old_waits.begin() + o.wait_begin + o.wait_count));
  }
}
void erase_op(schedule& s, std::uint32_t victim) { edit_program(s, victim); }
void insert_op(schedule& s, std::uint32_t at, op o, std::vector<std::uint32_t> const& deps = {}) {
  o.event = -1;
  edit_program(s, -1, at, o, deps);
}

stack_spec dense4() {
  stack_spec s;
  s.independent_layers = true;  // no layer reads another's output
  return s.append(layer_spec{"dense", {{"a", 4096}, {"b", 8192}}}, 4);
}
policy_spec offload_a() { return {rule_spec{.where = placement::offload, .slots = {"a"}}}; }
policy_spec remat_b_offload_a() {
  return {rule_spec{.where = placement::remat, .slots = {"b"}, .first_layer = 1},
          rule_spec{.where = placement::offload, .slots = {"a"}}};
}
pipeline_spec const chunked{.prefetch_distance = 1, .chunk_bytes = 1024, .max_offloads_in_flight = 2};  // a (4096 bytes) goes in 4 chunks

}  // namespace

// ---- real schedules pass -----------------------------------------------------------------------

TEST(CheckComplete, RealSchedulesOfSeveralPoliciesPass) {
  std::vector<policy_spec> const policies = {
      {},  // keep everything
      offload_a(),
      {rule_spec{.where = placement::offload}},
      {rule_spec{.where = placement::remat, .slots = {"b"}}},
      remat_b_offload_a(),
  };
  int n = 0;
  for (auto const& p : policies)
    for (bool hide : {true, false})
      for (std::size_t chunk : {std::size_t{0}, std::size_t{1000}, std::size_t{4096}})
        for (bool share : {true, false})
          for (collective_spec c : {collective_spec{}, collective_spec{.before_forward = true, .after_backward = true},
                                    collective_spec{.before_forward = true, .before_backward = true, .after_backward = true},
                                    collective_spec{.before_backward = true}}) {
            auto const s = build_schedule(
                dense4(), {.policy = p,
                           .buffers = {.guard_bytes = chunk == 1000 ? std::size_t{64} : std::size_t{0}, .share_phase_regions = share},
                           .pipeline = {.latency_hiding = hide, .prefetch_distance = 2, .chunk_bytes = chunk, .max_offloads_in_flight = 2},
                           .collectives = c});
            EXPECT_EQ(check_error(s), "no error") << describe(s);
            ++n;
          }
  EXPECT_EQ(n, 5 * 2 * 3 * 2 * 4);
}

// ---- completeness --------------------------------------------------------------------------------

TEST(CheckComplete, MissingBackwardIsRejected) {
  auto s = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  ASSERT_EQ(check_error(s), "no error");
  erase_op(s, find_op(s, op_kind::backward, 1));
  expect_rejected(s, {"completeness: layer 1 has no backward op"});
}

TEST(CheckComplete, BackwardRunTwiceIsRejected) {
  // The last op, layer 0's backward, again with the same waits: every byte access is still
  // ordered and reads the right data, but the gradient would be accumulated twice.
  auto s = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  auto const b = find_op(s, op_kind::backward, 0);
  ASSERT_EQ(b + 1, s.ops.size());
  auto const w = s.ops[b];
  insert_op(s, b + 1, w, std::vector<std::uint32_t>(s.waits.begin() + w.wait_begin, s.waits.begin() + w.wait_begin + w.wait_count));
  expect_rejected(s, {"completeness: layer 0 has two backward ops", "op #" + std::to_string(b) + " (backward L0",
                      "op #" + std::to_string(b + 1) + " (backward L0"});
}

TEST(CheckComplete, ForwardRunTwiceOrMissingIsRejected) {
  auto const keep = build_schedule(dense4(), {.pipeline = chunked});
  auto twice = keep;
  auto const f = find_op(twice, op_kind::forward, 0);
  insert_op(twice, f + 1, twice.ops[f]);
  expect_rejected(twice, {"completeness: layer 0 has two forward ops"});
  auto missing = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  erase_op(missing, find_op(missing, op_kind::forward, 3));
  expect_rejected(missing, {"completeness: layer 3 has no forward op"});
}

TEST(CheckComplete, BackwardBeforeItsForwardIsRejected) {
  auto s = build_schedule(dense4(), {.pipeline = chunked});  // keep-all: only compute ops
  auto const b = find_op(s, op_kind::backward, 3);
  auto moved = s.ops[b];
  erase_op(s, b);
  insert_op(s, 0, moved);  // the last layer's backward first of all
  expect_rejected(s, {"ordering: op #0 (backward L3", "is not ordered after", "(forward L3",
                      "a layer's backward follows its forward"});
}

TEST(CheckComplete, LayersOutOfOrderAreRejected) {
  auto s = build_schedule(dense4(), {.pipeline = chunked});
  std::swap(s.ops[find_op(s, op_kind::forward, 1)].layer, s.ops[find_op(s, op_kind::forward, 2)].layer);
  expect_rejected(s, {"ordering:", "forwards run in layer order"});
}

TEST(CheckComplete, MissingRecomputeIsRejected) {
  auto s = build_schedule(dense4(), {.policy = remat_b_offload_a(), .pipeline = chunked});
  ASSERT_EQ(check_error(s), "no error");
  erase_op(s, find_op(s, op_kind::recompute, 2));
  expect_rejected(s, {"completeness: layer 2 has remat slot 'b' but no recompute op"});
  // Only layer 2 recomputes, and its forward scratch is its recompute scratch: without the
  // recompute its backward finds the forward's bytes, but the program would not rematerialize.
  auto alone = build_schedule(dense4(), {.policy = {rule_spec{.where = placement::remat, .slots = {"b"}, .first_layer = 2, .last_layer = 3}},
                                        .pipeline = chunked});
  auto const& b2 = alone.slots[alone.layers[2].first_slot + 1];
  ASSERT_EQ(b2.forward_offset, b2.backward_offset);
  erase_op(alone, find_op(alone, op_kind::recompute, 2));
  expect_rejected(alone, {"completeness: layer 2 has remat slot 'b' but no recompute op"});
}

TEST(CheckComplete, StrayOrDuplicateRecomputeIsRejected) {
  auto const base = build_schedule(dense4(), {.policy = remat_b_offload_a(), .pipeline = chunked});
  auto stray = base;
  auto const b0 = find_op(stray, op_kind::backward, 0);  // layer 0 keeps b: nothing to recompute
  op r{op_kind::recompute, stream_role::compute, no_slot, 0};
  insert_op(stray, b0, r);
  expect_rejected(stray, {"completeness: op #" + std::to_string(b0) + " (recompute L0",
                          "recomputes a layer that has no remat slot"});
  auto twice = base;
  auto const r3 = find_op(twice, op_kind::recompute, 3);
  insert_op(twice, r3 + 1, twice.ops[r3]);
  expect_rejected(twice, {"completeness: layer 3 has two recompute ops"});
}

TEST(CheckComplete, RecomputeOutOfPlaceIsRejected) {
  auto s = build_schedule(dense4(), {.policy = {rule_spec{.where = placement::remat, .slots = {"b"}}}, .pipeline = chunked});
  auto const r = find_op(s, op_kind::recompute, 1);
  auto moved = s.ops[r];
  erase_op(s, r);
  insert_op(s, 0, moved);  // before the forward it recomputes
  expect_rejected(s, {"ordering: op #0 (recompute L1", "a recompute follows its layer's forward"});
  auto late = build_schedule(dense4(), {.policy = {rule_spec{.where = placement::remat, .slots = {"b"}}}, .pipeline = chunked});
  auto const r1 = find_op(late, op_kind::recompute, 1);
  auto const b1 = find_op(late, op_kind::backward, 1);
  ASSERT_LT(r1, b1);
  std::swap(late.ops[r1].kind, late.ops[b1].kind);  // backward, then its recompute
  expect_rejected(late, {"ordering:", "a layer's backward follows its recompute"});
}

TEST(CheckComplete, MissingPrefetchIsReportedClearly) {
  auto s = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  for (std::uint32_t c = 4; c-- > 0;) erase_op(s, find_op(s, op_kind::prefetch, 1, c));
  expect_rejected(s, {"completeness: slot 'a' of layer 1 is offloaded but never prefetched"});

  // Even where the backward would find the forward's bytes still in place (one offloaded layer,
  // source and staging buffer at the same address), the prefetch is required: the executor's
  // debug checks count it, and poison the source after the offload.
  auto one = build_schedule(dense4(), {.policy = {rule_spec{.where = placement::offload, .slots = {"a"}, .first_layer = 3}},
                                       .pipeline = {.prefetch_distance = 1, .max_offloads_in_flight = 2}});
  ASSERT_EQ(check_error(one), "no error");
  auto const& a3 = one.slots[one.layers[3].first_slot];
  ASSERT_EQ(a3.forward_offset, a3.backward_offset);
  erase_op(one, find_op(one, op_kind::prefetch, 3));
  expect_rejected(one, {"slot 'a' of layer 3 is offloaded but never prefetched"});

  auto chunk = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  erase_op(chunk, find_op(chunk, op_kind::prefetch, 2, 2));
  expect_rejected(chunk, {"completeness: slot 'a' of layer 2 has no prefetch op for chunk 2"});
}

TEST(CheckComplete, MissingOrDuplicatedOffloadChunkIsRejected) {
  auto const base = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  auto gone = base;
  for (std::uint32_t c = 4; c-- > 0;) erase_op(gone, find_op(gone, op_kind::offload, 0, c));
  expect_rejected(gone, {"slot 'a' of layer 0 is offloaded but never offloaded"});
  auto twice = base;
  auto const o = find_op(twice, op_kind::offload, 1, 3);
  insert_op(twice, o + 1, twice.ops[o], {find_op(twice, op_kind::forward, 1)});
  expect_rejected(twice, {"slot 'a' of layer 1 has two offload ops for chunk 3"});
  auto wrong_count = base;
  wrong_count.ops[find_op(wrong_count, op_kind::offload, 1, 3)].chunks = 5;
  expect_rejected(wrong_count, {"disagree on the offload chunk count of slot 'a' of layer 1"});
}

TEST(CheckComplete, CollectivesAreRequiredWhereTheScheduleAsksForThem) {
  auto s = build_schedule(dense4(), {.policy = offload_a(),
                                     .pipeline = chunked,
                                     .collectives = {.before_forward = true, .after_backward = true}});
  ASSERT_EQ(check_error(s), "no error");
  auto no_gather = s;
  erase_op(no_gather, find_op(no_gather, op_kind::gather, 2));
  expect_rejected(no_gather, {"completeness: layer 2 has no gather op"});
  auto no_reduce = s;
  erase_op(no_reduce, find_op(no_reduce, op_kind::reduce, 0));
  expect_rejected(no_reduce, {"completeness: layer 0 has no reduce op"});
  auto unasked = s;
  unasked.collectives = {};
  expect_rejected(unasked, {"gathers though the schedule's collectives do not"});

  auto r = build_schedule(dense4(), {.policy = remat_b_offload_a(),
                                     .pipeline = chunked,
                                     .collectives = {.before_forward = true, .before_backward = true, .after_backward = true}});
  ASSERT_EQ(check_error(r), "no error");
  auto no_regather = r;
  erase_op(no_regather, find_op(no_regather, op_kind::regather, 1));
  expect_rejected(no_regather, {"completeness: layer 1 has no regather op"});
  auto unasked_regather = r;
  unasked_regather.collectives.before_backward = false;
  expect_rejected(unasked_regather, {"regathers though the schedule's collectives do not"});
  // Regathers of layers 0 and 1 swapped: layer 1's is then not ordered before its recompute and
  // backward, which would read weights not gathered yet.
  auto late = r;
  auto const rg = find_op(late, op_kind::regather, 0);
  std::swap(late.ops[rg].layer, late.ops[find_op(late, op_kind::regather, 1)].layer);
  expect_rejected(late, {"follows its regather"});
  auto no_kind = r;
  no_kind.ops[rg].kind = static_cast<op_kind>(op_kind_count);
  expect_rejected(no_kind, {"has no valid kind"});
}

// ---- malformed tables and hostile offsets ------------------------------------------------------------

TEST(CheckMalformed, BindingSlotRangeOutsideTheTableIsRejected) {
  auto const base = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  auto past = base;
  past.layers[3].slot_count = 3;  // slots [6, 9) of 8
  expect_rejected(past, {"binding: layer 3's slots [6, 9) lie outside the 8 slot bindings"});
  auto far = base;
  far.layers[1].first_slot = std::numeric_limits<std::uint32_t>::max();  // no 32-bit wrap either
  expect_rejected(far, {"binding: layer 1's slots [4294967295, 4294967297) lie outside"});
  auto shared = base;
  shared.layers[2].first_slot = 2;  // layer 1's bindings
  expect_rejected(shared, {"binding: layers 1 and 2 share slot binding 2"});
  auto overlap = base;
  overlap.slots[1].forward_offset = overlap.slots[0].forward_offset + 256;  // b of layer 0 over a
  overlap.slots[1].backward_offset = overlap.slots[1].forward_offset;
  expect_rejected(overlap, {"binding: slot", "of layer 0 and slot", "overlap in the device arena"});
  auto huge = base;
  huge.slots[5].backward_offset = std::numeric_limits<std::size_t>::max() - 100;
  expect_rejected(huge, {"binding: the backward range of slot 'b' of layer 2 overflows size_t"});
  auto empty = base;
  empty.slots[3].bytes = 0;
  expect_rejected(empty, {"binding: slot 'b' of layer 1 has zero bytes"});
}

TEST(CheckMalformed, OpIndicesOutOfRangeAreRejected) {
  auto const base = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  auto layer = base;
  layer.ops[0].layer = 4;
  expect_rejected(layer, {"structure: op #0 names layer 4 beyond the 4-layer stack"});
  auto slot = base;
  auto const o = find_op(slot, op_kind::offload, 0);
  slot.ops[o].slot = 2;
  expect_rejected(slot, {"structure: op #" + std::to_string(o) + " names slot 2 which layer 0 does not have"});
  auto waits = base;
  auto const b = find_op(waits, op_kind::backward, 0);
  waits.ops[b].wait_begin = static_cast<std::uint32_t>(waits.waits.size());
  waits.ops[b].wait_count = 1;
  expect_rejected(waits, {"structure: op #" + std::to_string(b), "has waits", "beyond the"});
  auto kept = base;
  kept.ops[o].slot = 1;  // b is kept: nothing to copy
  expect_rejected(kept, {"copies a slot that is neither offloaded nor spilled (keep)"});
  auto chunk = base;
  chunk.ops[o].chunk = 4;
  expect_rejected(chunk, {"claims chunk 4 of 4"});
  auto event = base;
  event.ops[b].event = static_cast<std::int32_t>(event.event_count);
  expect_rejected(event, {"records event"});
}

TEST(CheckMalformed, CopyRangesAreInsideTheirSlotAndDoNotWrap) {
  auto const base = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  auto const p = find_op(base, op_kind::prefetch, 1, 3);
  auto device = base;
  device.ops[p].device_offset = std::numeric_limits<std::size_t>::max() - 512;  // + 1024 bytes wraps
  expect_rejected(device, {"structure: op #" + std::to_string(p), "its device range overflows size_t"});
  auto host = base;
  host.ops[p].host_offset = std::numeric_limits<std::size_t>::max();
  expect_rejected(host, {"its host range overflows size_t"});
  auto guard = base;
  guard.buffers.guard_bytes = 64;
  guard.ops[p].device_offset = std::numeric_limits<std::size_t>::max() - 1024 - 32;  // fits, guard does not
  expect_rejected(guard, {"overflows size_t"});
  auto longer = base;
  longer.ops[p].bytes = 2048;  // chunk 3 of 4096 bytes: [3072, 5120)
  expect_rejected(longer, {"copies bytes [3072, 5120) of a slot of 4096 bytes"});
  auto zero = base;
  zero.ops[p].bytes = 0;
  expect_rejected(zero, {"copies no bytes"});
  auto far_chunk = base;
  far_chunk.ops[p].chunks = std::numeric_limits<std::uint32_t>::max();
  far_chunk.ops[p].chunk = far_chunk.ops[p].chunks - 1;
  expect_rejected(far_chunk, {"structure: op #" + std::to_string(p), "of a slot of 4096 bytes"});
  // An in-range but wrong offset: the copy is not where its slot's bindings place the chunk
  // (caught by data flow or race before copy geometry was checked).
  auto moved = base;
  moved.ops[p].device_offset = moved.ops[find_op(moved, op_kind::prefetch, 2, 3)].device_offset;
  expect_rejected(moved, {"copy geometry: op #" + std::to_string(p) + " (prefetch L1 a 4/4 on h2d)"});
}

TEST(CheckMalformed, DataFlowAndRaceFailuresNameTheirInvariant) {
  auto s = build_schedule(dense4(), {.policy = offload_a(), .pipeline = chunked});
  // Layer 1's backward reads its kept slot b 1 KiB past where its forward wrote it: ordered, but
  // the wrong bytes of the slot (the same edit on a copy's offset now fails copy geometry).
  auto wrong = s;
  auto& b1 = wrong.slots[wrong.layers[1].first_slot + 1];
  ASSERT_EQ(b1.where, placement::keep);
  ASSERT_EQ(b1.forward_offset, b1.backward_offset);
  b1.backward_offset += 1024;
  expect_rejected(wrong, {"data flow: op #" + std::to_string(find_op(wrong, op_kind::backward, 1)),
                          "left other bytes of this slot there"});
  auto copy = s;
  auto const p1 = find_op(copy, op_kind::prefetch, 1, 1);
  copy.ops[p1].host_offset = copy.ops[find_op(copy, op_kind::prefetch, 1, 0)].host_offset;
  expect_rejected(copy, {"copy geometry: op #" + std::to_string(p1)});
  // Layer 0's backward no longer waits for its prefetch.
  auto racy = s;
  auto const b0 = find_op(racy, op_kind::backward, 0);
  racy.ops[b0].wait_count = 0;
  expect_rejected(racy, {"race:", "(backward L0", "nothing orders them"});
}

// ---- what the fuzzer found (tests/fuzz/regressions) -----------------------------------------------

namespace {
// Drops `op`'s wait on `on` (it must have one).
void drop_wait(schedule& s, std::uint32_t op, std::uint32_t on) {
  auto& o = s.ops[op];
  auto const first = s.waits.begin() + o.wait_begin, last = first + o.wait_count;
  auto const it = std::find(first, last, on);
  ASSERT_NE(it, last) << "op #" << op << " does not wait on op #" << on;
  std::iter_swap(it, last - 1);
  --o.wait_count;
}
}  // namespace

// edit_forward_races_offload_of_its_source_accepted: one offload source buffer for every layer;
// forward(3) writes 1-byte slots at offsets 0 and 1 of the 229 bytes that offload(2) still reads.
// The sweep's tree lost the reads of a range when it pushed a write and those reads down together.
TEST(CheckFuzzFindings, WriteRacingAnEarlierUnorderedReadIsRejected) {
  layer_spec const small{"t1", {{"input", 1}, {"c", 1}}};
  layer_spec const big{"t0", {{"f", 229}}};
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append(small, 2).append(big).append(small, 2);
  auto s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}},
                              .buffers = {.device_alignment = 1, .host_alignment = 256},
                              .pipeline = {.prefetch_distance = 0, .max_offloads_in_flight = 1}});
  ASSERT_EQ(check_error(s), "no error");
  auto const f2 = s.slots[s.layers[2].first_slot];
  ASSERT_EQ(f2.forward_offset, s.slots[s.layers[3].first_slot].forward_offset);  // one source buffer
  auto const fwd3 = find_op(s, op_kind::forward, 3), off2 = find_op(s, op_kind::offload, 2);
  drop_wait(s, fwd3, off2);
  expect_rejected(s, {"race: op #" + std::to_string(off2) + " (offload L2 f on d2h)",
                      "op #" + std::to_string(fwd3) + " (forward L3", "nothing orders them"});
}

// The tree itself: a range written, then read as a whole; a later query of part of it must still
// see the read (pushing the write's and the read's tags down together lost it).
TEST(CheckFuzzFindings, ByteStateTreeKeepsReadsPushedDownWithTheirWrite) {
  detail::byte_state_tree t(3);  // e.g. bytes [0, 1), [1, 2), [2, 229)
  t.write(0, 3, 7, 0, 42);
  t.read(0, 3, 8, 1);
  for (std::size_t leaf = 0; leaf < 3; ++leaf) {
    auto const q = t.query(leaf, leaf + 1);
    EXPECT_EQ(q.writer[0], 7) << leaf;
    EXPECT_EQ(q.reader[1], 8) << leaf;
    EXPECT_EQ(q.data_lo, 42) << leaf;
  }
  t.read(1, 2, 9, 2);  // a partial update pushes the tags down too
  EXPECT_EQ(t.query(0, 1).reader[1], 8);
  EXPECT_EQ(t.query(0, 3).reader[2], 9);
  t.write(0, 1, 10, 3, 43);  // a new write ends the reads of its bytes only
  EXPECT_EQ(t.query(0, 1).reader[1], -1);
  EXPECT_EQ(t.query(1, 3).reader[1], 8);
}

// edit_overlapping_offload_chunk_poisoned_by_debug_checks: an offload chunk copies 8 bytes past
// its chunk. Every read was of the slot's own bytes and ordered, but the executor's debug checks
// poison each offload chunk's source once copied: copies must tile their slot exactly.
TEST(CheckFuzzFindings, CopyOutsideItsChunkIsRejected) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append(layer_spec{"t0", {{"a", 256}}});
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"a"}}},
                                    .pipeline = {.latency_hiding = false,
                                                 .prefetch_distance = 3,
                                                 .chunk_bytes = 46,
                                                 .max_offloads_in_flight = 0}});
  ASSERT_EQ(check_error(s), "no error");
  auto const o0 = find_op(s, op_kind::offload, 0, 0);
  ASSERT_EQ(s.ops[o0].chunks, 6u);
  auto longer = s;
  longer.ops[o0].bytes = 54;
  expect_rejected(longer, {"copy geometry: op #" + std::to_string(o0) + " (offload L0 a 1/6",
                           "copies device [0, 54) to host [0, 54), but bytes [0, 46) of slot 'a' of layer 0 lie at "
                           "device [0, 46) (its forward offset)",
                           "poison"});
  // Every field of the tiling: where a chunk starts, on either side, how many chunks there are.
  auto const p5 = find_op(s, op_kind::prefetch, 0, 5);
  auto shorter = s;
  shorter.ops[p5].bytes -= 1;
  expect_rejected(shorter, {"copy geometry: op #" + std::to_string(p5), "bytes [230, 256) of slot 'a'"});
  auto device = s;
  device.ops[p5].device_offset += 2;
  expect_rejected(device, {"copy geometry: op #" + std::to_string(p5), "(its backward offset)"});
  auto host = s;
  host.ops[find_op(host, op_kind::offload, 0, 3)].host_offset -= 1;
  expect_rejected(host, {"copy geometry:", "(offload L0 a 4/6"});
  // One copy of the whole slot is a tiling too; five chunks of 46 bytes are not.
  auto whole = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"a"}}},
                                   .pipeline = {.latency_hiding = false, .prefetch_distance = 3, .max_offloads_in_flight = 0}});
  whole.pipeline.chunk_bytes = 46;
  EXPECT_EQ(check_error(whole), "no error");
  auto five = s;
  erase_op(five, find_op(five, op_kind::prefetch, 0, 5));
  erase_op(five, find_op(five, op_kind::offload, 0, 5));
  for (auto& o : five.ops)
    if (is_copy(o.kind)) o.chunks = 5;
  expect_rejected(five, {"copy geometry:", "is one of 5 chunks, but slot 'a' of layer 0 (256 bytes) goes in 6 chunks"});
}

// edit_recompute_slot_moved_into_guard_bytes_accepted: a remat slot's recompute region moved into
// the guard bytes the executor writes after another remat slot of the same layer.
TEST(CheckFuzzFindings, SlotMovedIntoGuardBytesIsRejected) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append(layer_spec{"t0", {{"b", 100}, {"a", 4096}}}, 4);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat}}, .buffers = {.guard_bytes = 512}});
  ASSERT_EQ(check_error(s), "no error");
  auto const& b2 = s.slots[s.layers[2].first_slot];
  auto moved = s;
  moved.slots[s.layers[2].first_slot + 1].backward_offset = b2.backward_offset + b2.bytes + 256;
  expect_rejected(moved, {"guard: the 512 guard bytes", "after slot 'b' of layer 2 overlap slot 'a'",
                          "backward offsets: the executor's debug checks write guard bytes after every remat slot"});
  // Forward regions carry a guard after every slot, whatever its placement.
  auto fwd = s;
  fwd.slots[s.layers[1].first_slot + 1].forward_offset = s.slots[s.layers[1].first_slot].forward_offset + 100 + 511;
  expect_rejected(fwd, {"guard: the 512 guard bytes", "after slot 'b' of layer 1 overlap slot 'a'", "forward offsets"});
  // Without guard bytes the same bindings are fine as far as guards go.
  auto unguarded = moved;
  unguarded.buffers.guard_bytes = 0;
  EXPECT_EQ(check_error(unguarded).find("guard"), std::string::npos) << check_error(unguarded);
}

// Guard writes are accesses of their op: a forward's guard bytes over another layer's live data
// clobber it (the executor writes them with debug checks on), which the sweep reports.
TEST(CheckFuzzFindings, GuardBytesOverLiveDataAreRejected) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append(layer_spec{"t0", {{"a", 64}, {"b", 64}}}, 3);
  // Each 64-byte slot takes a 256-byte region: 64 of data, 64 of guard.
  auto s = build_schedule(st, {.buffers = {.guard_bytes = 64}});
  ASSERT_EQ(check_error(s), "no error");
  // Layer 0's slot a moved into the guard bytes after layer 1's slot a.
  auto const& a1 = s.slots[s.layers[1].first_slot];
  auto& a0 = s.slots[s.layers[0].first_slot];
  a0.forward_offset = a0.backward_offset = a1.forward_offset + 64;
  expect_rejected(s, {"data flow: op #" + std::to_string(find_op(s, op_kind::backward, 0)),
                      "the last op to write them before it, op #" + std::to_string(find_op(s, op_kind::forward, 1)) +
                          " (forward L1",
                      "left the guard bytes after slot 'a' of layer 1 (written by the executor's debug checks"});
}

// ---- scale ---------------------------------------------------------------------------------------

// 126 layers x 8 slots of 2 MiB, 7 offloaded in 64 KiB chunks: ~57k ops reusing the same ring
// buffer regions, the program a debug executor checks on construction (timing: the benchmark
// check_schedule in bench/schedule_bench.cpp).
TEST(CheckScale, FiftySevenThousandOpsAreChecked) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"block", {{"layer_input", 2 << 20}, {"q_proj", 2 << 20}, {"k_proj", 2 << 20}, {"v_proj", 2 << 20},
                       {"attn_out", 2 << 20}, {"mlp_up", 2 << 20}, {"mlp_act", 2 << 20}, {"mlp_out", 2 << 20}}},
            126);
  policy_spec const most{rule_spec{.where = placement::offload,
                                   .slots = {"q_proj", "k_proj", "v_proj", "attn_out", "mlp_up", "mlp_act", "mlp_out"}}};
  auto const s = build_schedule(st, {.policy = most,
                                     .buffers = {.staging_buffers = 3},
                                     .pipeline = {.prefetch_distance = 2, .chunk_bytes = 64 << 10, .max_offloads_in_flight = 2}});
  ASSERT_GT(s.ops.size(), 56000u);
  auto const r = check_schedule(s);
  EXPECT_EQ(r.replayed_device_bytes, s.peak_device_bytes());
  EXPECT_GT(r.conflicting_pairs, s.ops.size());
  // A broken one of that size is still rejected.
  auto broken = s;
  broken.ops[find_op(broken, op_kind::backward, 60)].wait_count = 0;
  EXPECT_NE(check_error(broken), "no error");
}

// ---- the quadratic reference -----------------------------------------------------------------------

namespace {

std::size_t covered_length(std::vector<std::pair<std::size_t, std::size_t>>& spans, std::size_t lo, std::size_t hi) {
  std::sort(spans.begin(), spans.end());
  std::size_t total = 0, until = lo;
  for (auto [b, e] : spans) {
    b = std::max(b, until);
    e = std::min(e, hi);
    if (b < e) total += e - b, until = e;
  }
  return total;
}

// The checker's race and data-flow passes as they were before they became a sweep: every pair of
// overlapping accesses, and for each read every writer of its bytes. Returns whether it accepts.
bool quadratic_races_and_data_flow(detail::checked_program const& p) {
  auto acc = p.accesses;
  auto before = [&](std::uint32_t a, std::uint32_t b) { return p.before(a, b); };
  std::sort(acc.begin(), acc.end(), [](auto const& x, auto const& y) {
    return x.host != y.host ? x.host < y.host : x.begin < y.begin;
  });
  for (std::size_t i = 0; i < acc.size(); ++i)
    for (std::size_t j = i + 1; j < acc.size() && acc[j].host == acc[i].host && acc[j].begin < acc[i].end; ++j) {
      auto const& x = acc[i];
      auto const& y = acc[j];
      if (x.op == y.op || !(x.write || y.write)) continue;
      if (!before(x.op, y.op) && !before(y.op, x.op)) return false;
    }
  std::vector<detail::access const*> writers;
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  for (auto const& r : acc) {
    if (r.write) continue;
    writers.clear();
    spans.clear();
    for (auto const& w : acc)
      if (w.write && w.host == r.host && w.begin < r.end && r.begin < w.end && w.same_data(r)) {
        if (before(r.op, w.op)) continue;
        if (!before(w.op, r.op)) return false;
        writers.push_back(&w);
        spans.push_back({w.begin, w.end});
      }
    if (covered_length(spans, r.begin, r.end) < r.end - r.begin) return false;
    for (auto const& x : acc) {
      if (!x.write || x.host != r.host || !(x.begin < r.end && r.begin < x.end)) continue;
      if (x.same_data(r)) continue;
      if (before(r.op, x.op)) continue;
      auto const lo = std::max(x.begin, r.begin), hi = std::min(x.end, r.end);
      spans.clear();
      for (auto const* w : writers)
        if (before(x.op, w->op)) spans.push_back({w->begin, w->end});
      if (covered_length(spans, lo, hi) < hi - lo) return false;
    }
  }
  return true;
}

enum class verdict { structure, access, pass };  // rejected before the sweep, by it, or accepted

// The reference: the same structural passes, then the quadratic algorithm. `old_rules`: as the
// checker was before copy geometry and guards were checked (no `check_layout`, no guard writes
// among the accesses); otherwise today's rules, where the quadratic algorithm must agree with the
// sweep exactly.
verdict reference_verdict(schedule const& s, bool old_rules) {
  detail::checked_program p;
  try {
    p = detail::check_program(s);
    if (!old_rules) detail::check_layout(s);
    check_report r;
    detail::replay_peaks(s, p, r);
  } catch (schedule_error const&) {
    return verdict::structure;
  }
  if (old_rules) std::erase_if(p.accesses, [](detail::access const& a) { return a.guard; });
  return quadratic_races_and_data_flow(p) ? verdict::pass : verdict::access;
}

// The invariants added with copy geometry and guards: the only reasons today's checker may
// reject a program the old rules accepted.
bool new_invariant(std::string const& m) {
  return m.find("tide::check_schedule: copy geometry: ") == 0 || m.find("tide::check_schedule: guard: ") == 0 ||
         ((m.find("tide::check_schedule: race: ") == 0 || m.find("tide::check_schedule: data flow: ") == 0) &&
          m.find("the guard bytes after slot") != std::string::npos);
}

struct composer {
  std::mt19937_64 rng;
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); }
  bool coin() { return pick(2) == 1; }

  // A random stack, policy, buffers and pipeline; nullopt-like false when the builder refuses it.
  bool compose(schedule& out) {
    static constexpr std::string_view slot_names[] = {"s0", "s1", "s2", "s3"};
    static constexpr std::string_view type_names[] = {"t0", "t1", "t2"};
    stack_spec st;
    st.independent_layers = true;  // no layer reads another's output
    auto const types = 1 + pick(3);
    auto const layers = 2 + pick(5);
    std::vector<layer_spec> specs;
    for (std::size_t t = 0; t < types; ++t) {
      layer_spec l{type_names[t], {}};
      // Often tiny slots (with byte alignments below): ranges that start and end inside others,
      // as in the program where the fuzzer found the sweep losing reads.
      bool const tiny = coin();
      for (std::size_t k = 0, n = 1 + pick(4); k < n; ++k)
        l.slots.push_back({slot_names[k], tiny ? 1 + pick(300) : 100 + pick(6000)});
      specs.push_back(l);
    }
    for (std::size_t l = 0; l < layers; ++l) st.append(specs[pick(types)]);
    policy_spec p;
    for (std::size_t r = 0, n = pick(4); r < n; ++r) {
      rule_spec rule{.where = static_cast<placement>(pick(3))};
      for (auto name : slot_names)
        if (pick(3) == 0) rule.slots.push_back(name);
      rule.first_layer = static_cast<std::uint32_t>(pick(layers));
      if (coin()) rule.last_layer = rule.first_layer.value + 1 + static_cast<std::uint32_t>(pick(layers));
      if (pick(4) == 0) rule.min_bytes = pick(4000);
      p.rules.push_back(rule);
    }
    buffer_spec b;
    b.staging_buffers = static_cast<std::uint32_t>(1 + pick(3));
    b.share_phase_regions = coin();
    b.guard_bytes = coin() ? 0 : 64;
    if (coin()) b.device_alignment = pick(2) == 0 ? 1 : 8;
    std::size_t const chunks[] = {0, 1000, 2048};
    // Named in the order the generator draws them (the seed's programs depend on it).
    bool const hide = coin();
    auto const distance = static_cast<std::uint32_t>(pick(layers));
    auto const chunk = chunks[pick(3)];
    auto const in_flight = static_cast<std::uint32_t>(1 + pick(3));
    pipeline_spec pl{.latency_hiding = hide, .prefetch_distance = distance, .chunk_bytes = chunk, .max_offloads_in_flight = in_flight};
    bool const gather = pick(4) == 0;
    bool const reduce = pick(4) == 0;
    // Regathers with both (no draw of their own: the seed's programs stay what they were).
    collective_spec c{.before_forward = gather, .before_backward = gather && reduce, .after_backward = reduce};
    try {
      out = build_schedule(st, {.policy = p, .buffers = b, .pipeline = pl, .collectives = c});
    } catch (schedule_error const&) {
      return false;  // e.g. a rule that decides nothing
    }
    return true;
  }

  std::uint32_t random_copy(schedule const& s) {
    std::vector<std::uint32_t> copies;
    for (std::uint32_t i = 0; i < s.ops.size(); ++i)
      if (is_copy(s.ops[i].kind)) copies.push_back(i);
    return copies.empty() ? static_cast<std::uint32_t>(pick(s.ops.size())) : copies[pick(copies.size())];
  }

  // One random edit that keeps indices in range, so most edited programs reach the sweep.
  void mutate(schedule& s) {
    switch (pick(9)) {
      case 0:
      case 1: {  // drop a wait
        if (s.waits.empty()) return;
        auto const w = pick(s.waits.size());
        for (auto& o : s.ops)
          if (o.wait_begin <= w && w < std::size_t{o.wait_begin} + o.wait_count) --o.wait_count;
        s.waits.erase(s.waits.begin() + static_cast<std::ptrdiff_t>(w));
        for (auto& o : s.ops)
          if (o.wait_begin > w) --o.wait_begin;
        return;
      }
      case 2: {  // a wait on another earlier op that records an event
        if (s.waits.empty()) return;
        auto const w = pick(s.waits.size());
        std::uint32_t owner = 0;
        for (std::uint32_t i = 0; i < s.ops.size(); ++i)
          if (s.ops[i].wait_begin <= w && w < std::size_t{s.ops[i].wait_begin} + s.ops[i].wait_count) owner = i;
        std::vector<std::uint32_t> candidates;
        for (std::uint32_t i = 0; i < owner; ++i)
          if (s.ops[i].event >= 0) candidates.push_back(i);
        if (!candidates.empty()) s.waits[w] = candidates[pick(candidates.size())];
        return;
      }
      case 3: {  // a copy's device range moved onto another copy's
        auto const a = random_copy(s), b = random_copy(s);
        s.ops[a].device_offset = s.ops[b].device_offset;
        return;
      }
      case 4: {  // two copies swap host ranges
        auto const a = random_copy(s), b = random_copy(s);
        std::swap(s.ops[a].host_offset, s.ops[b].host_offset);
        return;
      }
      case 5: {  // a copy moved to another stream (its waits stay)
        auto const a = random_copy(s);
        s.ops[a].stream = static_cast<stream_role>(pick(stream_count));
        return;
      }
      case 6: {  // two slots swap backward offsets (staging or scratch addresses)
        auto const a = pick(s.slots.size()), b = pick(s.slots.size());
        std::swap(s.slots[a].backward_offset, s.slots[b].backward_offset);
        return;
      }
      case 7: {  // a copy a few bytes longer or shorter, as the fuzzer edits them
        auto& o = s.ops[random_copy(s)];
        if (is_copy(o.kind)) o.bytes = coin() ? o.bytes + 1 + pick(64) : o.bytes - std::min(o.bytes - 1, 1 + pick(64));
        return;
      }
      case 8: {  // a slot's forward or backward region a little earlier or later (into guard bytes)
        auto& b = s.slots[pick(s.slots.size())];
        auto& at = coin() ? b.forward_offset : b.backward_offset;
        auto const d = 1 + pick(128);
        at = coin() || at < d ? at + d : at - d;
        return;
      }
    }
  }
};

}  // namespace

// Two references. Under today's rules (copy geometry, guards among the accesses) the quadratic
// algorithm and the sweep agree exactly. Under the old rules the checker is strictly stricter:
// whatever the old rules reject it rejects too, and every extra rejection is one of the new
// invariants (copy geometry, guard regions, or a race or data flow on guard bytes).
TEST(CheckOracle, SweepAgreesWithTheQuadraticReference) {
  composer gen{std::mt19937_64{20240611}};
  int counts[3] = {0, 0, 0};  // old rules
  int now[3] = {0, 0, 0};     // today's rules
  int stricter = 0;
  int programs = 0;
  while (programs < 2500) {
    schedule s;
    if (!gen.compose(s)) continue;
    ++programs;
    ASSERT_EQ(check_error(s), "no error") << describe(s);  // built programs pass both
    ASSERT_EQ(reference_verdict(s, true), verdict::pass);
    ASSERT_EQ(reference_verdict(s, false), verdict::pass);
    for (std::size_t m = 0, n = 1 + gen.pick(3); m < n; ++m) gen.mutate(s);
    auto const old_want = reference_verdict(s, true);
    auto const want = reference_verdict(s, false);
    ++counts[static_cast<int>(old_want)];
    ++now[static_cast<int>(want)];
    auto const got = check_error(s);
    bool const sweep = got.find("race: ") != std::string::npos || got.find("data flow: ") != std::string::npos;
    // Today's rules: the same verdict, and the sweep's failures are the reference's.
    if (want == verdict::pass) {
      ASSERT_EQ(got, "no error") << "the reference accepts this program\n" << describe(s);
    } else {
      ASSERT_NE(got, "no error") << "the reference rejects this program\n" << describe(s);
      EXPECT_EQ(want == verdict::access, sweep) << got << "\n" << describe(s);
    }
    // The old rules: rejected there, rejected here; accepted there, rejected here only by a new invariant.
    if (old_want != verdict::pass) {
      ASSERT_NE(got, "no error") << "the old rules reject this program\n" << describe(s);
      if (old_want == verdict::access) {
        EXPECT_TRUE(sweep || new_invariant(got)) << got;
      }
    } else if (got != "no error") {
      ++stricter;
      EXPECT_TRUE(new_invariant(got)) << "rejected, though the old rules accept it, by: " << got << "\n" << describe(s);
    }
  }
  // The edits must exercise the sweep both ways, not only the structural passes.
  EXPECT_GT(counts[static_cast<int>(verdict::access)], 300) << counts[0] << " " << counts[1] << " " << counts[2];
  EXPECT_GT(counts[static_cast<int>(verdict::pass)], 300) << counts[0] << " " << counts[1] << " " << counts[2];
  EXPECT_GT(now[static_cast<int>(verdict::access)], 150) << now[0] << " " << now[1] << " " << now[2];
  EXPECT_GT(now[static_cast<int>(verdict::pass)], 300) << now[0] << " " << now[1] << " " << now[2];
  std::printf("old rules: %d structural, %d race or data flow, %d pass; today's rules: %d, %d, %d (%d stricter)\n",
              counts[0], counts[1], counts[2], now[0], now[1], now[2], stricter);
}
