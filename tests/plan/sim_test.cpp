// The sim backend: exact virtual times on a 3-layer program checked by hand, link sharing,
// recompute costs per rematted slot, determinism, budget errors, cost tables checked against
// the schedule whatever the call order, sync latency, and monotonicity (more work is never faster).
#include <gtest/gtest.h>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/backends/sim/sim_backend.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/tide.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace tide;

namespace {

using blk = layer<"blk", slot<"a", 1000>, slot<"b", 3000>>;
using three = stack<independent_layers, repeat<blk, 3>>;
using offload_b = policy<offload<slot_names<"b">>>;

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
  return uniform_costs(3, layer_cost{.forward_us = 100, .backward_us = 200}, host_link::symmetric(30e6));
}

using enum stream_role;
using k = op_kind;

}  // namespace

TEST(Sim, ThreeLayerOffloadTimelineByHand) {
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec(), .pipeline = {.prefetch_distance = 1}});
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

// The storage lane: a store or load takes the storage link's latency plus its bytes over the
// direction's rate, on the storage stream; reads and writes share the drive (not full duplex), and
// an unpaced storage link costs nothing.
TEST(Sim, StoresAndLoadsTakeTheStorageLinksTime) {
  stack_spec st;
  st.independent_layers = true;
  st.append(layer_spec{"blk", {{"a", 1000}, {"b", 3000}}}, 4);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::spill, .slots = {"b"}}}});
  auto costs = uniform_costs(4, {.forward_us = 100, .backward_us = 200}, host_link::symmetric(1e9));
  costs.storage = {.write = {1e8, 7}, .read = {2e8, 3}};  // 3000 bytes: 30 us write, 15 us read
  auto const r = simulate(s, costs);
  std::size_t stores = 0, loads = 0;
  for (auto const& sp : r.trace.ops) {
    auto const& o = s.ops[sp.op];
    if (!is_storage(o.kind)) continue;
    EXPECT_EQ(sp.stream, stream_role::storage);
    EXPECT_DOUBLE_EQ(sp.end_us - sp.begin_us, o.kind == op_kind::store ? 7 + 30 : 3 + 15) << op_label(s, o);
    (o.kind == op_kind::store ? stores : loads) += 1;
  }
  EXPECT_EQ(stores, 2u);  // layers 0 and 1: 2 and 3 stay in the ring
  EXPECT_EQ(loads, 2u);
  EXPECT_GT(r.summary.storage_us, 0);
  auto free = costs;
  free.storage = {};
  EXPECT_LE(simulate_step_us(s, free), r.summary.step_us);
}

TEST(Sim, NaivePipelineSerializesCopiesOnCompute) {
  auto s = build_schedule(three::spec(),
                          {.policy = offload_b::spec(), .pipeline = {.latency_hiding = false, .prefetch_distance = 0}});
  auto costs = hand_costs();
  auto r = simulate(s, costs);
  // 3 x (100 + 200) compute + 6 copies x 100, all on one stream.
  EXPECT_DOUBLE_EQ(r.summary.step_us, 900 + 600);
  EXPECT_DOUBLE_EQ(r.summary.exposed_transfer_us, 600);
  for (auto const& sp : r.trace.ops) EXPECT_EQ(sp.stream, compute);
}

TEST(Sim, ChunksPayLatencyPerChunk) {
  auto costs = hand_costs();
  costs.link = host_link::symmetric(30e6, 10);
  // 3000 bytes in chunks of 1024: 3 chunks, each 10 us latency plus bytes / 30 per us.
  auto s = build_schedule(three::spec(),
                          {.policy = offload_b::spec(), .pipeline = {.prefetch_distance = 1, .chunk_bytes = 1024}});
  auto r = simulate(s, costs);
  double d2h_total = 0;
  for (auto const& sp : r.trace.ops)
    if (s.ops[sp.op].kind == k::offload && s.ops[sp.op].layer == 0) d2h_total += sp.end_us - sp.begin_us;
  EXPECT_NEAR(d2h_total, 3 * 10 + 3000 / 30.0, 1e-9);
}

