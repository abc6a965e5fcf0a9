// The step contract per mode (issue 39): what a forward, a recompute and an advance may read and
// write, enforced; and the turn, the named place between the last forward and the first backward.
// Each debug check has a test here that fails without it, on the chain workloads of workload.hpp.
#include <gtest/gtest.h>

#include <tide/tide.hpp>

#include <cstddef>
#include <chrono>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "workload.hpp"

using namespace tide;

namespace {

bool has(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }
template <class F>
std::string what_of(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

executor_options const checked{.debug_checks = true, .check_schedule = true};

// ---- the chain through a carry, its forward unchanged in every mode --------------------------

stack_spec carry_stack(std::uint32_t layers = 6) {
  stack_spec st;
  st.independent_layers = true;  // the carry is the layers' only data flow
  st.append({"a", {{"h", 4096}, {"act", 333}, {"w", 64}}}, layers / 2);
  st.append({"b", {{"h", 1000}, {"g", 2048}}}, layers - layers / 2);
  st.carry = {"x", 1000};
  return st;
}

//! The strategies every contract test runs: keep-all, full remat, offload, a mix, checkpointing.
std::vector<std::pair<std::string, strategy>> every_policy() {
  auto rule = [](placement p, std::vector<tide::name> slots = {}) { return rule_spec{.where = p, .slots = slots}; };
  return {
      {"keep-all", strategy{}},
      {"full remat", {.policy = {rule(placement::remat)}}},
      {"offload", {.policy = {rule(placement::offload)}}},
      {"mixed", {.policy = {rule(placement::remat, {"h"}), rule(placement::offload, {"act", "g"})}}},
      {"mixed, naive", {.policy = {rule(placement::remat, {"act", "g"}), rule(placement::offload, {"w"})},
                        .pipeline = {.latency_hiding = false}}},
      {"checkpointed remat", {.policy = {rule(placement::remat, {"h", "w"})}, .checkpoints = {.device_snapshots = 2}}},
      {"guarded mix", {.policy = {rule(placement::remat, {"h"}), rule(placement::offload, {"g"})}, .buffers = {.guard_bytes = 64}}},
  };
}

template <class Forward>
std::vector<std::uint64_t> run_carry(schedule const& s, Forward&& forward_of, executor_options o = checked, int steps = 2) {
  host_backend b;
  executor exec(b, s, o);
  workload::carry_chain w(s);
  std::vector<std::uint64_t> out;
  for (int i = 0; i < steps; ++i) {
    w.write_input(exec.carry_input());
    exec.step([&](auto const& c) { forward_of(w, c); }, [&](auto const& c) { w.backward(c); });
    w.update(out);
  }
  return out;
}

TEST(Contract, AnUnchangedForwardAsTheRecomputeMatchesKeepAllUnderEveryPolicy) {
  auto const st = carry_stack();
  auto const want = run_carry(build_schedule(st, strategy{}), [](auto& w, auto const& c) { w.forward(c); });
  for (auto const& [name, how] : every_policy()) {
    auto const s = build_schedule(st, how);
    // Writes every slot and the carry out in every mode, with no private buffer: lent scratch takes
    // what a recompute (or an advance) does not rebuild. Without it, carry_out() is empty in a
    // recompute (the workload throws) and the kept slots are overwritten.
    auto const got = run_carry(s, [](auto& w, auto const& c) { w.unchanged_forward(c); });
    EXPECT_EQ(got, want) << name << "\n" << describe(s);
  }
}

// The issue's probe: a recompute writing what it does not rebuild ("7 where backward expected 42")
// writes scratch, never the saved bytes; and the scratch is inside the predicted peak.
TEST(Contract, WhatARecomputeDoesNotRebuildIsLentScratchNeverTheSavedBytes) {
  auto const st = carry_stack();
  auto const want = run_carry(build_schedule(st, strategy{}), [](auto& w, auto const& c) { w.forward(c); });
  for (auto const& [name, how] : every_policy()) {
    auto const s = build_schedule(st, how);
    int lent = 0;
    auto probe = [&](auto& w, auto const& c) {
      w.forward(c);
      if (c.mode != forward_mode::recompute) return;
      for (std::uint16_t k = 0; k < c.slot_count(); ++k) {
        if (c.produces(k)) continue;
        auto const scratch = c.slot(k);
        auto const saved = c.saved(k);
        EXPECT_NE(static_cast<void const*>(scratch.data()), static_cast<void const*>(saved.data()));
        auto const at = static_cast<std::size_t>(scratch.data() - c.device);
        EXPECT_GE(at, s.arena.backward_area + s.arena.staging_ring_bytes);
        EXPECT_LE(at + scratch.size(), s.peak_device_bytes());
        std::memset(scratch.data(), 7, scratch.size());
        ++lent;
      }
      auto const out = c.carry_out();  // lent scratch too
      EXPECT_EQ(out.size(), st.carry.bytes);
      EXPECT_FALSE(c.produces_carry());
      std::memset(out.data(), 7, out.size());
    };
    EXPECT_EQ(run_carry(s, probe), want) << name;
    bool const partial = name == "mixed" || name == "mixed, naive" || name == "checkpointed remat" || name == "guarded mix";
    EXPECT_EQ(lent > 0, partial) << name;
  }
}

// The chain without a carry (its input is a slot): a recompute reads the saved input through
// saved(), as tests/workload.hpp's chain and examples/mlp do.
TEST(Contract, ARecomputeReadsWhatItDoesNotRebuildThroughSaved) {
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 1000}, {"act", 333}}}, 5);
  host_backend b;
  auto const keep = build_schedule(st, strategy{});
  auto const want = workload::run_chain(b, keep, 2, checked);
  for (auto const& p : {policy_spec{rule_spec{.where = placement::remat, .slots = {"h", "act"}}},
                        policy_spec{rule_spec{.where = placement::offload, .slots = {"input"}},
                                    rule_spec{.where = placement::remat, .slots = {"h"}}}}) {
    auto const s = build_schedule(st, {.policy = p});
    EXPECT_EQ(workload::run_chain(b, s, 2, checked), want) << describe(s);
  }
}

