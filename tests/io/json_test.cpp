// Policy, calibration and model files (<tide/io/json.hpp>): the planner's result round-trips
// (plan -> JSON text -> strategy -> the same schedule, op for op), the format of a type-level
// strategy is pinned, bad documents name their JSON path, a calibration measured on the host
// backend round-trips bit for bit, and the documented model file reads as the stack it describes.
#include <gtest/gtest.h>

#include <algorithm>

#include <tide/io/json.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/plan/policy_codegen.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <unistd.h>

using namespace tide;

namespace {

std::string const source_root = TIDE_SOURCE_ROOT;

void expect_same_schedule(schedule const& a, schedule const& b) {
  EXPECT_EQ(a.ops, b.ops);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.waits, b.waits);
  EXPECT_EQ(a.event_count, b.event_count);
  EXPECT_EQ(a.arena, b.arena);
  EXPECT_EQ(a.buffers, b.buffers);
  EXPECT_EQ(a.pipeline, b.pipeline);
  EXPECT_EQ(a.collectives, b.collectives);
  EXPECT_EQ(a.carry, b.carry);
}

strategy through_text(strategy const& st, stack_spec const& stack) {
  auto const text = io::to_json(st).dump(2);
  return io::strategy_from_json(io::parse_json(text, "test"), stack);
}

// What the error says when reading `text` for `stack`, or "" when it reads.
std::string error_of(std::string_view text, stack_spec const& stack) {
  try {
    (void)io::strategy_from_json(io::parse_json(text, "policy file t.json"), stack, "policy file t.json");
  } catch (io::json_error const& e) {
    return e.what();
  }
  return "";
}

stack_spec chain_stack() {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"x", 4096, true}, {"qkv", 12288}, {"mlp_up", 16384}}}, 6);
  return st;
}

}  // namespace

//! [policy_round_trip]
TEST(PolicyFile, PlannerResultRoundTripsToTheSameSchedule) {
  auto const model = io::read_model_file(source_root + "/docs/examples/model.json");
  auto const costs = model.costs(hardware::h100_sxm(), hardware::h100_sxm().link());
  auto const keep_peak = build_schedule(model.stack, strategy{}).peak_device_bytes();
  auto const p = make_plan(model.stack, costs, {.device_budget = keep_peak / 8});
  ASSERT_TRUE(p.fits);
  std::size_t offloaded = 0, rematted = 0;
  for (auto d : p.decisions) offloaded += d == placement::offload, rematted += d == placement::remat;
  ASSERT_GT(offloaded, 0u) << "a budget this small should offload";
  ASSERT_GT(rematted, 0u) << "a budget this small should rematerialize";

  // plan -> JSON text -> strategy: the same schedule, op for op.
  auto const back = through_text(p.strategy, model.stack);
  expect_same_schedule(build_schedule(model.stack, back), p.build(model.stack));
  EXPECT_EQ(io::to_json(back), io::to_json(p.strategy));
}
//! [policy_round_trip]

// Rules counting from the end (issue 23): written as negative bounds, read back, described, and
// generated as C++ with the same meaning; out of range in a file, a clear error.
TEST(PolicyFile, RulesCountingFromTheEndRoundTrip) {
  auto has = [](std::string const& s, char const* what) { return s.find(what) != std::string::npos; };
  strategy const last_two{.policy = {rule_spec{.where = placement::offload, .slots = {"x"}, .first_layer = from_end(2)}}};
  EXPECT_TRUE(has(describe(last_two), "of layers [end - 2, end)")) << describe(last_two);
  auto const text = io::to_json(last_two).dump();
  EXPECT_TRUE(has(text, "\"first_layer\":-2}")) << text;
  stack_spec one;
  one.independent_layers = true;
  one.append({"l", {{"x", 4096}}}, 4);
  auto const back = io::strategy_from_json(io::parse_json(text, "test"), one);
  EXPECT_EQ(back.policy.rules.at(0).first_layer, from_end(2));
  EXPECT_TRUE(has(to_cpp_types(last_two), "tide::layer_range<tide::from_end(2)>")) << to_cpp_types(last_two);
  // Out of range in a file: a clear error.
  try {
    (void)io::strategy_from_json(io::parse_json(R"({"rules": [{"action": "remat", "layers": [-1073741825, null]}]})", "test"), one);
    FAIL();
  } catch (std::exception const& e) {
    EXPECT_TRUE(has(e.what(), "expected a layer index from -1073741824")) << e.what();
  }
  // Bounds whose fields were set by hand are written in their one spelling, which reads back:
  // 0 back is the end ("last_layer": 0 was written, an empty range), and a count past
  // max_from_end is max_from_end (-2,000,000,000 was written, which the reader refuses).
  strategy by_hand{.policy = {rule_spec{.where = placement::remat, .slots = {"x"}}}};
  by_hand.policy.rules[0].first_layer.value = 2'000'000'000;
  by_hand.policy.rules[0].first_layer.from_end = true;
  by_hand.policy.rules[0].last_layer.value = 0;
  by_hand.policy.rules[0].last_layer.from_end = true;
  auto const hand = io::to_json(by_hand).dump();
  EXPECT_TRUE(has(hand, "\"first_layer\":-1073741824")) << hand;
  EXPECT_FALSE(has(hand, "last_layer")) << hand;
  auto const read = io::strategy_from_json(io::parse_json(hand, "test"), one);
  EXPECT_EQ(read.policy.rules.at(0).first_layer, from_end(max_from_end));
  EXPECT_EQ(read.policy.rules.at(0).last_layer, layer_bound{all_layers});
  EXPECT_EQ(build_schedule(one, read).ops, build_schedule(one, by_hand).ops);
}

TEST(PolicyFile, EveryStrategyTableRowRoundTrips) {
  auto const model = io::read_model_file(source_root + "/docs/examples/model.json");
  auto const costs = model.costs(hardware::gb200(), hardware::gb200().link());
  auto const rows = compare_strategies(model.stack, costs, {.keep_slots = {"layer_input"}, .remat_rest = true});
  ASSERT_GE(rows.size(), 5u);
  for (auto const& r : rows) {
    SCOPED_TRACE(r.key);
    expect_same_schedule(build_schedule(model.stack, through_text(r.strategy, model.stack)), build_schedule(model.stack, r.strategy));
  }
}