TEST(Sim, RecomputeCostsOnlyRematSlots) {
  auto costs = uniform_costs(
      3, layer_cost{.forward_us = 100, .backward_us = 200, .recompute_us = 90, .slot_recompute_us = {30, 70}});
  auto s = build_schedule(three::spec(), {.policy = policy<remat<slot_names<"b">>>::spec()});
  auto r = simulate(s, costs);
  EXPECT_DOUBLE_EQ(r.summary.step_us, 900 + 3 * 70);  // each layer recomputes b only
  auto all = build_schedule(three::spec(), {.policy = policy<remat<>>::spec()});
  EXPECT_DOUBLE_EQ(simulate_step_us(all, costs), 900 + 3 * 90);  // 30 + 70 capped at the full 90
  costs.layers[1].slot_recompute_us.clear();
  EXPECT_DOUBLE_EQ(simulate_step_us(s, costs), 900 + 70 + 90 + 70);  // no per-slot costs: the full 90
}

// One op, one recompute charge: slots of one producer (attention's output and its log-sum-exp)
// cost the op once, the largest of their costs, whichever of them is rematted.
TEST(Sim, SlotsOfOneProducerAreChargedOnce) {
  layer_cost c{.forward_us = 100, .backward_us = 200, .slot_recompute_us = {0, 30, 30, 10}, .slot_producer = {0, 1, 1, 2}};
  auto time = [&](std::vector<bool> const& flags) {
    std::unique_ptr<bool[]> f(new bool[flags.size()]);
    for (std::size_t k = 0; k < flags.size(); ++k) f[k] = flags[k];
    return c.recompute_time_us(std::span<bool const>(f.get(), flags.size()));
  };
  EXPECT_DOUBLE_EQ(time({false, true, true, false}), 30);
  EXPECT_DOUBLE_EQ(time({false, true, false, true}), 40);
  EXPECT_DOUBLE_EQ(time({false, false, true, true}), 40);
  EXPECT_DOUBLE_EQ(time({false, true, true, true}), 40);
  c.slot_recompute_us = {0, 10, 30, 10};  // unequal members: the group costs its largest
  EXPECT_DOUBLE_EQ(time({false, true, true, false}), 30);
  EXPECT_DOUBLE_EQ(time({false, true, false, false}), 10);
  c.slot_producer.clear();  // each slot its own op: charged twice
  EXPECT_DOUBLE_EQ(time({false, true, true, false}), 40);
  // In a schedule, and in the checks of a table against a stack.
  using four = stack<independent_layers, repeat<layer<"blk", slot<"x", 64>, slot<"o", 1000>, slot<"lse", 100>, slot<"u", 500>>, 2>>;
  auto costs = uniform_costs(2, layer_cost{.forward_us = 100, .backward_us = 200, .slot_recompute_us = {0, 30, 30, 10},
                                           .slot_producer = {0, 1, 1, 2}});
  auto const s = build_schedule(four::spec(), {.policy = policy<remat<slot_names<"o", "lse">>>::spec()});
  EXPECT_DOUBLE_EQ(simulate_step_us(s, costs), 2 * (100 + 200 + 30));
  costs.layers[1].slot_producer = {0, 1};
  try {
    costs.check_against(four::spec());
    ADD_FAILURE() << "a producer list of the wrong length was accepted";
  } catch (cost_model_error const& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 of the cost table has 2 slot producers but 4 slot recompute costs"),
              std::string::npos)
        << e.what();
  }
}

