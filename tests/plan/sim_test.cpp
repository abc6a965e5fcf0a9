// The sim backend: exact virtual times on a 3-layer program checked by hand, link sharing,
// recompute costs per rematted slot, determinism, capacity errors.
#include <gtest/gtest.h>

#include <tide/backends/sim/sim_backend.hpp>
#include <tide/tide.hpp>

#include <vector>

using namespace tide;

namespace {

using blk = layer<"blk", slot<"a", 1000>, slot<"b", 3000>>;
using three = stack<repeat<blk, 3>>;
using offload_b = policy<offload<slots<"b">>>;

struct span_want {
  op_kind kind;
  std::uint32_t layer;
  stream_role stream;
  double begin, end;
};

void expect_spans(schedule_view s, timeline const& t, std::vector<span_want> const& want) {
  ASSERT_EQ(t.ops.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto const& sp = t.ops[i];
    auto const& o = s.ops[sp.op];
    EXPECT_EQ(o.kind, want[i].kind) << "span " << i;
    EXPECT_EQ(o.layer, want[i].layer) << "span " << i;
    EXPECT_EQ(sp.stream, want[i].stream) << "span " << i;
    EXPECT_DOUBLE_EQ(sp.begin_us, want[i].begin) << "span " << i << " (" << to_string(o.kind) << " L" << o.layer << ")";
    EXPECT_DOUBLE_EQ(sp.end_us, want[i].end) << "span " << i << " (" << to_string(o.kind) << " L" << o.layer << ")";
  }
}

// forward 100 us, backward 200 us; 3000 bytes at 30 MB/s = 100 us per copy.
cost_table hand_costs() {
  return uniform_costs(3, layer_cost{.forward_us = 100, .backward_us = 200}, link_spec::symmetric(30e6));
}

using enum stream_role;
using k = op_kind;

}  // namespace

TEST(Sim, ThreeLayerOffloadTimelineByHand) {
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, {true, 1, 0, 2});
  auto costs = hand_costs();
  auto r = simulate(s, costs);
  // Program (see core_test): f0 o0 f1 o1 f2(<-o0) o2 p2(<-o2, first backward-area use) p1
  // b2(<-p2) p0(<-b2) b1(<-p1) b0(<-p0).
  expect_spans(s, r.trace,
               {
                   {k::forward, 0, compute, 0, 100},
                   {k::offload, 0, d2h, 100, 200},
                   {k::forward, 1, compute, 100, 200},
                   {k::offload, 1, d2h, 200, 300},
                   {k::forward, 2, compute, 200, 300},
                   {k::offload, 2, d2h, 300, 400},
                   {k::prefetch, 2, h2d, 400, 500},
                   {k::prefetch, 1, h2d, 500, 600},
                   {k::backward, 2, compute, 500, 700},
                   {k::prefetch, 0, h2d, 700, 800},
                   {k::backward, 1, compute, 700, 900},
                   {k::backward, 0, compute, 900, 1100},
               });
  // Blocking waits, in issue order: d2h for f0 (0-100), h2d for o2 (0-400), compute for p2
  // (300-500), h2d for b2 (600-700). b0 finds p0 done (800 < 900): no wait.
  struct wait_want {
    stream_role stream;
    double begin, end;
  };
  std::vector<wait_want> waits = {{d2h, 0, 100}, {h2d, 0, 400}, {compute, 300, 500}, {h2d, 600, 700}};
  ASSERT_EQ(r.trace.waits.size(), waits.size());
  for (std::size_t i = 0; i < waits.size(); ++i) {
    EXPECT_EQ(r.trace.waits[i].stream, waits[i].stream) << i;
    EXPECT_DOUBLE_EQ(r.trace.waits[i].begin_us, waits[i].begin) << i;
    EXPECT_DOUBLE_EQ(r.trace.waits[i].end_us, waits[i].end) << i;
  }
  EXPECT_DOUBLE_EQ(r.summary.step_us, 1100);
  EXPECT_DOUBLE_EQ(r.summary.compute_us, 900);
  EXPECT_DOUBLE_EQ(r.summary.exposed_transfer_us, 200);  // b2 waited 300 -> 500 for p2
  EXPECT_EQ(r.summary.predicted_device_bytes, s.peak_device_bytes());
  EXPECT_EQ(r.summary.predicted_host_bytes, s.peak_host_bytes());
  EXPECT_DOUBLE_EQ(simulate_step_us(s, costs), 1100);
}

TEST(Sim, NaivePipelineSerializesCopiesOnCompute) {
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, {false, 0, 0, 2});
  auto costs = hand_costs();
  auto r = simulate(s, costs);
  // 3 x (100 + 200) compute + 6 copies x 100, all on one stream.
  EXPECT_DOUBLE_EQ(r.summary.step_us, 900 + 600);
  EXPECT_DOUBLE_EQ(r.summary.exposed_transfer_us, 600);
  for (auto const& sp : r.trace.ops) EXPECT_EQ(sp.stream, compute);
}

TEST(Sim, ChunksPayLatencyPerChunk) {
  auto costs = hand_costs();
  costs.link = link_spec::symmetric(30e6, 10e-6);
  // 3000 bytes in chunks of 1024: 3 chunks, each 10 us latency plus bytes / 30 per us.
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, {true, 1, 1024, 2});
  auto r = simulate(s, costs);
  double d2h_total = 0;
  for (auto const& sp : r.trace.ops)
    if (s.ops[sp.op].kind == k::offload && s.ops[sp.op].layer == 0) d2h_total += sp.end_us - sp.begin_us;
  EXPECT_NEAR(d2h_total, 3 * 10 + 3000 / 30.0, 1e-9);
}