TEST(Contract, SavedIsRefusedByNameOutsideARecomputeAndForARebuiltSlot) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"blk", {{"x", 64}, {"y", 64}}}, 2);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"y"}}}});
  host_backend b;
  for (auto mode : {forward_mode::forward, forward_mode::recompute}) {
    executor exec(b, s, checked);
    auto const m = what_of([&] {
      exec.step(
          [&](auto const& c) {
            if (c.mode == forward_mode::forward) std::memset(c.slot(0).data(), 1, 64), std::memset(c.slot(1).data(), 1, 64);
            if (c.mode == forward_mode::recompute) std::memset(c.slot(1).data(), 1, 64);
            if (c.mode == mode) static_cast<void>(c.saved(1));  // y: forward, or rebuilt in this recompute
          },
          [](auto const&) {});
    });
    // The forward of layer 0 runs first; the first recompute is layer 1's (backward order).
    auto const layer = mode == forward_mode::forward ? "layer 0" : "layer 1";
    EXPECT_TRUE(has(m, layer + std::string(" (blk), slot 'y', ") + std::string(to_string(mode)) + " mode")) << m;
    EXPECT_TRUE(has(m, mode == forward_mode::forward ? "use slot()" : "write it through slot()")) << m;
  }
}

// A schedule written without the scratch fields (by hand, or before them): a recompute's slot()
// of what it does not rebuild, and its carry_out(), are refused by name rather than handing out
// the saved bytes or an empty span.
TEST(Contract, AScheduleWithoutRecomputeScratchRefusesTheAccessByName) {
  auto const st = carry_stack(4);
  auto s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"h"}}}});
  for (auto& b : s.slots) b.recompute_offset = slot_binding::no_scratch;
  s.arena.recompute_carry_offset = no_carry;
  for (bool carry : {false, true}) {
    auto const m = what_of([&] {
      run_carry(s, [&](auto& w, auto const& c) {
        w.forward(c);
        if (c.mode != forward_mode::recompute) return;
        if (carry) static_cast<void>(c.carry_out());
        else static_cast<void>(c.slot(1));  // "act" or "g": kept, not rebuilt
      }, {.debug_checks = true, .check_schedule = false}, 1);
    });
    EXPECT_TRUE(has(m, carry ? "layer 3 (b), recompute mode: the schedule lends no carry scratch"
                             : "layer 3 (b), slot 'g', recompute mode: the recompute does not rebuild this slot"))
        << m;
    EXPECT_TRUE(has(m, carry ? "ctx.produces_carry()" : "ctx.saved(k)")) << m;
  }
}