TEST(PolicyFile, CheckpointsWithAHostTierRoundTrip) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.carry = {"u", 4096};
  st.append({"step", {{"flux", 8192}}}, 9);
  auto const reversal = two_tier_plan(9, 2, 2, chain_costs::constant(10, 20, 5, 5)).actions;
  strategy const want{.policy = {rule_spec{.where = placement::remat}},
                      .checkpoints = {.device_snapshots = 2, .host_snapshots = 2, .reversal = reversal}};
  auto const back = through_text(want, st);
  EXPECT_EQ(back.checkpoints, want.checkpoints);
  expect_same_schedule(build_schedule(st, back), build_schedule(st, want));
  // Every carry stored: written as "every".
  auto const every = io::to_json(strategy{.checkpoints = {.host_snapshots = 1, .reversal = reversal}});
  EXPECT_EQ(every["checkpoints"]["device_snapshots"], "every");
  // A three-tier reversal (disk actions, "disk_snapshots") round-trips and builds the same schedule;
  // without disk snapshots in the checkpoints, the builder names the first disk action.
  auto c = chain_costs::constant(1, 2, 1, 1);
  c.disk_write_us = 3, c.disk_read_us = 2;
  auto const three = three_tier_plan(9, chain_tiers{.device = 1, .host = 1, .disk = 2}, c).actions;
  ASSERT_TRUE(std::any_of(three.begin(), three.end(), [](chain_action const& a) { return a.op == chain_op::spill; }));
  strategy disk{.policy = {rule_spec{.where = placement::remat}},
                .checkpoints = {.device_snapshots = 1, .host_snapshots = 1, .reversal = three, .disk_snapshots = 2}};
  auto const disk_back = through_text(disk, st);
  EXPECT_EQ(disk_back.checkpoints, disk.checkpoints);
  auto const text = io::to_json(disk).dump();
  EXPECT_NE(text.find(R"({"op":"spill","host_snapshot":0,"disk_snapshot":0})"), std::string::npos);
  EXPECT_NE(text.find(R"("disk_snapshots":2)"), std::string::npos);
  expect_same_schedule(build_schedule(st, disk_back), build_schedule(st, disk));
  disk.checkpoints.disk_snapshots = 0;
  try {
    (void)build_schedule(st, disk);
    ADD_FAILURE() << "a reversal with disk actions was built without disk snapshots";
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("beyond checkpoint_spec::disk_snapshots"), std::string::npos) << e.what();
  }
}

