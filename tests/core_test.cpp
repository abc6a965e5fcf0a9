// Core: exact op programs for small stacks, peaks by hand, constexpr schedules, run-time errors,
// and the checker catching broken programs.
#include <gtest/gtest.h>

#include <tide/tide.hpp>

#include <limits>
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

// ---- hardening: inputs that used to crash or mis-schedule silently ---------------------------

namespace {
std::string what_of(auto&& f) {
  try {
    f();
  } catch (error const& e) {
    return e.what();
  }
  return "no error";
}
bool has(std::string const& s, std::string_view what) { return s.find(what) != std::string::npos; }
constexpr stack_spec one_slot_stack(std::size_t bytes, std::uint32_t layers = 1) {
  stack_spec st;
  st.append({"l", {{"x", bytes}}}, layers);
  return st;
}
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
}  // namespace

// Item 1: a kept slot of SIZE_MAX - 1 bytes used to predict a device peak of 0; offloading one
// of SIZE_MAX - 2 died of SIGFPE; huge guard bytes passed the checker and crashed the step.
TEST(Hardening, SizesNearSizeMaxAreOverflowErrorsNamingSlotAndQuantity) {
  auto keep = what_of([] { build_schedule(one_slot_stack(size_max - 1), {}); });
  EXPECT_TRUE(has(keep, "slot 'x' of layer type 'l' does not fit in std::size_t")) << keep;
  EXPECT_TRUE(has(keep, "aligned to the device alignment")) << keep;
  auto off = what_of([] { build_schedule(one_slot_stack(size_max - 2), offload_b_any()); });
  EXPECT_TRUE(has(off, "slot 'x'") && has(off, "does not fit")) << off;
  buffer_spec guard;
  guard.guard_bytes = size_max - 50;
  auto g = what_of([&] { build_schedule(one_slot_stack(64), {}, guard); });
  EXPECT_TRUE(has(g, "size plus guard bytes of slot 'x'")) << g;
  // Two kept slots of 2^63 bytes: each fits, their sum does not.
  auto sum = what_of([] { build_schedule(one_slot_stack(std::size_t{1} << 63, 2), {}); });
  EXPECT_TRUE(has(sum, "total of kept slots")) << sum;
  // An alignment of 2^63 is a power of two; the arena it implies is not representable.
  buffer_spec huge_align;
  huge_align.device_alignment = std::size_t{1} << 63;
  auto al = what_of([&] { build_schedule(one_slot_stack(64, 2), {}, huge_align); });
  EXPECT_TRUE(has(al, "does not fit in std::size_t")) << al;
  huge_align = {};
  huge_align.host_alignment = std::size_t{1} << 63;
  auto hal = what_of([&] { build_schedule(one_slot_stack(64, 2), offload_b_any(), huge_align); });
  EXPECT_TRUE(has(hal, "pinned host arena")) << hal;
  // A chunk size of 2^63 is one chunk per slot: valid, and the program is proven.
  auto s = build_schedule(one_slot_stack(4096, 3), offload_b_any(), {}, {.chunk_bytes = std::size_t{1} << 63});
  check_schedule(s);
  // A slot near SIZE_MAX split in 1-byte chunks: too many chunks, not an overflowing count.
  auto ch = what_of([] { build_schedule(one_slot_stack(size_max - 2, 3), offload_b_any(), {}, {.chunk_bytes = 1}); });
  EXPECT_TRUE(has(ch, "does not fit") || has(ch, "chunks")) << ch;
  // The same checks hold in constant expressions (make_schedule's static_asserts use them).
  static_assert(find_schedule_issue(one_slot_stack(size_max - 1), {}).code == schedule_issue_code::size_overflow);
  static_assert(find_schedule_issue(one_slot_stack(64), {}).code == schedule_issue_code::none);
  // Nothing is lost: the next build works.
  EXPECT_EQ(build_schedule(one_slot_stack(100), {}).peak_device_bytes(), 256u);
}

TEST(Hardening, TooManyOpsIsAnError) {
  // 64 layers x 2^23 one-byte chunks: within the per-slot chunk limit, past the op limit.
  auto e = what_of([] { build_schedule(one_slot_stack(std::size_t{1} << 23, 64), offload_b_any(), {}, {.chunk_bytes = 1}); });
  EXPECT_TRUE(has(e, "ops, more than the supported")) << e;
}