// buffer_spec::lend_recompute_scratch = false (a selective recompute's schedule): the peak is the
// lent scratch smaller, a selective recompute (saved() and produces()) is bitwise equal to the one
// with scratch, and an unchanged forward is refused by name, never handed the saved bytes.
TEST(Contract, WithoutLentScratchThePeakIsSmallerAndAnUnchangedForwardIsRefusedByName) {
  auto const st = carry_stack(4);
  strategy lend{.policy = {rule_spec{.where = placement::remat, .slots = {"h"}}}};
  auto no_lend = lend;
  no_lend.buffers.lend_recompute_scratch = false;
  auto const with = build_schedule(st, lend), without = build_schedule(st, no_lend);
  EXPECT_GT(with.arena.recompute_scratch_bytes, 0u);
  EXPECT_EQ(without.arena.recompute_scratch_bytes, 0u);
  EXPECT_LT(without.peak_device_bytes(), with.peak_device_bytes());
  static_assert(buffers<lend_recompute_scratch<false>>::spec().lend_recompute_scratch == false);
  auto selective = [](auto& w, auto const& c) { w.forward(c); };
  EXPECT_EQ(run_carry(without, selective), run_carry(with, selective));
  auto const m = what_of([&] {
    run_carry(without, [&](auto& w, auto const& c) {
      w.forward(c);
      if (c.mode == forward_mode::recompute) static_cast<void>(c.slot(1));  // an unchanged forward writes it
    }, {.debug_checks = true}, 1);
  });
  EXPECT_TRUE(has(m, "recompute mode: the recompute does not rebuild this slot")) << m;
}

// ---- the debug checks ------------------------------------------------------------------------

// A recompute that reads a slot it does not rebuild through slot() reads scratch: the rebuilt slot
// differs from the forward's, which the reproduction check names (layer, slot, mode, the fix).
TEST(DebugContract, ARecomputeReadingScratchInsteadOfSavedDataIsNamed) {
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 1000}}}, 3);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"h"}}}});
  host_backend b;
  std::vector<std::byte> batch(4096, std::byte{42});
  auto forward = [&](auto const& c) {
    if (c.mode == forward_mode::forward) std::memcpy(c.slot(0).data(), batch.data(), batch.size());
    auto const x = c.slot(0);  // the mistake: in a recompute this is scratch, not the saved input
    auto const h = c.slot(1);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = x[i] ^ std::byte{1};
  };
  executor exec(b, s, checked);
  auto const m = what_of([&] { exec.step(forward, [](auto const&) {}); });
  EXPECT_TRUE(has(m, "the recompute of layer 2 (blk)")) << m;
  EXPECT_TRUE(has(m, "recompute mode) rebuilt slot 'h'")) << m;
  EXPECT_TRUE(has(m, "read that with ctx.saved(k)")) << m;
  // Off, the same step runs (what the check protects against would go unseen).
  executor quiet(b, s, {.debug_checks = true, .check_reproduction = false});
  EXPECT_NO_THROW(quiet.step(forward, [](auto const&) {}));
}

// An advance that reads a slot through slot() (scratch in an advance) rebuilds a wrong carry.
TEST(DebugContract, AnAdvanceWhoseCarryDiffersFromTheForwardsIsNamed) {
  auto const st = carry_stack(6);
  auto const s = build_schedule(st, {.checkpoints = {.device_snapshots = 2}});
  ASSERT_GT(s.carry.advances, 0u);
  host_backend b;
  auto forward = [](auto const& c) {
    if (c.mode == forward_mode::forward) std::memset(c.slot(0).data(), 3, c.slot(0).size());
    // The mistake: the carry from a slot the advance never wrote (scratch), not from carry_in().
    if (c.produces_carry()) workload::derive(c.carry_out(), c.layer, std::span<std::byte const>(c.slot(0)));
  };
  executor exec(b, s, checked);
  auto const m = what_of([&] { exec.step(forward, [](auto const&) {}); });
  EXPECT_TRUE(has(m, "the advance of layer")) << m;
  EXPECT_TRUE(has(m, "advance mode) wrote a carry out ('x')")) << m;
  EXPECT_TRUE(has(m, "compute from ctx.carry_in()")) << m;
}

