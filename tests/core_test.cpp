// Core: exact op programs for small stacks, peaks by hand, constexpr schedules, run-time errors,
// and the checker catching broken programs.
#include <gtest/gtest.h>

#include <tide/tide.hpp>

#include <string>
#include <vector>

using namespace tide;

namespace {

using blk = layer<"blk", slot<"a", 1000>, slot<"b", 3000>>;
using three = stack<repeat<blk, 3>>;
using offload_b = policy<offload<slots<"b">>>;
policy_spec offload_b_any() { return policy_spec{rule_spec{placement::offload, {}, 0, all_layers, 0}}; }

struct expected_op {
  op_kind kind;
  stream_role stream;
  std::uint32_t layer;
  std::vector<std::uint32_t> waits;
};

void expect_program(schedule_view s, std::vector<expected_op> const& want) {
  ASSERT_EQ(s.ops.size(), want.size()) << describe(s);
  for (std::size_t i = 0; i < want.size(); ++i) {
    auto const& o = s.ops[i];
    EXPECT_EQ(o.kind, want[i].kind) << "op #" << i << "\n" << describe(s);
    EXPECT_EQ(o.stream, want[i].stream) << "op #" << i;
    EXPECT_EQ(o.layer, want[i].layer) << "op #" << i;
    auto w = s.waits_of(o);
    EXPECT_EQ(std::vector<std::uint32_t>(w.begin(), w.end()), want[i].waits) << "op #" << i << "\n" << describe(s);
  }
}

using enum stream_role;

}  // namespace

TEST(Schedule, OffloadWithLatencyHidingExactProgram) {
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, {true, 1, 0, 2});
  // Forward: each offload waits for its layer's forward; layer 2 reuses layer 0's source buffer
  // (2 in flight), so its forward waits for layer 0's offload. Backward: layers 2 and 1 are
  // prefetched at the start (distance 1), layer 0 once layer 2's backward frees staging buffer 0.
  expect_program(s, {
                        {op_kind::forward, compute, 0, {}},
                        {op_kind::offload, d2h, 0, {0}},
                        {op_kind::forward, compute, 1, {}},
                        {op_kind::offload, d2h, 1, {2}},
                        {op_kind::forward, compute, 2, {1}},
                        {op_kind::offload, d2h, 2, {4}},
                        {op_kind::prefetch, h2d, 2, {5}},
                        {op_kind::prefetch, h2d, 1, {}},
                        {op_kind::backward, compute, 2, {6}},
                        {op_kind::prefetch, h2d, 0, {8}},
                        {op_kind::backward, compute, 1, {7}},
                        {op_kind::backward, compute, 0, {9}},
                    });
  EXPECT_EQ(s.event_count, 9u);
  // By hand: a -> 1024-byte regions, b -> 3072. Kept 3 x 1024; two source and two staging
  // buffers of 3072 share addresses across phases. Host: 3 x align64(3000) = 3 x 3008.
  EXPECT_EQ(s.arena.kept_bytes, 3072u);
  EXPECT_EQ(s.peak_device_bytes(), 3072u + 2 * 3072u);
  EXPECT_EQ(s.peak_host_bytes(), 3u * 3008u);
  auto r = check_schedule(s);
  EXPECT_EQ(r.replayed_device_bytes, s.peak_device_bytes());
  EXPECT_EQ(r.replayed_host_bytes, s.peak_host_bytes());
}