// The format, pinned: a type-level strategy, its value, its file.
// Spill rules and the storage knobs round-trip; the knobs are written only when not the default
// (a 0.3.0 reader reads the rest).
TEST(PolicyFile, SpillRulesAndStorageKnobsRoundTrip) {
  stack_spec st;
  st.independent_layers = true;
  st.append(layer_spec{"blk", {{"a", 5000}, {"b", 3000}}}, 5);
  strategy how{.policy = {rule_spec{.where = placement::spill, .slots = {"a"}, .first_layer = 1}}};
  auto const plain = io::to_json(how).dump();
  EXPECT_EQ(plain.find("spill_buffers"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("storage_alignment"), std::string::npos) << plain;
  EXPECT_NE(plain.find("\"where\":\"spill\""), std::string::npos) << plain;
  how.buffers.spill_buffers = 3;
  how.buffers.storage_alignment = 512;
  auto const back = through_text(how, st);
  EXPECT_EQ(back.policy.rules[0].where, placement::spill);
  EXPECT_EQ(back.buffers.spill_buffers, 3u);
  EXPECT_EQ(back.buffers.storage_alignment, 512u);
  expect_same_schedule(build_schedule(st, back), build_schedule(st, how));
}

TEST(PolicyFile, TypeLevelStrategyWritesTheDocumentedFormat) {
  using planned = strategy_of<policy<offload<slot_names<"qkv", "mlp_up">, layer_range<0, 4>, min_bytes<1024>>, remat<slot_names<"qkv">>>,
                              buffers<staging_buffers<3>>, pipeline<prefetch_distance<2>, chunk_bytes<(1 << 20)>>,
                              collectives<before_forward, overlap_collectives<false>>>;
  auto const j = io::to_json(planned::spec());
  EXPECT_EQ(j.dump(),
            R"({"rules":[{"where":"offload","slots":["qkv","mlp_up"],"last_layer":4,"min_bytes":1024},)"
            R"({"where":"remat","slots":["qkv"]}],)"
            R"("buffers":{"staging_buffers":3,"device_alignment":256,"host_alignment":64,"guard_bytes":0,"share_phase_regions":true},)"
            R"("pipeline":{"latency_hiding":true,"prefetch_distance":2,"chunk_bytes":1048576,"max_offloads_in_flight":2},)"
            R"("collectives":{"before_forward":true,"before_backward":false,"after_backward":false,"overlap":false}})");
  auto const st = chain_stack();
  auto const back = io::strategy_from_json(j, st);
  EXPECT_EQ(io::to_json(back), j);
  // Absent parts keep their defaults (a range's end: the stack's).
  auto const partial = io::strategy_from_json(
      io::parse_json(R"({"rules": [{"where": "remat", "first_layer": 2}], "pipeline": {"latency_hiding": false}})", "t"), st);
  EXPECT_EQ(partial.policy.rules.at(0).first_layer, 2u);
  EXPECT_EQ(partial.policy.rules.at(0).last_layer, all_layers);
  EXPECT_FALSE(partial.pipeline.latency_hiding);
  EXPECT_EQ(partial.pipeline.prefetch_distance, pipeline_spec{}.prefetch_distance);
  EXPECT_EQ(partial.buffers, buffer_spec{});
  // 0.2's keys ("action", "layers"; a reversal's "state", "slot", "host") still read, as the
  // same strategy; a key given in both spellings is refused, naming the old one.
  auto const old = io::strategy_from_json(
      io::parse_json(R"({"rules": [{"action": "remat", "layers": [2, null]}], "pipeline": {"latency_hiding": false}})", "t"), st);
  EXPECT_EQ(io::to_json(old), io::to_json(partial));
  auto const carry = chain_stack();
  auto const reversal = io::strategy_from_json(
      io::parse_json(R"({"checkpoints": {"device_snapshots": 2, "reversal": [{"op": "store", "state": 0, "slot": 0}]}})", "t"), carry);
  EXPECT_EQ(reversal.checkpoints.reversal.at(0), chain_action::store(0, 0));
  EXPECT_EQ(io::to_json(reversal)["checkpoints"]["reversal"][0].dump(), R"({"op":"store","carry":0,"snapshot":0})");
  auto refused = [&](char const* text, stack_spec const& s) {
    try {
      (void)io::strategy_from_json(io::parse_json(text, "t"), s);
    } catch (io::json_error const& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(refused(R"({"rules": [{"where": "remat", "action": "remat"}]})", st).find("/rules/0/action: give \"where\" alone"),
            std::string::npos);
  EXPECT_NE(refused(R"({"rules": [{"where": "remat", "first_layer": 1, "layers": [1, 2]}]})", st).find("/rules/0/layers: give"),
            std::string::npos);
  EXPECT_NE(refused(R"({"checkpoints": {"reversal": [{"op": "free", "snapshot": 0, "slot": 0}]}})", carry).find("/slot: give \"snapshot\" alone"),
            std::string::npos);
  EXPECT_NE(refused(R"({"rules": [{"where": "remat", "first_layer": 3, "last_layer": 3}]})", st).find("is empty"), std::string::npos);
  EXPECT_NE(refused(R"({"rules": [{"slots": ["qkv"]}]})", st).find("where"), std::string::npos);
}

TEST(PolicyFile, BadDocumentsNameTheirJsonPath) {
  auto const st = chain_stack();
  struct bad {
    char const* text;
    char const* path;
    char const* says;
  };
  for (auto const& b : {
           bad{R"({"rules": [{"action": "offload", "slots": ["qkv", "qery"]}]})", "/rules/0/slots/1",
               "unknown slot 'qery' (the stack's slots: x, qkv, mlp_up)"},
           bad{R"({"pipeline": {"prefetch_distanc": 2}})", "/pipeline/prefetch_distanc", "unknown key 'prefetch_distanc'"},
           bad{R"({"rules": [{"action": "offlaod"}]})", "/rules/0/action", "unknown value 'offlaod'"},
           bad{R"({"rules": [{"slots": ["qkv"]}]})", "/rules/0", "missing key 'where'"},
           bad{R"({"rules": [{"action": "remat", "layers": [4, 2]}]})", "/rules/0/layers", "is empty"},
           bad{R"({"rules": [{"action": "remat", "layers": [4]}]})", "/rules/0/layers", "two entries"},
           bad{R"({"rules": [{"action": "remat", "slots": []}]})", "/rules/0/slots", "selects nothing"},
           bad{R"({"buffers": {"device_alignment": 100}})", "/buffers/device_alignment", "power of two"},
           bad{R"({"pipeline": {"latency_hiding": "yes"}})", "/pipeline/latency_hiding", "expected true or false"},
           bad{R"({"collectives": {"overlap": 0}})", "/collectives/overlap", "expected true or false"},
           bad{R"({"buffers": {"storage_alignment": 3000}})", "/buffers/storage_alignment", "power of two"},
           bad{R"({"buffers": {"spill_buffers": -2}})", "/buffers/spill_buffers", "non-negative integer"},
           bad{R"({"rules": [{"where": "spil"}]})", "/rules/0/where", "unknown value 'spil'"},
           bad{R"({"pipeline": {"prefetch_distance": -1}})", "/pipeline/prefetch_distance", "non-negative integer"},
           bad{R"({"pipeline": {"prefetch_distance": 1.5}})", "/pipeline/prefetch_distance", "non-negative integer"},
           bad{R"({"pipeline": {"prefetch_distance": 4294967296}})", "/pipeline/prefetch_distance", "at most 4294967295"},
           bad{R"({"rules": {}})", "/rules", "expected an array"},
           bad{R"({"checkpoints": {"device_snapshots": 0}})", "/checkpoints/device_snapshots", "at least 1"},
           bad{R"({"checkpoints": {"reversal": [{"op": "jump"}]}})", "/checkpoints/reversal/0/op", "unknown value 'jump'"},
           bad{R"({"rules": [], "extra": 1})", "/extra", "unknown key 'extra'"},
           bad{R"([1, 2])", "/:", "expected an object"},
       }) {
    SCOPED_TRACE(b.text);
    auto const what = error_of(b.text, st);
    EXPECT_NE(what.find(std::string("policy file t.json: ") + b.path), std::string::npos) << what;
    EXPECT_NE(what.find(b.says), std::string::npos) << what;
  }
  auto const malformed = error_of(R"({"rules": [})", st);
  EXPECT_NE(malformed.find("malformed JSON at byte 12"), std::string::npos) << malformed;
  // A JSON Pointer escapes '/' and '~' in keys.
  EXPECT_NE(error_of(R"({"a/b~c": 1})", st).find("/a~1b~0c"), std::string::npos);
  // After errors, a good document still reads.
  EXPECT_EQ(error_of(R"({"rules": [{"action": "offload", "slots": ["qkv"]}]})", st), "");
  try {
    (void)io::read_policy_file("/nonexistent/p.json", st);
    FAIL() << "read a missing file";
  } catch (io::json_error const& e) {
    EXPECT_NE(std::string(e.what()).find("policy file /nonexistent/p.json: /: cannot open"), std::string::npos) << e.what();
  }
}

// A read strategy refers to the stack's own names, not to the document's.
TEST(PolicyFile, SlotNamesReferToTheStack) {
  auto const st = chain_stack();
  strategy s;
  {
    auto const j = io::parse_json(R"({"rules": [{"action": "offload", "slots": ["mlp_up"]}]})", "t");
    s = io::strategy_from_json(j, st);
  }
  ASSERT_EQ(s.policy.rules.at(0).slots.size(), 1u);
  EXPECT_EQ(s.policy.rules[0].slots[0].data(), st.types[0].slots[2].name.data());
}

// A planner run made reproducible (issue 39): calibrate once (on a loaded machine each calibration
// measures other times, and the planner may choose otherwise), save it, and plan from the file:
// every run gets the same plan. The plan, pinned as a policy file and read back, builds the same
// schedule op for op, with no recompilation. The sequence docs/porting.md shows.
TEST(CalibrationFile, PlanningFromASavedCalibrationIsReproducibleAndThePlanReadsBack) {
  stack_spec st;
  st.append({"block", {{"ln", 1024}, {"fc", 4096}, {"fc_gelu", 4096}}}, 6);
  st.carry = {"residual", 1024};
  host_backend backend;
  auto work = [](auto const& c) {
    auto const until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    while (std::chrono::steady_clock::now() < until) {
    }
    if constexpr (requires { c.produces(0); }) {
      for (std::uint16_t k = 0; k < c.slot_count(); ++k) c.slot(k)[0] = std::byte{1};
      if (!c.carry_out().empty()) std::memset(c.carry_out().data(), 1, c.carry_out().size());
    }
  };
  auto const dir = std::filesystem::temp_directory_path() / ("tide_reproducible_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // Once: calibrate (a stack with a carry: calibration_options::input fills it) and save.
  auto const measured = calibrate(st, backend, work, work,
                                  {.repeats = 1, .input = [](std::span<std::byte> in) { std::memset(in.data(), 3, in.size()); }});
  io::write_calibration_file((dir / "calibration.json").string(), measured);
  // Every later run: plan from the file.
  auto const budget = build_schedule(st, strategy{}).peak_device_bytes() / 2;
  auto plan_from_file = [&] { return make_plan(st, io::read_calibration_file((dir / "calibration.json").string()), {.device_budget = budget}); };
  auto const first = plan_from_file();
  auto const second = plan_from_file();
  ASSERT_TRUE(first.fits);
  EXPECT_EQ(first.decisions, second.decisions);
  EXPECT_EQ(first.step_us, second.step_us);
  EXPECT_EQ(io::to_json(first.strategy), io::to_json(second.strategy));
  // Pinned: the plan as a policy file, read back for the same stack.
  io::write_policy_file((dir / "plan.json").string(), first.strategy);
  auto const pinned = io::read_policy_file((dir / "plan.json").string(), st);
  expect_same_schedule(build_schedule(st, pinned), first.build(st));
  std::filesystem::remove_all(dir);
}

TEST(CalibrationFile, MeasuredTableRoundTripsBitForBit) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"x", 4096, true}, {"h", 16384}}}, 3);
  host_backend_options o;
  o.d2h = o.h2d = {.bytes_per_second = 1e9, .latency_us = 10};
  host_backend backend(o);
  auto work = [](auto const& c) {
    auto const until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    while (std::chrono::steady_clock::now() < until) {
    }
    if constexpr (requires { c.produces(0); })
      for (std::uint16_t k = 0; k < c.slot_count(); ++k)
        if (c.produces(k)) c.slot(k)[0] = std::byte{1};
  };
  auto const measured = calibrate(st, backend, work, work, {.repeats = 1});
  auto const path = (std::filesystem::temp_directory_path() / ("tide_calibration_" + std::to_string(::getpid()) + ".json")).string();
  io::write_calibration_file(path, measured);
  auto const back = io::read_calibration_file(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.layers.size(), measured.layers.size());
  for (std::size_t l = 0; l < measured.layers.size(); ++l) {
    EXPECT_EQ(back.layers[l].forward_us, measured.layers[l].forward_us);
    EXPECT_EQ(back.layers[l].backward_us, measured.layers[l].backward_us);
    EXPECT_EQ(back.layers[l].full_recompute_us(), measured.layers[l].full_recompute_us());
    EXPECT_EQ(back.layers[l].slot_recompute_us, measured.layers[l].slot_recompute_us);
  }
  EXPECT_EQ(back.link.d2h.bytes_per_second, measured.link.d2h.bytes_per_second);
  EXPECT_EQ(back.link.h2d.latency_us, measured.link.h2d.latency_us);
  EXPECT_EQ(back.link.full_duplex, measured.link.full_duplex);
  EXPECT_EQ(back.sync_latency_us, measured.sync_latency_us);
  EXPECT_EQ(back.op_overhead_us, measured.op_overhead_us);
  back.check_against(st);

  // Without measuring the link, calibrate leaves it unpaced (0): that is written and read back too.
  auto const unpaced = calibrate(st, backend, work, work, {.repeats = 1, .measure_link = false});
  auto const unpaced_back = io::cost_table_from_json(io::parse_json(io::to_json(unpaced).dump(), "c"));
  EXPECT_EQ(unpaced_back.link.d2h.bytes_per_second, unpaced.link.d2h.bytes_per_second);
  EXPECT_EQ(unpaced_back.layers.size(), 3u);
  // JSON has no NaN: the writer refuses it, naming the field.
  auto nan_table = measured;
  nan_table.layers[1].backward_us = std::nan("");
  try {
    (void)io::to_json(nan_table);
    ADD_FAILURE() << "wrote a NaN";
  } catch (tide::error const& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 backward_us"), std::string::npos) << e.what();
  }

  auto bad = [](std::string_view text) {
    try {
      (void)io::cost_table_from_json(io::parse_json(text, "c"), "calibration file c");
    } catch (io::json_error const& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(bad(R"({"layers": [], "link": {}})").find("/layers: expected at least one layer"), std::string::npos);
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": -2}], "link": {}})").find("/layers/0/backward_us"), std::string::npos);
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": 2}], "link": {"d2h": {"bytes_per_second": -1}}})")
                .find("/link/d2h/bytes_per_second: expected a finite number of at least 0"),
            std::string::npos);
  // 0.2's latency in seconds is still read (deprecated), as microseconds; both spellings at once
  // are refused by name.
  auto const old = io::cost_table_from_json(io::parse_json(
      R"({"layers": [{"forward_us": 1, "backward_us": 2}], "link": {"d2h": {"bytes_per_second": 1e9, "latency_s": 1.5e-5}, "h2d": {"bytes_per_second": 1e9}}})", "c"));
  EXPECT_DOUBLE_EQ(old.link.d2h.latency_us, 15);
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": 2}], "link": {"d2h": {"bytes_per_second": 1, "latency_us": 1, "latency_s": 1}}})")
                .find("/link/d2h/latency_s: give \"latency_us\" alone"),
            std::string::npos);

  // Unreleased (after 0.3.0): slot producers, the memory-bound share and the HBM bandwidth (contention) round-trip
  // bit for bit; a producer list of the wrong length, a share outside [0, 1] and a positive
  // bandwidth below a byte per second are refused by path.
  auto shared = measured;
  shared.layers[0].slot_recompute_us = {0, 7.5};
  shared.layers[0].slot_producer = {3, 3};
  shared.layers[2].memory_bound_share = 0.125;
  shared.hbm_bytes_per_second = 8e12;
  auto const shared_back = io::cost_table_from_json(io::parse_json(io::to_json(shared).dump(), "c"));
  EXPECT_EQ(shared_back.layers[0].slot_producer, shared.layers[0].slot_producer);
  EXPECT_EQ(shared_back.layers[1].slot_producer, shared.layers[1].slot_producer);
  EXPECT_EQ(shared_back.layers[2].memory_bound_share, 0.125);
  EXPECT_EQ(shared_back.hbm_bytes_per_second, 8e12);
  EXPECT_EQ(io::to_json(shared_back), io::to_json(shared));
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": 2, "slot_recompute_us": [1, 2], "slot_producer": [0]}], "link": {"d2h": {"bytes_per_second": 1}, "h2d": {"bytes_per_second": 1}}})")
                .find("/layers/0/slot_producer: expected one producer per entry of slot_recompute_us (2), found 1"),
            std::string::npos);
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": 2, "slot_producer": [0]}], "link": {"d2h": {"bytes_per_second": 1}, "h2d": {"bytes_per_second": 1}}})")
                .find("/layers/0/slot_producer: slot_producer needs slot_recompute_us beside it"),
            std::string::npos);
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": 2, "memory_bound_share": 1.5}], "link": {"d2h": {"bytes_per_second": 1}, "h2d": {"bytes_per_second": 1}}})")
                .find("/layers/0/memory_bound_share"),
            std::string::npos);
  EXPECT_NE(bad(R"({"layers": [{"forward_us": 1, "backward_us": 2}], "link": {"d2h": {"bytes_per_second": 1}, "h2d": {"bytes_per_second": 1}}, "hbm_bytes_per_second": 0.5})")
                .find("/hbm_bytes_per_second: expected 0"),
            std::string::npos);
}

