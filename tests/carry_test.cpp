// Carries and segment checkpointing: a stack whose layers pass a carry from one to the next, its
// carries stored, offloaded or recomputed by the strategy's checkpoints, run on the host backend
// with real data flowing through the carry (workload::carry_chain). Gradients are compared
// bitwise against storing every carry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>

#include <tide/plan/checkpointing.hpp>
#include <tide/tide.hpp>

#include "workload.hpp"

using namespace tide;

namespace {

stack_spec carry_stack(std::uint32_t layers, std::size_t carry_bytes = 1000) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"h", 4096}, {"act", 333}, {"w", 64}}}, layers);
  st.carry = {"x", carry_bytes};
  return st;
}

policy_spec remat_h() {
  policy_spec p;
  p.rules.push_back({.where = placement::remat, .slots = {"h"}});
  p.rules.push_back({.where = placement::offload, .slots = {"act"}});
  return p;
}

std::uint64_t count(schedule const& s, op_kind k) {
  std::uint64_t n = 0;
  for (auto const& o : s.ops) n += o.kind == k;
  return n;
}

//! The executor test's knob (meson option stress_cases, env TIDE_STRESS_CASES): 500 in the main
//! build, fewer under the sanitizers, which run ~10x slower.
int stress_cases() {
  int cases = 500;
  if (char const* e = std::getenv("TIDE_STRESS_CASES")) cases = std::atoi(e);
  return cases;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// Every carry stored, Revolve with s = 1..L device snapshots, with and without latency hiding and
// slot remat/offload: the same gradients, bit for bit; each schedule's advances are Revolve's
// optimum, and the forward lambda writes a carry L + advances times.
TEST(Carry, RevolveGradientsBitwiseEqualStoreAll) {
  host_backend b;
  for (std::uint32_t L : {1u, 2u, 5u, 9u, 14u}) {
    auto const st = carry_stack(L);
    auto const all = build_schedule(st, strategy{});
    EXPECT_EQ(all.carry.advances, 0u);
    auto const want = workload::run_carry_chain(b, all, 3);
    for (std::uint32_t s = 1; s <= L; ++s)
      for (bool hiding : {true, false})
        for (bool slots : {false, true}) {
          strategy how{.checkpoints = {.device_snapshots = s}};
          how.pipeline.latency_hiding = hiding;
          if (slots) how.policy = remat_h();
          auto const sch = build_schedule(st, how);
          auto const what = "L=" + std::to_string(L) + " s=" + std::to_string(s) + (hiding ? " hiding" : "") + (slots ? " slots" : "");
          EXPECT_EQ(sch.carry.advances, static_cast<std::uint64_t>(revolve_extra_forwards(L, s))) << what;
          EXPECT_EQ(count(sch, op_kind::advance), sch.carry.advances) << what;
          EXPECT_LE(sch.carry.device_snapshots, s) << what;
          std::uint64_t forwards = 0;
          EXPECT_EQ(workload::run_carry_chain(b, sch, 3, {.debug_checks = true, .check_schedule = true}, &forwards), want) << what;
          EXPECT_EQ(forwards, L + sch.carry.advances) << what;
        }
  }
}

// Fewer snapshots, less device memory: the carry's buffers are part of the predicted peak.
TEST(Carry, SnapshotsCostDeviceMemoryInThePrediction) {
  auto const st = carry_stack(32, 1 << 20);
  std::size_t last = 0;
  for (std::uint32_t s : {1u, 2u, 4u, 8u, 32u}) {
    auto const sch = build_schedule(st, {.checkpoints = {.device_snapshots = s}});
    EXPECT_EQ(sch.arena.carry_bytes, std::size_t{sch.carry.device_buffers} * sch.carry.region_bytes);
    // The input (snapshot 0 in place), the output, s - 1 other snapshots, and the working carry's
    // two (a layer reads one and writes the other).
    EXPECT_LE(sch.carry.device_buffers, s + 3) << s;
    EXPECT_GT(sch.peak_device_bytes(), last) << s;
    last = sch.peak_device_bytes();
    check_schedule(sch);
  }
}

// Two tiers: the reversal from two_tier_plan (device snapshots, host snapshots, copies on the
// d2h/h2d streams), expanded by the builder, proven by the checker and bitwise equal on a paced
// link (copies slow enough to race with compute if a wait were missing).
TEST(Carry, TwoTierReversalBitwiseEqualStoreAll) {
  host_backend fast;
  host_backend_options po;
  po.d2h = po.h2d = {.bytes_per_second = 4e9, .latency_us = 20};
  host_backend paced(po);
  for (std::uint32_t L : {3u, 8u, 17u, 24u})
    for (std::int64_t sd : {1, 2, 3})
      for (std::int64_t sh : {1, 2, 4}) {
        auto const st = carry_stack(L, 4096);
        auto const all = build_schedule(st, strategy{});
        auto const want = workload::run_carry_chain(fast, all, 2);
        auto const plan = two_tier_plan(L, sd, sh, chain_costs::constant(10, 20, 5, 5));
        auto const sch = build_schedule(st, {.policy = remat_h(),
                                             .checkpoints = {.device_snapshots = static_cast<std::uint32_t>(sd),
                                                             .host_snapshots = static_cast<std::uint32_t>(sh),
                                                             .reversal = plan.actions}});
        auto const what = "L=" + std::to_string(L) + " sd=" + std::to_string(sd) + " sh=" + std::to_string(sh);
        EXPECT_EQ(static_cast<std::int64_t>(sch.carry.advances), plan.extra_forwards) << what;
        EXPECT_LE(sch.carry.host_snapshots, static_cast<std::uint32_t>(sh)) << what;
        EXPECT_EQ(sch.arena.host_carry_bytes, std::size_t{sch.carry.host_snapshots} * sch.carry.host_region_bytes) << what;
        EXPECT_EQ(workload::run_carry_chain(L % 2 ? paced : fast, sch, 2, {.debug_checks = true, .check_schedule = true}), want)
            << what << "\n" << describe(sch);
      }
}

// Three tiers: carries written to disk snapshots (a storage file, through a host snapshot) and
// read back, on io_uring or pread/pwrite, run bitwise equal to storing every carry; the schedule's
// file holds the disk snapshots, the checker proves the data flow, and nothing is left on disk.
TEST(Carry, ThreeTierReversalBitwiseEqualStoreAll) {
  workload::temp_dir dir;
  host_backend_options fo;
  fo.storage = {.directory = dir.path.string(), .quiet = true};
  host_backend fast(fo);
  host_backend_options po = fo;
  po.d2h = po.h2d = {.bytes_per_second = 4e9, .latency_us = 20};
  host_backend paced(po);
  host_backend plain;
  auto c = chain_costs::constant(10, 20, 5, 5);
  c.disk_write_us = 15, c.disk_read_us = 10;
  int with_disk = 0;
  for (std::uint32_t L : {4u, 9u, 20u, 40u})
    for (auto const t : {chain_tiers{1, 1, 1}, chain_tiers{2, 1, 3}, chain_tiers{2, 2, 6}}) {
      auto const st = carry_stack(L, 5000);  // not a multiple of the storage alignment: padded regions
      auto const all = build_schedule(st, strategy{});
      auto const want = workload::run_carry_chain(plain, all, 2);
      auto const plan = three_tier_plan(L, t, c);
      auto const sch = build_schedule(st, {.policy = remat_h(),
                                           .checkpoints = {.device_snapshots = static_cast<std::uint32_t>(t.device),
                                                           .host_snapshots = static_cast<std::uint32_t>(t.host),
                                                           .reversal = plan.actions,
                                                           .disk_snapshots = static_cast<std::uint32_t>(t.disk)}});
      auto const what = "L=" + std::to_string(L) + " tiers " + std::to_string(t.device) + "/" + std::to_string(t.host) + "/" +
                        std::to_string(t.disk);
      EXPECT_EQ(static_cast<std::int64_t>(sch.carry.advances), plan.extra_forwards) << what;
      EXPECT_LE(sch.carry.disk_snapshots, static_cast<std::uint32_t>(t.disk)) << what;
      EXPECT_EQ(sch.peak_storage_bytes(), std::size_t{sch.carry.disk_snapshots} * sch.carry.file_region_bytes) << what;
      EXPECT_EQ(sch.carry.file_region_bytes % sch.buffers.storage_alignment, 0u) << what;
      EXPECT_EQ(sch.carry.host_area % sch.buffers.storage_alignment, 0u) << what;
      std::int64_t stores = 0;
      for (auto const& o : sch.ops) stores += o.kind == op_kind::store;
      EXPECT_EQ(stores, plan.disk_writes) << what;
      with_disk += plan.disk_writes > 0;
      EXPECT_EQ(workload::run_carry_chain(L % 2 ? paced : fast, sch, 2, {.debug_checks = true, .check_schedule = true}), want)
          << what << "\n" << describe(sch);
    }
  EXPECT_GE(with_disk, 4);  // the plans used the disk
  EXPECT_TRUE(dir.empty());
}

// Disk snapshots without a storage directory, or a reversal that misuses them: refused by name
// before anything runs, and the backend runs the next schedule.
TEST(Carry, DiskSnapshotsMisuseIsNamed) {
  auto const st = carry_stack(9, 5000);
  auto c = chain_costs::constant(10, 20, 5, 5);
  c.disk_write_us = c.disk_read_us = 1;
  chain_tiers const t{.device = 1, .host = 1, .disk = 2};
  auto const plan = three_tier_plan(9, t, c);
  ASSERT_GT(plan.disk_writes, 0);
  strategy how{.policy = remat_h(), .checkpoints = {.device_snapshots = 1, .host_snapshots = 1, .reversal = plan.actions, .disk_snapshots = 2}};
  auto const sch = build_schedule(st, how);
  host_backend none;  // no storage directory
  auto message = [](auto&& f) {
    try {
      f();
    } catch (std::exception const& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto const m = message([&] { (void)workload::run_carry_chain(none, sch, 1); });
  EXPECT_NE(m.find("bytes of spilled slots or disk snapshots but the backend has no storage tier"), std::string::npos) << m;
  auto const all = build_schedule(st, strategy{});
  host_backend other;
  auto const want = workload::run_carry_chain(other, all, 1);
  EXPECT_EQ(workload::run_carry_chain(none, all, 1), want);  // the backend still runs
  // Disk snapshots without a reversal; a load from an empty disk snapshot; a spill into an occupied one.
  EXPECT_NE(message([&] { (void)build_schedule(st, strategy{.checkpoints = {.device_snapshots = 2, .disk_snapshots = 1}}); })
                .find("disk snapshot(s) of carry 'x' but give no reversal: pass checkpoint_spec::reversal = tide::three_tier_plan"),
            std::string::npos);
  auto broken = how;
  broken.checkpoints.reversal.insert(broken.checkpoints.reversal.begin(), chain_action::load(1, 0));
  EXPECT_NE(message([&] { (void)build_schedule(st, broken); }).find("it loads from a disk snapshot that holds no carry"), std::string::npos);
  broken = how;
  auto& r = broken.checkpoints.reversal;
  auto const first_spill = std::find_if(r.begin(), r.end(), [](chain_action const& a) { return a.op == chain_op::spill; });
  ASSERT_NE(first_spill, r.end());
  r.insert(first_spill + 1, *first_spill);  // the same spill again, into the snapshot it just filled
  EXPECT_NE(message([&] { (void)build_schedule(st, broken); }).find("it spills into a disk snapshot that is not empty"), std::string::npos);
}

// Random stacks, slot policies, pipelines, collectives and checkpoints (one tier and two): every
// schedule the builder accepts runs bitwise equal to storing every carry.
TEST(Carry, StressRandomStacksAndCheckpoints) {
  std::mt19937_64 rng(20261130);
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  host_backend fast;
  host_backend_options po;
  po.d2h = po.h2d = {.bytes_per_second = 4e9, .latency_us = 20};
  host_backend paced(po);
  std::vector<std::string_view> const names = {"d0", "d1", "d2", "d3"};
  int const cases = std::max(20, stress_cases() / 5);
  int rejected = 0, gathered = 0;  // gathers with advances (rejected), gathers that ran
  for (int i = 0; i < cases; ++i) {
    stack_spec st;
    st.independent_layers = true;  // no layer reads another's output
    auto const n_types = uni(1, 3);
    std::vector<layer_spec> types;
    char const* type_names[] = {"t0", "t1", "t2"};
    for (std::uint64_t t = 0; t < n_types; ++t) {
      layer_spec ls{type_names[t], {}};
      for (std::uint64_t k = 0, n = uni(0, 4); k < n; ++k) ls.slots.push_back({names[k], static_cast<std::size_t>(uni(1, 50000))});
      types.push_back(ls);
    }
    auto const L = static_cast<std::uint32_t>(uni(1, 40));
    for (std::uint32_t l = 0; l < L; ++l) st.append(types[uni(0, n_types - 1)]);
    st.carry = {"x", static_cast<std::size_t>(uni(1, 20000))};
    policy_spec p;
    p.allow_unused_rules = true;
    for (std::uint64_t r = 0, n = uni(0, 3); r < n; ++r) {
      rule_spec rs{.where = static_cast<placement>(uni(0, 2)), .first_layer = static_cast<std::uint32_t>(uni(0, L - 1))};
      rs.last_layer = static_cast<std::uint32_t>(uni(rs.first_layer.value + 1, L));
      if (uni(0, 1)) rs.slots.push_back(names[uni(0, names.size() - 1)]);
      if (!rs.slots.empty() && !st.has_slot(rs.slots[0])) rs.slots.clear();
      p.rules.push_back(rs);
    }
    strategy how{.policy = p};
    how.buffers.staging_buffers = static_cast<std::uint32_t>(uni(1, 3));
    how.buffers.guard_bytes = uni(0, 1) ? 0 : static_cast<std::size_t>(uni(1, 64));
    how.buffers.share_phase_regions = uni(0, 1);
    how.buffers.device_alignment = std::size_t{1} << uni(0, 8);
    how.buffers.host_alignment = std::size_t{1} << uni(0, 6);
    how.pipeline = {.latency_hiding = uni(0, 3) != 0,
                    .prefetch_distance = static_cast<std::uint32_t>(uni(0, 3)),
                    .chunk_bytes = uni(0, 1) ? 0 : static_cast<std::size_t>(uni(1, 1 << 14)),
                    .max_offloads_in_flight = static_cast<std::uint32_t>(uni(1, 3))};
    how.collectives.before_forward = uni(0, 3) == 0;
    how.collectives.after_backward = uni(0, 3) == 0;
    how.collectives.before_backward = uni(0, 3) == 0;
    auto const sd = static_cast<std::uint32_t>(uni(1, L + 1));
    auto const sh = static_cast<std::uint32_t>(uni(0, 1) ? 0 : uni(1, 6));
    how.checkpoints.device_snapshots = uni(0, 5) ? sd : every_carry;
    if (sh > 0 && how.checkpoints.device_snapshots != every_carry) {
      how.checkpoints.host_snapshots = sh;
      how.checkpoints.reversal =
          two_tier_plan(L, sd, sh, chain_costs::constant(static_cast<double>(uni(1, 20)), static_cast<double>(uni(1, 40)),
                                                         static_cast<double>(uni(0, 30)), static_cast<double>(uni(0, 30))))
              .actions;
    }
    auto const all = build_schedule(st, strategy{});
    auto const want = workload::run_carry_chain(fast, all, 2);
    schedule s;
    if (auto const issue = try_build_schedule_into(s, st, how)) {
      // Gathers with advances: rejected, as an advance runs no gather hook.
      ASSERT_EQ(issue.code, schedule_issue_code::advance_without_gather) << "case " << i << ": " << to_message(issue);
      ASSERT_TRUE(how.collectives.before_forward || how.collectives.before_backward);
      ++rejected;
      how.collectives.before_forward = how.collectives.before_backward = false;
      s = build_schedule(st, how);
    }
    gathered += how.collectives.before_forward || how.collectives.before_backward;
    auto& b = i % 2 ? paced : fast;
    ASSERT_EQ(workload::run_carry_chain(b, s, 2, {.debug_checks = true, .check_schedule = true}), want)
        << "case " << i << "\n" << describe(s);
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(gathered, 0);
}

// The checker proves the carries' data flow: an advance reading the wrong buffer, or a copy's
// wait removed, is caught and named.
TEST(Carry, CheckerCatchesAMisroutedCarry) {
  auto const st = carry_stack(9);
  auto const good = build_schedule(st, {.checkpoints = {.device_snapshots = 2}});
  check_schedule(good);
  auto bad = good;
  for (auto& o : bad.ops)
    if (o.kind == op_kind::advance) {
      o.carry_in = o.carry_out;  // reads what it is about to write
      break;
    }
  auto const msg = error_of([&] { check_schedule(bad); });
  EXPECT_NE(msg.find("carry"), std::string::npos) << msg;

  auto bad2 = good;
  for (auto& o : bad2.ops)
    if (o.kind == op_kind::forward && o.layer == 0) o.carry_in = good.carry.output_offset();
  EXPECT_NE(error_of([&] { check_schedule(bad2); }).find("input buffer"), std::string::npos);

  // An advance that writes the output buffer: no read sees it, but the user's output is gone.
  auto bad4 = good;
  for (auto it = bad4.ops.rbegin(); it != bad4.ops.rend(); ++it)
    if (it->kind == op_kind::advance) {
      it->carry_out = good.carry.output_offset();
      break;
    }
  EXPECT_NE(error_of([&] { check_schedule(bad4); }).find("of the output buffer"), std::string::npos);

  auto const two = build_schedule(st, {.checkpoints = {.device_snapshots = 2, .host_snapshots = 2,
                                                       .reversal = two_tier_plan(9, 2, 2, chain_costs::constant(10, 20, 5, 5)).actions}});
  check_schedule(two);
  bool cut = false;
  auto bad3 = two;
  for (std::uint32_t i = 0; i < bad3.ops.size() && !cut; ++i)
    if (bad3.ops[i].kind == op_kind::prefetch && bad3.ops[i].slot == carry_slot && bad3.ops[i].wait_count > 0) {
      bad3.ops[i].wait_count = 0;  // no longer waits for the offload that wrote its host slot
      cut = true;
    }
  ASSERT_TRUE(cut);
  auto const msg3 = error_of([&] { check_schedule(bad3); });
  EXPECT_TRUE(msg3.find("race") != std::string::npos || msg3.find("data flow") != std::string::npos) << msg3;

  // Disk snapshots: a load that no longer waits for its store, a load from another disk
  // snapshot's region, a store outside the disk snapshots' area: each caught.
  auto c = chain_costs::constant(10, 20, 5, 5);
  c.disk_write_us = c.disk_read_us = 1;
  auto const three = build_schedule(st, {.checkpoints = {.device_snapshots = 1, .host_snapshots = 1,
                                                         .reversal = three_tier_plan(9, {.device = 1, .host = 1, .disk = 2}, c).actions,
                                                         .disk_snapshots = 2}});
  check_schedule(three);
  auto carry_transfer = [&](schedule& x, op_kind k) -> op* {
    for (auto& o : x.ops)
      if (o.kind == k && o.slot == carry_slot) return &o;
    return nullptr;
  };
  ASSERT_EQ(three.carry.disk_snapshots, 2u);
  auto unordered = three;
  auto* ld = carry_transfer(unordered, op_kind::load);
  ASSERT_NE(ld, nullptr);
  ASSERT_GT(ld->wait_count, 0u);
  ld->wait_count = 0;
  auto const m5 = error_of([&] { check_schedule(unordered); });
  EXPECT_TRUE(m5.find("race") != std::string::npos || m5.find("data flow") != std::string::npos) << m5;
  auto misread = three;
  ld = carry_transfer(misread, op_kind::load);
  ld->file_offset = ld->file_offset == three.carry.file_area ? three.carry.file_area + three.carry.file_region_bytes : three.carry.file_area;
  auto const m6 = error_of([&] { check_schedule(misread); });
  EXPECT_NE(m6, "(no error)");  // what the check names (the data read, or the region's order) is printed below
  std::printf("a load from the other disk snapshot: %s\n", m6.c_str());
  auto outside = three;
  carry_transfer(outside, op_kind::store)->file_offset += 512;
  EXPECT_NE(error_of([&] { check_schedule(outside); }).find("not a host snapshot's region and a disk snapshot's"), std::string::npos);
}

// Bad input: each a clear error naming what is wrong, and the next build or step still works.
TEST(Carry, BadInputIsNamed) {
  auto const st = carry_stack(6);
  auto const zero = error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 0}}); });
  EXPECT_NE(zero.find("device_snapshots >= 1"), std::string::npos) << zero;
  auto const host = error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 2, .host_snapshots = 2}}); });
  EXPECT_NE(host.find("two_tier_plan"), std::string::npos) << host;

  stack_spec plain;
  plain.independent_layers = true;  // no layer reads another's output
  plain.append({"blk", {{"input", 4096, true}, {"h", 100}}}, 4);
  auto const nocarry = error_of([&] { (void)build_schedule(plain, {.checkpoints = {.device_snapshots = 2}}); });
  EXPECT_NE(nocarry.find("declares no carry"), std::string::npos) << nocarry;
  policy_spec remat_input;
  remat_input.rules.push_back({.where = placement::remat, .slots = {"input"}, .first_layer = 2});
  auto const input = error_of([&] { (void)build_schedule(plain, {.policy = remat_input}); });
  EXPECT_NE(input.find("slot 'input' of layer 2"), std::string::npos) << input;
  EXPECT_NE(input.find("declare the stack's carry"), std::string::npos) << input;
  policy_spec remat_any;
  remat_any.rules.push_back({.where = placement::remat});
  EXPECT_NE(error_of([&] { (void)build_schedule(plain, {.policy = remat_any}); }).find("is the layer's input"), std::string::npos);

  // A reversal that is not one: backward before the turn; a slot beyond the cap; ends early.
  auto rev = revolve_schedule(6, 2);
  auto const cap = error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 1, .reversal = rev}}); });
  EXPECT_NE(cap.find("beyond checkpoint_spec::device_snapshots"), std::string::npos) << cap;
  auto early = rev;
  early.resize(early.size() / 2);
  auto const ends = error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 2, .reversal = early}}); });
  EXPECT_NE(ends.find("ends before the backward of layer 0"), std::string::npos) << ends;
  std::vector<chain_action> far{chain_action::store(0, 2'000'000'000), chain_action::turn(5)};  // no table of 2e9 slots
  auto const f = error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 2'100'000'000, .reversal = far}}); });
  EXPECT_NE(f.find("action 0"), std::string::npos) << f;
  std::vector<chain_action> wrap{chain_action::advance(std::numeric_limits<std::int32_t>::min(), 5)};
  EXPECT_NE(error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 2, .reversal = wrap}}); }).find("action 0"),
            std::string::npos);
  std::vector<chain_action> jump{chain_action::backward(5)};
  auto const j = error_of([&] { (void)build_schedule(st, {.checkpoints = {.device_snapshots = 2, .reversal = jump}}); });
  EXPECT_NE(j.find("action 0"), std::string::npos) << j;

  // A carry too large for the device budget: out_of_memory naming the carry and what it takes;
  // then a schedule that fits runs on the same backend.
  {
    auto const big = carry_stack(6, 1 << 20);
    auto const all = build_schedule(big, strategy{});
    auto const two = build_schedule(big, {.checkpoints = {.device_snapshots = 2}});
    host_backend small({.device_budget = two.peak_device_bytes()});
    auto const oom = error_of([&] { executor ex(small, all); });
    EXPECT_NE(oom.find("the carry 'x' (1048576 bytes) takes"), std::string::npos) << oom;
    EXPECT_NE(oom.find("store fewer carries"), std::string::npos) << oom;
    host_backend roomy;
    EXPECT_EQ(workload::run_carry_chain(small, two, 2), workload::run_carry_chain(roomy, all, 2));
  }

  // A carry of SIZE_MAX / 2 bytes overflows the arena: named, not wrapped.
  auto huge = st;
  huge.carry.bytes = std::size_t(-1) / 2;
  auto const over = error_of([&] { (void)build_schedule(huge, strategy{}); });
  EXPECT_NE(over.find("carry"), std::string::npos) << over;
}

