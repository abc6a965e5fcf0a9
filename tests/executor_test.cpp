// The executor on the host backend: bitwise-equal gradients across policies and pipelines, a
// property-based stress test, failure paths, debug checks, collectives, steady-state allocation,
// enqueue and wait, named hooks, typed slot handles, timelines through the executor (host and
// sim), and the sim's cost table checked at construction.
#include <gtest/gtest.h>

#include <tide/tide.hpp>
#include <tide/trace/detail/sweep.hpp>  // the occupancy sweep, against a reference

#include "../examples/mlp/mlp.hpp"
#include "workload.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

using namespace tide;

// ---- counting every heap allocation in this program ------------------------------------------
// GCC cannot see that these replacements pair malloc with free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<std::size_t> allocations{0};
}
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

bool contains(std::string const& s, std::string const& what) { return s.find(what) != std::string::npos; }

std::uint64_t train_mlp(schedule const& s, mlp::config c, int steps, host_backend_options bo = {}) {
  host_backend b(bo);
  executor exec(b, s);
  mlp::network net(c);
  std::uint64_t all = 0;
  for (int i = 0; i < steps; ++i) {
    exec.step([&](auto const& ctx) { net.forward(ctx); }, [&](auto const& ctx) { net.backward(ctx); });
    all = all * 31 + net.update();
  }
  return all;
}

policy_spec rules(std::initializer_list<rule_spec> r) { return policy_spec(r); }
rule_spec r_offload(std::vector<tide::name> s, std::uint32_t first = 0, std::uint32_t last = all_layers) {
  return {.where = placement::offload, .slots = std::move(s), .first_layer = first, .last_layer = last};
}
rule_spec r_remat(std::vector<tide::name> s, std::uint32_t first = 0, std::uint32_t last = all_layers) {
  return {.where = placement::remat, .slots = std::move(s), .first_layer = first, .last_layer = last};
}

}  // namespace

TEST(Executor, MlpGradientsBitwiseEqualAcrossPoliciesAndPipelines) {
  mlp::config c{6, 24, 5, 0.05f};
  auto const st = mlp::make_stack(c);
  auto const want = train_mlp(build_schedule(st, strategy{}), c, 3);
  std::vector<policy_spec> policies = {
      rules({r_remat({"pre_act", "act", "inv_rms"})}),
      rules({r_offload({"input", "pre_act", "act"})}),
      rules({r_offload({"input"}, 0, 3), r_remat({"pre_act", "act"}), r_offload({"inv_rms"}, 2)}),
      rules({r_offload({})}),
  };
  int n = 0;
  for (auto const& p : policies)
    for (bool hide : {true, false})
      for (std::uint32_t d : {0u, 1u, 3u, 5u})
        for (std::size_t chunk : {std::size_t{0}, std::size_t{100}, std::size_t{1000}})
          for (std::uint32_t staging : {1u, 2u, 4u}) {
            if (!hide && (d > 0 || staging > 1)) continue;  // these do not apply to the naive pipeline
            buffer_spec b;
            b.staging_buffers = staging;
            b.guard_bytes = 32;
            auto s = build_schedule(st, {.policy = p,
                                         .buffers = b,
                                         .pipeline = {.latency_hiding = hide,
                                                      .prefetch_distance = d,
                                                      .chunk_bytes = chunk,
                                                      .max_offloads_in_flight = 2}});
            EXPECT_EQ(train_mlp(s, c, 3), want) << describe(s, {false, false});
            ++n;
          }
  EXPECT_GT(n, 100);
}

namespace {
//! Random cases per stress test: TIDE_STRESS_CASES from the environment, else as built.
int stress_cases() {
#ifdef TIDE_STRESS_CASES
  int cases = TIDE_STRESS_CASES;
#else
  int cases = 500;
#endif
  if (char const* e = std::getenv("TIDE_STRESS_CASES")) cases = std::atoi(e);
  return cases;
}
}  // namespace

TEST(Executor, StressRandomStacksPoliciesPipelines) {
  int const cases = stress_cases();
  std::mt19937_64 rng(20261129);
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  workload::temp_dir dir;  // spilled slots go to files here
  host_backend_options o;
  o.storage = {.directory = dir.path.string(), .quiet = true};
  host_backend b(o);
  for (int i = 0; i < cases; ++i) {
    // A random stack of 1..64 layers of up to 3 types, slot sizes log-uniform in [1 B, 8 MiB],
    // with at most 24 MiB in all so the suite stays fast.
    stack_spec st;
    st.independent_layers = true;  // the synthetic workload: no layer reads another's output
    char const* type_names[] = {"t0", "t1", "t2"};
    char const* slot_names[] = {"s0", "s1", "s2", "s3", "s4"};
    std::vector<layer_spec> types;
    auto const n_types = uni(1, 3);
    for (std::uint64_t t = 0; t < n_types; ++t) {
      layer_spec ls{type_names[t], {}};
      auto const n_slots = uni(1, 5);
      for (std::uint64_t k = 0; k < n_slots; ++k) {
        auto const bits = uni(0, 23);
        ls.slots.push_back({slot_names[k], static_cast<std::size_t>(uni(std::uint64_t{1} << bits, (std::uint64_t{2} << bits) - 1))});
      }
      types.push_back(ls);
    }
    auto const layers = static_cast<std::uint32_t>(uni(1, 64));
    std::size_t total = 0;
    for (std::uint32_t l = 0; l < layers; ++l) {
      auto const& t = types[uni(0, n_types - 1)];
      for (auto const& sl : t.slots) total += sl.bytes;
      if (total > (24u << 20) && l > 0) break;
      st.append(t);
    }
    policy_spec p;
    p.allow_unused_rules = true;  // random rules often shadow one another
    auto const n_rules = uni(0, 4);
    for (std::uint64_t r = 0; r < n_rules; ++r) {
      rule_spec rs{.where = static_cast<placement>(uni(0, 3)),  // keep, offload, remat or spill
                   .first_layer = static_cast<std::uint32_t>(uni(0, st.layer_count() - 1)),
                   .last_layer = all_layers,
                   .min_bytes = uni(0, 1) ? 0 : static_cast<std::size_t>(uni(0, 1 << 16))};
      rs.last_layer = static_cast<std::uint32_t>(uni(rs.first_layer.value + 1, st.layer_count()));
      if (uni(0, 1)) rs.slots.push_back(slot_names[uni(0, 4)]);
      if (!rs.slots.empty() && !st.has_slot(rs.slots[0])) rs.slots.clear();
      p.rules.push_back(rs);
    }
    buffer_spec bs;
    bs.staging_buffers = static_cast<std::uint32_t>(uni(1, 4));
    bs.guard_bytes = uni(0, 1) ? 0 : 16;
    bs.share_phase_regions = uni(0, 1);
    pipeline_spec pl{.latency_hiding = uni(0, 3) != 0,
                     .prefetch_distance = static_cast<std::uint32_t>(uni(0, std::min<std::uint64_t>(3, st.layer_count() - 1))),
                     .chunk_bytes = uni(0, 1) ? 0 : static_cast<std::size_t>(uni(1, 1 << 20)),
                     .max_offloads_in_flight = static_cast<std::uint32_t>(uni(1, 3))};
    auto const keep = build_schedule(st, {.buffers = bs});
    auto const s = build_schedule(st, {.policy = p, .buffers = bs, .pipeline = pl});
    auto const want = workload::run(b, keep, 2, {.debug_checks = true, .check_schedule = false});
    auto const got = workload::run(b, s, 2, {.debug_checks = true, .check_schedule = true});
    ASSERT_EQ(got, want) << "case " << i << "\n" << describe(s);
  }
}

// ---- the chain workload: layer l + 1 reads layer l's output ---------------------------------

TEST(Executor, StressChainRandomStacksPoliciesPipelines) {
  int const cases = stress_cases();
  std::mt19937_64 rng(20260611);
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  workload::temp_dir dir;  // spilled slots go to files here
  host_backend_options fo;
  fo.storage = {.directory = dir.path.string(), .quiet = true};
  host_backend fast(fo);
  host_backend_options po = fo;
  po.d2h = po.h2d = {.bytes_per_second = 4e9, .latency_us = 20};  // a paced link: copies take long enough to race with compute
  po.storage.io = storage_io::posix;  // and the other storage path
  host_backend paced(po);
  char const* type_names[] = {"t0", "t1", "t2", "t3"};
  std::vector<tide::name> const derived_names = {"d0", "d1", "d2", "d3", "d4"};
  for (int i = 0; i < cases; ++i) {
    // 1..48 layers of up to 4 types; each type has "input" (at a random position) and 0..5
    // derived slots; sizes log-uniform in [1 B, 2 MiB], at most 12 MiB in all.
    auto const n_types = uni(1, 4);
    std::vector<layer_spec> types;
    for (std::uint64_t t = 0; t < n_types; ++t) {
      layer_spec ls{type_names[t], {}};
      auto const n_derived = uni(0, 5);
      auto const at = uni(0, n_derived);
      for (std::uint64_t k = 0; k <= n_derived; ++k) {
        auto const bits = uni(0, 20);
        auto const bytes = static_cast<std::size_t>(uni(std::uint64_t{1} << bits, (std::uint64_t{2} << bits) - 1));
        ls.slots.push_back({k == at ? workload::chain::input : derived_names[k - (k > at)], bytes, k == at});
      }
      types.push_back(ls);
    }
    stack_spec st;
    auto const layers = static_cast<std::uint32_t>(uni(1, 48));
    std::size_t total = 0;
    for (std::uint32_t l = 0; l < layers; ++l) {
      auto const& t = types[uni(0, n_types - 1)];
      for (auto const& sl : t.slots) total += sl.bytes;
      if (total > (12u << 20) && l > 0) break;
      st.append(t);
    }
    std::vector<tide::name> present;  // derived names some type has
    for (auto n : derived_names)
      if (st.has_slot(n)) present.push_back(n);
    // Never remat "input": recompute mode cannot rebuild it (it is the previous layer's output,
    // long overwritten), and the builder rejects it (see ChainWorkloadDetectsRematOfTheInput).
    // Input is kept, offloaded or spilled; derived slots get anything.
    policy_spec p;
    p.allow_unused_rules = true;  // random rules often shadow one another
    auto const n_rules = uni(0, 5);
    for (std::uint64_t r = 0; r < n_rules; ++r) {
      rule_spec rs{.where = static_cast<placement>(uni(0, 3)),  // keep, offload, remat or spill
                   .first_layer = static_cast<std::uint32_t>(uni(0, st.layer_count() - 1)),
                   .last_layer = all_layers,
                   .min_bytes = uni(0, 2) ? 0 : static_cast<std::size_t>(uni(0, 1 << 16))};
      rs.last_layer = static_cast<std::uint32_t>(uni(rs.first_layer.value + 1, st.layer_count()));
      if (uni(0, 1)) {
        rs.slots.push_back(workload::chain::input);
        if (!present.empty() && uni(0, 1)) rs.slots.push_back(present[uni(0, present.size() - 1)]);
      } else if (!present.empty() && uni(0, 2)) {
        rs.slots.push_back(present[uni(0, present.size() - 1)]);
      }
      if (rs.where == placement::remat) {
        std::erase(rs.slots, workload::chain::input);
        if (rs.slots.empty()) {  // "any slot" would include the input: name the derived ones
          if (present.empty()) rs.where = placement::offload;
          for (auto n : present)
            if (uni(0, 1) || n == present.back()) rs.slots.push_back(n);
        }
      }
      p.rules.push_back(rs);
    }
    buffer_spec bs;
    bs.staging_buffers = static_cast<std::uint32_t>(uni(1, 4));
    bs.guard_bytes = uni(0, 1) ? 0 : static_cast<std::size_t>(uni(1, 64));
    bs.share_phase_regions = uni(0, 1);
    bs.device_alignment = std::size_t{1} << uni(0, 12);
    bs.host_alignment = std::size_t{1} << uni(0, 8);
    bs.spill_buffers = static_cast<std::uint32_t>(uni(1, 4));
    bs.storage_alignment = std::size_t{512} << uni(0, 3);
    pipeline_spec pl{.latency_hiding = uni(0, 3) != 0,
                     .prefetch_distance = static_cast<std::uint32_t>(uni(0, std::min<std::uint64_t>(4, st.layer_count() - 1))),
                     .chunk_bytes = uni(0, 1) ? 0 : static_cast<std::size_t>(uni(1, 1 << 20)),
                     .max_offloads_in_flight = static_cast<std::uint32_t>(uni(1, 3))};
    collective_spec cs{.before_forward = uni(0, 3) == 0, .after_backward = uni(0, 3) == 0};
    int const steps = static_cast<int>(uni(2, 3));
    auto const keep = build_schedule(st, strategy{});
    auto const s = build_schedule(st, {.policy = p, .buffers = bs, .pipeline = pl, .collectives = cs});
    auto const want = workload::run_chain(fast, keep, steps, {.debug_checks = true, .check_schedule = false});
    auto& b = i % 2 ? paced : fast;
    auto const got = workload::run_chain(b, s, steps, {.debug_checks = true, .check_schedule = true});
    ASSERT_EQ(got, want) << "case " << i << (i % 2 ? " (paced link)" : "") << "\n" << describe(s);
  }
}

