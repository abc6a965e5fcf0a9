// Issue 39, item 4: the step summary says "-" for the overlap of a step that copied nothing and
// describes every field; the out-of-memory message names each way to fit with what it takes on
// the stack at hand.
#include <gtest/gtest.h>

#include <tide/tide.hpp>

#include <cstring>
#include <string>

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

stack_spec carry_stack() {
  stack_spec st;
  st.append({"block", {{"ln", 1024}, {"fc", 4096}, {"fc_gelu", 4096}}}, 6);
  st.carry = {"residual", 1024};
  return st;
}

step_summary one_step(schedule const& s) {
  host_backend b;
  timeline t;
  executor ex(b, s, {.debug_checks = false, .check_schedule = true, .timeline = &t});
  auto forward = [](auto const& c) {
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) std::memset(c.slot(k).data(), 1, c.slot(k).size());
    if (!c.carry_out().empty()) std::memset(c.carry_out().data(), 2, c.carry_out().size());
  };
  ex.step(forward, [](auto const&) {});
  return summarize(t, s);
}

// ---- the step summary ---------------------------------------------------------------------------

TEST(Summary, OverlapIsADashWhenNothingWasCopied) {
  auto const st = carry_stack();
  for (auto const& how : {strategy{}, strategy{.policy = {rule_spec{.where = placement::remat}}}}) {
    auto const sum = one_step(build_schedule(st, how));
    EXPECT_FALSE(sum.copied());
    EXPECT_EQ(overlap_text(sum), "-");  // it was "100%": nothing hidden, because nothing was copied
    EXPECT_TRUE(has(describe(sum), "overlap -")) << describe(sum);
  }
  auto const off = one_step(build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}}));
  EXPECT_TRUE(off.copied());
  auto const text = overlap_text(off);
  EXPECT_EQ(text.back(), '%') << text;
  EXPECT_TRUE(has(describe(off), "overlap " + text)) << describe(off);
}

TEST(Summary, DescribeNamesEveryField) {
  auto const st = carry_stack();
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"fc"}}}});
  auto const d = describe(one_step(s));
  for (auto const* part : {"step ", "compute ", "forward ", "recompute ", "backward ", "copies running ", "exposed ",
                           "collectives exposed ", "storage transfers running ", "device predicted ", "host predicted ",
                           "storage predicted ", "measured "})
    EXPECT_TRUE(has(d, part)) << part << " in\n" << d;
  EXPECT_TRUE(has(d, "device predicted " + std::to_string(s.peak_device_bytes()) + " B")) << d;
  EXPECT_TRUE(has(d, "host predicted " + std::to_string(s.peak_host_bytes()) + " B")) << d;
}

// ---- out of memory: each way to fit, with what it takes ------------------------------------------

TEST(OutOfMemory, NamesEveryWayToFitWithWhatEachTakesOnThisStack) {
  auto const st = carry_stack();
  auto const keep = build_schedule(st, strategy{});
  auto const remat = build_schedule(st, {.policy = {rule_spec{.where = placement::remat}}});
  auto const offload = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}});
  auto const budget = keep.peak_device_bytes() / 2;
  ASSERT_LE(remat.peak_device_bytes(), budget);
  host_backend small({.device_budget = budget});
  auto const m = what_of([&] { executor ex(small, keep); });
  // The old message: the need, the budget, and the carry's share.
  EXPECT_TRUE(has(m, "needs " + std::to_string(keep.peak_device_bytes()) + " bytes, budget is " + std::to_string(budget))) << m;
  EXPECT_TRUE(has(m, "store fewer carries")) << m;
  // Each way to fit, with the bytes it takes on this stack (device / pinned host / file).
  auto const d_h = [](schedule const& s) { return std::to_string(s.peak_device_bytes()) + " / " + std::to_string(s.peak_host_bytes()); };
  EXPECT_TRUE(has(m, "keep every slot (tide::strategy{}): " + d_h(keep) + " / 0 (does not fit)")) << m;
  EXPECT_TRUE(has(m, "offload every slot to pinned host memory (rule_spec{.where = placement::offload}): " + d_h(offload))) << m;
  EXPECT_TRUE(has(m, "rematerialize every slot but the layer inputs (placement::remat): one more forward per layer: " + d_h(remat) +
                         " / 0 (fits)"))
      << m;
  EXPECT_TRUE(has(m, "store 2 carries")) << m;
  EXPECT_TRUE(has(m, "spill every slot to a file (placement::spill")) << m;
  EXPECT_TRUE(has(m, "tide::make_plan(stack, tide::calibrate(stack, backend, forward, backward), {.device_budget = " +
                         std::to_string(budget) + "})"))
      << m;
  // Nothing was taken: the schedule the message names runs on the same backend.
  executor fits(small, remat);
}

TEST(OutOfMemory, RematLeavesTheInputSlotsAndAHostBudgetIsNamedAsSuch) {
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 8192}}}, 4);
  auto const keep = build_schedule(st, strategy{});
  auto const remat_h = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"h"}}}});
  host_backend small({.device_budget = keep.peak_device_bytes() - 1});
  auto const m = what_of([&] { executor ex(small, keep); });
  EXPECT_TRUE(has(m, "rematerialize every slot but the layer inputs (placement::remat): one more forward per layer: " +
                         std::to_string(remat_h.peak_device_bytes()) + " / 0 / 0 (fits)"))
      << m;
  EXPECT_FALSE(has(m, "store 2 carries")) << m;  // no carry

  auto const offload = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}});
  host_backend pinned({.host_budget = offload.peak_host_bytes() / 2});
  auto const h = what_of([&] { executor ex(pinned, offload); });
  EXPECT_TRUE(has(h, "pinned host arena")) << h;
  EXPECT_TRUE(has(h, "{.host_budget = " + std::to_string(offload.peak_host_bytes() / 2) + "}")) << h;
  EXPECT_TRUE(has(h, "keep every slot (tide::strategy{}): " + std::to_string(keep.peak_device_bytes()) + " / 0 / 0 (fits)")) << h;
}

TEST(OutOfMemory, TheSimBackendsMessageNamesTheWaysToo) {
  auto const st = carry_stack();
  auto const keep = build_schedule(st, strategy{});
  auto const costs = uniform_costs(keep.layer_count(), layer_cost{.forward_us = 1, .backward_us = 2});
  sim_backend sim(costs, {.device_budget = keep.peak_device_bytes() / 2});
  auto const m = what_of([&] { executor ex(sim, keep, {.debug_checks = false, .check_schedule = false}); });
  EXPECT_TRUE(has(m, "sim backend device arena")) << m;
  EXPECT_TRUE(has(m, "rematerialize every slot but the layer inputs")) << m;
  EXPECT_TRUE(has(m, storage_backend<sim_backend> ? "spill every slot to a file" : "on a backend with a storage tier")) << m;
}

}  // namespace