// A forward lambda that does not write its carry out: the debug checks poison the buffer and
// name the layer; the executor's next step (with a correct lambda) still succeeds.
TEST(Carry, UnwrittenCarryOutIsADebugFailureNamingTheLayer) {
  auto const st = carry_stack(5);
  auto const sch = build_schedule(st, {.checkpoints = {.device_snapshots = 2}});
  host_backend b;
  executor ex(b, sch, {.debug_checks = true, .check_schedule = true});
  workload::carry_chain w(sch);
  w.write_input(ex.carry_input());
  std::int64_t skipped = -1;
  auto lazy = [&](auto const& c) {
    if (c.mode == tide::forward_mode::advance && skipped < 0) {  // forgets its carry out when it first recomputes a segment
      skipped = c.layer;
      return;
    }
    w.forward(c);
  };
  auto back = [&](auto const& c) { w.backward(c); };
  auto const msg = error_of([&] { ex.step(lazy, back); });
  ASSERT_GE(skipped, 0);
  EXPECT_NE(msg.find("layer " + std::to_string(skipped) + " "), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not write its carry out"), std::string::npos) << msg;
  workload::carry_chain fresh(sch);
  fresh.write_input(ex.carry_input());
  EXPECT_NO_THROW(ex.step([&](auto const& c) { fresh.forward(c); }, [&](auto const& c) { fresh.backward(c); }));
}

// Type-level: a tide::carry part sets the stack's carry; a layer can declare its input slot.
TEST(Carry, TypeLevelCarryAndInputSlot) {
  using blk = tide::layer<"blk", tide::input_slot<"in", 256>, tide::slot<"h", 512>>;
  using net = tide::stack<tide::carry<"x", 128>, tide::repeat<blk, 4>>;
  auto const st = net::spec();
  EXPECT_EQ(st.carry.name, "x");
  EXPECT_EQ(st.carry.bytes, 128u);
  EXPECT_TRUE(st.layer(0).slots[0].input);
  constexpr auto s = tide::make_schedule<net>();
  static_assert(s.carry.bytes == 128 && s.carry.advances == 0);
  EXPECT_EQ(check_schedule(s).replayed_device_bytes, s.peak_device_bytes());
  // Revolve with 2 snapshots at compile time: its advances in a constant expression, and the
  // same program as the run-time builder's.
  using two = tide::strategy_of<tide::checkpoints<tide::device_snapshots<2>>, tide::policy<tide::remat<tide::slot_names<"h">>>>;
  constexpr auto r = tide::make_schedule<net, two>();
  static_assert(r.carry.advances == 1);  // t(4, 2) - 3 = (2 * 4 - C(4, 3)) - 3
  auto const rt = build_schedule(st, two::spec());
  ASSERT_EQ(rt.ops.size(), r.ops.size());
  for (std::size_t i = 0; i < rt.ops.size(); ++i) EXPECT_EQ(rt.ops[i], r.ops[i]) << i;
  check_schedule(r);
}

// The planner's snapshot counts keep recomputation within 16 forwards a layer: a long stack does
// not get s = 1 (quadratic ops), a short one does.
TEST(Carry, SnapshotCandidatesBoundTheRecomputation) {
  auto const few = snapshot_candidates(20);
  EXPECT_EQ(few.front(), every_carry);
  EXPECT_EQ(few.back(), 1u);
  auto const many = snapshot_candidates(30000);
  EXPECT_GT(many.back(), 1u);
  for (auto s : many) {
    if (s == every_carry) continue;
    EXPECT_LE(revolve_extra_forwards(30000, s), 16 * 30000) << s;
  }
}

// The sim charges an advance a whole forward: fewer snapshots, more time.
TEST(Carry, SimChargesSegmentRecomputation) {
  auto const st = carry_stack(16);
  cost_table costs;
  costs.layers.assign(16, layer_cost{.forward_us = 100, .backward_us = 200});
  double last = 0;
  for (std::uint32_t s : {16u, 4u, 2u, 1u}) {
    auto const sch = build_schedule(st, {.checkpoints = {.device_snapshots = s}});
    auto const us = simulate_step_us(sch, costs);
    EXPECT_GE(us, 16 * 300.0 + 100.0 * static_cast<double>(sch.carry.advances) - 1e-6) << s;
    EXPECT_GT(us, last) << s;
    last = us;
  }
}

// The planner's plans always run. Random stacks (half with a carry, half without one but with a
// declared input slot), random costs and link, budgets from 15% to 100% of keep-all: every plan
// that fits is built, fits its budget, and runs on the host backend bitwise equal to keep-all
// with a chain workload (layer i + 1's input is layer i's output). Some plans drop carries.
TEST(Carry, EveryPlanRunsBitwiseEqualKeepAll) {
  std::mt19937_64 rng(77);
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  host_backend b;
  int fits = 0, dropped = 0, offloaded_inputs = 0, host_tier = 0;
  std::vector<std::string_view> const names = {"d0", "d1", "d2"};
  int const cases = stress_cases() >= 500 ? 20 : 6;  // each plans its stack: about 1.5 s a case optimized
  for (int i = 0; i < cases; ++i) {
    bool const with_carry = i % 2 == 0;
    stack_spec st;
    st.independent_layers = true;  // no layer reads another's output
    std::vector<layer_spec> types;
    char const* type_names[] = {"t0", "t1"};
    for (std::uint64_t t = 0, n = uni(1, 2); t < n; ++t) {
      layer_spec ls{type_names[t], {}};
      std::size_t const in_bytes = with_carry ? 0 : 4096;  // the chain workload: one activation size
      if (!with_carry) ls.slots.push_back({workload::chain::input, in_bytes, true});
      for (std::uint64_t k = 0, m = uni(with_carry ? 1 : 0, 3); k < m; ++k)
        ls.slots.push_back({names[k], static_cast<std::size_t>(uni(256, 32768))});
      types.push_back(ls);
    }
    auto const L = static_cast<std::uint32_t>(uni(2, 20));
    for (std::uint32_t l = 0; l < L; ++l) st.append(types[uni(0, types.size() - 1)]);
    if (with_carry) st.carry = {"x", static_cast<std::size_t>(uni(1024, 65536))};
    cost_table costs;
    for (std::uint32_t l = 0; l < L; ++l) {
      layer_cost c{.forward_us = real(10, 100)};
      c.backward_us = 2 * c.forward_us;
      for (std::size_t k = 0; k < st.layer(l).slots.size(); ++k) c.slot_recompute_us.push_back(real(0.1, 0.6) * c.forward_us);
      costs.layers.push_back(c);
    }
    costs.link = host_link::symmetric(real(0.2e9, 20e9), 5);
    auto const keep = build_schedule(st, strategy{});
    auto const budget = static_cast<std::size_t>(static_cast<double>(keep.peak_device_bytes()) * real(0.15, 1.0));
    plan_options po{.device_budget = budget};
    if (uni(0, 2) == 0) po.host_budget = static_cast<std::size_t>(uni(0, 1 << 20));
    if (cases < 40) {  // sanitizer runs: a shorter search (what they check is the plans' runs)
      po.local_search_max_evaluations = 300;
      po.local_search_kicks = 0;
    }
    auto const p = make_plan(st, costs, po);
    if (!p.fits) continue;
    ++fits;
    auto const s = p.build(st);
    ASSERT_LE(s.peak_device_bytes(), budget) << "case " << i;
    ASSERT_LE(s.peak_host_bytes(), po.host_budget) << "case " << i;
    dropped += s.carry.advances > 0;
    host_tier += s.carry.host_snapshots > 0;
    for (std::uint32_t l = 0; l < L; ++l)
      offloaded_inputs += !with_carry && s.view().slots_of(l)[0].where == placement::offload;
    auto const opts = executor_options{.debug_checks = true, .check_schedule = true};
    if (with_carry)
      ASSERT_EQ(workload::run_carry_chain(b, s, 2, opts), workload::run_carry_chain(b, keep, 2)) << "case " << i << "\n" << describe(s);
    else
      ASSERT_EQ(workload::run_chain(b, s, 2, opts), workload::run_chain(b, keep, 2)) << "case " << i << "\n" << describe(s);
  }
  std::printf("plans that fit: %d of %d; dropping carries: %d (with host snapshots: %d); offloading an input slot: %d layers\n",
              fits, cases, dropped, host_tier, offloaded_inputs);
  EXPECT_GE(fits, cases / 2);
  if (cases >= 20) {
    EXPECT_GT(dropped, 0);  // the statistics need the whole run
  }
  EXPECT_GT(offloaded_inputs, 0);
}