// The chain workload sees what the synthetic one cannot: the input slot rematerialized. Recompute
// mode does not rebuild the input (its data, the previous layer's output, is gone), so a backward
// reading it would see whatever the scratch holds. A stack must therefore say where a layer's
// input comes from: undeclared, every policy (keep-all too) is refused, naming the layer type and
// the three ways to declare it; declared as the layer's input (slot_spec::input), every policy
// that rematerializes it is refused, naming the slot and saying to declare a carry.
TEST(Executor, ChainWorkloadDetectsRematOfTheInput) {
  stack_spec undeclared;
  undeclared.append({"blk", {{"input", 4096}, {"h", 1000}, {"act", 333}}}, 5);
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 1000}, {"act", 333}}}, 5);
  host_backend b;
  auto const keep = build_schedule(st, strategy{});
  auto const want = workload::run_chain(b, keep, 2);
  auto refused = [](auto&& build, char const* what) {
    try {
      build();
      ADD_FAILURE() << "accepted: " << what;
      return std::string();
    } catch (schedule_error const& e) {
      return std::string(e.what());
    }
  };
  auto const undeclared_keep = refused([&] { (void)build_schedule(undeclared, strategy{}); }, "an undeclared input");
  for (auto const* part : {"layer type 'blk' does not say where its input comes from", "stack_spec::carry",
                           "slot_spec::input", "stack_spec::independent_layers"})
    EXPECT_NE(undeclared_keep.find(part), std::string::npos) << undeclared_keep;
  for (auto const& p : {rules({{.where = placement::remat, .slots = {"input"}}}), rules({r_remat({})}),
                        rules({r_remat({"input", "h"}, 2, 4)})}) {
    auto const u = refused([&] { (void)build_schedule(undeclared, {.policy = p}); }, "an undeclared input");
    EXPECT_NE(u.find("does not say where its input comes from"), std::string::npos) << u;
    auto const e = refused([&] { (void)build_schedule(st, {.policy = p}); }, "a remat of the declared input");
    EXPECT_NE(e.find("is the layer's input"), std::string::npos) << e;
    EXPECT_NE(e.find("declare the stack's carry"), std::string::npos) << e;
  }
  // Stated independence is taken at its word (the user says no layer reads another's output).
  auto independent = undeclared;
  independent.independent_layers = true;
  EXPECT_NO_THROW((void)build_schedule(independent, {.policy = rules({r_remat({})})}));
  // And a sound policy on the declared stack matches keep-all.
  auto const ok = build_schedule(st, {.policy = rules({r_offload({"input"}), r_remat({"h", "act"})})});
  EXPECT_EQ(workload::run_chain(b, ok, 2), want);
}

// ---- failure paths ---------------------------------------------------------------------------

namespace {
stack_spec small_stack() {
  stack_spec st;
  st.independent_layers = true;  // the synthetic workload
  st.append({"l", {{"x", 4096}, {"y", 1000}}}, 6);
  return st;
}
}  // namespace

TEST(Failures, ThrowingLambdaDrainsAndNextStepSucceeds) {
  auto const st = small_stack();
  buffer_spec bs;
  bs.guard_bytes = 16;
  auto const s = build_schedule(st, {.policy = rules({r_offload({"x"}), r_remat({"y"}, 2, 4)}),
                                     .buffers = bs,
                                     .pipeline = {.prefetch_distance = 2, .chunk_bytes = 512},
                                     .collectives = {.before_forward = true, .after_backward = true}});
  host_backend b;
  auto const want = workload::run(b, s, 2);
  executor exec(b, s);
  workload::synthetic w(st.layer_count());
  int throw_at = 3;
  auto fwd = [&](auto const& c) {
    if (static_cast<int>(c.layer) == throw_at && c.mode == tide::forward_mode::forward) throw std::runtime_error("user failure in layer 3");
    w.forward(c);
  };
  auto bwd = [&](auto const& c) { w.backward(c); };
  try {
    workload::step(exec, fwd, bwd);
    FAIL() << "expected the user's exception";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "user failure in layer 3");
  }
  throw_at = -1;
  std::fill(w.digest.begin(), w.digest.end(), 0);
  for (w.step = 0; w.step < 2; ++w.step) workload::step(exec, fwd, bwd);  // the next steps succeed, with right data
  EXPECT_EQ(w.digest, want);
}

TEST(Failures, WritePastSlotIsReportedBySlotAndLayer) {
  buffer_spec bs;
  bs.guard_bytes = 64;
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"y"})}), .buffers = bs});
  host_backend b;
  executor exec(b, s, {.debug_checks = true});  // a debug check: on explicitly (off by default under NDEBUG)
  auto fwd = [](auto const& c) {
    auto y = c.template slot<"y">();
    std::memset(y.data(), 1, y.size() + (c.layer == 4 ? 3 : 0));  // overruns in layer 4
  };
  try {
    exec.step(fwd, [](auto const&) {});
    FAIL() << "expected a debug_check_error";
  } catch (debug_check_error const& e) {
    EXPECT_TRUE(contains(e.what(), "layer 4 wrote past the end of slot 'y'")) << e.what();
  }
  EXPECT_NO_THROW(exec.step([](auto const&) {}, [](auto const&) {}));
}

TEST(Failures, ReadOfASlotNeverSaved) {
  auto const s = build_schedule(small_stack(), strategy{});
  host_backend b;
  executor exec(b, s);
  try {
    exec.step([](auto const&) {}, [](auto const& c) { (void)c.template slot<"mlp_up">(); });
    FAIL();
  } catch (slot_error const& e) {
    EXPECT_TRUE(contains(e.what(), "layer 5 (l) has no slot 'mlp_up'; its slots are: x, y")) << e.what();
  }
}

TEST(Failures, ArenaTooSmallNamesNeedAndBudget) {
  auto const s = build_schedule(small_stack(), strategy{});
  host_backend_options o;
  o.device_budget = s.peak_device_bytes() - 1;
  host_backend small(o);
  try {
    executor exec(small, s);
    FAIL();
  } catch (out_of_memory const& e) {
    EXPECT_EQ(e.requested, s.peak_device_bytes());
    EXPECT_TRUE(contains(e.what(), "needs " + std::to_string(s.peak_device_bytes()) + " bytes, budget is " +
                                       std::to_string(o.device_budget)))
        << e.what();
  }
  // The same backend still serves a schedule that fits.
  auto const fits = build_schedule(small_stack(), {.policy = rules({r_offload({})})});
  ASSERT_LE(fits.peak_device_bytes(), o.device_budget);
  host_backend b;
  EXPECT_EQ(workload::run(small, fits), workload::run(b, fits));
  host_backend_options ho;
  ho.host_budget = 100;
  host_backend pinned_small(ho);
  EXPECT_THROW(executor(pinned_small, fits), out_of_memory);
}

TEST(Failures, ZeroSizedSlotIsRejected) {
  stack_spec st;
  st.append({"l", {{"x", 0}}}, 2);
  try {
    (void)build_schedule(st, strategy{});
    FAIL();
  } catch (schedule_error const& e) {
    EXPECT_TRUE(contains(e.what(), "slot 'x' of layer type 'l' has zero bytes")) << e.what();
  }
}

TEST(DebugChecks, UseBeforePrefetchIsCaught) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"x", 1 << 16}}}, 3);
  auto s = build_schedule(st, {.policy = rules({r_offload({})}), .pipeline = {.prefetch_distance = 1}});
  // Drop the wait that orders layer 0's backward after its prefetch.
  for (auto& o : s.ops)
    if (o.kind == op_kind::backward && o.layer == 0) {
      ASSERT_EQ(o.wait_count, 1u);
      o.wait_count = 0;
    }
  EXPECT_THROW(check_schedule(s), schedule_error);  // the checker rejects it statically
  host_backend_options slow;
  slow.h2d = {.bytes_per_second = 1e6, .latency_us = 0.25e6};  // 250 ms per prefetch: the backward surely runs first
  host_backend b(slow);
  executor exec(b, s, {.debug_checks = true, .check_schedule = false});
  try {
    workload::synthetic w(3);
    exec.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
    FAIL();
  } catch (debug_check_error const& e) {
    EXPECT_TRUE(contains(e.what(), "(backward L0) reads slot 'x' whose prefetch has not completed")) << e.what();
  }
}

TEST(DebugChecks, PoisonExposesAMissingRecompute) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_remat({"y"})})});
  host_backend b;
  // A debug check: on explicitly (off by default under NDEBUG); the reproduction check, which
  // names this mistake first (ContractTest), off, to see what the poison alone shows.
  executor exec(b, s, {.debug_checks = true, .check_reproduction = false});
  std::vector<unsigned char> seen;
  // A forward that forgets to produce y in recompute mode: backward sees the poison pattern.
  exec.step(
      [](auto const& c) {
        if (c.mode == tide::forward_mode::forward) std::memset(c.template slot<"y">().data(), 7, c.template slot<"y">().size());
      },
      [&](auto const& c) { seen.push_back(static_cast<unsigned char>(c.template slot<"y">()[0])); });
  exec.step(
      [](auto const& c) {
        if (c.mode == tide::forward_mode::forward) std::memset(c.template slot<"y">().data(), 7, c.template slot<"y">().size());
      },
      [&](auto const& c) { seen.push_back(static_cast<unsigned char>(c.template slot<"y">()[0])); });
  EXPECT_EQ(seen.back(), 0xDB);
}

// ---- collectives and ordering ---------------------------------------------------------------