// Past the end of the scratch lent for a slot in a recompute or an advance: guard bytes catch it
// (the next region is another slot's scratch, or a carry a later backward reads).
TEST(DebugContract, WritingPastLentScratchIsNamedByModeAndSlot) {
  auto const st = carry_stack(6);
  for (auto mode : {forward_mode::recompute, forward_mode::advance}) {
    strategy how{.policy = {rule_spec{.where = placement::remat, .slots = {"h"}}}, .buffers = {.guard_bytes = 64}};
    if (mode == forward_mode::advance) how = {.buffers = {.guard_bytes = 64}, .checkpoints = {.device_snapshots = 2}};
    auto const s = build_schedule(st, how);
    auto const m = what_of([&] {
      run_carry(s, [&](auto& w, auto const& c) {
        w.unchanged_forward(c);
        if (c.mode == mode && c.layer == 1) {
          auto const g = c.slot(2);  // "w": kept, so a recompute's is lent scratch
          g.data()[g.size()] = std::byte{0};  // one byte past it: a guard byte
        }
      });
    });
    EXPECT_TRUE(has(m, "the " + std::string(to_string(mode)) + " lambda of layer 1 wrote past the end of slot 'w'")) << m;
    EXPECT_TRUE(has(m, "in the scratch tide lends for it in " + std::string(to_string(mode)) + " mode")) << m;
  }
}

// ---- the checked configuration (issue 53): every write outside the contract named -------------

//! The guide's checked configuration: every check on, and a schedule with guard bytes.
executor_options const all_checks = executor_options::checked();
strategy guarded(strategy s) {
  s.buffers.guard_bytes = 64;
  return s;
}
//! (policy, what the step throws) for each of every_policy()'s guarded schedules of carry_stack(),
//! trained under the checked configuration with `forward`.
template <class Forward>
std::vector<std::pair<std::string, std::string>> failures_under_every_policy(Forward forward) {
  std::vector<std::pair<std::string, std::string>> r;
  for (auto const& [name, how] : every_policy()) {
    auto const s = build_schedule(carry_stack(), guarded(how));
    r.emplace_back(name, what_of([&] { run_carry(s, forward, all_checks); }));
  }
  return r;
}

// No false alarm: under every policy, an unchanged forward that writes what it must passes every
// check (the forward runs twice, the input is poisoned after each step) with keep-all's gradients.
TEST(CheckedContract, AnUnchangedForwardPassesEveryCheckUnderEveryPolicy) {
  auto const st = carry_stack();
  auto const want = run_carry(build_schedule(st, strategy{}), [](auto& w, auto const& c) { w.forward(c); }, checked, 3);
  for (auto const& [name, how] : every_policy()) {
    auto const s = build_schedule(st, guarded(how));
    EXPECT_EQ(run_carry(s, [](auto& w, auto const& c) { w.unchanged_forward(c); }, all_checks, 3), want) << name;
  }
}

TEST(CheckedContract, GuardAndPoisonPatternsTheChecksCannotTellApartAreRefused) {
  auto const s = build_schedule(carry_stack(), guarded({}));
  host_backend b;
  auto const same = what_of([&] { executor exec(b, s, {.debug_checks = true, .guard_pattern = std::byte{0xDB}}); });
  EXPECT_TRUE(has(same, "guard_pattern is the poison pattern: the debug checks could not tell a guard byte from poison")) << same;
  auto o = all_checks;
  o.guard_pattern = ~o.poison_pattern;
  auto const complement = what_of([&] { executor exec(b, s, o); });
  EXPECT_TRUE(has(complement, "the poison pattern's complement (check_unwritten's second pattern)")) << complement;
  EXPECT_NO_THROW(executor(b, s, {.debug_checks = false, .guard_pattern = std::byte{0xDB}}));  // no checks, nothing to confuse
}

TEST(CheckedContract, AScheduleWithoutGuardBytesIsRefusedWhenTheyAreRequired) {
  auto const s = build_schedule(carry_stack(), strategy{});
  host_backend b;
  auto const m = what_of([&] { executor exec(b, s, all_checks); });
  EXPECT_TRUE(has(m, "require_guard_bytes is on, but the schedule has no guard bytes")) << m;
  EXPECT_TRUE(has(m, ".guard_bytes = 64")) << m;
}