TEST(ModelFile, TheDocumentedFileReadsAsItsStack) {
  auto const m = io::read_model_file(source_root + "/docs/examples/model.json");
  ASSERT_EQ(m.stack.layer_count(), 24u);
  ASSERT_EQ(m.stack.types.size(), 1u);
  auto const& t = m.stack.types[0];
  ASSERT_EQ(t.slots.size(), 5u);
  EXPECT_EQ(t.slots[0].name, "layer_input");
  EXPECT_TRUE(t.slots[0].input);
  EXPECT_EQ(t.slots[3].name, "mlp_up");
  EXPECT_EQ(t.slots[3].bytes, 268435456u);
  EXPECT_EQ(m.resident_bytes, std::size_t{20} << 30);
  ASSERT_TRUE(m.has_costs());
  auto const hw = hardware::h100_sxm();
  auto const c = m.costs(hw, hw.link());
  ASSERT_EQ(c.layers.size(), 24u);
  // Work into time on the preset: FLOPs at peak times MFU, bytes at HBM bandwidth.
  EXPECT_DOUBLE_EQ(c.layers[5].forward_us, 1e6 * (1924145348608.0 / (hw.dense_flops * hw.mfu) + 671088640.0 / hw.hbm_bytes_per_second));
  EXPECT_DOUBLE_EQ(c.layers[5].backward_us, 1e6 * (2 * 1924145348608.0 / (hw.dense_flops * hw.mfu) + 2 * 671088640.0 / hw.hbm_bytes_per_second));
  ASSERT_EQ(c.layers[5].slot_recompute_us.size(), 5u);
  EXPECT_EQ(c.layers[5].slot_recompute_us[0], 0);  // the input: never rematerialized
  c.check_against(m.stack);
}