// HBM contention: forward 100, backward 200, each offload and prefetch 100 us (3000 bytes at
// 30 MB/s). With HBM at 300 MB/s a copy takes a tenth of it; half the compute is memory-bound, so
// an op loses 0.05 us per us a copy runs beside it: o0 (100-200) lies under all of f1, which runs
// 105 us. Copies on the compute stream overlap nothing and cost nothing more; nor does
// compute-bound work (share 0). A share outside [0, 1] and a bandwidth that is negative, NaN or
// infinite are refused.
// Issue 40, item 6: the C++ entry points took tables the JSON readers refuse (a negative slot
// recompute cost, negative op overhead or link latency, NaN), and with them a plan beat its lower
// bound or cost 0 us. One check (cost_table::check) now runs in the planner, the lower bound,
// compare_strategies and the calibration file's reader and writer, naming the field.
TEST(CostTable, OneCheckRefusesHostileValuesInEveryEntryPoint) {
  auto const st = three::spec();
  auto const good = hand_costs();
  struct hostile {
    char const* says;
    void (*edit)(cost_table&);
  };
  for (auto const& [says, edit] : std::initializer_list<hostile>{
           {"layer 1 slot_recompute_us[0] is -5", [](cost_table& t) { t.layers[1].slot_recompute_us = {-5, 1}; }},
           {"op_overhead_us is -1", [](cost_table& t) { t.op_overhead_us = -1; }},
           {"sync_latency_us is nan", [](cost_table& t) { t.sync_latency_us = std::nan(""); }},
           {"link d2h latency_us is -3", [](cost_table& t) { t.link.d2h.latency_us = -3; }},
           {"link h2d bytes_per_second is -1", [](cost_table& t) { t.link.h2d.bytes_per_second = -1; }},
           {"storage read bytes_per_second is inf", [](cost_table& t) { t.storage.read.bytes_per_second = std::numeric_limits<double>::infinity(); }},
           {"layer 0 forward_us is nan", [](cost_table& t) { t.layers[0].forward_us = std::nan(""); }},
           {"layer 2 backward_us is 1.6999999999999999e+308", [](cost_table& t) { t.layers[2].backward_us = 1.7e308; }},
           {"layer 0 recompute_us is -inf", [](cost_table& t) { t.layers[0].recompute_us = -std::numeric_limits<double>::infinity(); }},
           {"layer 1 gather_us is -2", [](cost_table& t) { t.layers[1].gather_us = -2; }},
           // Below a byte per second, as the calibration file's reader refuses it (rows showed "step inf").
           {"link d2h bytes_per_second is 1e-300: give a finite bandwidth of at least 1 byte per second",
            [](cost_table& t) { t.link.d2h.bytes_per_second = 1e-300; }},
           {"hbm_bytes_per_second is 0.5", [](cost_table& t) { t.hbm_bytes_per_second = 0.5; }},
       }) {
    auto t = good;
    edit(t);
    auto const named = [&](auto&& f) {
      try {
        f();
      } catch (cost_model_error const& e) {
        return std::string(e.what()).find(says) != std::string::npos;
      }
      return false;
    };
    EXPECT_TRUE(named([&] { t.check(); })) << says;
    EXPECT_TRUE(named([&] { (void)make_plan(st, t); })) << says;
    EXPECT_TRUE(named([&] { (void)step_lower_bound(st, t); })) << says;
    EXPECT_TRUE(named([&] { (void)compare_strategies(st, t); })) << says;
    // The sim backend (it checked only the table's length: a NaN time ran as one).
    EXPECT_TRUE(named([&] {
      auto const s = build_schedule(st, strategy{});
      sim_backend sb(t);
      executor ex(sb, s);
    })) << says;
  }
  EXPECT_NO_THROW(good.check());
  EXPECT_NO_THROW((void)make_plan(st, good));
}