// A slot declared too small: the forward writes past it, into the next slot; without guard bytes
// the step ran to other gradients.
TEST(CheckedContract, AWritePastASlotIsNamedByLayerSlotAndMode) {
  for (auto const& [name, m] : failures_under_every_policy([](auto& w, auto const& c) {
         w.unchanged_forward(c);
         if (c.mode == forward_mode::forward && c.layer == 4) c.slot(0).data()[c.slot(0).size() + 3] = std::byte{1};
       }))
    EXPECT_TRUE(has(m, "the forward lambda of layer 4 wrote past the end of slot 'h' (1000 bytes, layer type 'b'): guard byte 3"))
        << name << ": " << m;
}

TEST(CheckedContract, AWritePastTheCarryOutIsNamed) {
  for (auto const& [name, m] : failures_under_every_policy([](auto& w, auto const& c) {
         w.unchanged_forward(c);
         if (c.mode == forward_mode::forward && c.layer == 2) c.carry_out().data()[c.carry_out().size() + 7] = std::byte{1};
       })) {
    EXPECT_TRUE(has(m, "the forward lambda of layer 2 (a) (op #")) << name << ": " << m;
    EXPECT_TRUE(has(m, "wrote past the end of its carry out ('x', 1000 bytes): guard byte 7 was overwritten")) << name << ": " << m;
  }
  // The recompute's lent carry out is guarded too.
  auto const s = build_schedule(carry_stack(), guarded({.policy = {rule_spec{.where = placement::remat}}}));
  auto const m = what_of([&] {
    run_carry(s, [&](auto& w, auto const& c) {
      w.unchanged_forward(c);
      if (c.mode == forward_mode::recompute && c.layer == 1) c.carry_out().data()[c.carry_out().size()] = std::byte{1};
    }, all_checks);
  });
  EXPECT_TRUE(has(m, "the recompute lambda of layer 1 (a)")) << m;
  EXPECT_TRUE(has(m, "in the scratch tide lends for it in recompute mode): guard byte 0")) << m;
}

// One byte of 1,000 left unwritten passes "every byte still holds the poison"; two runs under two
// patterns find it. Without check_unwritten the same step trains on stale bytes, silently.
TEST(CheckedContract, APartlyWrittenCarryOutIsNamed) {
  auto const st = carry_stack();
  auto leave_one = [](auto& w, auto const& c) {
    auto const out = c.carry_out();
    auto const keep = out[500];
    w.unchanged_forward(c);
    if (c.layer == 3) out[500] = keep;  // byte 500 not written
  };
  for (auto const& [name, m] : failures_under_every_policy(leave_one)) {
    EXPECT_TRUE(has(m, "the forward of layer 3 (b) (op #")) << name << ": " << m;
    EXPECT_TRUE(has(m, "forward mode) left byte 500 of its carry out ('x', 1000 bytes) unwritten")) << name << ": " << m;
  }
  EXPECT_NO_THROW(run_carry(build_schedule(st, strategy{}), leave_one, checked));  // what the issue saw
}

// A kept slot partly written reaches the backward as whatever the buffer held: named too.
TEST(CheckedContract, APartlyWrittenSlotIsNamed) {
  auto const st = carry_stack();
  auto const s = build_schedule(st, guarded({.policy = {rule_spec{.where = placement::offload, .slots = {"g"}}}}));
  auto const m = what_of([&] {
    run_carry(s, [](auto& w, auto const& c) {
      auto const g = c.layer == 5 ? c.slot(1) : std::span<std::byte>{};
      std::vector<std::byte> before(g.begin(), g.end());
      w.unchanged_forward(c);
      if (!g.empty()) std::memcpy(g.data() + 2000, before.data() + 2000, 48);  // its last 48 bytes not written
    }, all_checks);
  });
  EXPECT_TRUE(has(m, "the forward of layer 5 (b)")) << m;
  EXPECT_TRUE(has(m, "left byte 2000 of slot 'g' (2048 bytes) unwritten")) << m;
}