TEST(ModelFile, CopiesKeepTheirNames) {
  io::model_description copy;
  {
    auto const m = io::model_from_json(io::parse_json(R"({"layer_types": [{"name": "step", "slots": [{"name": "flux", "bytes": 64}],
      "cost": {"forward_us": 10, "backward_us": 20}}], "layers": [{"type": "step", "count": 5}], "carry": {"name": "u", "bytes": 32}})",
                                                       "m"));
    copy = m;
  }
  EXPECT_EQ(copy.stack.types[0].name, "step");
  EXPECT_EQ(copy.stack.types[0].slots[0].name, "flux");
  EXPECT_EQ(copy.stack.carry.name, "u");
  EXPECT_EQ(copy.stack.carry.bytes, 32u);
  EXPECT_EQ(build_schedule(copy.stack, strategy{.checkpoints = {.device_snapshots = 2}}).carry.device_snapshots, 2u);
}

TEST(ModelFile, BadDescriptionsNameTheirJsonPath) {
  auto error_of_model = [](std::string_view text) {
    try {
      (void)io::model_from_json(io::parse_json(text, "m"), "model file m.json");
    } catch (io::json_error const& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  struct bad {
    char const* text;
    char const* says;
  };
  std::string const ok_type = R"({"name": "blk", "slots": [{"name": "a", "bytes": 8}], "cost": {"forward_us": 1, "backward_us": 2}})";
  for (auto const& b : {
           bad{R"({"layers": []})", "/: missing key 'layer_types'"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}]}], "layers": [{"type": "blc"}]})",
               "/layers/0/type: unknown layer type 'blc' (the file's types: blk)"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}, {"name": "a", "bytes": 8}]}], "layers": [{"type": "blk"}]})",
               "/layer_types/0/slots/1/name: a second slot named 'a'"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 0}]}], "layers": [{"type": "blk"}]})",
               "/layer_types/0/slots/0/bytes: expected a positive size"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}], "cost": {"forward_us": 1, "backward_us": 2, "forward_flops": 5}}], "layers": [{"type": "blk"}]})",
               "/layer_types/0/cost: give times (forward_us, ...) or work (forward_flops, ...), not both"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8, "recompute_us": 1}, {"name": "b", "bytes": 8}], "cost": {"forward_us": 1, "backward_us": 2}}], "layers": [{"type": "blk"}]})",
               "/layer_types/0/slots: some slots give a recompute cost"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}], "cost": {"forward_us": 1}}], "layers": [{"type": "blk"}]})",
               "/layer_types/0/cost: missing key 'backward_us'"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}]}], "layers": [{"type": "blk", "count": 0}]})",
               "/layers/0/count: expected at least 1"},
           bad{R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}]}], "layers": [{"type": "blk"}], "carry": {"name": "u", "bytes": 0}})",
               "/carry/bytes: expected a positive size"},
           bad{R"({"layer_types": [{"name": "blk", "slot": []}], "layers": []})", "/layer_types/0/slot: unknown key 'slot'"},
       }) {
    SCOPED_TRACE(b.text);
    auto const what = error_of_model(b.text);
    EXPECT_NE(what.find(std::string("model file m.json: ") + b.says), std::string::npos) << what;
  }
  // A type without a cost: reading works (a calibration file may give the costs), costing names it.
  auto const m = io::model_from_json(
      io::parse_json(R"({"layer_types": [{"name": "blk", "slots": [{"name": "a", "bytes": 8}]}], "layers": [{"type": "blk"}]})", "m"));
  EXPECT_FALSE(m.has_costs());
  try {
    (void)m.costs(hardware::h100_sxm(), {});
    FAIL() << "costed a type without a cost";
  } catch (cost_model_error const& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 (type 'blk') of the model file has no cost"), std::string::npos) << e.what();
  }
  EXPECT_EQ(error_of_model(R"({"layer_types": [)" + ok_type + R"(], "layers": [{"type": "blk", "count": 3}]})"), "");
  // A run of layers with its own cost; slot recompute costs stay the type's, in the same unit.
  auto const typed = R"({"name": "blk", "slots": [{"name": "a", "bytes": 8, "recompute_us": 0.5}], "cost": {"forward_us": 1, "backward_us": 2}})";
  auto const own = io::model_from_json(io::parse_json(std::string(R"({"layer_types": [)") + typed +
                                                          R"(], "layers": [{"type": "blk", "count": 2}, {"type": "blk", "cost": {"forward_us": 5, "backward_us": 9}}]})",
                                                      "m"));
  auto const oc = own.costs(hardware::h100_sxm(), {});
  ASSERT_EQ(oc.layers.size(), 3u);
  EXPECT_EQ(oc.layers[1].forward_us, 1);
  EXPECT_EQ(oc.layers[2].forward_us, 5);
  EXPECT_EQ(oc.layers[2].backward_us, 9);
  EXPECT_EQ(oc.layers[2].slot_recompute_us, std::vector<double>{0.5});
  EXPECT_NE(error_of_model(std::string(R"({"layer_types": [)") + typed + R"(], "layers": [{"type": "blk", "cost": {"forward_flops": 5}}]})")
                .find("/layers/0/cost: the type's slot recompute costs are times"),
            std::string::npos);
}