TEST(Sim, HostCopiesSlowTheMemoryBoundComputeBesideThem) {
  auto costs = hand_costs();
  for (auto& l : costs.layers) l.memory_bound_share = 0.5;
  auto const s = build_schedule(three::spec(), {.policy = offload_b::spec(), .pipeline = {.prefetch_distance = 1}});
  auto const base = simulate(s, costs);
  costs.hbm_bytes_per_second = 3e8;
  auto const slowed = simulate(s, costs);
  for (auto const& sp : slowed.trace.ops)
    if (s.ops[sp.op].kind == k::forward && s.ops[sp.op].layer == 1) {
      EXPECT_DOUBLE_EQ(sp.end_us - sp.begin_us, 105);
    }
  EXPECT_GT(slowed.summary.step_us, base.summary.step_us);
  EXPECT_LE(slowed.summary.step_us, base.summary.step_us + 0.05 * base.summary.copy_us);
  auto const naive = build_schedule(three::spec(), {.policy = offload_b::spec(), .pipeline = naive_pipeline::spec()});
  auto no_hbm = costs;
  no_hbm.hbm_bytes_per_second = 0;
  EXPECT_DOUBLE_EQ(simulate_step_us(naive, costs), simulate_step_us(naive, no_hbm));
  auto compute_bound = costs;
  for (auto& l : compute_bound.layers) l.memory_bound_share = 0;
  EXPECT_DOUBLE_EQ(simulate_step_us(s, compute_bound), base.summary.step_us);
  // Hostile values are refused, naming the field.
  auto refused = [](cost_table const& t) {
    try {
      t.check_against(three::spec());
    } catch (cost_model_error const& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  compute_bound.layers[2].memory_bound_share = 2;
  EXPECT_NE(refused(compute_bound).find("layer 2 of the cost table has memory_bound_share 2"), std::string::npos);
  compute_bound.layers[2].memory_bound_share = std::nan("");
  EXPECT_NE(refused(compute_bound).find("memory_bound_share"), std::string::npos);
  for (double hbm : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto bad = costs;
    bad.hbm_bytes_per_second = hbm;
    EXPECT_NE(refused(bad).find("hbm_bytes_per_second"), std::string::npos) << hbm;
  }
}

TEST(Sim, SharedLinkSerializesDirections) {
  auto costs = hand_costs();
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec()});
  for (bool duplex : {true, false}) {
    costs.link.full_duplex = duplex;
    sim_backend b(costs);
    timeline t;
    b.record_timeline(&t);  // the backend driven by hand, without an executor
    b.setup(backend_setup::of(s));
    b.begin_step(s);
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
  auto costs = uniform_costs(3, layer_cost{.forward_us = 100, .backward_us = 200, .gather_us = 50, .reduce_us = 400});
  auto s = build_schedule(three::spec(), {.policy = keep_all::spec(),
                                          .collectives = {.before_forward = true, .after_backward = true}});
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

// Regathers (the weights again before each backward, as FSDP does) by hand: three layers, forward
// 100, backward 200, gather 50. Gathers: g0 0-50, g1 50-100, g2 (after f0) 150-200; forwards end at
// 150, 250, 350. Regathers continue the sequence with two buffers: rg2 after f1, rg1 after f2, rg0
// after b2. With 80 us each they hide (b2 350-550, b1 550-750, b0 750-950); with 300 us they do
// not: rg2 250-550, rg1 550-850, rg0 850-1150, and b0 runs 1150-1350.
TEST(Sim, RegathersRunOnTheCommStreamOneLayerAhead) {
  for (auto [regather, step] : {std::pair{80.0, 950.0}, std::pair{300.0, 1350.0}}) {
    auto costs = uniform_costs(3, layer_cost{.forward_us = 100, .backward_us = 200, .gather_us = 50, .regather_us = regather});
    auto s = build_schedule(three::spec(), {.policy = keep_all::spec(),
                                            .collectives = {.before_forward = true, .before_backward = true}});
    auto r = simulate(s, costs);
    EXPECT_DOUBLE_EQ(r.summary.step_us, step) << "regather " << regather;
    double comm_busy = 0;
    for (auto const& sp : r.trace.ops)
      if (sp.stream == comm) comm_busy += sp.end_us - sp.begin_us;
    EXPECT_DOUBLE_EQ(comm_busy, 3 * 50 + 3 * regather);
  }
}

// Without overlap (`collective_spec::overlap = false`) every hook runs on the compute stream just
// before the op that needs it: three layers, forward 100, backward 200, gather 50, regather 80,
// reduce 400 take 3 x (50 + 100) + 3 x (80 + 200 + 400) = 2490 us, all of it exposed collective
// time but the compute; with overlap the same costs take less, and expose less of the
// collectives (the last reduce).
TEST(Sim, CollectivesWithoutOverlapRunOnTheComputeStream) {
  auto costs = uniform_costs(3, layer_cost{.forward_us = 100, .backward_us = 200, .gather_us = 50, .reduce_us = 400, .regather_us = 80});
  for (bool overlap : {true, false}) {
    auto s = build_schedule(three::spec(), {.policy = keep_all::spec(),
                                            .collectives = {.before_forward = true,
                                                            .before_backward = true,
                                                            .after_backward = true,
                                                            .overlap = overlap}});
    check_schedule(s);
    auto r = simulate(s, costs);
    for (auto const& o : s.ops)
      if (is_collective(o.kind)) {
        EXPECT_EQ(o.stream, overlap ? comm : stream_role::compute) << op_label(s, o);
      }
    if (overlap) {
      EXPECT_LT(r.summary.step_us, 2490);
      EXPECT_LT(r.summary.exposed_collective_us, 3 * (50 + 80 + 400));
    } else {
      EXPECT_DOUBLE_EQ(r.summary.step_us, 2490);
      EXPECT_DOUBLE_EQ(r.summary.exposed_collective_us, 3 * (50 + 80 + 400));
    }
  }
}

TEST(Sim, IsDeterministic) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"dense", {{"x", 512}, {"q", 4096}, {"up", 10000}}}, 5).append({"moe", {{"x", 512}, {"e", 7777}}}, 20);
  cost_table costs;
  for (std::uint32_t l = 0; l < 25; ++l)
    costs.layers.push_back({.forward_us = 100.0 + l, .backward_us = 210.0 + 3 * l});
  costs.link = host_link::symmetric(50e6, 2, false);
  auto s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"up", "e"}, .last_layer = 20},
                                          rule_spec{.where = placement::remat, .slots = {"q"}}},
                              .buffers = {.staging_buffers = 3},
                              .pipeline = {.prefetch_distance = 2, .chunk_bytes = 3000}});
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
  executor<sim_backend> ex(be, s, sim_executor_options());
  auto none = [](auto const&) {};
  ex.step(none, none);
  ex.step(none, none);
  EXPECT_EQ(be.step_us(), a.summary.step_us);
  EXPECT_GE(a.summary.step_us, costs.compute_us());
}