// A rematerialized slot written by neither the forward nor the recompute reached the backward as
// poison: with check_unwritten the forward's two runs name it; one the recompute leaves unwritten
// holds the complement of the forward's poison there, so it is a mismatch, named with the byte.
TEST(CheckedContract, AnUnwrittenRebuiltSlotIsNamed) {
  auto const st = carry_stack();
  auto const s = build_schedule(st, guarded({.policy = {rule_spec{.where = placement::remat, .slots = {"act"}}}}));
  auto skip_act_in = [](forward_mode mode) {
    return [mode](auto& w, auto const& c) {
      auto const act = c.type_name == "a" && c.mode == mode ? c.slot(1) : std::span<std::byte>{};
      std::vector<std::byte> before(act.begin(), act.end());
      w.unchanged_forward(c);
      if (!act.empty()) std::memcpy(act.data() + 100, before.data() + 100, act.size() - 100);  // bytes 100.. not written
    };
  };
  auto const m = what_of([&] { run_carry(s, skip_act_in(forward_mode::recompute), all_checks); });
  EXPECT_TRUE(has(m, "the recompute of layer 2 (a)")) << m;
  EXPECT_TRUE(has(m, "recompute mode) rebuilt slot 'act' (333 bytes) differently")) << m;
  EXPECT_TRUE(has(m, "Byte 100 still holds the recompute's poison 0x24: likely left unwritten")) << m;
  auto const m2 = what_of([&] { run_carry(s, skip_act_in(forward_mode::forward), all_checks); });
  EXPECT_TRUE(has(m2, "the forward of layer 0 (a) (op #")) << m2;
  EXPECT_TRUE(has(m2, "left byte 100 of slot 'act' (333 bytes) unwritten: it held the poison pattern 0xDB after a first run and 0x24")) << m2;
}

TEST(CheckedContract, AStepWhoseInputWasNotWrittenIsRefused) {
  auto const s = build_schedule(carry_stack(), guarded({}));
  host_backend b;
  executor exec(b, s, all_checks);
  workload::carry_chain w(s);
  auto fwd = [&](auto const& c) { w.forward(c); };
  auto bwd = [&](auto const& c) { w.backward(c); };
  auto const m = what_of([&] { exec.step(fwd, bwd); });  // never written
  EXPECT_TRUE(has(m, "the stack's input ('x', 1000 bytes) was not written before this step")) << m;
  w.write_input(exec.carry_input());
  EXPECT_NO_THROW(exec.step(fwd, bwd));
  auto const again = what_of([&] { exec.step(fwd, bwd); });  // not written since
  EXPECT_TRUE(has(again, "was not written before this step")) << again;
  w.write_input(exec.carry_input());
  EXPECT_NO_THROW(exec.step(fwd, bwd));
}

// Names from strings that die before the stack, the strategy and the schedule are used (ASan:
// no use after free), equal to what was given, and interned (equal names share their bytes).
TEST(Names, SpecsAndSchedulesBuiltFromTemporaryStringsOwnTheirNames) {
  stack_spec st;
  strategy how;
  {
    std::vector<std::string> names;
    for (int i = 0; i < 3; ++i) names.push_back("slot_number_" + std::to_string(i) + std::string(40, 'x'));
    std::string const type = std::string("layer_type_") + std::string(40, 'y');
    st.append({type, {{names[0], 4096}, {names[1], 1000}, {names[2], 64}}}, 4);
    st.carry = {std::string("carry_") + std::string(40, 'z'), 1000};
    how.policy = {rule_spec{.where = placement::remat, .slots = {names[1]}}};
    how.buffers.guard_bytes = 64;
  }  // the strings are gone
  std::string const slot1 = "slot_number_1" + std::string(40, 'x');
  auto const s = build_schedule(st, how);
  ASSERT_EQ(s.slots.size(), 12u);
  EXPECT_EQ(s.slots[1].name, slot1);
  EXPECT_EQ(s.slots[1].where, placement::remat);
  EXPECT_EQ(s.layers[3].type_name, "layer_type_" + std::string(40, 'y'));
  EXPECT_EQ(s.carry.name, "carry_" + std::string(40, 'z'));
  EXPECT_EQ(tide::name(slot1).data(), s.slots[1].name.data());  // one copy per distinct name
  std::vector<std::string> seen;
  auto const got = run_carry(s, [&](auto& w, auto const& c) {
    w.unchanged_forward(c);
    if (c.mode == forward_mode::forward) seen.push_back(std::string(c.type_name) + "/" + std::string(c.bindings[2].name));
  }, checked);
  stack_spec plain;  // the same stack from literals: the same training
  plain.append({"layer_type_" + std::string(40, 'y'), {{"slot_number_0" + std::string(40, 'x'), 4096}, {slot1, 1000},
                                                       {"slot_number_2" + std::string(40, 'x'), 64}}}, 4);
  plain.carry = {"carry_" + std::string(40, 'z'), 1000};
  EXPECT_EQ(got, run_carry(build_schedule(plain, how), [](auto& w, auto const& c) { w.unchanged_forward(c); }, checked));
  ASSERT_EQ(seen.size(), 8u);  // 4 layers, 2 steps
  EXPECT_EQ(seen[0], "layer_type_" + std::string(40, 'y') + "/slot_number_2" + std::string(40, 'x'));
  // A compile-time stack's names view its literals (no table entry), as before.
  constexpr tide::name literal("q_proj");
  static_assert(literal.size() == 6);
}