TEST(Schedule, NaivePipelinePutsCopiesOnComputeStream) {
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, pipeline_spec{false, 0, 0, 2});
  expect_program(s, {
                        {op_kind::forward, compute, 0, {}},
                        {op_kind::offload, compute, 0, {}},
                        {op_kind::forward, compute, 1, {}},
                        {op_kind::offload, compute, 1, {}},
                        {op_kind::forward, compute, 2, {}},
                        {op_kind::offload, compute, 2, {}},
                        {op_kind::prefetch, compute, 2, {}},
                        {op_kind::backward, compute, 2, {}},
                        {op_kind::prefetch, compute, 1, {}},
                        {op_kind::backward, compute, 1, {}},
                        {op_kind::prefetch, compute, 0, {}},
                        {op_kind::backward, compute, 0, {}},
                    });
  EXPECT_EQ(s.event_count, 0u);
  EXPECT_EQ(s.peak_device_bytes(), 3072u + 3072u);  // one source/staging buffer suffices
  check_schedule(s);
}

TEST(Schedule, RematAndKeepPeaksByHand) {
  using p = policy<remat<slots<"b">, layers<1, 3>>>;
  auto s = build_schedule(three::spec(), p::spec());
  // kept: a x3 (1024 each) + b of layer 0 (3072); remat scratch one b (3072), shared by phases.
  EXPECT_EQ(s.arena.kept_bytes, 3 * 1024u + 3072u);
  EXPECT_EQ(s.peak_device_bytes(), 3 * 1024u + 3072u + 3072u);
  EXPECT_EQ(s.peak_host_bytes(), 0u);
  expect_program(s, {
                        {op_kind::forward, compute, 0, {}},
                        {op_kind::forward, compute, 1, {}},
                        {op_kind::forward, compute, 2, {}},
                        {op_kind::recompute, compute, 2, {}},
                        {op_kind::backward, compute, 2, {}},
                        {op_kind::recompute, compute, 1, {}},
                        {op_kind::backward, compute, 1, {}},
                        {op_kind::backward, compute, 0, {}},
                    });
  check_schedule(s);
  auto keep = build_schedule(three::spec(), keep_all::spec());
  EXPECT_EQ(keep.peak_device_bytes(), 3 * (1024u + 3072u));
}

TEST(Schedule, ChunksCollectivesAndNoPhaseSharing) {
  buffer_spec b;
  b.share_phase_regions = false;
  auto s = build_schedule(three::spec(), offload_b::spec(), b, {true, 1, 1024, 1}, {true, true});
  std::size_t offloads = 0, prefetches = 0, gathers = 0, colls = 0;
  for (auto const& o : s.ops) {
    offloads += o.kind == op_kind::offload;
    prefetches += o.kind == op_kind::prefetch;
    gathers += o.kind == op_kind::gather;
    colls += o.kind == op_kind::collective;
    if (is_copy(o.kind)) {
      EXPECT_EQ(o.chunks, 3u);  // 3000 bytes in 1024-byte chunks
      EXPECT_EQ(o.bytes, o.chunk < 2 ? 1024u : 952u);
    }
  }
  EXPECT_EQ(offloads, 9u);
  EXPECT_EQ(prefetches, 9u);
  EXPECT_EQ(gathers, 3u);
  EXPECT_EQ(colls, 3u);
  // One source buffer, two staging buffers, not shared: 3072 + 3072 + 2 x 3072.
  EXPECT_EQ(s.peak_device_bytes(), 3072u + 3072u + 2 * 3072u);
  check_schedule(s);
}