TEST(Executor, CollectiveHooksRunOnCommStreamInOrder) {
  auto const st = small_stack();
  auto const s = build_schedule(st, {.policy = rules({r_offload({"x"})}),
                                     .pipeline = {.prefetch_distance = 1},
                                     .collectives = {.before_forward = true, .after_backward = true}});
  host_backend b;
  executor exec(b, s);
  std::vector<int> grad(6, 0), reduced(6, -1), gathered(6, 0);
  std::vector<std::uint32_t> order;
  std::atomic<int> wrong_stream{0};
  exec.step(
      [&](auto const& c) {
        if (gathered[c.layer] != 1) wrong_stream++;  // the layer's gather completed first
      },
      [&](auto const& c) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        grad[c.layer] = 100 + static_cast<int>(c.layer);
      },
      hooks{.before_forward =
                [&](auto const& c) {
                  if (c.stream != stream_role::comm || c.kind != op_kind::gather) wrong_stream++;
                  gathered[c.layer] = 1;
                },
            .after_backward =
                [&](auto const& c) {
                  if (c.stream != stream_role::comm || c.kind != op_kind::reduce) wrong_stream++;
                  reduced[c.layer] = grad[c.layer];  // must see the backward's result
                  order.push_back(c.layer);
                }});
  EXPECT_EQ(wrong_stream.load(), 0);
  EXPECT_EQ(reduced, (std::vector<int>{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(order, (std::vector<std::uint32_t>{5, 4, 3, 2, 1, 0}));
}

// Without overlap the hooks are given the compute stream, each just before the op that needs it,
// and a recompute's regather comes before it; gradients equal the overlapped schedule's.
TEST(Executor, CollectiveHooksWithoutOverlapRunOnTheComputeStream) {
  mlp::config c{6, 16, 4, 0.05f};
  std::uint64_t want = 0;
  for (bool overlap : {true, false}) {
    auto const s = build_schedule(mlp::make_stack(c), {.policy = rules({r_offload({"act"}), r_remat({"pre_act"})}),
                                                       .collectives = {.before_forward = true,
                                                                       .before_backward = true,
                                                                       .after_backward = true,
                                                                       .overlap = overlap}});
    host_backend b;
    executor exec(b, s);
    mlp::network net(c);
    std::vector<int> gathered(c.layers, 0), regathered(c.layers, 0);
    std::atomic<int> wrong{0};
    auto const want_stream = overlap ? stream_role::comm : stream_role::compute;
    exec.step(
        [&](auto const& ctx) {
          if (gathered[ctx.layer] != 1) wrong++;
          if (ctx.mode == forward_mode::recompute && regathered[ctx.layer] != 1) wrong++;
          net.forward(ctx);
        },
        [&](auto const& ctx) {
          if (regathered[ctx.layer] != 1) wrong++;
          net.backward(ctx);
        },
        hooks{.before_forward = [&](auto const& h) { wrong += h.stream != want_stream; gathered[h.layer] = 1; },
              .before_backward = [&](auto const& h) { wrong += h.stream != want_stream; regathered[h.layer] = 1; },
              .after_backward = [&](auto const& h) { wrong += h.stream != want_stream; }});
    EXPECT_EQ(wrong.load(), 0) << "overlap " << overlap;
    auto const got = net.update();  // a hash of the gradients, bitwise
    if (overlap) want = got;
    else EXPECT_EQ(got, want);
  }
}

TEST(Executor, SteadyStateStepAllocatesNothing) {
  mlp::config c{6, 16, 4, 0.05f};
  auto const s = build_schedule(mlp::make_stack(c),
                                {.policy = rules({r_offload({"input", "act"}), r_remat({"pre_act"})}),
                                 .buffers = {.staging_buffers = 2,
                                             .device_alignment = 256,
                                             .host_alignment = 64,
                                             .guard_bytes = 32,
                                             .share_phase_regions = true},
                                 .pipeline = {.prefetch_distance = 2, .chunk_bytes = 256},
                                 .collectives = {.before_forward = true, .after_backward = true}});
  host_backend b;
  timeline t;
  executor exec(b, s, {.timeline = &t});
  mlp::network net(c);
  auto fwd = [&](auto const& ctx) { net.forward(ctx); };
  auto bwd = [&](auto const& ctx) { net.backward(ctx); };
  auto hook = [](auto const&) {};
  hooks const both{.before_forward = hook, .after_backward = hook};
  exec.step(fwd, bwd, both);
  net.update();
  exec.step(fwd, bwd, both);
  net.update();
  auto const before = allocations.load();
  for (int i = 0; i < 3; ++i) exec.step(fwd, bwd, both);
  EXPECT_EQ(allocations.load() - before, 0u);
  EXPECT_EQ(t.ops.size(), s.ops.size());  // and the timeline was recorded
}

TEST(Trace, SummaryAndChromeJson) {
  auto const st = small_stack();
  auto const s = build_schedule(
      st, {.policy = rules({r_offload({"x"})}),
           .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1}});
  host_backend_options o;
  o.d2h = o.h2d = {.bytes_per_second = 4096.0 / 0.002, .latency_us = 0};  // 2 ms per 4 KiB copy, on the compute stream
  host_backend b(o);
  timeline t;
  workload::run(b, s, 1, {.timeline = &t});
  auto sum = summarize(t, s);
  EXPECT_GE(sum.exposed_transfer_us, 12 * 2000 * 0.95);  // 12 copies, none hidden
  EXPECT_LT(sum.overlap_fraction, 0.05);
  EXPECT_EQ(sum.predicted_device_bytes, s.peak_device_bytes());
  EXPECT_LE(sum.measured_device_bytes, sum.predicted_device_bytes);
  EXPECT_GT(sum.measured_device_bytes, 0u);
  EXPECT_EQ(sum.measured_host_bytes, 6 * 4096u);  // all offloaded copies live at the turn
  std::ostringstream js;
  write_chrome_trace(js, t, s, "run \"a\"\n");
  EXPECT_TRUE(contains(js.str(), "\"name\":\"offload L0 x\""));
  EXPECT_TRUE(contains(js.str(), "\"name\":\"run \\\"a\\\"\\u000a\"")) << js.str().substr(0, 200);
  EXPECT_TRUE(contains(js.str(), "\"name\":\"device bytes\",\"ph\":\"C\""));
}

// The occupancy sweep (issue 54: allocations and frees apart, equal times merged before it, the
// two sorted and merged): against a map from time to summed delta, on random deltas with many
// equal times, both signs of zero and negative times.
TEST(Trace, OccupancySweepMatchesAReference) {
  std::mt19937_64 rng(54);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{5000}, std::size_t{50000}}) {
    std::vector<std::pair<double, std::ptrdiff_t>> d, freed;
    std::map<double, std::ptrdiff_t> ref;  // -0.0 and 0.0 are one key, as the sweep merges them
    for (std::size_t i = 0; i < n; ++i) {
      double t = 0;
      switch (rng() % 5) {
        case 0: t = static_cast<double>(rng() % 64); break;  // many ties
        case 1: t = std::ldexp(static_cast<double>(rng() >> 11), -static_cast<int>(rng() % 80)); break;
        case 2: t = rng() % 2 ? -0.0 : 0.0; break;
        case 3: t = -static_cast<double>(rng() % 1000) / 7; break;
        default: t = 1e6 + static_cast<double>(rng() % 100000) / 3; break;
      }
      // Allocations first, then frees of what is live: the curve stays at or above zero.
      std::ptrdiff_t const b = static_cast<std::ptrdiff_t>(rng() % 4096) + 1;
      d.push_back({t, b});
      ref[t] += b;
    }
    for (auto const& [t, b] : d) {
      // Half freed late, half at a time some allocation has (ties across the two vectors).
      auto const at = rng() % 2 ? t + 1e7 : std::max(t, 0.0) + static_cast<double>(rng() % 64);
      freed.push_back({at, -b});
      ref[at] -= b;
    }
    auto const curve = detail::sweep(d, freed);
    ASSERT_EQ(curve.size(), ref.size()) << n;
    std::ptrdiff_t sum = 0;
    std::size_t i = 0;
    for (auto const& [t, b] : ref) {
      sum += b;
      ASSERT_EQ(curve[i].t_us, t) << n << " at " << i;
      ASSERT_EQ(curve[i].bytes, static_cast<std::size_t>(sum)) << n << " at " << i;
      ++i;
    }
    if (n > 0) {
      EXPECT_EQ(curve.back().bytes, 0u);
    }
  }
}

TEST(Failures, StepIsNeitherReentrantNorSharedAcrossExecutors) {
  auto const s = build_schedule(small_stack(), strategy{});
  host_backend b;
  executor exec(b, s);
  auto noop = [](auto const&) {};
  try {
    exec.step([&](auto const& c) { if (c.layer == 2) exec.step(noop, noop); }, noop);
    FAIL();
  } catch (error const& e) {
    EXPECT_TRUE(contains(e.what(), "enqueue was called from inside one of this executor's own lambdas")) << e.what();
  }
  executor other(b, s);
  try {
    exec.step([&](auto const& c) { if (c.layer == 2) other.step(noop, noop); }, noop);
    FAIL();
  } catch (error const& e) {
    EXPECT_TRUE(contains(e.what(), "a step is already running on this backend")) << e.what();
  }
  EXPECT_NO_THROW(exec.step(noop, noop));
  EXPECT_NO_THROW(other.step(noop, noop));
}

TEST(Failures, SlotViewedAsTheWrongTypeIsRejected) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"odd", 6}}}, 2);
  auto const s = build_schedule(st, strategy{});
  host_backend b;
  executor exec(b, s);
  try {
    exec.step([](auto const& c) { (void)c.template slot<"odd", float>(); }, [](auto const&) {});
    FAIL();
  } catch (slot_error const& e) {
    EXPECT_TRUE(contains(e.what(), "slot 'odd' of layer 0 (6 bytes) cannot be viewed as elements of 4 bytes")) << e.what();
  }
}

namespace {
//! The host backend, failing its n-th copy at issue time (as a CUDA call can).
struct failing_backend : host_backend {
  int copies_left;
  explicit failing_backend(int n) : copies_left(n) {}
  void copy(stream_role r, std::uint32_t i, op const& o, void* d, void const* s, std::size_t n) {
    if (copies_left-- == 0) throw error("injected copy failure");
    host_backend::copy(r, i, o, d, s, n);
  }
};
}  // namespace

TEST(Failures, IssueFailureStillCallsEveryCollectiveHook) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.after_backward = true}});
  failing_backend b(3);
  executor exec(b, s);
  std::vector<int> calls(6, 0), failed_calls(6, 0);
  auto hook = [&](auto const& c) {
    if (c.kind != op_kind::reduce) return;
    ++calls[c.layer];
    failed_calls[c.layer] += c.step_failed;
  };
  auto noop = [](auto const&) {};
  try {
    exec.step(noop, noop, hooks{.after_backward = hook});
    FAIL();
  } catch (error const& e) {
    EXPECT_STREQ(e.what(), "injected copy failure");
  }
  // Every layer's collective ran once, told that the step failed: a peer rank is not left waiting.
  EXPECT_EQ(calls, std::vector<int>(6, 1));
  EXPECT_EQ(failed_calls, std::vector<int>(6, 1));
  b.copies_left = 1 << 30;
  EXPECT_NO_THROW(exec.step(noop, noop, hooks{.after_backward = hook}));
}

namespace {
//! The host backend running lambdas inline on the issuing thread, as the CUDA backend does; once
//! a lambda has "faulted" (set `sticky`), every later call fails, as CUDA calls do after a kernel
//! faults and the context's error is sticky.
struct sticky_backend : host_backend {
  bool sticky = false;
  void run(stream_role, std::uint32_t, op const&, task t) {
    if (sticky) throw error("injected sticky error (the aftermath)");
    t();
  }
  void record(stream_role r, std::uint32_t e) {
    if (sticky) throw error("injected sticky error (the aftermath)");
    host_backend::record(r, e);
  }
};
}  // namespace

// Issue 27, item 8: when a lambda fails and a later backend call fails because of it, the step
// rethrows the lambda's error (the root cause), not the backend's; and the next step runs.
TEST(Failures, TheLambdasErrorComesBeforeTheBackendsAftermath) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"x", 4096}}}, 4);
  auto const s = build_schedule(st, strategy{});  // keep-all: compute only, inline in order
  sticky_backend b;
  executor exec(b, s);
  auto faulting = [&](auto const& c) {
    if (c.layer == 1) {
      b.sticky = true;
      throw std::runtime_error("the root cause: layer 1's kernel faulted");
    }
  };
  auto noop = [](auto const&) {};
  try {
    exec.step(faulting, noop);
    FAIL() << "the step did not throw";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "the root cause: layer 1's kernel faulted");
  } catch (std::exception const& e) {
    FAIL() << "the step threw the aftermath: " << e.what();
  }
  b.sticky = false;
  EXPECT_NO_THROW(exec.step(noop, noop));
}