// ---- Hardening (issue 21) ----------------------------------------------------------------------

namespace {
// What reading `text` as `kind` ("policy", "model", "calibration") says, or "" when it reads.
std::string read_error(std::string_view kind, std::string_view text) {
  try {
    auto const j = io::parse_json(text, std::string(kind) + " file t.json");
    if (kind == "policy") (void)io::strategy_from_json(j, chain_stack(), "policy file t.json");
    else if (kind == "model") (void)io::model_from_json(j, "model file t.json");
    else (void)io::cost_table_from_json(j, "calibration file t.json");
  } catch (io::json_error const& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// A key given twice in one object is an error naming the file, the JSON Pointer and the key, in
// every kind of file and at any depth; the same key in two objects is fine.
TEST(Hardening, DuplicateKeysAreErrors) {
  EXPECT_EQ(read_error("policy", R"({"pipeline": {"latency_hiding": true, "latency_hiding": false}})"),
            "tide: policy file t.json: /pipeline/latency_hiding: the key 'latency_hiding' is given twice in one object");
  EXPECT_EQ(read_error("policy", R"({"rules": [{"action": "keep"}, {"action": "remat", "slots": ["qkv"], "action": "offload"}]})"),
            "tide: policy file t.json: /rules/1/action: the key 'action' is given twice in one object");
  EXPECT_EQ(read_error("model", R"({"layer_types": [{"name": "b", "slots": [{"name": "x", "bytes": 8, "bytes": 16}]}], "layers": []})"),
            "tide: model file t.json: /layer_types/0/slots/0/bytes: the key 'bytes' is given twice in one object");
  EXPECT_EQ(read_error("calibration", R"({"layers": [{"forward_us": 1, "backward_us": 2}], "layers": []})"),
            "tide: calibration file t.json: /layers: the key 'layers' is given twice in one object");
  EXPECT_EQ(read_error("policy", R"({"rules": [{"action": "keep", "slots": ["x"]}, {"action": "remat", "slots": ["qkv"]}],
                                     "pipeline": {"latency_hiding": true}, "buffers": {"staging_buffers": 2}})"),
            "");
}

// A number a double cannot hold names the file and the value's JSON Pointer; times past
// max_time_us (which would overflow a step) are refused naming the field.
TEST(Hardening, OverflowingAndAbsurdNumbersNameTheirPath) {
  EXPECT_EQ(read_error("calibration", R"({"layers": [{"forward_us": 1, "backward_us": 2}, {"forward_us": 1e400}]})"),
            "tide: calibration file t.json: /layers/1/forward_us: number overflow parsing '1e400'");
  EXPECT_EQ(read_error("policy", R"({"rules": [], "pipeline": {"chunk_bytes": [0, -1e999]}})"),
            "tide: policy file t.json: /pipeline/chunk_bytes/1: number overflow parsing '-1e999'");
  EXPECT_EQ(read_error("calibration", "1e400"), "tide: calibration file t.json: /: number overflow parsing '1e400'");
  auto const e = read_error("calibration", R"({"layers": [{"forward_us": 1e308, "backward_us": 2}], "link": {}})");
  EXPECT_NE(e.find("/layers/0/forward_us: expected a finite number from 0 to 1000000000000, found 1e+308"), std::string::npos) << e;
  auto const bw = read_error("calibration", R"({"layers": [{"forward_us": 1, "backward_us": 2}],
      "link": {"d2h": {"bytes_per_second": 1e-300}, "h2d": {"bytes_per_second": 0}}})");
  EXPECT_NE(bw.find("/link/d2h/bytes_per_second: expected 0 (unpaced) or at least 1 byte per second"), std::string::npos) << bw;
  // Work that no GPU finishes in max_time_us: refused when it becomes time, naming the layer.
  auto const m = io::model_from_json(io::parse_json(R"({"layer_types": [{"name": "b", "slots": [{"name": "x", "bytes": 8, "input": true}],
      "cost": {"forward_flops": 1e30}}], "layers": [{"type": "b", "count": 2}]})", "m"), "model file m.json");
  try {
    (void)m.costs(hardware::h100_sxm(), hardware::h100_sxm().link());
    ADD_FAILURE() << "absurd work was accepted";
  } catch (cost_model_error const& x) {
    EXPECT_NE(std::string(x.what()).find("model file m.json: layer 0 (type 'b'): its forward takes"), std::string::npos) << x.what();
  }
}