TEST(Sim, RecomputeCostsOnlyRematSlots) {
  auto costs = uniform_costs(3, layer_cost{100, 200, 90, {30, 70}});
  auto s = build_schedule(three::spec(), policy<remat<slots<"b">>>::spec());
  auto r = simulate(s, costs);
  EXPECT_DOUBLE_EQ(r.summary.step_us, 900 + 3 * 70);  // each layer recomputes b only
  auto all = build_schedule(three::spec(), policy<remat<>>::spec());
  EXPECT_DOUBLE_EQ(simulate_step_us(all, costs), 900 + 3 * 90);  // 30 + 70 capped at the full 90
  costs.layers[1].slot_recompute_us.clear();
  EXPECT_DOUBLE_EQ(simulate_step_us(s, costs), 900 + 70 + 90 + 70);  // no per-slot costs: the full 90
}

TEST(Sim, SharedLinkSerializesDirections) {
  auto costs = hand_costs();
  auto s = build_schedule(three::spec(), offload_b::spec());
  for (bool duplex : {true, false}) {
    costs.link.full_duplex = duplex;
    sim_backend b(costs);
    timeline t;
    b.record_timeline(&t);
    b.setup({4, 0, 0, 0});
    b.begin_step();
    op off{k::offload, d2h};
    op pre{k::prefetch, h2d};
    b.copy(d2h, 0, off, nullptr, nullptr, 3000);
    b.copy(h2d, 1, pre, nullptr, nullptr, 3000);
    b.end_step();
    EXPECT_DOUBLE_EQ(b.step_us(), duplex ? 100 : 200) << "duplex " << duplex;
    EXPECT_DOUBLE_EQ(t.ops[1].begin_us, duplex ? 0 : 100);
  }
}

TEST(Sim, CollectivesRunOnTheCommStream) {
  auto costs = uniform_costs(3, layer_cost{100, 200, -1, {}, 50, 400});
  auto s = build_schedule(three::spec(), keep_all::spec(), {}, {}, {true, true});
  auto r = simulate(s, costs);
  // Gathers run ahead (one layer early) and hide; the last gradient collective (after b0 ends at
  // 50 + 300 + 600 = 950... ) is exposed: step ends after it.
  double last_backward_end = 0, comm_end = 0;
  for (auto const& sp : r.trace.ops) {
    if (s.ops[sp.op].kind == k::backward) last_backward_end = std::max(last_backward_end, sp.end_us);
    if (sp.stream == comm) comm_end = std::max(comm_end, sp.end_us);
  }
  EXPECT_DOUBLE_EQ(r.summary.step_us, comm_end);
  EXPECT_GE(comm_end, last_backward_end + 400);
  EXPECT_DOUBLE_EQ(r.trace.ops.front().end_us, 50);  // gather of layer 0 first
}

TEST(Sim, IsDeterministic) {
  stack_spec st;
  st.append({"dense", {{"x", 512}, {"q", 4096}, {"up", 10000}}}, 5).append({"moe", {{"x", 512}, {"e", 7777}}}, 20);
  cost_table costs;
  for (std::uint32_t l = 0; l < 25; ++l)
    costs.layers.push_back({.forward_us = 100.0 + l, .backward_us = 210.0 + 3 * l});
  costs.link = link_spec::symmetric(50e6, 2e-6, false);
  auto s = build_schedule(st, policy_spec{rule_spec{placement::offload, {"up", "e"}, 0, 20, 0},
                                          rule_spec{placement::remat, {"q"}, 0, all_layers, 0}},
                          {3}, {true, 2, 3000, 2});
  auto a = simulate(s, costs);
  for (int i = 0; i < 3; ++i) {
    auto b = simulate(s, costs);
    ASSERT_EQ(a.trace.ops.size(), b.trace.ops.size());
    for (std::size_t j = 0; j < a.trace.ops.size(); ++j) {
      EXPECT_EQ(a.trace.ops[j].op, b.trace.ops[j].op);
      EXPECT_EQ(a.trace.ops[j].begin_us, b.trace.ops[j].begin_us);
      EXPECT_EQ(a.trace.ops[j].end_us, b.trace.ops[j].end_us);
    }
    EXPECT_EQ(a.summary.step_us, b.summary.step_us);
  }
  // The executor runs it step after step with the same result.
  sim_backend be(costs);
  be.bind(s);
  executor<sim_backend> ex(be, s, sim_executor_options());
  auto none = [](auto const&) {};
  ex.step(none, none);
  ex.step(none, none);
  EXPECT_EQ(be.step_us(), a.summary.step_us);
  EXPECT_GE(a.summary.step_us, costs.compute_us());
}

TEST(Sim, CapacityAndMismatchErrorsNameTheProblem) {
  auto s = build_schedule(three::spec(), keep_all::spec());
  auto costs = hand_costs();
  try {
    simulate(s, costs, {.device_capacity = 1000});
    FAIL() << "expected out_of_memory";
  } catch (out_of_memory const& e) {
    EXPECT_EQ(e.requested, s.peak_device_bytes());
    EXPECT_NE(std::string(e.what()).find("sim backend device arena"), std::string::npos) << e.what();
  }
  auto two = uniform_costs(2, layer_cost{.forward_us = 1, .backward_us = 2});
  try {
    simulate(s, two);
    FAIL() << "expected schedule_error";
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("cost table has 2"), std::string::npos) << e.what();
  }
}