// The hooks of ops never issued go through the backend, in stream order, before the step's one
// synchronization (on CUDA: nothing they enqueue is still running when the error is rethrown):
// on the host backend they run on the communication stream's worker, not on the caller's thread.
TEST(Failures, RemainingHooksAreEnqueuedBeforeTheSynchronization) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.after_backward = true}});
  failing_backend b(3);
  executor exec(b, s);
  auto const caller = std::this_thread::get_id();
  std::atomic<int> on_caller{0}, done{0};
  auto hook = [&](auto const& c) {
    if (c.kind != op_kind::reduce) return;
    if (std::this_thread::get_id() == caller) ++on_caller;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // still running, were it not synchronized
    ++done;
  };
  auto noop = [](auto const&) {};
  EXPECT_THROW(exec.step(noop, noop, hooks{.after_backward = hook}), error);
  EXPECT_EQ(done.load(), 6);
  EXPECT_EQ(on_caller.load(), 0);
}

namespace {
//! A hook that, like tide::nccl_hooks, reports after the synchronization whether the step failed.
struct agreeing_hook {
  int finished = 0;
  bool saw_failure = false;
  void operator()(collective_context<stream_role> const& c) { saw_failure |= c.step_failed; }
  void finish_step() {
    ++finished;
    if (std::exchange(saw_failure, false)) throw collective_error("a rank failed");
  }
};
}  // namespace

TEST(Executor, HooksAreToldOnceTheStepHasSynchronized) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.before_forward = true, .after_backward = true}});
  host_backend b;
  executor exec(b, s);
  agreeing_hook agree;
  // Stateful: passed by std::ref (a copy would keep the state); one object as both hooks.
  hooks const both{.before_forward = std::ref(agree), .after_backward = std::ref(agree)};
  auto noop = [](auto const&) {};
  exec.step(noop, noop, both);  // one object as both hooks: told once
  EXPECT_EQ(agree.finished, 1);
  // A failed step rethrows its own error first; the hooks still close the step.
  auto throwing = [](auto const& c) {
    if (c.layer == 2) throw std::runtime_error("lambda failed");
  };
  try {
    exec.step(throwing, noop, both);
    FAIL();
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "lambda failed");
  }
  EXPECT_EQ(agree.finished, 2);
  EXPECT_NO_THROW(exec.step(noop, noop, both));
  EXPECT_EQ(agree.finished, 3);
}

namespace {
//! A distributed hook with the step-end agreement: records when it ran relative to the lambdas.
struct step_end_hook {
  std::atomic<int>* lambdas_done = nullptr;  // lambdas of the step completed so far
  int gathers = 0, agreements = 0, finished = 0;
  int lambdas_seen = -1;  // how many lambdas had completed when agree ran
  bool agreed_failure = false;
  stream_role agreed_on = stream_role::compute;
  void operator()(collective_context<stream_role> const& c) { gathers += c.kind == op_kind::gather; }
  void agree(step_end_context<stream_role> const& c) {
    ++agreements;
    lambdas_seen = lambdas_done->load();
    agreed_failure = c.step_failed;
    agreed_on = c.stream;
  }
  void finish_step() {
    ++finished;
    if (std::exchange(agreed_failure, false)) throw collective_error("a rank failed (agreed at the step's end)");
  }
};
}  // namespace

// Issue 27, item 6: with gathers only, a failure after the last collective hook (in the backward)
// is still agreed: `agree` runs once per step on the communication stream after every lambda of
// the step, told that it failed, on the host backend (workers as streams) and with the CUDA
// backend's inline lambdas alike.
template <class Backend>
void agreement_after_the_last_collective(Backend& b) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.before_forward = true}});
  executor exec(b, s);
  std::atomic<int> done{0};
  step_end_hook h{&done};
  auto count = [&](auto const&) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // still running, were agree not ordered after it
    ++done;
  };
  hooks const gathers{.before_forward = std::ref(h)};
  exec.step(count, count, gathers);
  EXPECT_EQ(h.gathers, 6);
  EXPECT_EQ(h.agreements, 1);
  EXPECT_EQ(h.lambdas_seen, 12);  // 6 forwards and 6 backwards, all before the agreement
  EXPECT_EQ(h.agreed_on, stream_role::comm);
  EXPECT_EQ(h.finished, 1);
  // Layer 0's backward, the step's last op, well after the last gather: agreed as failed.
  done = 0;
  auto failing_last = [&](backward_context<stream_role> const& c) {
    ++done;
    if (c.layer == 0) throw std::runtime_error("backward of layer 0 failed");
  };
  EXPECT_THROW(exec.step(count, failing_last, gathers), std::runtime_error);
  EXPECT_EQ(h.agreements, 2);
  EXPECT_EQ(h.finished, 2);
  // The next step is healthy again, and agreed so.
  done = 0;
  EXPECT_NO_THROW(exec.step(count, count, gathers));
  EXPECT_EQ(h.agreements, 3);
  EXPECT_EQ(h.lambdas_seen, 12);
}

TEST(Hooks, AFailureAfterTheLastCollectiveIsAgreedAtTheStepsEnd) {
  host_backend b;
  agreement_after_the_last_collective(b);
}

namespace {
//! The host backend calling lambdas inline on the issuing thread, as the CUDA backend does.
struct inline_backend : host_backend {
  void run(stream_role, std::uint32_t, op const&, task t) { t(); }
  void run_after_all(stream_role, task t) { t(); }
};
}  // namespace

TEST(Hooks, AFailureAfterTheLastCollectiveIsAgreedWithInlineLambdas) {
  inline_backend b;
  agreement_after_the_last_collective(b);
}

// A peer that cannot agree (its agreement throws) fails the step on this rank too; one object
// passed as two hooks agrees once; when issuing fails, the agreement still runs, told so.
TEST(Hooks, TheAgreementRunsOnceAndAlsoWhenIssuingFails) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.before_forward = true, .after_backward = true}});
  failing_backend b(1 << 30);
  executor exec(b, s);
  std::atomic<int> done{0};
  step_end_hook h{&done};
  hooks const both{.before_forward = std::ref(h), .after_backward = std::ref(h)};
  auto noop = [](auto const&) {};
  exec.step(noop, noop, both);
  EXPECT_EQ(h.agreements, 1);
  b.copies_left = 2;
  try {
    exec.step(noop, noop, both);
    FAIL();
  } catch (error const& e) {
    EXPECT_STREQ(e.what(), "injected copy failure");
  }
  EXPECT_EQ(h.agreements, 2);
  EXPECT_EQ(h.finished, 2);
  b.copies_left = 1 << 30;
  struct refusing {
    void operator()(collective_context<stream_role> const&) const {}
    void agree(step_end_context<stream_role> const&) const { throw collective_error("peer unreachable"); }
  };
  try {
    exec.step(noop, noop, hooks{.before_forward = refusing{}, .after_backward = refusing{}});
    FAIL();
  } catch (collective_error const& e) {
    EXPECT_STREQ(e.what(), "peer unreachable");
  }
  EXPECT_NO_THROW(exec.step(noop, noop, both));
  EXPECT_EQ(h.agreements, 3);
}

// The sim: the agreement's stream resumes once every stream is free.
TEST(SimBackend, RunAfterAllWaitsForEveryStream) {
  auto const s = build_schedule(small_stack(), {.collectives = {.before_forward = true}});
  cost_table costs;
  costs.layers.assign(6, layer_cost{.forward_us = 10, .backward_us = 20});
  costs.op_overhead_us = 0;
  costs.sync_latency_us = 1;
  sim_backend b(costs);
  (void)b.setup(backend_setup::of(s));
  b.begin_step(s);
  op fwd{};
  fwd.kind = op_kind::forward;
  b.run(stream_role::compute, 0, fwd, {});
  b.run_after_all(stream_role::comm, {});
  op g{};
  g.kind = op_kind::gather;
  b.run(stream_role::comm, 1, g, {});
  b.end_step();
  EXPECT_DOUBLE_EQ(b.step_us(), 11.0);  // the gather (0 us) starts after the forward and the wait
}

// ---- enqueue and wait ------------------------------------------------------------------------

namespace {
stack_spec chain_stack() {
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 1000}, {"act", 333}}}, 5);
  return st;
}
schedule chain_schedule() {
  return build_schedule(chain_stack(), {.policy = rules({r_offload({"input"}), r_remat({"h", "act"}, 1, 4)}),
                                        .pipeline = {.prefetch_distance = 2, .chunk_bytes = 1024},
                                        .collectives = {.before_forward = true, .after_backward = true}});
}
//! Hooks for chain_schedule()'s room (a gather and a reduce) that move no data.
constexpr hooks<workload::empty_hook, no_hook, workload::empty_hook> chain_hooks{};
constexpr std::size_t kinds = static_cast<std::size_t>(op_kind::reduce) + 1;
//! How many times each kind of op runs per layer in one step of `s`.
std::vector<std::vector<int>> ops_per_layer(schedule_view s) {
  std::vector<std::vector<int>> n(kinds, std::vector<int>(s.layer_count(), 0));
  for (auto const& o : s.ops) ++n[static_cast<std::size_t>(o.kind)][o.layer];
  return n;
}
}  // namespace

TEST(Enqueue, EnqueueThenWaitIsBitwiseEqualToStepAndRunsEachLambdaOncePerOp) {
  auto const s = chain_schedule();
  host_backend b;
  auto const want = workload::run_chain(b, s, 3);  // step()
  auto const per_step = ops_per_layer(s);
  ASSERT_GT(per_step[static_cast<std::size_t>(op_kind::recompute)][2], 0);  // the schedule recomputes
  executor exec(b, s);
  workload::chain w(s);
  std::vector<std::uint64_t> got;
  // Every call, by op kind and layer: the compute stream calls fwd and bwd, the comm stream the
  // hooks; wait() orders both before the reads below.
  std::vector<std::vector<int>> calls(kinds, std::vector<int>(s.layer_count(), 0));
  auto fwd = [&](auto const& c) {
    ++calls[static_cast<std::size_t>(c.mode != tide::forward_mode::forward ? op_kind::recompute : op_kind::forward)][c.layer];
    w.forward(c);
  };
  auto bwd = [&](auto const& c) {
    ++calls[static_cast<std::size_t>(op_kind::backward)][c.layer];
    w.backward(c);
  };
  auto count = [&](auto const& c) { ++calls[static_cast<std::size_t>(c.kind)][c.layer]; };
  hooks const h{.before_forward = count, .after_backward = count};
  for (int i = 0; i < 3; ++i) {
    exec.enqueue(fwd, bwd, h);
    EXPECT_TRUE(exec.pending());
    exec.wait();
    EXPECT_FALSE(exec.pending());
    w.update(got);
  }
  EXPECT_EQ(exec.steps(), 3u);
  EXPECT_EQ(got, want);
  for (auto k : {op_kind::forward, op_kind::recompute, op_kind::backward, op_kind::gather, op_kind::reduce}) {
    auto const i = static_cast<std::size_t>(k);
    for (std::uint32_t l = 0; l < s.layer_count(); ++l)
      EXPECT_EQ(calls[i][l], 3 * per_step[i][l]) << to_string(k) << " of layer " << l;
  }
  exec.wait();  // nothing pending: nothing to do
  EXPECT_EQ(exec.steps(), 3u);
}