TEST(Sim, BudgetAndMismatchErrorsNameTheProblem) {
  auto s = build_schedule(three::spec(), {.policy = keep_all::spec()});
  auto costs = hand_costs();
  try {
    (void)simulate(s, costs, {.device_budget = 1000});
    FAIL() << "expected out_of_memory";
  } catch (out_of_memory const& e) {
    EXPECT_EQ(e.requested, s.peak_device_bytes());
    EXPECT_NE(std::string(e.what()).find("sim backend device arena"), std::string::npos) << e.what();
  }
  auto two = uniform_costs(2, layer_cost{.forward_us = 1, .backward_us = 2});
  try {
    (void)simulate(s, two);
    FAIL() << "expected cost_model_error";
  } catch (cost_model_error const& e) {
    EXPECT_NE(std::string(e.what()).find("cost table has 2"), std::string::npos) << e.what();
  }
}

TEST(Sim, CostTableShorterThanTheScheduleIsAnErrorWhateverTheCallOrder) {
  auto const s = build_schedule(three::spec(), {.policy = offload_b::spec(), .pipeline = {.prefetch_distance = 1}});  // 3 layers
  auto const two_layers = build_schedule(stack<independent_layers, repeat<blk, 2>>::spec(), {.policy = offload_b::spec()});
  auto const two = uniform_costs(2, layer_cost{.forward_us = 1, .backward_us = 2});
  auto names_both = [](cost_model_error const& e) {
    std::string const w = e.what();
    EXPECT_NE(w.find("the schedule has 3 layers"), std::string::npos) << w;
    EXPECT_NE(w.find("the cost table has 2"), std::string::npos) << w;
  };
  // A fresh backend: the executor hands it the schedule, which it checks.
  {
    sim_backend b(two);
    try {
      executor<sim_backend> ex(b, s, sim_executor_options());
      FAIL() << "an executor accepted a schedule longer than the cost table";
    } catch (cost_model_error const& e) {
      names_both(e);
    }
  }
  // A backend already serving a schedule that matches, then an executor for one that does not;
  // the first executor still steps.
  {
    sim_backend b(two);
    executor<sim_backend> ok(b, two_layers, sim_executor_options());
    auto none = [](auto const&) {};
    ok.step(none, none);
    auto const first = b.step_us();
    EXPECT_GT(first, 0);
    try {
      executor<sim_backend> ex(b, s, sim_executor_options());
      FAIL() << "an executor accepted a schedule longer than the cost table";
    } catch (cost_model_error const& e) {
      names_both(e);
    }
    ok.step(none, none);
    EXPECT_DOUBLE_EQ(b.step_us(), first);
  }
  // Driven by hand, without an executor: run checks the layer against the table.
  {
    sim_backend b(two);
    b.setup(backend_setup::of(two_layers));
    b.begin_step(two_layers);
    op o{k::backward, compute};
    o.layer = 2;
    try {
      b.run(compute, 7, o, {});
      FAIL() << "run read beyond the cost table";
    } catch (cost_model_error const& e) {
      EXPECT_NE(std::string(e.what()).find("op #7 (backward L2) is beyond the cost table, which has 2 layers"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Sim, SyncLatencyIsPaidByEveryWaiterOfARecordedEvent) {
  auto costs = hand_costs();  // 30 bytes per us
  costs.sync_latency_us = 5;
  sim_backend b(costs);
  timeline t;
  b.record_timeline(&t);  // the backend driven by hand, without an executor
  auto const s = build_schedule(three::spec(), strategy{});  // as many layers as the cost table
  auto v = s.view();
  v.event_count = 2;  // the events recorded and waited on below
  b.setup(backend_setup::of(v));
  b.begin_step(v);
  b.run(compute, 0, op{k::forward, compute}, {});  // 0 -> 100
  b.record(compute, 0);
  b.copy(h2d, 1, op{k::prefetch, h2d}, nullptr, nullptr, 3060);  // 0 -> 102
  b.wait(d2h, 0);   // arrives long before the record: resumes 5 us after it
  b.wait(h2d, 0);   // arrives after the record, within the latency: resumes then too, not at once
  b.wait(comm, 1);  // never recorded this step: no wait
  b.end_step();
  ASSERT_EQ(t.waits.size(), 2u);
  EXPECT_EQ(t.waits[0].stream, d2h);
  EXPECT_DOUBLE_EQ(t.waits[0].begin_us, 0);
  EXPECT_DOUBLE_EQ(t.waits[0].end_us, 105);
  EXPECT_EQ(t.waits[1].stream, h2d);
  EXPECT_DOUBLE_EQ(t.waits[1].begin_us, 102);
  EXPECT_DOUBLE_EQ(t.waits[1].end_us, 105);
  EXPECT_DOUBLE_EQ(b.step_us(), 105);
}

namespace {

//! A random composition on which to test monotonicity: 1..12 layers of up to 3 types.
struct random_case {
  stack_spec stack;
  schedule s;
  cost_table costs;
};

random_case make_case(std::mt19937_64& rng) {
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  random_case c;
  char const* type_names[] = {"t0", "t1", "t2"};
  char const* slot_names[] = {"s0", "s1", "s2", "s3"};
  std::vector<layer_spec> types;
  for (std::uint64_t t = 0, n = uni(1, 3); t < n; ++t) {
    layer_spec ls{type_names[t], {}};
    for (std::uint64_t k = 0, m = uni(1, 4); k < m; ++k) ls.slots.push_back({slot_names[k], static_cast<std::size_t>(uni(1, 200000))});
    types.push_back(ls);
  }
  auto const layers = static_cast<std::uint32_t>(uni(1, 12));
  c.stack.independent_layers = true;
  for (std::uint32_t l = 0; l < layers; ++l) c.stack.append(types[uni(0, types.size() - 1)]);
  for (int attempt = 0;; ++attempt) {
    policy_spec p;
    for (std::uint64_t r = 0, n = attempt > 20 ? 0 : uni(0, 3); r < n; ++r) {  // at last: keep all
      std::vector<tide::name> slots;
      if (uni(0, 1)) slots.push_back(slot_names[uni(0, types[0].slots.size() - 1)]);
      auto const first = static_cast<std::uint32_t>(uni(0, layers - 1));
      p.rules.push_back(rule_spec{.where = uni(0, 1) ? placement::offload : placement::remat,
                                  .slots = slots,
                                  .first_layer = first,
                                  .last_layer = static_cast<std::uint32_t>(uni(first + 1, layers))});
    }
    buffer_spec b;
    b.staging_buffers = static_cast<std::uint32_t>(uni(1, 3));
    pipeline_spec pl{.latency_hiding = uni(0, 3) > 0,
                     .prefetch_distance = static_cast<std::uint32_t>(uni(0, layers - 1)),
                     .chunk_bytes = uni(0, 1) ? std::size_t{0} : static_cast<std::size_t>(uni(1000, 100000)),
                     .max_offloads_in_flight = static_cast<std::uint32_t>(uni(1, 3))};
    if (!pl.latency_hiding) pl.prefetch_distance = 0, b.staging_buffers = 1;
    collective_spec col{.before_forward = uni(0, 3) == 0, .after_backward = uni(0, 3) == 0};
    try {
      c.s = build_schedule(c.stack, {.policy = p, .buffers = b, .pipeline = pl, .collectives = col});
      break;
    } catch (schedule_error const&) {  // a composition the builder rejects: draw again
      if (attempt > 20) throw;
    }
  }
  // Whole microseconds, so that ties (a waiter arriving right at or just after a record) are
  // common, as they are when layers repeat.
  auto us = [&](std::uint64_t lo, std::uint64_t hi) { return static_cast<double>(uni(lo, hi)); };
  for (std::uint32_t l = 0; l < layers; ++l) {
    layer_cost lc;
    lc.forward_us = us(1, 60);
    lc.backward_us = us(1, 120);
    lc.recompute_us = uni(0, 1) ? std::optional<double>{} : us(1, 60);
    if (uni(0, 1))
      for (std::size_t k = 0; k < c.stack.layer(l).slots.size(); ++k) lc.slot_recompute_us.push_back(us(0, 30));
    lc.gather_us = c.s.collectives.before_forward ? us(0, 20) : 0;
    lc.reduce_us = c.s.collectives.after_backward ? us(0, 20) : 0;
    c.costs.layers.push_back(lc);
  }
  // Links from slow to very fast against compute (copies of 0.01 to 2000 us), with latencies
  // and a sync latency that may dwarf the copies.
  c.costs.link = {{std::pow(10.0, real(8, 10.5)), us(0, 10)}, {std::pow(10.0, real(8, 10.5)), us(0, 10)},
                  uni(0, 1) == 1};
  c.costs.sync_latency_us = us(0, 40);
  c.costs.op_overhead_us = uni(0, 1) ? 0 : us(0, 3);
  return c;
}

}  // namespace

TEST(Sim, MoreWorkIsNeverFaster) {
  std::mt19937_64 rng(20260517);
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  int checks = 0;
  for (int i = 0; i < 400; ++i) {
    auto c = make_case(rng);
    auto const base = simulate_step_us(c.s, c.costs);
    auto const L = c.s.layer_count();
    auto expect_not_faster = [&](cost_table const& more, schedule_view s, std::string const& what) {
      auto const t = simulate_step_us(s, more);
      EXPECT_GE(t, base) << "case " << i << ": " << what << " made the step " << base - t << " us shorter\n"
                         << describe(c.s, {false, false});
      ++checks;
    };
    for (int j = 0; j < 8; ++j) {
      auto more = c.costs;
      auto const l = static_cast<std::uint32_t>(uni(0, L - 1));
      double const steps[] = {0.25, 1, 2, 5, 20, 100};
      auto const d = steps[uni(0, 5)];
      auto& lc = more.layers[l];
      std::string what = "layer " + std::to_string(l) + " ";
      switch (uni(0, 5)) {
        case 0: lc.forward_us += d, what += "forward"; break;
        case 1: lc.backward_us += d, what += "backward"; break;
        case 2:
          if (lc.recompute_us) *lc.recompute_us += d;
          else lc.forward_us += d;
          what += "recompute";
          break;
        case 3:
          if (!lc.slot_recompute_us.empty()) lc.slot_recompute_us[uni(0, lc.slot_recompute_us.size() - 1)] += d;
          what += "slot recompute";
          break;
        case 4: lc.gather_us += d, what += "gather"; break;
        case 5: lc.reduce_us += d, what += "reduce"; break;
      }
      expect_not_faster(more, c.s, what + " +" + std::to_string(d) + " us");
    }
    // A copy's bytes, a link's bandwidth or latency, the sync latency, the dispatch overhead.
    std::vector<std::uint32_t> copies;
    for (std::uint32_t o = 0; o < c.s.ops.size(); ++o)
      if (is_copy(c.s.ops[o].kind)) copies.push_back(o);
    for (int j = 0; j < 4 && !copies.empty(); ++j) {
      schedule bigger = c.s;
      auto const o = copies[uni(0, copies.size() - 1)];
      bigger.ops[o].bytes += uni(1, 100000);
      expect_not_faster(c.costs, bigger, "op #" + std::to_string(o) + " copying more bytes");
    }
    for (bool d2h : {true, false}) {
      auto more = c.costs;
      auto& link = d2h ? more.link.d2h : more.link.h2d;
      link.bytes_per_second *= std::uniform_real_distribution<double>(0.1, 0.99)(rng);
      expect_not_faster(more, c.s, d2h ? "a slower d2h link" : "a slower h2d link");
      more = c.costs;
      (d2h ? more.link.d2h : more.link.h2d).latency_us += std::uniform_real_distribution<double>(0.01, 50)(rng);
      expect_not_faster(more, c.s, d2h ? "a longer d2h latency" : "a longer h2d latency");
    }
    auto more = c.costs;
    more.sync_latency_us += std::uniform_real_distribution<double>(0.01, 20)(rng);
    expect_not_faster(more, c.s, "a longer sync latency");
    more = c.costs;
    more.op_overhead_us += std::uniform_real_distribution<double>(0.01, 5)(rng);
    expect_not_faster(more, c.s, "a longer dispatch overhead");
    if (HasFailure()) break;  // one counterexample is enough to read
  }
  EXPECT_GT(checks, 4000);
}