TEST(Schedule, EveryPipelineVariantPassesTheChecker) {
  stack_spec st;
  st.append({"dense", {{"x", 512}, {"q", 4096}, {"up", 10000}}}, 2).append({"moe", {{"x", 512}, {"e", 7777}}}, 5);
  std::vector<policy_spec> policies = {
      {},
      {rule_spec{placement::offload, {}, 0, all_layers, 0}},
      {rule_spec{placement::remat, {"up"}, 0, all_layers, 0}, rule_spec{placement::offload, {"e", "q"}, 1, 6, 0}},
      {rule_spec{placement::offload, {}, 0, all_layers, 5000}, rule_spec{placement::remat, {"q"}, 0, all_layers, 0}},
  };
  int n = 0;
  for (auto const& p : policies)
    for (bool hide : {true, false})
      for (std::uint32_t d : {0u, 1u, 3u, 6u})
        for (std::size_t chunk : {std::size_t{0}, std::size_t{1000}, std::size_t{4096}})
          for (std::uint32_t st_bufs : {1u, 2u, 4u})
            for (std::uint32_t inflight : {1u, 3u})
              for (bool share : {true, false}) {
                buffer_spec b;
                b.staging_buffers = st_bufs;
                b.share_phase_regions = share;
                b.guard_bytes = chunk == 1000 ? 64 : 0;
                auto s = build_schedule(st, p, b, {hide, d, chunk, inflight}, {d == 1, d == 3});
                ASSERT_NO_THROW(check_schedule(s)) << describe(s);
                ++n;
              }
  EXPECT_EQ(n, 4 * 2 * 4 * 3 * 3 * 2 * 2);
}

TEST(Schedule, PrefetchDistanceIsLimitedByStagingBuffers) {
  stack_spec st;
  st.append({"l", {{"s", 256}}}, 8);
  auto s = build_schedule(st, policy_spec{rule_spec{placement::offload, {}, 0, all_layers, 0}}, {2, 256, 64, 0, true},
                          {true, 4, 0, 2});
  // With 2 staging buffers, the prefetch of layer l can only be issued once layer l+2's backward
  // (the buffer's previous reader) has been issued.
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto const& o = s.ops[i];
    if (o.kind != op_kind::prefetch || o.layer >= 6) continue;
    bool after_reader = false;
    for (std::uint32_t j = 0; j < i; ++j)
      after_reader |= s.ops[j].kind == op_kind::backward && s.ops[j].layer == o.layer + 2;
    EXPECT_TRUE(after_reader) << "prefetch of layer " << o.layer;
  }
  check_schedule(s);
}

// ---- compile time --------------------------------------------------------------------------

using dense = layer<"dense", slot<"layer_input", 4096>, slot<"q_proj", 8192>, slot<"mlp_up", 16384>>;
using moe = layer<"moe", slot<"layer_input", 4096>, slot<"q_proj", 8192>, slot<"experts", 65536>>;
using deepish = stack<repeat<dense, 3>, repeat<moe, 13>>;
using selective = policy<offload<slots<"experts", "q_proj">, layers<3>>, remat<slots<"mlp_up">>>;
constexpr auto static_sched = make_schedule<deepish, selective, buffers<staging_ring<3>>, pipeline<true, 2, 16384, 2>>();
static_assert(static_sched.peak_device_bytes() < 16 * (4096 + 8192 + 65536));
static_assert(static_sched.layer_count() == 16);
static_assert(static_sched.slots[3 * 3 + 2].where == placement::offload);  // layer 3's experts

TEST(Schedule, StaticAndRuntimeSchedulesAreIdentical) {
  auto rt = make_runtime_schedule<deepish, selective, buffers<staging_ring<3>>, pipeline<true, 2, 16384, 2>>();
  ASSERT_EQ(rt.ops.size(), static_sched.ops.size());
  for (std::size_t i = 0; i < rt.ops.size(); ++i) EXPECT_EQ(rt.ops[i], static_sched.ops[i]) << i;
  EXPECT_EQ(std::vector<std::uint32_t>(rt.waits.begin(), rt.waits.end()),
            std::vector<std::uint32_t>(static_sched.waits.begin(), static_sched.waits.end()));
  EXPECT_EQ(rt.arena, static_sched.arena);
  check_schedule(static_sched);
}

TEST(Schedule, DynamicSizesAtRunTime) {
  using l = layer<"l", slot<"act">, slot<"fixed", 100>>;
  auto s = make_runtime_schedule<stack<repeat<l, 2>>, keep_all>(slot_sizes{{"act", 5000}});
  EXPECT_EQ(s.slots[0].bytes, 5000u);
  EXPECT_EQ(s.peak_device_bytes(), 2 * (align_up(5000, 256) + 256));
  try {
    make_runtime_schedule<stack<repeat<l, 2>>, keep_all>();
    FAIL() << "expected schedule_error";
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("slot 'act' of layer type 'l' has a run-time size"), std::string::npos)
        << e.what();
  }
}