TEST(Enqueue, WaitRethrowsAnEnqueuedStepsErrorAndTheNextStepWorks) {
  auto const s = chain_schedule();
  host_backend b;
  auto const want = workload::run_chain(b, s, 2);
  executor exec(b, s);
  std::optional<workload::chain> w(std::in_place, s);
  int throw_at = 2;
  auto fwd = [&](auto const& c) {
    if (static_cast<int>(c.layer) == throw_at && c.mode == tide::forward_mode::forward) throw std::runtime_error("forward of layer 2 failed");
    w->forward(c);
  };
  auto bwd = [&](auto const& c) { w->backward(c); };
  EXPECT_NO_THROW(exec.enqueue(fwd, bwd, chain_hooks));  // the lambda's error belongs to the step, not to its enqueueing
  EXPECT_TRUE(exec.pending());
  try {
    exec.wait();
    FAIL() << "expected the forward lambda's exception";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "forward of layer 2 failed");
  }
  EXPECT_FALSE(exec.pending());
  EXPECT_NO_THROW(exec.wait());  // reported once
  // The next steps succeed with the right data.
  throw_at = -1;
  w.emplace(s);
  std::vector<std::uint64_t> got;
  for (int i = 0; i < 2; ++i) {
    exec.enqueue(fwd, bwd, chain_hooks);
    exec.wait();
    w->update(got);
  }
  EXPECT_EQ(got, want);
}

TEST(Enqueue, EnqueueWhileAStepIsPendingWaitsForItFirst) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"}), r_remat({"y"}, 2, 4)}),
                                                .pipeline = {.prefetch_distance = 2, .chunk_bytes = 512}});
  host_backend b;
  // The reference: steps 0 and 1 of the synthetic workload, each from a zero digest.
  std::vector<std::uint64_t> want[2];
  for (std::uint64_t step : {0u, 1u}) {
    executor ref(b, s);
    workload::synthetic w(s.layer_count());
    w.step = step;
    ref.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
    want[step] = w.digest;
  }
  executor exec(b, s);
  workload::synthetic first(s.layer_count()), second(s.layer_count());
  second.step = 1;
  std::atomic<int> first_backwards{0};
  auto fwd1 = [&](auto const& c) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // still running when enqueue returns
    first.forward(c);
  };
  auto bwd1 = [&](auto const& c) {
    first.backward(c);
    ++first_backwards;
  };
  auto fwd2 = [&](auto const& c) { second.forward(c); };
  auto bwd2 = [&](auto const& c) { second.backward(c); };
  exec.enqueue(fwd1, bwd1);
  exec.enqueue(fwd2, bwd2);  // waits for the first step, then enqueues the second
  EXPECT_EQ(first_backwards.load(), static_cast<int>(s.layer_count()));  // the first step has completed
  EXPECT_EQ(exec.steps(), 1u);
  EXPECT_TRUE(exec.pending());
  exec.wait();
  EXPECT_EQ(exec.steps(), 2u);
  EXPECT_EQ(first.digest, want[0]);
  EXPECT_EQ(second.digest, want[1]);

  // The pending step's error comes out of the next enqueue, which then enqueues nothing.
  auto throwing = [](auto const& c) {
    if (c.layer == 3) throw std::runtime_error("pending step failed");
  };
  auto noop = [](auto const&) {};
  int second_calls = 0;
  auto counting = [&](auto const&) { ++second_calls; };
  exec.enqueue(throwing, noop);
  try {
    exec.enqueue(counting, counting);
    FAIL() << "expected the pending step's exception";
  } catch (std::runtime_error const& e) {
    EXPECT_STREQ(e.what(), "pending step failed");
  }
  EXPECT_FALSE(exec.pending());
  EXPECT_EQ(second_calls, 0);
  EXPECT_NO_THROW(exec.step(counting, counting));
  auto const compute_ops = std::count_if(s.ops.begin(), s.ops.end(), [](op const& o) {
    return o.kind == op_kind::forward || o.kind == op_kind::recompute || o.kind == op_kind::backward;
  });
  EXPECT_EQ(compute_ops, 6 + 2 + 6);  // forwards, recomputes of layers 2 and 3, backwards
  EXPECT_EQ(second_calls, compute_ops);
}

// ---- named hooks -------------------------------------------------------------------------------

namespace {
//! Records what it is called for; tells how many times the step was finished.
struct recording_hook {
  std::vector<std::pair<op_kind, std::uint32_t>> calls;
  int finished = 0;
  void operator()(collective_context<stream_role> const& c) { calls.push_back({c.kind, c.layer}); }
  void finish_step() { ++finished; }
};
}  // namespace

// The README's spelling for compilers without class template argument deduction from designated
// initializers (Clang before 17): the hook types written out, a stateful hook by reference.
TEST(Hooks, ExplicitTemplateArgumentsTakeAHookByReference) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.after_backward = true}});
  host_backend b;
  executor exec(b, s);
  auto noop = [](auto const&) {};
  recording_hook h;
  exec.step(noop, noop, tide::hooks<tide::no_hook, tide::no_hook, decltype(h)&>{.after_backward = h});
  std::vector<std::pair<op_kind, std::uint32_t>> want;
  for (std::uint32_t l = 6; l-- > 0;) want.push_back({op_kind::reduce, l});
  EXPECT_EQ(h.calls, want);  // the caller's object, not a copy
  EXPECT_EQ(h.finished, 1);
}

TEST(Hooks, NamedHooksGetTheirOpKindsAndLayers) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.before_forward = true, .after_backward = true}});
  host_backend b;
  executor exec(b, s);
  auto noop = [](auto const&) {};
  recording_hook gather, reduce;
  exec.step(noop, noop, hooks{.before_forward = std::ref(gather), .after_backward = std::ref(reduce)});
  std::vector<std::pair<op_kind, std::uint32_t>> want_gather, want_reduce;
  for (std::uint32_t l = 0; l < 6; ++l) want_gather.push_back({op_kind::gather, l});
  for (std::uint32_t l = 6; l-- > 0;) want_reduce.push_back({op_kind::reduce, l});
  EXPECT_EQ(gather.calls, want_gather);
  EXPECT_EQ(reduce.calls, want_reduce);
  EXPECT_EQ(gather.finished, 1);  // two objects: each told once
  EXPECT_EQ(reduce.finished, 1);

  // Passed by value, a hook object is copied: the caller's object sees nothing.
  recording_hook copied;
  exec.step(noop, noop, hooks{.before_forward = copied, .after_backward = copied});
  EXPECT_TRUE(copied.calls.empty());
  EXPECT_EQ(copied.finished, 0);
}

// The hook contract: every hook the schedule makes room for is given, and every hook given has
// room. Otherwise a data-parallel step would leave gradients unreduced (or a hook uncalled) with
// no error, and replicas would diverge. Each mismatch is refused before anything runs, naming
// the hook, and the next step with the right hooks still works.
TEST(Hooks, AHookMissingOrWithoutRoomIsRefusedByName) {
  auto const reduce_only = build_schedule(small_stack(), {.collectives = {.after_backward = true}});
  auto const none_room = build_schedule(small_stack(), strategy{});
  auto const all_room = build_schedule(small_stack(), {.policy = rules({r_remat({"y"})}),
                                                       .collectives = {.before_forward = true, .before_backward = true, .after_backward = true}});
  host_backend b;
  auto noop = [](auto const&) {};
  recording_hook h;
  auto refused = [&](auto& exec, auto&& hs, std::string const& want) {
    try {
      exec.step(noop, noop, hs);
      ADD_FAILURE() << "accepted; expected: " << want;
    } catch (error const& e) {
      EXPECT_TRUE(contains(e.what(), want)) << e.what();
    }
    EXPECT_FALSE(exec.pending());
  };
  {
    executor exec(b, reduce_only);
    refused(exec, hooks{}, "makes room for a reduce hook (collective_spec::after_backward) but the step was given none");
    refused(exec, hooks{.before_forward = std::ref(h), .after_backward = std::ref(h)},
            "was given a gather hook (hooks::before_forward) but the schedule makes no room for it");
    EXPECT_TRUE(h.calls.empty());  // refused before anything ran
    EXPECT_EQ(exec.steps(), 0u);
    exec.step(noop, noop, hooks{.after_backward = std::ref(h)});
    EXPECT_EQ(h.calls.size(), 6u);
  }
  {
    executor exec(b, none_room);
    refused(exec, hooks{.after_backward = std::ref(h)}, "was given a reduce hook (hooks::after_backward)");
    refused(exec, hooks{.before_backward = std::ref(h)}, "was given a regather hook (hooks::before_backward)");
    EXPECT_NO_THROW(exec.step(noop, noop));
  }
  {
    executor exec(b, all_room);
    refused(exec, hooks{.before_forward = std::ref(h), .after_backward = std::ref(h)},
            "makes room for a regather hook (collective_spec::before_backward)");
    refused(exec, hooks{.before_backward = std::ref(h), .after_backward = std::ref(h)},
            "makes room for a gather hook (collective_spec::before_forward)");
    h.calls.clear();
    exec.step(noop, noop, hooks{.before_forward = std::ref(h), .before_backward = std::ref(h), .after_backward = std::ref(h)});
    EXPECT_EQ(h.calls.size(), 18u);
  }
}