// ---- the turn ---------------------------------------------------------------------------------

//! The carry chain with its loss moved from the last backward into the turn.
struct turned_chain : workload::carry_chain {
  explicit turned_chain(schedule_view s) : carry_chain(s) { seed_in_backward = false; }
  int turns = 0;
  template <class Ctx>
  void turn(Ctx const& c) {
    seed(c.output());
    ++turns;
  }
};

TEST(Turn, TheLossInTheTurnGivesTheGradientsOfTheLossInTheLastBackward) {
  auto const st = carry_stack();
  auto const want = run_carry(build_schedule(st, strategy{}), [](auto& w, auto const& c) { w.forward(c); });
  for (auto const& [name, how] : every_policy()) {
    auto const s = build_schedule(st, how);
    host_backend b;
    executor exec(b, s, checked);
    turned_chain w(s);
    std::vector<std::uint64_t> got;
    std::vector<std::string> order;
    for (int i = 0; i < 2; ++i) {
      w.write_input(exec.carry_input());
      order.clear();
      auto forward = [&](auto const& c) {
        w.forward(c);
        if (c.mode == forward_mode::forward) order.push_back("forward " + std::to_string(c.layer));
      };
      auto backward = [&](auto const& c) {
        order.push_back("backward " + std::to_string(c.layer));
        w.backward(c);  // seeds nothing: the turn did
      };
      exec.step(forward, backward, tide::turn{[&](turn_context<host_backend::stream_type> const& c) {
                  EXPECT_EQ(c.layer, s.layer_count() - 1);
                  EXPECT_EQ(c.output().size(), st.carry.bytes);
                  EXPECT_EQ(c.output().data(), exec.carry_output().data());
                  order.push_back("turn");
                  w.turn(c);
                }});
      w.update(got);
    }
    EXPECT_EQ(got, want) << name;
    EXPECT_EQ(w.turns, 2) << name;
    // After the last forward, before the first backward.
    auto const at = std::find(order.begin(), order.end(), "turn") - order.begin();
    ASSERT_LT(at, static_cast<long>(order.size())) << name;
    EXPECT_EQ(order[static_cast<std::size_t>(at) - 1], "forward " + std::to_string(s.layer_count() - 1)) << name;
    EXPECT_EQ(order[static_cast<std::size_t>(at) + 1], "backward " + std::to_string(s.layer_count() - 1)) << name;
  }
}

// Without a carry there is no output to read: the turn still runs once, in its place, with hooks.
TEST(Turn, RunsOncePerStepWithHooksByRefAndWithoutACarry) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"x", 256}}}, 4);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}, .collectives = {.after_backward = true}});
  host_backend b;
  executor exec(b, s, checked);
  struct counter {
    int calls = 0;
    void operator()(turn_context<host_backend::stream_type> const& c) {
      ++calls;
      EXPECT_TRUE(c.output().empty());
    }
  } turn_counter;
  int reduces = 0, backwards = 0, steps = 0;
  auto forward = [&](auto const& c) {
    std::memset(c.slot(0).data(), 1, c.slot(0).size());
    if (c.layer == 0) ++steps;
  };
  auto backward = [&](auto const&) {
    EXPECT_EQ(turn_counter.calls, steps);  // the turn ran before any backward of this step
    ++backwards;
  };
  exec.step(forward, backward, tide::turn{std::ref(turn_counter)}, hooks{.after_backward = [&](auto const&) { ++reduces; }});
  EXPECT_EQ(turn_counter.calls, 1);
  EXPECT_EQ(reduces, 4);
  EXPECT_EQ(backwards, 4);
  tide::turn const t{std::ref(turn_counter)};
  tide::hooks const h{.after_backward = [&](auto const&) { ++reduces; }};
  exec.enqueue(forward, backward, t, h);  // lvalues, as enqueue takes them
  exec.wait();
  EXPECT_EQ(turn_counter.calls, 2);
}