// ---- run-time errors -----------------------------------------------------------------------

namespace {
std::string error_of(stack_spec const& st, policy_spec const& p, buffer_spec b = {}, pipeline_spec pl = {}) {
  try {
    build_schedule(st, p, b, pl);
  } catch (schedule_error const& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Schedule, RuntimeErrorsNameWhatIsWrong) {
  auto st = three::spec();
  auto contains = [](std::string const& s, char const* what) { return s.find(what) != std::string::npos; };
  EXPECT_TRUE(contains(error_of(st, offload_b::spec(), {}, {true, 3, 0, 2}),
                       "prefetch distance 3 reaches beyond a stack of 3 layers"));
  buffer_spec zero;
  zero.staging_buffers = 0;
  EXPECT_TRUE(contains(error_of(st, offload_b::spec(), zero), "zero staging buffers"));
  EXPECT_EQ(error_of(st, keep_all::spec(), zero), "no error");  // staging only matters with offload
  EXPECT_TRUE(contains(error_of(st, policy_spec{rule_spec{placement::offload, {"nope"}, 0, all_layers, 0}}),
                       "names slot 'nope' which no layer of the stack has"));
  stack_spec dup;
  dup.append({"d", {{"x", 4}, {"x", 8}}});
  EXPECT_TRUE(contains(error_of(dup, {}), "layer type 'd' names slot 'x' twice"));
  stack_spec zero_slot;
  zero_slot.append({"z", {{"x", 0}}});
  EXPECT_TRUE(contains(error_of(zero_slot, {}), "slot 'x' of layer type 'z' has zero bytes"));
  EXPECT_TRUE(contains(error_of(stack_spec{}, {}), "the stack has no layers"));
  EXPECT_TRUE(contains(error_of(st, offload_b::spec(), {}, {true, 1, 0, 0}), "zero offloads in flight"));
  EXPECT_TRUE(contains(error_of(st, policy_spec{rule_spec{placement::remat, {}, 2, 2, 0}}), "empty range"));
}

// ---- the checker catches broken programs -----------------------------------------------------

TEST(Checker, DroppedWaitIsCaught) {
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, {true, 1, 0, 2});
  // Drop each wait in turn: every one is load-bearing, and the checker names the ops involved.
  for (std::size_t w = 0; w < s.waits.size(); ++w) {
    auto broken = s;
    for (auto& o : broken.ops)
      if (o.wait_begin <= w && w < o.wait_begin + o.wait_count) {
        broken.waits.erase(broken.waits.begin() + static_cast<std::ptrdiff_t>(w));
        --o.wait_count;
        for (auto& later : broken.ops)
          if (later.wait_begin > w) --later.wait_begin;
        break;
      }
    EXPECT_THROW(check_schedule(broken), schedule_error) << "wait " << w << " dropped\n" << describe(broken);
  }
}

TEST(Checker, ReusedRegionAndWrongPeakAreCaught) {
  auto s = build_schedule(three::spec(), offload_b::spec(), {}, {true, 1, 0, 2});
  auto moved = s;
  for (auto& o : moved.ops)
    if (o.kind == op_kind::prefetch && o.layer == 0) o.device_offset = moved.slots[1 * 2 + 1].backward_offset;  // layer 1's buffer
  EXPECT_THROW(check_schedule(moved), schedule_error);
  auto peak = s;
  peak.arena.device_bytes += 256;
  try {
    check_schedule(peak);
    FAIL();
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("predicted peak"), std::string::npos) << e.what();
  }
  auto late = s;
  late.waits[0] = 11;  // a wait on an op issued later
  EXPECT_THROW(check_schedule(late), schedule_error);
}