// A lambda or hook that starts or waits for a step of its own executor (after enqueue returned,
// while the step runs on the backend's workers) would wait for itself: the call is refused, that
// error fails the outer step (its wait() throws it: nothing completes silently), and the next
// step works.
TEST(Hooks, ReentryFromALambdaOrAHookFailsTheOuterStep) {
  auto const s = build_schedule(small_stack(), {.collectives = {.after_backward = true}});
  host_backend b;
  executor exec(b, s);
  auto noop = [](auto const&) {};
  std::atomic<bool> enqueued{false};
  auto after_enqueue = [&] {
    for (int i = 0; i < 5000 && !enqueued.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  auto reenter = [&](int how) {
    auto h = hooks{.after_backward = noop};
    if (how == 0) exec.step(noop, noop, h);
    else if (how == 1) exec.wait();
    else exec.record_timeline(nullptr);
  };
  for (int from_hook = 0; from_hook < 2; ++from_hook)
    for (int how = 0; how < 3; ++how) {
      enqueued = false;
      auto fwd = [&](auto const& c) {
        if (!from_hook && c.layer == 2) after_enqueue(), reenter(how);
      };
      auto reduce = [&](auto const& c) {
        if (from_hook && c.layer == 1) after_enqueue(), reenter(how);
      };
      auto h = hooks{.after_backward = reduce};
      exec.enqueue(fwd, noop, h);
      enqueued = true;
      try {
        exec.wait();
        ADD_FAILURE() << "a reentrant call (" << how << (from_hook ? ", from a hook" : ", from a lambda") << ") went unnoticed";
      } catch (error const& e) {
        EXPECT_TRUE(contains(e.what(), "from inside one of this executor's own lambdas or hooks")) << e.what();
      }
      EXPECT_FALSE(exec.pending());
      workload::synthetic w(6), fresh(6);
      auto wf = [&](auto const& c) { w.forward(c); };
      auto wb = [&](auto const& c) { w.backward(c); };
      exec.step(wf, wb, hooks{.after_backward = noop});  // the next step runs, with right data
      host_backend other;
      executor alone(other, s);
      workload::step(alone, [&](auto const& c) { fresh.forward(c); }, [&](auto const& c) { fresh.backward(c); });
      EXPECT_EQ(w.digest, fresh.digest);
    }
}

// FSDP-style: weights gathered before each forward and again before each recompute and backward.
// Each regather runs before its layer's recompute and backward, the first of the backward sweep's
// only after the forward of the layer before last (two receive buffers), and one object passed as
// all three hooks is told once.
TEST(Hooks, RegatherRunsBeforeEachLayersRecomputeAndBackward) {
  auto const s = build_schedule(small_stack(), {.policy = rules({r_offload({"x"}), r_remat({"y"})}),
                                                .pipeline = {.prefetch_distance = 1},
                                                .collectives = {.before_forward = true, .before_backward = true, .after_backward = true}});
  host_backend b;
  executor exec(b, s);
  std::mutex m;
  std::vector<std::string> order;
  auto note = [&](std::string what) {
    std::lock_guard lock(m);
    order.push_back(std::move(what));
  };
  auto fwd = [&](forward_context<stream_role> const& c) { note((c.mode != tide::forward_mode::forward ? "recompute " : "forward ") + std::to_string(c.layer)); };
  auto bwd = [&](backward_context<stream_role> const& c) { note("backward " + std::to_string(c.layer)); };
  struct all_kinds {
    std::function<void(std::string)> note;
    int finished = 0;
    void operator()(collective_context<stream_role> const& c) { note(std::string(to_string(c.kind)) + " " + std::to_string(c.layer)); }
    void finish_step() { ++finished; }
  } h{note};
  exec.step(fwd, bwd, hooks{.before_forward = std::ref(h), .before_backward = std::ref(h), .after_backward = std::ref(h)});
  EXPECT_EQ(h.finished, 1);
  auto at = [&](std::string const& what) {
    auto const i = std::find(order.begin(), order.end(), what);
    EXPECT_NE(i, order.end()) << what;
    EXPECT_EQ(std::count(order.begin(), order.end(), what), 1) << what;
    return i - order.begin();
  };
  for (std::uint32_t l = 0; l < 6; ++l) {
    auto const L = std::to_string(l);
    EXPECT_LT(at("gather " + L), at("forward " + L));
    EXPECT_LT(at("regather " + L), at("recompute " + L));
    EXPECT_LT(at("recompute " + L), at("backward " + L));
    EXPECT_LT(at("backward " + L), at("reduce " + L));
    if (l + 2 < 6) {
      EXPECT_LT(at("backward " + std::to_string(l + 2)), at("regather " + L));  // two buffers
    }
  }
  EXPECT_LT(at("forward 4"), at("regather 5"));
  EXPECT_LT(at("forward 5"), at("regather 4"));
}

TEST(Hooks, OneObjectByReferenceAsBothHooksIsToldOnce) {
  auto const s = build_schedule(small_stack(), {.collectives = {.before_forward = true, .after_backward = true}});
  host_backend b;
  executor exec(b, s);
  auto noop = [](auto const&) {};
  recording_hook h;
  for (int i = 1; i <= 3; ++i) {
    exec.step(noop, noop, hooks{.before_forward = std::ref(h), .after_backward = std::ref(h)});
    EXPECT_EQ(h.finished, i);
  }
  EXPECT_EQ(h.calls.size(), 3u * 12u);
  // Through enqueue and wait: told by wait, not before.
  hooks const by_ref{.before_forward = std::ref(h), .after_backward = std::ref(h)};
  exec.enqueue(noop, noop, by_ref);
  EXPECT_EQ(h.finished, 3);
  exec.wait();
  EXPECT_EQ(h.finished, 4);
  EXPECT_EQ(h.calls.size(), 4u * 12u);
}

// ---- typed slot handles ------------------------------------------------------------------------

namespace {
using typed_layer = layer<"typed", slot<"x", 64>, slot<"y", 32>>;
using other_layer = layer<"other", slot<"x", 64>>;
using typed_stack = stack<independent_layers, repeat<typed_layer, 3>>;
constexpr auto typed_x = slot_handle_of<typed_layer, "x", float>;
constexpr auto typed_y = slot_handle_of<typed_layer, "y", std::uint32_t>;
constexpr auto other_x = slot_handle_of<other_layer, "x", float>;
static_assert(typed_x.index == 0 && typed_y.index == 1 && typed_x.layer_type == "typed");
static_assert(std::is_same_v<decltype(typed_x)::element_type, float>);

//! What a lambda saw in one layer: spans by handle, name and index, and the errors of misuse.
struct seen_slots {
  bool same_span = false;  //!< handle, name and index forms agree
  bool produces = false;
  std::string wrong_type;  //!< slot_error of a handle of another layer type
  std::string wrong_name;  //!< slot_error of a name the layer lacks
};
template <class T, class Byte>
bool same(std::span<T> a, std::span<Byte> bytes) {
  return static_cast<void const*>(a.data()) == static_cast<void const*>(bytes.data()) &&
         a.size() == bytes.size() / sizeof(T) && a.size() > 0;
}
}  // namespace

TEST(SlotHandles, HandleNameAndIndexFormsAgreeAndMisuseIsASlotError) {
  auto const s = build_schedule(typed_stack::spec(), {.policy = policy<remat<slot_names<"y">>>::spec()});
  host_backend b;
  executor exec(b, s);
  using fwd_ctx = executor<host_backend>::forward_context_type;
  using bwd_ctx = executor<host_backend>::backward_context_type;
  std::vector<seen_slots> fwd_seen(3), rec_seen(3), bwd_seen(3);
  auto fwd = [&](fwd_ctx const& c) {
    auto& r = (c.mode != tide::forward_mode::forward ? rec_seen : fwd_seen)[c.layer];
    auto const x = c.slot(typed_x);
    auto const y = c.slot(typed_y);
    static_assert(std::is_same_v<decltype(x), std::span<float> const>);
    r.same_span = same(x, c.slot(0)) && same(y, c.slot(1)) && same(c.slot<"x", float>(), c.slot(0)) &&
                  same(c.slot<"y", std::uint32_t>(), c.slot(1)) && same(c.slot<"y">(), c.slot(1)) && x.size() == 16 &&
                  y.size() == 8;
    r.produces = c.produces(typed_y) && c.produces<"y">() && c.produces(typed_x) == (c.mode == tide::forward_mode::forward) &&
                 c.produces<"x">() == c.produces(0);
    try {
      (void)c.slot(other_x);
    } catch (slot_error const& e) {
      r.wrong_type = e.what();
    }
    try {
      (void)c.slot<"z", float>();
    } catch (slot_error const& e) {
      r.wrong_name = e.what();
    }
  };
  auto bwd = [&](bwd_ctx const& c) {
    auto& r = bwd_seen[c.layer];
    auto const x = c.slot(typed_x);
    static_assert(std::is_same_v<decltype(x), std::span<float const> const>);  // read-only in backward
    r.same_span = same(x, c.slot(0)) && same(c.slot(typed_y), c.slot(1)) && same(c.slot<"x", float>(), c.slot(0)) &&
                  same(c.slot<"y">(), c.slot(1));
    try {
      (void)c.slot(other_x);
    } catch (slot_error const& e) {
      r.wrong_type = e.what();
    }
    try {
      (void)c.slot<"input">();
    } catch (slot_error const& e) {
      r.wrong_name = e.what();
    }
  };
  exec.step(fwd, bwd);
  exec.step(fwd, bwd);  // the per-thread cache of the name form, warm
  for (std::uint32_t l = 0; l < 3; ++l) {
    auto const L = std::to_string(l);
    for (auto const* r : {&fwd_seen[l], &rec_seen[l], &bwd_seen[l]}) {
      EXPECT_TRUE(r->same_span) << "layer " << l;
      EXPECT_TRUE(contains(r->wrong_type, "a slot handle of layer type 'other' was used in layer " + L +
                                              ", of type 'typed'"))
          << r->wrong_type;
    }
    EXPECT_TRUE(fwd_seen[l].produces) << l;
    EXPECT_TRUE(rec_seen[l].produces) << l;
    EXPECT_TRUE(contains(fwd_seen[l].wrong_name, "layer " + L + " (typed) has no slot 'z'; its slots are: x, y"))
        << fwd_seen[l].wrong_name;
    EXPECT_TRUE(contains(bwd_seen[l].wrong_name, "layer " + L + " (typed) has no slot 'input'; its slots are: x, y"))
        << bwd_seen[l].wrong_name;
  }
}

TEST(SlotHandles, AWrongHandleFailsTheStepWithASlotError) {
  auto const s = build_schedule(typed_stack::spec(), strategy{});
  host_backend b;
  executor exec(b, s);
  auto noop = [](auto const&) {};
  try {
    exec.step([](auto const& c) { (void)c.slot(other_x); }, noop);
    FAIL() << "expected a slot_error";
  } catch (slot_error const& e) {
    EXPECT_TRUE(contains(e.what(), "'other'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'typed'")) << e.what();
  }
  // An index out of range is a slot_error too, in every build.
  try {
    exec.step(noop, [](auto const& c) { (void)c.slot(std::uint16_t{2}); });
    FAIL() << "expected a slot_error";
  } catch (slot_error const& e) {
    EXPECT_TRUE(contains(e.what(), "slot index 2 is out of range")) << e.what();
  }
  std::vector<float> sums;
  EXPECT_NO_THROW(exec.step([](auto const& c) { std::ranges::fill(c.slot(typed_x), 1.5f); },
                            [&](auto const& c) {
                              float t = 0;
                              for (float v : c.slot(typed_x)) t += v;
                              sums.push_back(t);
                            }));
  EXPECT_EQ(sums, (std::vector<float>{24, 24, 24}));
}

// ---- timelines through the executor ------------------------------------------------------------

namespace {
//! Each op of `s` appears once in `t`, with a non-negative interval.
void expect_every_op_once(timeline const& t, schedule_view s) {
  ASSERT_EQ(t.ops.size(), s.ops.size());
  std::vector<int> seen(s.ops.size(), 0);
  for (auto const& sp : t.ops) {
    ASSERT_LT(sp.op, s.ops.size());
    ++seen[sp.op];
    EXPECT_EQ(sp.stream, s.ops[sp.op].stream) << "op " << sp.op;
    EXPECT_LE(sp.begin_us, sp.end_us) << "op " << sp.op;
  }
  EXPECT_EQ(seen, std::vector<int>(s.ops.size(), 1));
}
}  // namespace

TEST(Timeline, ExecutorOptionsTimelineIsFilledOnTheHostBackend) {
  auto const s = chain_schedule();
  host_backend b;
  timeline t;
  executor exec(b, s, {.timeline = &t});
  EXPECT_EQ(exec.options().timeline, &t);
  workload::chain w(s);
  auto fwd = [&](auto const& c) { w.forward(c); };
  auto bwd = [&](auto const& c) { w.backward(c); };
  auto noop = [](auto const&) {};
  hooks const h{.before_forward = noop, .after_backward = noop};
  exec.step(fwd, bwd, h);
  expect_every_op_once(t, s);
  // Switched to another timeline: the first keeps the step it had.
  std::vector<std::uint64_t> got;
  w.update(got);
  auto const first = t.ops.size();
  timeline t2;
  exec.record_timeline(&t2);
  exec.enqueue(fwd, bwd, h);
  exec.wait();
  expect_every_op_once(t2, s);
  EXPECT_EQ(t.ops.size(), first);
  exec.record_timeline(nullptr);
  t2.clear();
  exec.step(fwd, bwd, h);
  EXPECT_TRUE(t2.ops.empty());
}

TEST(Timeline, ExecutorOptionsTimelineIsFilledOnTheSimBackend) {
  auto const s = chain_schedule();
  auto const costs = uniform_costs(s.layer_count(), layer_cost{.forward_us = 100, .backward_us = 200, .gather_us = 10, .reduce_us = 30},
                                   host_link::symmetric(100e6, 5));
  sim_backend b(costs);
  timeline t;
  auto o = sim_executor_options();
  o.timeline = &t;
  executor exec(b, s, o);
  auto none = [](auto const&) {};
  exec.step(none, none, chain_hooks);
  expect_every_op_once(t, s);
  double last = 0;
  for (auto const& sp : t.ops) last = std::max(last, sp.end_us);
  EXPECT_DOUBLE_EQ(b.step_us(), last);
  EXPECT_GE(b.step_us(), costs.compute_us());
  // The same as simulate(), which takes the same path.
  auto const r = simulate(s, costs);
  ASSERT_EQ(r.trace.ops.size(), t.ops.size());
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    EXPECT_EQ(r.trace.ops[i].op, t.ops[i].op);
    EXPECT_DOUBLE_EQ(r.trace.ops[i].begin_us, t.ops[i].begin_us);
    EXPECT_DOUBLE_EQ(r.trace.ops[i].end_us, t.ops[i].end_us);
  }
  EXPECT_EQ(r.trace.waits.size(), t.waits.size());
}

// ---- the sim backend checks its cost table against the schedule --------------------------------

TEST(SimBackend, CostTableOfTheWrongLayerCountIsRejectedAtExecutorConstruction) {
  auto const s = chain_schedule();  // 5 layers
  for (std::uint32_t layers : {4u, 6u, 0u}) {
    auto const costs = uniform_costs(layers, layer_cost{.forward_us = 1, .backward_us = 2});
    sim_backend b(costs);
    try {
      executor exec(b, s, sim_executor_options());
      FAIL() << "an executor accepted a cost table of " << layers << " layers for a 5-layer schedule";
    } catch (cost_model_error const& e) {
      EXPECT_TRUE(contains(e.what(), "the schedule has 5 layers but the cost table has " + std::to_string(layers)))
          << e.what();
    }
  }
  auto const right = uniform_costs(5, layer_cost{.forward_us = 1, .backward_us = 2});
  sim_backend b(right);
  executor exec(b, s, sim_executor_options());
  auto none = [](auto const&) {};
  EXPECT_NO_THROW(exec.step(none, none, chain_hooks));
  EXPECT_GE(b.step_us(), right.compute_us());
}

// ---- backends shared by executors while a step is enqueued ---------------------------------------

TEST(Enqueue, AnotherExecutorOnABackendWithAStepEnqueuedIsRefusedUntilItIsWaitedFor) {
  auto const s = chain_schedule();
  host_backend b;
  auto const want = workload::run_chain(b, s, 1);
  executor first(b, s);
  workload::chain w(s);
  auto fwd = [&](auto const& c) { w.forward(c); };
  auto bwd = [&](auto const& c) { w.backward(c); };
  first.enqueue(fwd, bwd, chain_hooks);
  // Its setup would replace the events and queues the enqueued step's workers are using.
  try {
    executor second(b, s);
    FAIL() << "an executor was set up on a backend with a step enqueued";
  } catch (tide::error const& e) {
    EXPECT_TRUE(contains(e.what(), "setup while a step is enqueued on this backend")) << e.what();
  }
  first.wait();
  std::vector<std::uint64_t> got;
  w.update(got);
  EXPECT_EQ(got, want);
  executor second(b, s);  // now it may
  EXPECT_EQ(workload::run_chain(b, s, 1), want);
}

namespace {
struct finish_counter {
  int calls = 0, finished = 0;
  void operator()(collective_context<stream_role> const&) { ++calls; }
  void finish_step() { ++finished; }
};
}  // namespace

TEST(Enqueue, AnExecutorDestroyedWithAStepEnqueuedDrainsItWithoutTellingTheHooksAndTheBackendGoesOn) {
  auto const s = chain_schedule();
  host_backend b;
  auto const want = workload::run_chain(b, s, 1);
  auto counter = std::make_unique<finish_counter>();
  {
    workload::chain w(s);
    auto fwd = [&](auto const& c) { w.forward(c); };
    auto bwd = [&](auto const& c) { w.backward(c); };
    hooks h{.before_forward = std::ref(*counter), .after_backward = std::ref(*counter)};
    executor exec(b, s);
    exec.enqueue(fwd, bwd, h);
  }  // the executor goes first: its destructor waits for the step (w and h are still alive)
  EXPECT_EQ(counter->calls, static_cast<int>(2 * s.layer_count()));  // every hook ran
  EXPECT_EQ(counter->finished, 0);  // but the hooks, which may be gone, were not told
  EXPECT_EQ(workload::run_chain(b, s, 1), want);  // the backend is free and the next step right
}

TEST(Timeline, RecordTimelineWhileAStepIsEnqueuedWaitsForItFirst) {
  auto const s = chain_schedule();
  host_backend b;
  timeline t, t2;
  executor exec(b, s, {.timeline = &t});
  workload::chain w(s);
  auto fwd = [&](auto const& c) { w.forward(c); };
  auto bwd = [&](auto const& c) { w.backward(c); };
  exec.enqueue(fwd, bwd, chain_hooks);
  exec.record_timeline(&t2);  // the workers write `t` until the step ends: it ends first
  EXPECT_FALSE(exec.pending());
  expect_every_op_once(t, s);
  EXPECT_TRUE(t2.ops.empty());
  exec.step(fwd, bwd, chain_hooks);
  expect_every_op_once(t2, s);
}

TEST(SimBackend, ExecutorsSharingOneBackendEachGetTheirOwnSchedulesCosts) {
  // Two schedules of one stack with different remat (so different recompute costs) and event
  // counts: stepping them alternately on one backend gives each its own simulated time.
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 1000}, {"act", 333}}}, 5);
  auto const a = build_schedule(st, {.policy = rules({r_remat({"h"}, 1, 4)})});
  auto const c = build_schedule(st, {.policy = rules({r_offload({"input"}), r_remat({"h", "act"}, 0, 5)}),
                                     .pipeline = {.chunk_bytes = 1024}});
  ASSERT_NE(a.event_count, c.event_count);
  auto costs = uniform_costs(5, layer_cost{.forward_us = 100, .backward_us = 200, .slot_recompute_us = {0, 30, 10}},
                             host_link::symmetric(100e6, 5));
  double const alone_a = simulate_step_us(a, costs), alone_c = simulate_step_us(c, costs);
  ASSERT_NE(alone_a, alone_c);
  sim_backend b(costs);
  executor ea(b, a, sim_executor_options());
  executor ec(b, c, sim_executor_options());
  auto none = [](auto const&) {};
  for (int i = 0; i < 2; ++i) {
    ea.step(none, none);
    EXPECT_DOUBLE_EQ(b.step_us(), alone_a);
    ec.step(none, none);
    EXPECT_DOUBLE_EQ(b.step_us(), alone_c);
  }
}