// A throwing turn fails the step with its own error, and no backward runs after it.
TEST(Turn, AThrowingTurnFailsTheStepAndTheNextStepRuns) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"x", 256}}}, 3);
  auto const s = build_schedule(st, strategy{});
  host_backend b;
  executor exec(b, s, checked);
  int backwards = 0;
  auto forward = [](auto const& c) { std::memset(c.slot(0).data(), 1, c.slot(0).size()); };
  auto backward = [&](auto const&) { ++backwards; };
  EXPECT_EQ(what_of([&] { exec.step(forward, backward, tide::turn{[](auto const&) { throw std::runtime_error("loss is NaN"); }}); }),
            "loss is NaN");
  EXPECT_EQ(backwards, 0);
  exec.step(forward, backward, tide::turn{[](auto const&) {}});
  EXPECT_EQ(backwards, 3);
}

// The sim calls no user code, the turn included; a step with one runs as a step without.
// The turn is its own interval in a host timeline, in the summary and in the Chrome trace; the
// last forward's interval no longer holds its time (issue 54: the turn was recorded as the last
// layer's forward).
TEST(Turn, IsItsOwnIntervalInTheTimelineSummaryAndTrace) {
  auto const st = carry_stack();
  auto const s = build_schedule(st, strategy{});
  host_backend b;
  timeline tl;
  executor exec(b, s, {.timeline = &tl});
  workload::carry_chain w(s);
  w.seed_in_backward = false;
  tide::turn const loss{[&](auto const& c) {
    w.seed(c.output());
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // a head the last forward must not absorb
  }};
  w.write_input(exec.carry_input());
  exec.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); }, loss);
  ASSERT_TRUE(tl.turn.has_value());
  EXPECT_GE(tl.turn->end_us - tl.turn->begin_us, 3000);
  bool found = false;
  for (auto const& sp : tl.ops)
    if (s.ops[sp.op].kind == op_kind::forward && s.ops[sp.op].layer + 1 == s.layer_count()) {
      found = true;
      EXPECT_LE(sp.end_us, tl.turn->begin_us);
      EXPECT_LT(sp.end_us - sp.begin_us, 3000) << "the last forward's interval holds the turn";
    }
  EXPECT_TRUE(found);
  for (auto const& sp : tl.ops) {
    if (s.ops[sp.op].kind == op_kind::backward) {
      EXPECT_GE(sp.begin_us, tl.turn->end_us);
    }
  }
  auto const sum = summarize(tl, s);
  EXPECT_DOUBLE_EQ(sum.turn_us, tl.turn->end_us - tl.turn->begin_us);
  EXPECT_GE(sum.compute_us, sum.forward_us + sum.backward_us + sum.turn_us - 1e-9);
  std::ostringstream trace;
  write_chrome_trace(trace, tl, s);
  EXPECT_NE(trace.str().find("{\"name\":\"turn\",\"cat\":\"turn\""), std::string::npos);
  // A step without a turn records none.
  w.write_input(exec.carry_input());
  w.seed_in_backward = true;
  exec.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
  EXPECT_FALSE(tl.turn.has_value());
}

TEST(Turn, TheSimRunsAStepWithATurnAsOneWithout) {
  auto const st = carry_stack(4);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"h"}}}});
  auto const costs = uniform_costs(s.layer_count(), layer_cost{.forward_us = 100, .backward_us = 200}, host_link::symmetric(100e6, 5));
  sim_backend sim(costs);
  executor exec(sim, s, {.debug_checks = false, .check_schedule = true});
  int turns = 0;
  auto none = [](auto const&) {};
  exec.step(none, none);
  auto const t0 = sim.step_us();
  exec.step(none, none, tide::turn{[&](auto const&) { ++turns; }});
  EXPECT_EQ(turns, 0);
  EXPECT_EQ(sim.step_us(), t0);
}

}  // namespace