TEST(Describe, NamesPlacementsAndStreams) {
  auto s = build_schedule(three::spec(), policy_spec{rule_spec{placement::remat, {"a"}, 0, 1, 0},
                                                     rule_spec{placement::offload, {"b"}, 0, all_layers, 0}});
  auto d = describe(s);
  EXPECT_NE(d.find("layer 0 (blk): a=remat"), std::string::npos) << d;
  EXPECT_NE(d.find("b=offload"), std::string::npos) << d;
  EXPECT_NE(d.find("d2h: #"), std::string::npos) << d;
  EXPECT_NE(d.find("h2d: #"), std::string::npos) << d;
}

TEST(Schedule, GathersRunOneLayerAheadAndNoFurther) {
  auto s = build_schedule(three::spec(), keep_all::spec(), {}, {}, {true, false});
  // gather(l + 1) waits for forward(l - 1): two receive buffers suffice.
  std::vector<std::uint32_t> fwd(3), gat(3);
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    if (s.ops[i].kind == op_kind::forward) fwd[s.ops[i].layer] = i;
    if (s.ops[i].kind == op_kind::gather) gat[s.ops[i].layer] = i;
  }
  auto waits_of = [&](std::uint32_t i) {
    auto w = s.view().waits_of(s.ops[i]);
    return std::vector<std::uint32_t>(w.begin(), w.end());
  };
  EXPECT_EQ(waits_of(gat[2]), std::vector<std::uint32_t>{fwd[0]});
  EXPECT_EQ(waits_of(fwd[2]), std::vector<std::uint32_t>{gat[2]});
  EXPECT_LT(gat[1], fwd[0]);  // issued one layer ahead
  check_schedule(s);
}

TEST(Schedule, NaivePipelineIgnoresDistanceAndRings) {
  stack_spec one;
  one.append({"l", {{"x", 100}}});
  buffer_spec zero;
  zero.staging_buffers = 0;
  // Prefetch distance, staging buffers and offloads in flight only matter with latency hiding.
  auto s = build_schedule(one, offload_b_any(), zero, {false, 1, 0, 0});
  EXPECT_EQ(s.peak_device_bytes(), 256u);
  check_schedule(s);
  EXPECT_THROW(build_schedule(one, offload_b_any(), zero, {true, 0, 0, 2}), schedule_error);
  EXPECT_THROW(build_schedule(one, offload_b_any(), {}, {true, 1, 0, 2}), schedule_error);
  EXPECT_NO_THROW(build_schedule(one, offload_b_any(), {}, {true, 0, 1, 2}));  // 100 chunks of 1 byte
  stack_spec big;
  big.append({"l", {{"x", std::size_t{1} << 25}}});
  try {
    build_schedule(big, offload_b_any(), {}, {true, 0, 1, 2});
    FAIL();
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("would be copied in 33554432 chunks"), std::string::npos) << e.what();
  }
}

TEST(Checker, ChunkCopiedTwiceInsteadOfReloadedIsCaught) {
  buffer_spec b;
  b.share_phase_regions = false;
  auto s = build_schedule(three::spec(), offload_b::spec(), b, {true, 1, 1024, 2});
  check_schedule(s);
  // Replace the reload of layer 0's chunk 1 by a second copy of chunk 0: bytes [1024, 2048) of
  // the slot never come back, though byte counts still add up.
  std::int64_t c0 = -1;
  for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
    auto& o = s.ops[i];
    if (o.kind != op_kind::prefetch || o.layer != 0) continue;
    if (o.chunk == 0) c0 = i;
    if (o.chunk == 1) {
      o.chunk = 0;
      o.device_offset = s.ops[c0].device_offset;
      o.host_offset = s.ops[c0].host_offset;
    }
  }
  EXPECT_THROW(check_schedule(s), schedule_error);
}