TEST(SimBackend, AScheduleRebuiltInPlaceIsTakenAnewByTheNextExecutor) {
  // build_schedule_into reuses the schedule's storage: the second schedule has the first one's
  // address, slot count and event count, but rematerializes other slots (other recompute costs).
  stack_spec st;
  st.append({"blk", {{"input", 4096, true}, {"h", 1000}, {"act", 333}}}, 5);
  auto const costs = uniform_costs(5, layer_cost{.forward_us = 100, .backward_us = 200, .slot_recompute_us = {0, 30, 10}});
  sim_backend b(costs);
  schedule s;
  std::vector<double> got, want;
  for (auto slot : {"h", "act"}) {
    build_schedule_into(s, st, {.policy = rules({r_remat({slot})})});
    want.push_back(simulate_step_us(s, costs));
    executor ex(b, s, sim_executor_options());
    auto none = [](auto const&) {};
    ex.step(none, none);
    got.push_back(b.step_us());
  }
  ASSERT_NE(want[0], want[1]);
  EXPECT_EQ(got, want);
}

// ---- run-time stacks (issue 23, item 2, in part) ---------------------------------------------
// Handles resolved once from a stack built at run time, the layer type as an index in the
// context, a typed by-index accessor, the forward lambda's mode, and policy rules that count
// layers from the end of the stack (their file and C++ spellings: tests/io/json_test.cpp).

namespace {
//! Two layer types built at run time (names from strings that outlive the stack), a carry.
stack_spec two_type_stack(std::vector<std::string> const& names, std::uint32_t dense, std::uint32_t moe) {
  stack_spec st;
  st.carry = {"h", 64};
  st.append({names[0], {{names[2], 256}, {names[3], 128}}}, dense);
  st.append({names[1], {{names[3], 128}, {names[4], 512}, {names[2], 256}}}, moe);
  return st;
}
bool mentions(std::string const& s, char const* what) { return s.find(what) != std::string::npos; }
}  // namespace

TEST(RunTimeStack, HandlesResolveOnceAndMisuseNamesWhatExists) {
  std::vector<std::string> const names{"dense", "moe", "q", "act", "router"};
  auto const st = two_type_stack(names, 2, 2);
  auto const q_dense = st.handle<float>("dense", "q");
  auto const q_moe = st.handle<float>("moe", "q");
  EXPECT_EQ(q_dense.index, 0);
  EXPECT_EQ(q_moe.index, 2);
  EXPECT_EQ(st.type_index("moe"), 1u);
  try {
    (void)st.handle<float>("moe", "qq");
    FAIL() << "a misspelled slot was resolved";
  } catch (slot_error const& e) {
    EXPECT_TRUE(mentions(e.what(), "layer type 'moe' has no slot 'qq'; its slots are: 'act', 'router', 'q'")) << e.what();
  }
  try {
    (void)st.type_index("mlp");
    FAIL() << "a missing layer type was resolved";
  } catch (slot_error const& e) {
    EXPECT_TRUE(mentions(e.what(), "no layer type 'mlp'; its types are: 'dense', 'moe'")) << e.what();
  }

  // In the lambdas: the handle of the context's type (picked by ctx.type_index), the same span as
  // by index, typed; the mode; a handle of the other type refused by name.
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"router"}}},
                                     .checkpoints = {.device_snapshots = 2}});
  host_backend b;
  executor exec(b, s);
  std::mutex m;
  std::set<std::tuple<std::uint32_t, forward_mode>> modes;
  std::vector<std::string> errors;
  int same = 0, typed = 0, calls = 0;
  slot_handle<float> const q_of_type[] = {q_dense, q_moe};
  auto fwd = [&](executor<host_backend>::forward_context_type const& c) {
    std::lock_guard lock(m);
    ++calls;
    modes.insert({c.layer, c.mode});
    EXPECT_EQ(c.type_index, st.layer_types[c.layer]);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    EXPECT_EQ(c.recompute, c.mode != forward_mode::forward);  // the deprecated 0.2 spellings still work
    EXPECT_EQ(c.advance, c.mode == forward_mode::advance);
#pragma GCC diagnostic pop
    auto const q = c.slot(q_of_type[c.type_index]);
    same += q.data() == reinterpret_cast<float*>(c.slot(q_of_type[c.type_index].index).data()) && q.size() == 64;
    typed += c.template slot_as<float>(q_of_type[c.type_index].index).data() == q.data();
    try {
      (void)c.slot(q_of_type[1 - c.type_index]);
    } catch (slot_error const& e) {
      errors.push_back(e.what());
    }
    if (c.produces_carry()) std::fill(c.carry_out().begin(), c.carry_out().end(), std::byte{1});
  };
  auto bwd = [&](executor<host_backend>::backward_context_type const& c) {
    std::lock_guard lock(m);
    typed += c.template slot_as<float>(q_of_type[c.type_index].index).size() == 64;
  };
  exec.step(fwd, bwd);
  // 4 forwards; 2 device snapshots of 5 carries: advances re-run layers; the remat router recomputed.
  EXPECT_TRUE(modes.count({0, forward_mode::forward}) && modes.count({3, forward_mode::forward}));
  EXPECT_TRUE(modes.count({2, forward_mode::recompute}) || modes.count({3, forward_mode::recompute}));
  bool advanced = false;
  for (auto const& [l, md] : modes) advanced |= md == forward_mode::advance;
  EXPECT_TRUE(advanced);
  EXPECT_EQ(same, calls);
  EXPECT_EQ(typed, calls + 4);
  ASSERT_EQ(errors.size(), static_cast<std::size_t>(calls));
  EXPECT_TRUE(mentions(errors.front(), "a slot handle of layer type")) << errors.front();
}