// An unknown key of a megabyte is quoted shortened, once in the path and once in the message.
TEST(Hardening, HugeUnknownKeysAreShortenedInMessages) {
  std::string const key(1 << 20, 'k');
  auto const e = read_error("policy", R"({")" + key + R"(": 1})");
  EXPECT_LT(e.size(), 600u) << e.size();
  EXPECT_NE(e.find("unknown key '" + key.substr(0, 64) + "... (1048576 bytes)'"), std::string::npos);
  EXPECT_EQ(io::detail::echo("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9... (4 bytes)");  // cut at a UTF-8 boundary
}

// Negative zero is written as -0.0 and reads back with its sign, in every field.
TEST(Hardening, NegativeZeroRoundTripsBitForBit) {
  cost_table t;
  t.layers.push_back({.forward_us = -0.0, .backward_us = 1, .recompute_us = -0.0, .slot_recompute_us = {-0.0},
                      .gather_us = -0.0, .reduce_us = -0.0, .regather_us = -0.0});
  t.sync_latency_us = -0.0;
  t.op_overhead_us = -0.0;
  t.link.d2h.latency_us = -0.0;
  auto const back = io::cost_table_from_json(io::parse_json(io::to_json(t).dump(), "c"));
  auto const& l = back.layers.at(0);
  for (double v : {l.forward_us, l.recompute_us.value_or(1), l.slot_recompute_us.at(0), l.gather_us, l.reduce_us, l.regather_us,
                   back.sync_latency_us, back.op_overhead_us, back.link.d2h.latency_us})
    EXPECT_TRUE(v == 0 && std::signbit(v));
  EXPECT_EQ(io::to_json(back), io::to_json(t));
}

// A strategy-table row is never cut, however long its name.
TEST(Hardening, StrategyTableRowsAreNotCut) {
  strategy_row row;
  row.name = std::string(300, 'n') + "|end";
  auto const text = format_strategy_table({row});
  EXPECT_NE(text.find(row.name + " "), std::string::npos);
  EXPECT_NE(text.find("does not fit\n"), std::string::npos);
}

// Slot names with quotes, backslashes, control and non-ASCII bytes are spelled as C++ literals of
// the same bytes.
TEST(Hardening, GeneratedCppEscapesSlotNames) {
  EXPECT_EQ(cpp_string_literal("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(cpp_string_literal("\n\xc3\xa9" "1"), "\"\\012\\303\\2511\"");
  stack_spec st;
  st.independent_layers = true;
  st.append({"blk", {{"q\"k", 64}, {"b\\s", 64}}}, 2);
  strategy s;
  s.policy.rules.push_back({.where = placement::offload, .slots = {st.types[0].slots[0].name, st.types[0].slots[1].name}});
  auto const code = to_cpp_types(s, "p");
  EXPECT_NE(code.find("tide::slot_names<\"q\\\"k\", \"b\\\\s\">"), std::string::npos) << code;
}

// Impossible layouts are refused in one place, naming the degree, its value and the constraint;
// transformer_costs calls it.
TEST(Hardening, ImpossibleParallelLayoutsAreRefused) {
  auto const hw = hardware::gb200();
  auto message = [&](transformer_spec const& m, parallel_layout const& l) -> std::string {
    try {
      (void)transformer_costs(m, hw, {.layout = l});
    } catch (cost_model_error const& e) {
      return e.what();
    }
    return "";
  };
  auto const ds = models::deepseek_v3(4096, 1, 1);
  EXPECT_EQ(message(models::deepseek_v3(4096, 1, 3), {.gpus = 128, .fsdp = 32}),
            "tide: tensor_parallel 3 does not divide the 128 attention heads of 'DeepSeek-V3-like'");
  EXPECT_NE(message(models::deepseek_v3(4096, 1, 1024), {.gpus = 1024}).find("tensor_parallel 1024 does not divide"), std::string::npos);
  EXPECT_EQ(message(ds, {.gpus = 128, .fsdp = 3}), "tide: fsdp 3 x tensor_parallel 1 x pipeline_parallel 1 = 3 GPUs does not divide gpus 128");
  EXPECT_NE(message(ds, {.gpus = 96, .fsdp = 96, .expert_parallel = 64}).find("expert_parallel 64 x"), std::string::npos);
  EXPECT_NE(message(ds, {.gpus = 128, .fsdp = 128, .expert_parallel = 48}).find("does not divide the 256 experts"), std::string::npos);
  EXPECT_NE(message(ds, {.gpus = 192, .fsdp = 96, .expert_parallel = 64}).find("must divide one another"), std::string::npos);
  EXPECT_NE(message(models::llama3_405b(8192, 1, 8), {.gpus = 128, .fsdp = 16, .expert_parallel = 2}).find("which has no experts"),
            std::string::npos);
  EXPECT_EQ(message(ds, {.gpus = 128, .fsdp = 128, .expert_parallel = 64}), "");
  EXPECT_EQ(message(models::llama3_405b(8192, 1, 8), {.gpus = 128, .fsdp = 16}), "");
  EXPECT_THROW((void)transformer_costs(models::llama3_405b(8192, 1, 3), hw), cost_model_error);  // without communication too
  EXPECT_THROW(check_parallel_layout(ds, {.gpus = 128, .fsdp = 3}), cost_model_error);
}

// A model file says where a layer's input comes from with an input slot, a carry or
// "independent_layers"; with none of them the builder refuses the stack.
TEST(ModelFile, IndependentLayersKey) {
  auto const text = [](char const* extra) {
    return std::string(R"({"layer_types": [{"name": "b", "slots": [{"name": "h", "bytes": 64}]}], "layers": [{"type": "b", "count": 2}])") +
           extra + "}";
  };
  auto const m = io::model_from_json(io::parse_json(text(R"(, "independent_layers": true)"), "m"));
  EXPECT_TRUE(m.stack.independent_layers);
  EXPECT_NO_THROW((void)build_schedule(m.stack, strategy{}));
  auto const plain = io::model_from_json(io::parse_json(text(""), "m"));
  EXPECT_FALSE(plain.stack.independent_layers);
  EXPECT_THROW((void)build_schedule(plain.stack, strategy{}), schedule_error);
}

// Every file tide writes, its own reader accepts (issue 54): random strategies (rules with slot
// subsets, bounds by index and from the end, sizes; every buffer, pipeline and collective knob;
// Revolve checkpoints) and random calibrations (every field, measured and "as forward" recompute
// times, per-slot costs and producers, unpaced and paced links) are written and read back. A
// strategy the builder accepts reads back to one that builds the same schedule, and is written
// again unchanged; a calibration reads back bit for bit. (tide writes no model files.)
TEST(RoundTrip, RandomPoliciesAndCalibrationsReadBackAsWritten) {
  std::mt19937_64 rng(0x5eed'0054);
  auto pick = [&](std::uint64_t n) { return static_cast<std::uint64_t>(rng() % n); };
  auto coin = [&] { return pick(2) == 1; };
  stack_spec st;
  st.append({"dense", {{"x", 4096, true}, {"qkv", 12288}, {"mlp_up", 16384}, {"norm", 512}}}, 3);
  st.append({"moe", {{"x", 4096, true}, {"qkv", 12288}, {"router", 256}, {"experts", 65536}}}, 5);
  st.carry = {"residual", 4096};
  std::vector<tide::name> const names = {"qkv", "mlp_up", "norm", "router", "experts"};
  placement const wheres[] = {placement::keep, placement::offload, placement::remat, placement::spill};
  auto bound = [&](bool end) -> layer_bound {
    switch (pick(4)) {
      case 0: return end ? layer_bound{all_layers} : layer_bound{0};
      case 1: return layer_bound{static_cast<std::uint32_t>(pick(8))};
      case 2: return from_end(static_cast<std::uint32_t>(1 + pick(8)));
      default: {  // fields set by hand: 0 back, or a count past max_from_end
        layer_bound b;
        b.value = coin() ? 0 : max_from_end + static_cast<std::uint32_t>(pick(1000));
        b.from_end = true;
        return b;
      }
    }
  };
  int built = 0;
  for (int i = 0; i < 400; ++i) {
    strategy s;
    for (auto r = pick(4); r-- > 0;) {
      rule_spec rule{.where = wheres[pick(4)], .first_layer = bound(false), .last_layer = bound(true)};
      for (auto const& n : names)
        if (pick(3) == 0) rule.slots.push_back(n);
      if (coin()) rule.min_bytes = pick(20000);
      s.policy.rules.push_back(rule);
    }
    s.policy.allow_unused_rules = coin();
    s.buffers = {.staging_buffers = static_cast<std::uint32_t>(pick(5)),
                 .device_alignment = std::size_t{1} << (4 + pick(9)),
                 .host_alignment = std::size_t{1} << (4 + pick(9)),
                 .guard_bytes = coin() ? 0 : pick(128),
                 .share_phase_regions = coin(),
                 .spill_buffers = static_cast<std::uint32_t>(1 + pick(3)),
                 .storage_alignment = std::size_t{1} << (9 + pick(4)),
                 .lend_recompute_scratch = coin()};
    s.pipeline = {.latency_hiding = coin(),
                  .prefetch_distance = static_cast<std::uint32_t>(pick(4)),
                  .chunk_bytes = coin() ? 0 : 1 + pick(20000),
                  .max_offloads_in_flight = static_cast<std::uint32_t>(pick(4))};
    s.collectives = {.before_forward = coin(), .before_backward = coin(), .after_backward = coin()};
    if (pick(4) == 0) s.checkpoints.device_snapshots = static_cast<std::uint32_t>(2 + pick(4));
    auto const text = io::to_json(s).dump(2);
    schedule want;
    bool const builds = !try_build_schedule_into(want, st, s);
    strategy back;
    try {
      back = io::strategy_from_json(io::parse_json(text, "policy file"), st);
    } catch (io::json_error const& e) {
      // The reader may refuse only what the builder refuses too.
      EXPECT_FALSE(builds) << "case " << i << ": the reader refused a strategy the builder accepts: " << e.what() << "\n" << text;
      continue;
    }
    EXPECT_EQ(io::to_json(back).dump(2), text) << "case " << i << ": written again differently";
    if (!builds) continue;
    ++built;
    schedule got;
    ASSERT_FALSE(try_build_schedule_into(got, st, back)) << "case " << i << "\n" << text;
    expect_same_schedule(got, want);
  }
  EXPECT_GT(built, 100);  // the property speaks of schedules, not only of refusals
  // 0 offloads in flight reads as written (the reader refused it, though the builder accepts it
  // where nothing is offloaded with latency hiding); the builder refuses it where that matters.
  auto const zero = io::strategy_from_json(io::parse_json(R"({"rules": [{"where": "offload", "slots": ["qkv"]}],
                                                              "pipeline": {"max_offloads_in_flight": 0}})", "policy file"), st);
  EXPECT_EQ(zero.pipeline.max_offloads_in_flight, 0u);
  schedule none;
  EXPECT_EQ(try_build_schedule_into(none, st, zero).code, schedule_issue_code::zero_offloads_in_flight);

  for (int i = 0; i < 300; ++i) {
    cost_table c;
    auto time = [&] { return coin() ? static_cast<double>(pick(1000)) : std::ldexp(static_cast<double>(rng() >> 11), -static_cast<int>(14 + pick(60))); };  // below 1e12
    for (std::uint32_t l = 0; l < st.layer_count(); ++l) {
      layer_cost lc{.forward_us = time(), .backward_us = time(), .recompute_us = coin() ? std::optional<double>{} : time()};
      if (coin()) {
        for (std::size_t k = 0; k < st.layer(l).slots.size(); ++k) lc.slot_recompute_us.push_back(time());
        if (coin())
          for (std::size_t k = 0; k < st.layer(l).slots.size(); ++k) lc.slot_producer.push_back(static_cast<std::uint16_t>(pick(3)));
      }
      lc.gather_us = time(), lc.reduce_us = time(), lc.regather_us = time();
      lc.memory_bound_share = coin() ? 0 : static_cast<double>(pick(1001)) / 1000;
      c.layers.push_back(lc);
    }
    auto rate = [&] { return coin() ? 0.0 : 1 + std::ldexp(static_cast<double>(rng() >> 11), -static_cast<int>(pick(20))); };
    c.link = {.d2h = {.bytes_per_second = rate(), .latency_us = time()}, .h2d = {.bytes_per_second = rate(), .latency_us = time()},
              .full_duplex = coin()};
    c.sync_latency_us = time(), c.op_overhead_us = time(), c.hbm_bytes_per_second = rate();
    if (coin())  // the storage link (issue 54: the file had none, and drives read back as unpaced)
      c.storage = {.write = {.bytes_per_second = rate(), .latency_us = time()}, .read = {.bytes_per_second = rate(), .latency_us = time()},
                   .full_duplex = coin()};
    ASSERT_NO_THROW(c.check()) << "case " << i << ": the generator made a table check() refuses";
    auto const text = io::to_json(c).dump();
    cost_table back;
    try {
      back = io::cost_table_from_json(io::parse_json(text, "calibration file"));
    } catch (std::exception const& e) {
      ADD_FAILURE() << "case " << i << ": a valid table written was refused: " << e.what() << "\n" << text;
      continue;
    }
    EXPECT_EQ(io::to_json(back).dump(), text) << "case " << i;
    for (std::uint32_t l = 0; l < st.layer_count(); ++l) {
      EXPECT_EQ(std::memcmp(&back.layers[l].forward_us, &c.layers[l].forward_us, sizeof(double)), 0) << "case " << i;
      EXPECT_EQ(back.layers[l].slot_producer, c.layers[l].slot_producer) << "case " << i;
      EXPECT_EQ(std::memcmp(&back.storage.write.bytes_per_second, &c.storage.write.bytes_per_second, sizeof(double)), 0) << "case " << i;
      EXPECT_EQ(std::memcmp(&back.storage.read.latency_us, &c.storage.read.latency_us, sizeof(double)), 0) << "case " << i;
      EXPECT_EQ(back.storage.full_duplex, c.storage.full_duplex) << "case " << i;
      // "As forward_us" reads back as such (the writer wrote the forward's time, issue 54).
      EXPECT_EQ(back.layers[l].recompute_us, c.layers[l].recompute_us) << "case " << i;
    }
  }
}