// Item 2: two layer types of the same name and different slots were merged into the first.
TEST(Hardening, SameLayerNameWithDifferentSlotsIsAnError) {
  stack_spec st;
  st.append({"dense", {{"x", 64}}}, 2);
  auto e = what_of([&] { st.append({"dense", {{"x", 64}, {"y", 4096}}}); });
  EXPECT_TRUE(has(e, "two layer types are named 'dense'")) << e;
  EXPECT_TRUE(has(e, "slot 1: no slot in the first, 'y' of 4096 bytes in the second")) << e;
  auto sizes = what_of([&] { st.append({"dense", {{"x", 128}}}); });
  EXPECT_TRUE(has(sizes, "slot 0: 'x' of 64 bytes in the first, 'x' of 128 bytes")) << sizes;
  EXPECT_EQ(st.layer_count(), 2u);  // nothing appended by the failed calls
  st.append({"dense", {{"x", 64}}});  // the same type again is reused
  EXPECT_EQ(st.types.size(), 1u);
  EXPECT_EQ(st.layer_count(), 3u);
}

// Item 10: a rule that decides nothing is almost always a typo.
TEST(Hardening, RulesThatDecideNothingAreErrors) {
  auto st = one_slot_stack(4096, 16);
  auto past = what_of([&] { build_schedule(st, policy_spec{rule_spec{placement::offload, {}, 20, all_layers, 0}}); });
  EXPECT_TRUE(has(past, "policy rule 0 (offload of any slot) decides no (layer, slot) of this 16-layer stack")) << past;
  auto small = what_of([&] { build_schedule(st, policy_spec{rule_spec{placement::remat, {"x"}, 0, all_layers, 8192}}); });
  EXPECT_TRUE(has(small, "policy rule 0 (remat of slot 'x')")) << small;
  // Shadowed: every slot the second rule matches is decided by the first.
  auto shadowed = what_of([&] {
    build_schedule(st, policy_spec{rule_spec{placement::remat, {}, 0, all_layers, 0},
                                   rule_spec{placement::offload, {"x"}, 4, 8, 0}});
  });
  EXPECT_TRUE(has(shadowed, "policy rule 1 (offload of slot 'x')")) << shadowed;
  // The opt-out, for one policy shared by stacks it only partly fits.
  policy_spec shared{rule_spec{placement::offload, {}, 20, all_layers, 0}};
  shared.allow_unused_rules = true;
  EXPECT_EQ(build_schedule(st, shared).peak_host_bytes(), 0u);
}

// Item 10: the default pipeline (prefetch distance 1) used to reject any offload on a one-layer
// stack; a distance past the stack now means "as early as the staging ring allows".
TEST(Hardening, PrefetchDistancePastTheStackIsClampedAndRuns) {
  auto one = one_slot_stack(4096);
  auto s1 = build_schedule(one, offload_b_any());
  check_schedule(s1);
  EXPECT_EQ(s1.peak_host_bytes(), 4096u);
  auto st = three::spec();
  auto far = build_schedule(st, offload_b::spec(), {}, {.prefetch_distance = std::numeric_limits<std::uint32_t>::max()});
  auto last = build_schedule(st, offload_b::spec(), {}, {.prefetch_distance = 2});
  check_schedule(far);
  EXPECT_EQ(far.ops, last.ops);
  EXPECT_EQ(far.waits, last.waits);
  // And it runs: bitwise the keep-all result on real data.
  host_backend b;
  auto digest = [&](schedule_view s) {
    executor ex(b, s);
    std::uint64_t h = 0;
    ex.step(
        [&](auto const& c) {
          for (std::uint16_t k = 0; k < c.slot_count(); ++k)
            if (c.produces(k))
              for (auto& x : c.slot(k)) x = static_cast<std::byte>(c.layer * 31 + k * 7 + 1);
        },
        [&](auto const& c) {
          for (std::uint16_t k = 0; k < c.slot_count(); ++k)
            for (auto x : c.slot(k)) h = h * 1099511628211ull + static_cast<std::uint8_t>(x);
        });
    return h;
  };
  auto keep = build_schedule(one, {});
  EXPECT_EQ(digest(s1), digest(keep));
}

// Item 6: slot(k), where(k), slot_name(k) and produces(k) did not check k.
TEST(Hardening, SlotIndexOutOfRangeIsASlotError) {
  stack_spec st;
  st.append({"l", {{"x", 64}}}, 2);
  auto s = build_schedule(st, {});
  host_backend b;
  executor ex(b, s);
  auto none = [](auto const&) {};
  for (int which = 0; which < 4; ++which) {
    auto e = what_of([&] {
      ex.step(
          [&](auto const& c) {
            if (which == 0) static_cast<void>(c.slot(1));
            if (which == 1) static_cast<void>(c.where(1));
            if (which == 2) static_cast<void>(c.slot_name(7));
            if (which == 3) static_cast<void>(c.produces(1));
          },
          none);
    });
    EXPECT_TRUE(has(e, "is out of range for layer 0 (l), which has 1 slot(s)")) << which << ": " << e;
  }
  auto back = what_of([&] { ex.step(none, [](auto const& c) { static_cast<void>(c.slot(1)); }); });
  EXPECT_TRUE(has(back, "slot index 1 is out of range for layer 1 (l)")) << back;
  ex.step(none, none);  // the next step still works
}