TEST(RunTimeStack, RulesCountLayersFromTheEnd) {
  EXPECT_EQ(from_end(0), all_layers);
  EXPECT_EQ(resolve_layer(from_end(2), 6), 4u);
  EXPECT_EQ(resolve_layer(from_end(9), 6), 0u);
  EXPECT_EQ(resolve_layer(3, 6), 3u);
  // The last two layers offloaded, whatever the depth.
  strategy const last_two{.policy = {rule_spec{.where = placement::offload, .slots = {"x"}, .first_layer = from_end(2)}}};
  for (std::uint32_t layers : {3u, 6u, 40u}) {
    stack_spec st;
    st.independent_layers = true;
    st.append({"l", {{"x", 4096}, {"y", 64}}}, layers);
    auto const s = build_schedule(st, last_two);
    for (std::uint32_t l = 0; l < layers; ++l)
      EXPECT_EQ(s.view().slots_of(l)[0].where, l + 2 >= layers ? placement::offload : placement::keep) << layers << " " << l;
    // The sweep (many rules and slots) agrees with asking each pair.
    EXPECT_EQ(detail::swept_deciding_rules(last_two.policy, st), last_two.policy.deciding_rules(st));
  }
  // Everything but the first and the last layer.
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"x", 4096}}}, 5);
  auto const middle = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .first_layer = 1, .last_layer = from_end(1)}}});
  for (std::uint32_t l = 0; l < 5; ++l) EXPECT_EQ(middle.view().slots_of(l)[0].where, l >= 1 && l < 4 ? placement::remat : placement::keep);
  // Empty once resolved: rejected by name, with the resolved range.
  auto const empty = find_schedule_issue(st, {.policy = {rule_spec{.where = placement::remat, .first_layer = 4, .last_layer = from_end(2)}}});
  EXPECT_EQ(empty.code, schedule_issue_code::empty_rule_range);
  EXPECT_EQ(empty.value, 4u);
  EXPECT_EQ(empty.limit, 3u);
  EXPECT_EQ(to_message(empty),
            "tide: a policy rule's layer range, counted from the end, is [4, 3) in this stack, an empty range: it must select at "
            "least one layer of the stacks it is used with");
  // Unordered in every stack: the bounds as the rule spells them, and advice that fits them ("[1, 3)
  // ... use first < last" was said of [from_end(1), from_end(3))).
  auto const message = [&](layer_bound first, layer_bound last) {
    return to_message(find_schedule_issue(st, {.policy = {rule_spec{.where = placement::remat, .first_layer = first, .last_layer = last}}}));
  };
  auto const ff = message(from_end(1), from_end(3));
  EXPECT_NE(ff.find("selects layers [tide::from_end(1), tide::from_end(3)), an empty range: counts from the end descend"), std::string::npos) << ff;
  EXPECT_NE(ff.find("[tide::from_end(3), tide::from_end(1)) if that is meant"), std::string::npos) << ff;
  auto const fi = message(from_end(2), 3);
  EXPECT_NE(fi.find("[tide::from_end(2), 3), an empty range: a count from the end cannot come before an index"), std::string::npos) << fi;
  EXPECT_NE(message(3, 1).find("selects layers [3, 1), an empty range: use first < last"), std::string::npos);
  // One spelling per bound: 0 back is the end, counts past max_from_end are max_from_end, however built.
  EXPECT_EQ(layer_bound(0, true), layer_bound{all_layers});
  EXPECT_EQ(layer_bound::counted_from_end(0), from_end(0));
  EXPECT_EQ(layer_bound(2'000'000'000u, true), from_end(max_from_end));
  EXPECT_EQ(from_end(5), layer_bound(5, true));
}

// The type-level spelling: the same policy at compile time.
using last_two_type = strategy_of<policy<offload<slot_names<"x">, layer_range<from_end(2)>>>>;
using six = stack<independent_layers, repeat<layer<"l", slot<"x", 4096>, slot<"y", 64>>, 6>>;
constexpr auto last_two_static = make_schedule<six, last_two_type>();
static_assert(last_two_static.slots[2 * 4].where == placement::offload && last_two_static.slots[2 * 3].where == placement::keep);

// A slot map: every slot of the context's layer by the user's own index, in every mode; the
// produced set is ctx.produces; misuse (a slot no index names, two indices of one name, a map of
// another stack) is a slot_error naming it, and the executor goes on.
TEST(RunTimeStack, ASlotMapGivesTheSlotsByTheUsersIndex) {
  std::vector<std::string> const names{"dense", "moe", "q", "act", "router"};
  auto const st = two_type_stack(names, 2, 2);
  enum idx : std::size_t { q, act, router, unused, count };
  static constexpr std::array<char const*, count> by_index{"q", "act", "router", "unused"};
  slot_map<float, count> const map(st, [](std::size_t i) { return by_index[i]; });
  EXPECT_EQ(map.handle(1, router).index, 1);
  // Names given as temporaries (a std::string per call) resolve the same.
  slot_map<float, count> const from_strings(st, [](std::size_t i) { return std::string(by_index[i]) + ""; });
  EXPECT_EQ(from_strings.handle(1, router).index, 1);
  EXPECT_EQ(from_strings.handle(0, act).index, map.handle(0, act).index);
  EXPECT_THROW((void)map.handle(0, router), slot_error);  // dense has no router

  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"router"}}},
                                     .checkpoints = {.device_snapshots = 2}});
  host_backend b;
  executor exec(b, s);
  std::mutex m;
  int checked = 0, calls = 0;
  auto fwd = [&](executor<host_backend>::forward_context_type const& c) {
    std::lock_guard lock(m);
    ++calls;
    auto const sv = map.spans(c);
    auto const produced = map.produced(c);
    for (std::size_t i = 0; i < count; ++i) {
      auto const bound = map.bound(c).test(i);
      EXPECT_EQ(bound, i != unused && (i != router || c.type_index == 1)) << i;
      if (!bound) {
        EXPECT_TRUE(sv[i].empty());
        EXPECT_FALSE(produced.test(i));
        continue;
      }
      auto const k = c.slot_index(by_index[i]);
      checked += sv[i].data() == c.template slot_as<float>(k).data() && sv[i].size() == c.template slot_as<float>(k).size() &&
                 produced.test(i) == c.produces(k);
    }
    if (c.produces_carry()) std::fill(c.carry_out().begin(), c.carry_out().end(), std::byte{1});
  };
  auto bwd = [&](executor<host_backend>::backward_context_type const& c) {
    std::lock_guard lock(m);
    auto const sv = map.spans(c);
    static_assert(std::is_same_v<decltype(sv)::value_type, std::span<float const>>);
    checked += sv[q].data() == c.template slot_as<float>(c.slot_index("q")).data();
  };
  exec.step(fwd, bwd);
  EXPECT_GT(calls, 4);  // advances and recomputes too
  int expected = 0;  // each forward, recompute and advance checks its type's slots (dense 2, moe 3), each backward q
  for (auto const& o : s.ops)
    if (o.kind == op_kind::forward || o.kind == op_kind::recompute || o.kind == op_kind::advance)
      expected += st.layer_types[o.layer] == 0 ? 2 : 3;
    else if (o.kind == op_kind::backward)
      ++expected;
  EXPECT_EQ(checked, expected);

  // Misuse.
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (slot_error const& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_TRUE(mentions(error_of([&] { slot_map<float, 2>(st, [](std::size_t i) { return i == 0 ? "q" : "act"; }); }),
                       "slot 'router' of layer type 'moe' has no index"));
  EXPECT_TRUE(mentions(error_of([&] { slot_map<float, 3>(st, [](std::size_t i) { return i == 2 ? "q" : by_index[i]; }); }),
                       "indices 0 and 2 are both named 'q'"));
  stack_spec one;
  one.carry = {"h", 64};
  one.append({"solo", {{"q", 256}}}, 1);
  slot_map<float, count> const other(one, [](std::size_t i) { return by_index[i]; });
  std::string failed;
  try {
    exec.step([&](auto const& c) { (void)other.spans(c); }, [](auto const&) {});
  } catch (slot_error const& e) {
    failed = e.what();
  }
  EXPECT_TRUE(mentions(failed, "the map was made from a stack of 1 type(s)") || mentions(failed, "a slot handle of layer type"))
      << failed;
  exec.step(fwd, bwd);  // the executor goes on
}

// An advance (a segment recomputation) gets every slot of its layer as scratch from tide's arena:
// sized for the largest layer advanced, inside the predicted peak, apart from everything live.
// The carry chain's advances write junk there, and the gradients still equal storing every carry.
TEST(RunTimeStack, AnAdvanceWritesItsSlotsIntoScratchInsideThePeak) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"small", {{"a", 1000}, {"b", 300}}}, 2);
  st.append({"big", {{"a", 1000}, {"c", 5000}}}, 4);
  st.carry = {"x", 512};
  auto const all = build_schedule(st, strategy{});
  EXPECT_EQ(all.arena.advance_scratch_bytes, 0u);  // nothing advanced
  host_backend b;
  auto const want = workload::run_carry_chain(b, all, 2);
  for (bool share : {false, true})
    for (bool offload : {false, true}) {
      strategy how{.checkpoints = {.device_snapshots = 2}};
      how.buffers.share_phase_regions = share;
      if (offload) how.policy.rules.push_back({.where = placement::offload, .slots = {"c"}});
      auto const s = build_schedule(st, how);
      ASSERT_GT(s.carry.advances, 0u);
      auto const align = [&](std::size_t n) { return (n + how.buffers.device_alignment - 1) / how.buffers.device_alignment * how.buffers.device_alignment; };
      EXPECT_EQ(s.arena.advance_scratch_bytes, align(1000) + align(5000));  // a "big" layer's slots
      for (std::uint32_t l = 0; l < s.layer_count(); ++l) {
        bool advanced = false;
        for (auto const& o : s.ops) advanced |= o.kind == op_kind::advance && o.layer == l;
        if (!advanced) continue;
        for (auto const& sl : s.view().slots_of(l)) {
          EXPECT_GE(sl.advance_offset, s.arena.backward_area + s.arena.staging_ring_bytes);
          EXPECT_LE(sl.advance_offset + sl.bytes, s.arena.backward_area + s.arena.staging_ring_bytes + s.arena.advance_scratch_bytes);
          EXPECT_LE(sl.advance_offset + sl.bytes, s.peak_device_bytes());
        }
      }
      EXPECT_EQ(workload::run_carry_chain(b, s, 2, {.debug_checks = true, .check_schedule = true}), want)
          << "share " << share << " offload " << offload;
    }
}

// The executor checks a schedule (check_schedule) before anything indexes the bindings by its
// ops: a prefetch naming a layer the schedule has not is refused by name, nothing is read out
// of bounds (ASan), and the backend is usable afterwards.
TEST(RunTimeStack, AMalformedScheduleIsRefusedBeforeTheExecutorIndexesIt) {
  stack_spec st;
  st.independent_layers = true;
  st.append({"l", {{"x", 4096, true}}}, 3);
  auto s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}});
  auto prefetch = std::find_if(s.ops.begin(), s.ops.end(), [](op const& o) { return o.kind == op_kind::prefetch; });
  ASSERT_NE(prefetch, s.ops.end());
  prefetch->layer = 1000;
  host_backend b;
  try {
    executor exec(b, s, {.debug_checks = true, .check_schedule = true});
    FAIL() << "a prefetch of layer 1000 was accepted";
  } catch (schedule_error const& e) {
    EXPECT_TRUE(mentions(e.what(), "tide::check_schedule")) << e.what();
  }
  auto const good = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}});
  executor exec(b, good);
  exec.step([](auto const& c) {
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (c.produces(k)) std::fill(c.slot(k).begin(), c.slot(k).end(), std::byte{1});
  }, [](auto const&) {});
}
