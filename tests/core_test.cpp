// Core: exact op programs for small stacks, peaks by hand, constexpr schedules, run-time errors,
// the checker catching broken programs, and the strategy's spellings (type-level knobs, describe,
// code generation, op labels).
#include <gtest/gtest.h>

#include <tide/plan/policy_codegen.hpp>
#include <tide/tide.hpp>

#include <cstddef>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace tide;

namespace {

using blk = layer<"blk", slot<"a", 1000>, slot<"b", 3000>>;
using three = stack<independent_layers, repeat<blk, 3>>;
using offload_b = policy<offload<slot_names<"b">>>;
policy_spec offload_b_any() { return policy_spec{rule_spec{.where = placement::offload}}; }

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
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec(),
                                          .pipeline = {.latency_hiding = true, .prefetch_distance = 1, .max_offloads_in_flight = 2}});
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
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec(),
                                          .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 2}});
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
  using p = policy<remat<slot_names<"b">, layer_range<1, 3>>>;
  auto s = build_schedule(three::spec(), {.policy = p::spec()});
  // kept: a x3 (1024 each) + b of layer 0 (3072); remat scratch one b (3072), shared by phases;
  // a recompute is lent scratch for a, which it does not rebuild (1024), after its b.
  EXPECT_EQ(s.arena.kept_bytes, 3 * 1024u + 3072u);
  EXPECT_EQ(s.arena.recompute_scratch_bytes, 3072u + 1024u);
  EXPECT_EQ(s.peak_device_bytes(), 3 * 1024u + 3072u + 3072u + 1024u);
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
  auto keep = build_schedule(three::spec(), {.policy = keep_all::spec()});
  EXPECT_EQ(keep.peak_device_bytes(), 3 * (1024u + 3072u));
}

TEST(Schedule, ChunksCollectivesAndNoPhaseSharing) {
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec(),
                                          .buffers = {.share_phase_regions = false},
                                          .pipeline = {.prefetch_distance = 1, .chunk_bytes = 1024, .max_offloads_in_flight = 1},
                                          .collectives = {.before_forward = true, .after_backward = true}});
  std::size_t offloads = 0, prefetches = 0, gathers = 0, colls = 0;
  for (auto const& o : s.ops) {
    offloads += o.kind == op_kind::offload;
    prefetches += o.kind == op_kind::prefetch;
    gathers += o.kind == op_kind::gather;
    colls += o.kind == op_kind::reduce;
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
  st.independent_layers = true;  // no layer reads another's output
  st.append({"dense", {{"x", 512}, {"q", 4096}, {"up", 10000}}}, 2).append({"moe", {{"x", 512}, {"e", 7777}}}, 5);
  std::vector<policy_spec> policies = {
      {},
      {rule_spec{.where = placement::offload}},
      {rule_spec{.where = placement::remat, .slots = {"up"}},
       rule_spec{.where = placement::offload, .slots = {"e", "q"}, .first_layer = 1, .last_layer = 6}},
      {rule_spec{.where = placement::offload, .min_bytes = 5000}, rule_spec{.where = placement::remat, .slots = {"q"}}},
  };
  int n = 0;
  for (auto const& p : policies)
    for (bool hide : {true, false})
      for (std::uint32_t d : {0u, 1u, 3u, 6u})
        for (std::size_t chunk : {std::size_t{0}, std::size_t{1000}, std::size_t{4096}})
          for (std::uint32_t st_bufs : {1u, 2u, 4u})
            for (std::uint32_t inflight : {1u, 3u})
              for (bool share : {true, false}) {
                auto s = build_schedule(st, {.policy = p,
                                             .buffers = {.staging_buffers = st_bufs,
                                                         .guard_bytes = chunk == 1000 ? std::size_t{64} : std::size_t{0},
                                                         .share_phase_regions = share},
                                             .pipeline = {.latency_hiding = hide,
                                                          .prefetch_distance = d,
                                                          .chunk_bytes = chunk,
                                                          .max_offloads_in_flight = inflight},
                                             .collectives = {.before_forward = d == 1, .after_backward = d == 3}});
                ASSERT_NO_THROW(check_schedule(s)) << describe(s);
                ++n;
              }
  EXPECT_EQ(n, 4 * 2 * 4 * 3 * 3 * 2 * 2);
}

TEST(Schedule, PrefetchDistanceIsLimitedByStagingBuffers) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"l", {{"s", 256}}}, 8);
  auto s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload}},
                              .buffers = {.staging_buffers = 2},
                              .pipeline = {.prefetch_distance = 4}});
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

using dense = layer<"dense", input_slot<"layer_input", 4096>, slot<"q_proj", 8192>, slot<"mlp_up", 16384>>;
using moe = layer<"moe", input_slot<"layer_input", 4096>, slot<"q_proj", 8192>, slot<"experts", 65536>>;
using deepish = stack<repeat<dense, 3>, repeat<moe, 13>>;
using selective = policy<offload<slot_names<"experts", "q_proj">, layer_range<3>>, remat<slot_names<"mlp_up">>>;
using selective_strategy = strategy_of<selective, buffers<staging_buffers<3>>, pipeline<prefetch_distance<2>, chunk_bytes<16384>>>;
constexpr auto static_sched = make_schedule<deepish, selective_strategy>();
static_assert(static_sched.peak_device_bytes() < 16 * (4096 + 8192 + 65536));
static_assert(static_sched.layer_count() == 16);
static_assert(static_sched.slots[3 * 3 + 2].where == placement::offload);  // layer 3's experts

TEST(Schedule, StaticAndRuntimeSchedulesAreIdentical) {
  auto rt = make_runtime_schedule<deepish, selective_strategy>();
  ASSERT_EQ(rt.ops.size(), static_sched.ops.size());
  for (std::size_t i = 0; i < rt.ops.size(); ++i) EXPECT_EQ(rt.ops[i], static_sched.ops[i]) << i;
  EXPECT_EQ(std::vector<std::uint32_t>(rt.waits.begin(), rt.waits.end()),
            std::vector<std::uint32_t>(static_sched.waits.begin(), static_sched.waits.end()));
  EXPECT_EQ(rt.arena, static_sched.arena);
  check_schedule(static_sched);
}

TEST(Schedule, DynamicSizesAtRunTime) {
  using l = layer<"l", slot<"act">, slot<"fixed", 100>>;
  auto s = make_runtime_schedule<stack<independent_layers, repeat<l, 2>>, strategy_of<keep_all>>(slot_sizes{{"act", 5000}});
  EXPECT_EQ(s.slots[0].bytes, 5000u);
  EXPECT_EQ(s.peak_device_bytes(), 2 * (align_up(5000, 256) + 256));
  try {
    make_runtime_schedule<stack<independent_layers, repeat<l, 2>>>();
    FAIL() << "expected schedule_error";
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("slot 'act' of layer type 'l' has a run-time size"), std::string::npos)
        << e.what();
  }
}

// ---- run-time errors -----------------------------------------------------------------------

namespace {
std::string error_of(stack_spec const& st, strategy const& how) {
  try {
    (void)build_schedule(st, how);
  } catch (schedule_error const& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Schedule, RuntimeErrorsNameWhatIsWrong) {
  auto st = three::spec();
  auto contains = [](std::string const& s, char const* what) { return s.find(what) != std::string::npos; };
  buffer_spec const zero{.staging_buffers = 0};
  EXPECT_TRUE(contains(error_of(st, {.policy = offload_b::spec(), .buffers = zero}), "zero staging buffers"));
  EXPECT_EQ(error_of(st, {.policy = keep_all::spec(), .buffers = zero}), "no error");  // staging only matters with offload
  EXPECT_TRUE(contains(error_of(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"nope"}}}}),
                       "names slot 'nope' which no layer of the stack has"));
  stack_spec dup;
  dup.independent_layers = true;  // no layer reads another's output
  dup.append({"d", {{"x", 4}, {"x", 8}}});
  EXPECT_TRUE(contains(error_of(dup, {}), "layer type 'd' names slot 'x' twice"));
  stack_spec zero_slot;
  zero_slot.independent_layers = true;  // no layer reads another's output
  zero_slot.append({"z", {{"x", 0}}});
  EXPECT_TRUE(contains(error_of(zero_slot, {}), "slot 'x' of layer type 'z' has zero bytes"));
  EXPECT_TRUE(contains(error_of(stack_spec{}, {}), "the stack has no layers"));
  EXPECT_TRUE(contains(error_of(st, {.policy = offload_b::spec(), .pipeline = {.max_offloads_in_flight = 0}}),
                       "zero offloads in flight"));
  EXPECT_TRUE(contains(error_of(st, {.policy = {rule_spec{.where = placement::remat, .first_layer = 2, .last_layer = 2}}}),
                       "empty range"));
}

// ---- the checker catches broken programs -----------------------------------------------------

TEST(Checker, DroppedWaitIsCaught) {
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec()});
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
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec()});
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
  auto s = build_schedule(three::spec(), {.policy = {rule_spec{.where = placement::remat, .slots = {"a"}, .last_layer = 1},
                                                     rule_spec{.where = placement::offload, .slots = {"b"}}}});
  auto d = describe(s);
  EXPECT_NE(d.find("layer 0 (blk): a=remat"), std::string::npos) << d;
  EXPECT_NE(d.find("b=offload"), std::string::npos) << d;
  EXPECT_NE(d.find("d2h: #"), std::string::npos) << d;
  EXPECT_NE(d.find("h2d: #"), std::string::npos) << d;
  // One line per stream, each op by its label, its waits in parentheses.
  EXPECT_NE(d.find("\n  compute: #0 forward L0; #2 forward L1; #4 forward L2 (after #1);"), std::string::npos) << d;
  EXPECT_NE(d.find("\n  d2h: #1 offload L0 b (after #0);"), std::string::npos) << d;
}

TEST(Schedule, GathersRunOneLayerAheadAndNoFurther) {
  auto s = build_schedule(three::spec(), {.policy = keep_all::spec(), .collectives = {.before_forward = true}});
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
  one.independent_layers = true;  // no layer reads another's output
  one.append({"l", {{"x", 100}}});
  buffer_spec const zero{.staging_buffers = 0};
  // Prefetch distance, staging buffers and offloads in flight only matter with latency hiding.
  auto s = build_schedule(one, {.policy = offload_b_any(),
                                .buffers = zero,
                                .pipeline = {.latency_hiding = false, .prefetch_distance = 1, .max_offloads_in_flight = 0}});
  EXPECT_EQ(s.peak_device_bytes(), 256u);
  check_schedule(s);
  EXPECT_THROW(build_schedule(one, {.policy = offload_b_any(), .buffers = zero, .pipeline = {.prefetch_distance = 0}}),
               schedule_error);
  EXPECT_NO_THROW(build_schedule(one, {.policy = offload_b_any(), .pipeline = {.prefetch_distance = 0, .chunk_bytes = 1}}));  // 100 chunks of 1 byte
  stack_spec big;
  big.independent_layers = true;  // no layer reads another's output
  big.append({"l", {{"x", std::size_t{1} << 25}}});
  try {
    (void)build_schedule(big, {.policy = offload_b_any(), .pipeline = {.prefetch_distance = 0, .chunk_bytes = 1}});
    FAIL();
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("would be copied in 33554432 chunks"), std::string::npos) << e.what();
  }
}

TEST(Checker, ChunkCopiedTwiceInsteadOfPrefetchedIsCaught) {
  auto s = build_schedule(three::spec(), {.policy = offload_b::spec(),
                                          .buffers = {.share_phase_regions = false},
                                          .pipeline = {.chunk_bytes = 1024}});
  check_schedule(s);
  // Replace the prefetch of layer 0's chunk 1 by a second copy of chunk 0: bytes [1024, 2048) of
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
  st.independent_layers = true;  // no layer reads another's output
  st.append({"l", {{"x", bytes}}}, layers);
  return st;
}
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
}  // namespace

// Item 1: a kept slot of SIZE_MAX - 1 bytes used to predict a device peak of 0; offloading one
// of SIZE_MAX - 2 died of SIGFPE; huge guard bytes passed the checker and crashed the step.
TEST(Hardening, SizesNearSizeMaxAreOverflowErrorsNamingSlotAndQuantity) {
  auto keep = what_of([] { (void)build_schedule(one_slot_stack(size_max - 1), strategy{}); });
  EXPECT_TRUE(has(keep, "slot 'x' of layer type 'l' does not fit in std::size_t")) << keep;
  EXPECT_TRUE(has(keep, "aligned to the device alignment")) << keep;
  auto off = what_of([] { (void)build_schedule(one_slot_stack(size_max - 2), {.policy = offload_b_any()}); });
  EXPECT_TRUE(has(off, "slot 'x'") && has(off, "does not fit")) << off;
  buffer_spec const guard{.guard_bytes = size_max - 50};
  auto g = what_of([&] { (void)build_schedule(one_slot_stack(64), {.buffers = guard}); });
  EXPECT_TRUE(has(g, "size plus guard bytes of slot 'x'")) << g;
  // Two kept slots of 2^63 bytes: each fits, their sum does not.
  auto sum = what_of([] { (void)build_schedule(one_slot_stack(std::size_t{1} << 63, 2), strategy{}); });
  EXPECT_TRUE(has(sum, "total of kept slots")) << sum;
  // An alignment of 2^63 is a power of two; the arena it implies is not representable.
  buffer_spec huge_align{.device_alignment = std::size_t{1} << 63};
  auto al = what_of([&] { (void)build_schedule(one_slot_stack(64, 2), {.buffers = huge_align}); });
  EXPECT_TRUE(has(al, "does not fit in std::size_t")) << al;
  huge_align = {};
  huge_align.host_alignment = std::size_t{1} << 63;
  auto hal = what_of([&] { (void)build_schedule(one_slot_stack(64, 2), {.policy = offload_b_any(), .buffers = huge_align}); });
  EXPECT_TRUE(has(hal, "pinned host arena")) << hal;
  // A chunk size of 2^63 is one chunk per slot: valid, and the program is proven.
  auto s = build_schedule(one_slot_stack(4096, 3), {.policy = offload_b_any(), .pipeline = {.chunk_bytes = std::size_t{1} << 63}});
  check_schedule(s);
  // A slot near SIZE_MAX split in 1-byte chunks: too many chunks, not an overflowing count.
  auto ch = what_of([] { (void)build_schedule(one_slot_stack(size_max - 2, 3), {.policy = offload_b_any(), .pipeline = {.chunk_bytes = 1}}); });
  EXPECT_TRUE(has(ch, "does not fit") || has(ch, "chunks")) << ch;
  // The same checks hold in constant expressions (make_schedule's static_asserts use them).
  static_assert(find_schedule_issue(one_slot_stack(size_max - 1), strategy{}).code == schedule_issue_code::size_overflow);
  static_assert(find_schedule_issue(one_slot_stack(64), strategy{}).code == schedule_issue_code::none);
  // Nothing is lost: the next build works.
  EXPECT_EQ(build_schedule(one_slot_stack(100), strategy{}).peak_device_bytes(), 256u);
}

TEST(Hardening, TooManyOpsIsAnError) {
  // 64 layers x 2^20 one-byte chunks: within the per-slot chunk limit, past the op limit.
  auto e = what_of([] { (void)build_schedule(one_slot_stack(std::size_t{1} << 20, 64), {.policy = offload_b_any(), .pipeline = {.chunk_bytes = 1}}); });
  EXPECT_TRUE(has(e, "ops (about")) << e;
  EXPECT_TRUE(has(e, "more than the supported 8388608")) << e;
}

// Second pass, item 9: a policy file of 100 bytes (chunk_bytes 1 KiB on a DeepSeek-sized stack:
// 61 layers x 11 slots of 100 MiB, 69 million copies) made the builder reserve 15.75 GiB and fail
// with bad_alloc. The op count is bounded before anything is reserved, and the message says why.
// Item 10: a failed build leaves nothing behind (it used to keep the arena of the last one).
TEST(HardeningSecondPass, AbsurdChunkSizeIsRefusedBeforeReservingAndLeavesNothing) {
  static constexpr std::string_view names[] = {"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10"};
  stack_spec st;
  st.independent_layers = true;
  layer_spec blk{"blk", {}};
  for (auto n : names) blk.slots.push_back({n, std::size_t{100} << 20});
  st.append(blk, 61);
  schedule s;
  ASSERT_FALSE(try_build_schedule_into(s, one_slot_stack(4096, 3), {.policy = offload_b_any()}));
  ASSERT_GT(s.peak_device_bytes(), 0u);
  auto const i = try_build_schedule_into(s, st, {.policy = offload_b_any(), .pipeline = {.chunk_bytes = 1024}});
  EXPECT_EQ(i.code, schedule_issue_code::too_many_ops);
  auto const m = to_message(i);
  EXPECT_TRUE(has(m, "MiB of op program")) << m;
  EXPECT_TRUE(has(m, "use a larger chunk size (pipeline_spec::chunk_bytes)")) << m;
  EXPECT_LE(s.ops.capacity(), std::size_t{1} << 12);  // nothing reserved for the refused program
  EXPECT_EQ(s.peak_device_bytes(), 0u);
  EXPECT_EQ(s.peak_host_bytes(), 0u);
  EXPECT_EQ(s.layer_count(), 0u);
  EXPECT_TRUE(s.ops.empty() && s.slots.empty() && s.waits.empty());
  // A structural issue (found before placement) empties it too.
  ASSERT_FALSE(try_build_schedule_into(s, one_slot_stack(4096, 3), strategy{}));
  EXPECT_TRUE(try_build_schedule_into(s, stack_spec{}, strategy{}));
  EXPECT_EQ(s.peak_device_bytes(), 0u);
  EXPECT_EQ(s.layer_count(), 0u);
  // The same chunk size on a small stack is fine: the limit is the program's size, not the knob.
  EXPECT_FALSE(try_build_schedule_into(s, one_slot_stack(4096, 3), {.policy = offload_b_any(), .pipeline = {.chunk_bytes = 1024}}));
  EXPECT_GT(s.peak_device_bytes(), 0u);
  check_schedule(s);
}

// Item 2: two layer types of the same name and different slots were merged into the first.
TEST(Hardening, SameLayerNameWithDifferentSlotsIsAnError) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
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
  auto past = what_of([&] { (void)build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .first_layer = 20}}}); });
  EXPECT_TRUE(has(past, "policy rule 0 (offload of any slot) decides no (layer, slot) of this 16-layer stack")) << past;
  auto small = what_of([&] { (void)build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {"x"}, .min_bytes = 8192}}}); });
  EXPECT_TRUE(has(small, "policy rule 0 (remat of slot 'x')")) << small;
  // Shadowed: every slot the second rule matches is decided by the first.
  auto shadowed = what_of([&] {
    (void)build_schedule(st, {.policy = {rule_spec{.where = placement::remat},
                                   rule_spec{.where = placement::offload, .slots = {"x"}, .first_layer = 4, .last_layer = 8}}});
  });
  EXPECT_TRUE(has(shadowed, "policy rule 1 (offload of slot 'x')")) << shadowed;
  // The opt-out, for one policy shared by stacks it only partly fits.
  policy_spec shared{rule_spec{.where = placement::offload, .first_layer = 20}};
  shared.allow_unused_rules = true;
  EXPECT_EQ(build_schedule(st, {.policy = shared}).peak_host_bytes(), 0u);
}

// Issue 40, item 5: "from the end" is a flag, not a range of values a real index can land in.
// rule_spec{.first_layer = 3'500'000'000} was read as a count from the end and selected every
// layer; now it is an index, refused by name past what a rule may name, as the policy-file reader
// refuses it. from_end(k) still counts from the end, in values and in types.
TEST(Hardening, ALargeLayerIndexIsAnIndexNotACountFromTheEnd) {
  auto st = one_slot_stack(4096, 16);
  rule_spec const huge{.where = placement::offload, .first_layer = 3'500'000'000u};
  EXPECT_FALSE(counts_from_end(huge.first_layer));
  EXPECT_EQ(resolve_layer(huge.first_layer, 16), 3'500'000'000u);
  auto const issue = find_schedule_issue(st, {.policy = {huge}});
  EXPECT_EQ(issue.code, schedule_issue_code::rule_layer_out_of_range);
  auto const m = what_of([&] { (void)build_schedule(st, {.policy = {huge}}); });
  EXPECT_TRUE(has(m, "policy rule 0 names layer 3500000000, past the largest layer index a rule may name (1073741823)")) << m;
  EXPECT_TRUE(has(m, "tide::from_end(k)")) << m;
  // Even with unused rules allowed (where it used to select every layer): refused, nothing offloaded.
  policy_spec lenient{huge};
  lenient.allow_unused_rules = true;
  EXPECT_THROW((void)build_schedule(st, {.policy = lenient}), schedule_error);
  // Every value a from_end used to be is an index now; the same count from the end is not.
  for (std::uint32_t v : {all_layers - 1, all_layers - 2, all_layers - max_from_end, max_from_end}) {
    rule_spec r{.where = placement::offload, .first_layer = v};
    EXPECT_EQ(find_schedule_issue(st, {.policy = {r}}).code, schedule_issue_code::rule_layer_out_of_range) << v;
    r.last_layer = v;
    r.first_layer = 0;
    EXPECT_EQ(find_schedule_issue(st, {.policy = {r}}).code, schedule_issue_code::rule_layer_out_of_range) << v;
  }
  // The largest index is a plain index (selects nothing here); all_layers is the end.
  policy_spec last_index{rule_spec{.where = placement::offload, .first_layer = max_from_end - 1}};
  EXPECT_EQ(find_schedule_issue(st, {.policy = last_index}).code, schedule_issue_code::unused_rule);
  // from_end(k): the flag, the same selection as before.
  rule_spec const last_two{.where = placement::offload, .first_layer = from_end(2)};
  EXPECT_TRUE(counts_from_end(last_two.first_layer));
  EXPECT_EQ(from_end_count(last_two.first_layer), 2u);
  EXPECT_NE(last_two.first_layer, layer_bound{2});
  EXPECT_EQ(from_end(0), layer_bound{all_layers});
  EXPECT_EQ(from_end(max_from_end + 5), from_end(max_from_end));
  auto const s = build_schedule(st, {.policy = {last_two}});
  EXPECT_EQ(s.peak_host_bytes(), 2u * 4096u);
  static_assert(ordered_layer_bounds(0, from_end(1)) && ordered_layer_bounds(from_end(3), from_end(1)) &&
                !ordered_layer_bounds(from_end(1), from_end(3)) && !ordered_layer_bounds(from_end(2), 10) &&
                ordered_layer_bounds(from_end(2), all_layers) && !ordered_layer_bounds(3, 3));
  // The type-level spelling takes the same bounds.
  EXPECT_EQ(offload<layer_range<from_end(2)>>::spec().first_layer, from_end(2));
  EXPECT_EQ((offload<layer_range<1, 3>>::spec().last_layer), layer_bound{3});
}

// Item 10: the default pipeline (prefetch distance 1) used to reject any offload on a one-layer
// stack; a distance past the stack now means "as early as the staging ring allows".
TEST(Hardening, PrefetchDistancePastTheStackIsClampedAndRuns) {
  auto one = one_slot_stack(4096);
  auto s1 = build_schedule(one, {.policy = offload_b_any()});
  check_schedule(s1);
  EXPECT_EQ(s1.peak_host_bytes(), 4096u);
  auto st = three::spec();
  auto far = build_schedule(st, {.policy = offload_b::spec(),
                                 .pipeline = {.prefetch_distance = std::numeric_limits<std::uint32_t>::max()}});
  auto last = build_schedule(st, {.policy = offload_b::spec(), .pipeline = {.prefetch_distance = 2}});
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
  auto keep = build_schedule(one, strategy{});
  EXPECT_EQ(digest(s1), digest(keep));
}

// Item 6: slot(k), where(k), slot_name(k) and produces(k) did not check k.
TEST(Hardening, SlotIndexOutOfRangeIsASlotError) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"l", {{"x", 64}}}, 2);
  auto s = build_schedule(st, strategy{});
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

// ---- the strategy: type-level knobs, describe, code generation, op labels ---------------------

namespace {
constexpr bool same_rule(rule_spec const& a, rule_spec const& b) {
  return a.where == b.where && a.slots == b.slots && a.first_layer == b.first_layer && a.last_layer == b.last_layer &&
         a.min_bytes == b.min_bytes;
}
void expect_same_strategy(strategy const& got, strategy const& want) {
  ASSERT_EQ(got.policy.rules.size(), want.policy.rules.size()) << describe(got) << "vs\n" << describe(want);
  for (std::size_t i = 0; i < want.policy.rules.size(); ++i)
    EXPECT_TRUE(same_rule(got.policy.rules[i], want.policy.rules[i])) << "rule " << i << "\n" << describe(got);
  EXPECT_EQ(got.policy.allow_unused_rules, want.policy.allow_unused_rules);
  EXPECT_EQ(got.buffers, want.buffers) << describe(got);
  EXPECT_EQ(got.pipeline, want.pipeline) << describe(got);
  EXPECT_EQ(got.collectives, want.collectives) << describe(got);
}

// One strategy four ways: its parts in three orders as types, and as a value.
using offload_b_remat_a = policy<offload<slot_names<"b">>, remat<layer_range<1, 3>, slot_names<"a">>>;
using three_staging_apart = buffers<share_phase_regions<false>, staging_buffers<3>>;
using distance2_chunked = pipeline<chunk_bytes<750>, prefetch_distance<2>>;
using reduce_only = collectives<after_backward>;
using mixed_1 = strategy_of<offload_b_remat_a, three_staging_apart, distance2_chunked, reduce_only>;
using mixed_2 = strategy_of<reduce_only, distance2_chunked, three_staging_apart, offload_b_remat_a>;
using mixed_3 = strategy_of<distance2_chunked, offload_b_remat_a, reduce_only, three_staging_apart>;
strategy mixed_value() {
  return {.policy = {rule_spec{.where = placement::offload, .slots = {"b"}},
                     rule_spec{.where = placement::remat, .slots = {"a"}, .first_layer = 1, .last_layer = 3}},
          .buffers = {.staging_buffers = 3, .share_phase_regions = false},
          .pipeline = {.prefetch_distance = 2, .chunk_bytes = 750},
          .collectives = {.after_backward = true}};
}
constexpr auto mixed_static_1 = make_schedule<three, mixed_1>();
constexpr auto mixed_static_2 = make_schedule<three, mixed_2>();
}  // namespace

TEST(TypeLevel, PipelineKnobsInAnyOrderGiveTheValueForm) {
  constexpr pipeline_spec want{.latency_hiding = false, .prefetch_distance = 2, .chunk_bytes = 4096, .max_offloads_in_flight = 3};
  static_assert(pipeline<latency_hiding<false>, prefetch_distance<2>, chunk_bytes<4096>, max_offloads_in_flight<3>>::spec() == want);
  static_assert(pipeline<max_offloads_in_flight<3>, chunk_bytes<4096>, prefetch_distance<2>, latency_hiding<false>>::spec() == want);
  EXPECT_EQ((pipeline<chunk_bytes<4096>, latency_hiding<false>, max_offloads_in_flight<3>, prefetch_distance<2>>::spec()), want);
  // An absent knob keeps pipeline_spec's default.
  EXPECT_EQ(pipeline<>::spec(), pipeline_spec{});
  EXPECT_EQ(pipeline<prefetch_distance<2>>::spec(), pipeline_spec{.prefetch_distance = 2});
  EXPECT_EQ((pipeline<chunk_bytes<(1 << 20)>, latency_hiding<true>>::spec()), pipeline_spec{.chunk_bytes = 1 << 20});
  EXPECT_EQ(naive_pipeline::spec(), (pipeline_spec{.latency_hiding = false, .prefetch_distance = 0}));
}

TEST(TypeLevel, BufferAndCollectiveKnobsInAnyOrderGiveTheValueForm) {
  constexpr buffer_spec want{.staging_buffers = 3, .device_alignment = 512, .host_alignment = 128, .guard_bytes = 64,
                             .share_phase_regions = false};
  static_assert(buffers<staging_buffers<3>, device_alignment<512>, host_alignment<128>, guard_bytes<64>,
                        share_phase_regions<false>>::spec() == want);
  EXPECT_EQ((buffers<share_phase_regions<false>, guard_bytes<64>, host_alignment<128>, device_alignment<512>,
                     staging_buffers<3>>::spec()),
            want);
  EXPECT_EQ((buffers<guard_bytes<64>, staging_buffers<3>, share_phase_regions<false>, host_alignment<128>,
                     device_alignment<512>>::spec()),
            want);
  EXPECT_EQ(buffers<>::spec(), buffer_spec{});
  EXPECT_EQ((buffers<staging_buffers<3>, guard_bytes<64>>::spec()), (buffer_spec{.staging_buffers = 3, .guard_bytes = 64}));
  EXPECT_EQ(debug_buffers::spec(), buffer_spec{.guard_bytes = 64});

  constexpr collective_spec both{.before_forward = true, .after_backward = true};
  static_assert(collectives<before_forward, after_backward>::spec() == both);
  EXPECT_EQ((collectives<after_backward, before_forward>::spec()), both);
  EXPECT_EQ(collectives<after_backward>::spec(), collective_spec{.after_backward = true});
  EXPECT_EQ((collectives<overlap_collectives<false>, after_backward>::spec()),
            (collective_spec{.after_backward = true, .overlap = false}));
  EXPECT_EQ(collectives<before_forward>::spec(), collective_spec{.before_forward = true});
  EXPECT_EQ(no_collectives::spec(), collective_spec{});
}

TEST(TypeLevel, RuleSelectorsInAnyOrderGiveTheValueForm) {
  rule_spec const want{.where = placement::offload, .slots = {"a", "b"}, .first_layer = 0, .last_layer = 4, .min_bytes = 1024};
  EXPECT_TRUE(same_rule(offload<slot_names<"a", "b">, layer_range<0, 4>, min_bytes<1024>>::spec(), want));
  EXPECT_TRUE(same_rule(offload<min_bytes<1024>, layer_range<0, 4>, slot_names<"a", "b">>::spec(), want));
  EXPECT_TRUE(same_rule(offload<layer_range<0, 4>, slot_names<"a", "b">, min_bytes<1024>>::spec(), want));
  static_assert(same_rule(offload<min_bytes<1024>, slot_names<"a", "b">, layer_range<0, 4>>::spec(),
                          rule_spec{.where = placement::offload, .slots = {"a", "b"}, .last_layer = 4, .min_bytes = 1024}));
  // The order of the names is kept (it is the rule's), and an absent selector selects everything.
  EXPECT_FALSE(same_rule(offload<slot_names<"b", "a">, layer_range<0, 4>, min_bytes<1024>>::spec(), want));
  EXPECT_TRUE(same_rule(offload<>::spec(), rule_spec{.where = placement::offload}));
  EXPECT_TRUE(same_rule(keep<slot_names<"x">>::spec(), rule_spec{.where = placement::keep, .slots = {"x"}}));
  EXPECT_TRUE(same_rule(remat<layer_range<5>>::spec(), rule_spec{.where = placement::remat, .first_layer = 5}));
  EXPECT_EQ(remat<layer_range<5>>::spec().last_layer, all_layers);
  // A policy keeps its rules in order: the first match wins.
  auto const p = policy<remat<slot_names<"a">>, offload<>>::spec();
  ASSERT_EQ(p.rules.size(), 2u);
  EXPECT_TRUE(same_rule(p.rules[0], rule_spec{.where = placement::remat, .slots = {"a"}}));
  EXPECT_TRUE(same_rule(p.rules[1], rule_spec{.where = placement::offload}));
  EXPECT_TRUE(keep_all::spec().rules.empty());
}

TEST(TypeLevel, StrategyPartsInAnyOrderGiveOneStrategy) {
  expect_same_strategy(mixed_1::spec(), mixed_value());
  expect_same_strategy(mixed_2::spec(), mixed_value());
  expect_same_strategy(mixed_3::spec(), mixed_value());
  // Each part is optional; an absent one is the default.
  expect_same_strategy(strategy_of<>::spec(), strategy{});
  expect_same_strategy(strategy_of<distance2_chunked>::spec(), {.pipeline = {.prefetch_distance = 2, .chunk_bytes = 750}});
  expect_same_strategy(strategy_of<reduce_only, offload_b>::spec(),
                       {.policy = {rule_spec{.where = placement::offload, .slots = {"b"}}}, .collectives = {.after_backward = true}});
}

TEST(TypeLevel, MakeScheduleEqualsBuildScheduleOpForOp) {
  auto const rt = build_schedule(three::spec(), mixed_value());
  ASSERT_GT(rt.ops.size(), 0u);
  for (auto const* st : {&mixed_static_1, &mixed_static_2}) {
    auto const& cs = *st;
    ASSERT_EQ(cs.ops.size(), rt.ops.size()) << describe(rt);
    for (std::size_t i = 0; i < rt.ops.size(); ++i) EXPECT_EQ(cs.ops[i], rt.ops[i]) << "op #" << i;
    EXPECT_EQ(std::vector<std::uint32_t>(cs.waits.begin(), cs.waits.end()), rt.waits);
    EXPECT_EQ(std::vector<slot_binding>(cs.slots.begin(), cs.slots.end()), rt.slots);
    EXPECT_EQ(std::vector<layer_binding>(cs.layers.begin(), cs.layers.end()), rt.layers);
    EXPECT_EQ(cs.event_count, rt.event_count);
    EXPECT_EQ(cs.arena, rt.arena);
    EXPECT_EQ(cs.buffers, rt.buffers);
    EXPECT_EQ(cs.pipeline, rt.pipeline);
    EXPECT_EQ(cs.collectives, rt.collectives);
  }
  // And the strategy took effect: b in 4 chunks of 750 bytes, a reduce per layer, a rematted.
  std::size_t reduces = 0, recomputes = 0;
  for (auto const& o : rt.ops) {
    if (is_copy(o.kind)) {
      EXPECT_EQ(o.chunks, 4u);
    }
    reduces += o.kind == op_kind::reduce;
    recomputes += o.kind == op_kind::recompute;
  }
  EXPECT_EQ(reduces, 3u);
  EXPECT_EQ(recomputes, 2u);
  EXPECT_EQ(rt.arena.staging_buffers, 3u);
  check_schedule(mixed_static_1);
  // The run-time twin from the same type.
  auto const twin = make_runtime_schedule<three, mixed_3>();
  EXPECT_EQ(twin.ops, rt.ops);
  EXPECT_EQ(twin.waits, rt.waits);
}

TEST(Describe, StrategyNamesItsRulesAndParts) {
  EXPECT_EQ(describe(mixed_value()),
            "strategy:\n"
            "  policy:\n"
            "    offload b\n"
            "    remat a of layers [1, 3)\n"
            "  buffers: 3 staging buffers, device alignment 256, host alignment 64, guard bytes 0, phases apart\n"
            "  pipeline: latency hiding on, prefetch distance 2, chunk 750 B, offloads in flight 2\n"
            "  collectives: reduce after backward\n");
  auto const keep = describe(strategy{});
  EXPECT_TRUE(has(keep, "policy: keep everything\n")) << keep;
  EXPECT_TRUE(has(keep, "2 staging buffers")) << keep;
  EXPECT_TRUE(has(keep, "chunk whole slot")) << keep;
  EXPECT_TRUE(has(keep, "collectives: none\n")) << keep;
  strategy st{.policy = {rule_spec{.where = placement::remat, .first_layer = 2, .min_bytes = 1 << 20},
                         rule_spec{.where = placement::offload, .slots = {"q_proj", "k_proj"}}},
              .buffers = {.guard_bytes = 64},
              .pipeline = {.latency_hiding = false, .chunk_bytes = 1 << 20},
              .collectives = {.before_forward = true, .after_backward = true}};
  st.policy.allow_unused_rules = true;
  auto const d = describe(st);
  EXPECT_TRUE(has(d, "\n    remat any slot of layers [2, end) of at least 1.00 MiB\n")) << d;
  EXPECT_TRUE(has(d, "\n    offload q_proj, k_proj\n")) << d;
  EXPECT_TRUE(has(d, "(unused rules allowed)")) << d;
  EXPECT_TRUE(has(d, "guard bytes 64, phases share regions")) << d;
  EXPECT_TRUE(has(d, "latency hiding off")) << d;
  EXPECT_TRUE(has(d, "chunk 1.00 MiB")) << d;
  EXPECT_TRUE(has(d, "collectives: gather before forward, reduce after backward\n")) << d;
  st.collectives.overlap = false;
  EXPECT_TRUE(has(describe(st), "collectives: gather before forward, reduce after backward (on the compute stream, not overlapped)\n"))
      << describe(st);
}

namespace {
// What to_cpp_types prints for mixed_value() (below), pasted: it compiles, and spells the same strategy.
using printed = tide::strategy_of<
    tide::policy<
        tide::offload<tide::slot_names<"b">>,
        tide::remat<tide::slot_names<"a">, tide::layer_range<1, 3>>>,
    tide::buffers<tide::staging_buffers<3>, tide::share_phase_regions<false>>,
    tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<750>>,
    tide::collectives<tide::after_backward>>;
}  // namespace

TEST(Codegen, ToCppTypesPrintsOneStrategyOf) {
  auto const text = to_cpp_types(mixed_value());
  EXPECT_EQ(text.rfind("using planned = tide::strategy_of<", 0), 0u) << text;
  EXPECT_TRUE(has(text, "tide::policy<\n        tide::offload<tide::slot_names<\"b\">>,\n")) << text;
  EXPECT_TRUE(has(text, "tide::remat<tide::slot_names<\"a\">, tide::layer_range<1, 3>>>")) << text;
  EXPECT_TRUE(has(text, "tide::buffers<tide::staging_buffers<3>, tide::share_phase_regions<false>>")) << text;
  EXPECT_TRUE(has(text, "tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<750>>")) << text;
  EXPECT_TRUE(has(text, "tide::collectives<tide::after_backward>>;\n")) << text;
  // Knobs at their defaults are left out.
  EXPECT_FALSE(has(text, "latency_hiding")) << text;
  EXPECT_FALSE(has(text, "device_alignment")) << text;
  EXPECT_FALSE(has(text, "max_offloads_in_flight")) << text;
  EXPECT_FALSE(has(text, "before_forward")) << text;
  // The printed type, compiled (`printed` above), is the strategy it was printed from.
  expect_same_strategy(printed::spec(), mixed_value());
  // Every knob, and a name.
  strategy all{.policy = {rule_spec{.where = placement::keep, .first_layer = 4, .min_bytes = 4096}},
               .buffers = {.staging_buffers = 1, .device_alignment = 512, .host_alignment = 128, .guard_bytes = 64},
               .pipeline = {.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1},
               .collectives = {.before_forward = true, .after_backward = true}};
  auto const t = to_cpp_types(all, "mine");
  EXPECT_EQ(t.rfind("using mine = tide::strategy_of<", 0), 0u) << t;
  EXPECT_TRUE(has(t, "tide::keep<tide::layer_range<4>, tide::min_bytes<4096>>")) << t;
  EXPECT_TRUE(has(t, "tide::buffers<tide::staging_buffers<1>, tide::device_alignment<512>, tide::host_alignment<128>, "
                     "tide::guard_bytes<64>>")) << t;
  EXPECT_TRUE(has(t, "tide::pipeline<tide::latency_hiding<false>, tide::prefetch_distance<0>, "
                     "tide::max_offloads_in_flight<1>>")) << t;
  EXPECT_TRUE(has(t, "tide::collectives<tide::before_forward, tide::after_backward>")) << t;
  // Collectives not overlapped, printed and compiled (`printed_serial` below).
  all.collectives.overlap = false;
  EXPECT_TRUE(has(to_cpp_types(all), "tide::collectives<tide::before_forward, tide::after_backward, tide::overlap_collectives<false>>"))
      << to_cpp_types(all);
  using printed_serial = tide::collectives<tide::before_forward, tide::after_backward, tide::overlap_collectives<false>>;
  EXPECT_EQ(printed_serial::spec(), all.collectives);
  // Keep-all with default parts: only the empty policy.
  EXPECT_EQ(to_cpp_types(strategy{}, "keep"), "using keep = tide::strategy_of<\n    tide::policy<>>;\n");
}

TEST(OpLabel, ChunksCountFromOneAndShowOnlyWhenSplit) {
  auto const s = build_schedule(three::spec(), {.policy = offload_b::spec(),
                                                .pipeline = {.chunk_bytes = 750},  // b: 3000 bytes in 4 chunks
                                                .collectives = {.before_forward = true, .after_backward = true}});
  auto label_of = [&](op_kind k, std::uint32_t layer, std::uint32_t chunk = 0) {
    for (auto const& o : s.ops)
      if (o.kind == k && o.layer == layer && o.chunk == chunk) return op_label(s, o);
    return std::string("no such op");
  };
  EXPECT_EQ(label_of(op_kind::prefetch, 2, 1), "prefetch L2 b 2/4");
  EXPECT_EQ(label_of(op_kind::offload, 0, 0), "offload L0 b 1/4");
  EXPECT_EQ(label_of(op_kind::offload, 1, 3), "offload L1 b 4/4");
  EXPECT_EQ(label_of(op_kind::forward, 0), "forward L0");
  EXPECT_EQ(label_of(op_kind::backward, 2), "backward L2");
  EXPECT_EQ(label_of(op_kind::gather, 1), "gather L1");
  EXPECT_EQ(label_of(op_kind::reduce, 0), "reduce L0");
  // One chunk: no chunk part.
  auto const whole = build_schedule(three::spec(), {.policy = offload_b::spec()});
  std::size_t whole_offloads = 0;
  for (auto const& o : whole.ops)
    if (o.kind == op_kind::offload && o.layer == 1) {
      EXPECT_EQ(op_label(whole, o), "offload L1 b");
      ++whole_offloads;
    }
  EXPECT_EQ(whole_offloads, 1u);
  // write_op_label: the slot's index when no name is given, truncated to the buffer, terminated.
  op const o{.kind = op_kind::prefetch, .stream = stream_role::h2d, .slot = 1, .layer = 3, .chunk = 1, .chunks = 4};
  char buf[64];
  write_op_label(buf, o, "");
  EXPECT_EQ(std::string(buf), "prefetch L3 slot 1 2/4");
  write_op_label(buf, o, "q_proj");
  EXPECT_EQ(std::string(buf), "prefetch L3 q_proj 2/4");
  char small[10];
  write_op_label(small, o, "q_proj");
  EXPECT_EQ(std::string(small), "prefetch ");
  char tail[20];  // room for "prefetch L3 q_proj " only
  write_op_label(tail, o, "q_proj");
  EXPECT_EQ(std::string(tail), "prefetch L3 q_proj ");
  // In checker messages: "op #i (label on stream)".
  auto broken = s;
  std::uint32_t p = 0;
  while (!(broken.ops[p].kind == op_kind::prefetch && broken.ops[p].layer == 1 && broken.ops[p].chunk == 1)) ++p;
  broken.ops[p].device_offset += 8;
  auto const e = what_of([&] { check_schedule(broken); });
  EXPECT_TRUE(has(e, "op #" + std::to_string(p) + " (prefetch L1 b 2/4 on h2d)")) << e;
}

// The positive twin of tests/compile_fail/misspelled_slot_handle.cpp: a handle resolves at
// compile time to the slot's index in its layer type.
TEST(TypeLevel, SlotHandlesResolveAtCompileTime) {
  constexpr auto b = slot_handle_of<blk, "b", float>;
  static_assert(b.index == 1);
  static_assert(std::is_same_v<decltype(b)::element_type, float>);
  EXPECT_EQ(b.layer_type, "blk");
  static_assert(slot_handle_of<moe, "experts">.index == 2);
  static_assert(std::is_same_v<decltype(slot_handle_of<moe, "experts">)::element_type, std::byte>);
}

// Second pass, item 11: the builder asks the policy once for the whole stack (a sweep over the
// layers) instead of once per (layer, slot) through every rule. Random stacks and policies
// (overlapping ranges, wildcards, repeated and unknown names, size thresholds): the sweep's
// answer is the first-match rule of each pair, and policy_from_decisions reproduces random
// decisions exactly.
TEST(HardeningSecondPass, RuleSweepEqualsFirstMatchOnRandomPolicies) {
  std::mt19937_64 rng(20261201);
  auto uni = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  static constexpr std::string_view pool[] = {"a", "b", "c", "d", "e", "zz"};
  for (int trial = 0; trial < 400; ++trial) {
    stack_spec st;
    st.independent_layers = true;
    std::vector<layer_spec> types(uni(1, 3));
    for (std::size_t t = 0; t < types.size(); ++t) {
      types[t].name = pool[t];
      for (std::size_t k = 0, n = uni(1, 4); k < n; ++k) {
        auto const name = pool[uni(0, 4)];
        bool dup = false;
        for (auto const& s : types[t].slots) dup |= s.name == name;
        if (!dup) types[t].slots.push_back({name, static_cast<std::size_t>(uni(1, 4) * 1000)});
      }
    }
    for (std::uint64_t l = 0, L = uni(1, 40); l < L; ++l) st.append(types[uni(0, types.size() - 1)]);
    policy_spec p;
    for (std::uint64_t r = 0, R = uni(0, 12); r < R; ++r) {
      rule_spec rs{.where = static_cast<placement>(uni(0, 2))};
      for (std::uint64_t k = 0, n = uni(0, 3); k < n; ++k) rs.slots.push_back(pool[uni(0, 5)]);
      rs.first_layer = static_cast<std::uint32_t>(uni(0, st.layer_count()));
      rs.last_layer = uni(0, 2) ? all_layers : static_cast<std::uint32_t>(uni(0, st.layer_count() + 2));
      rs.min_bytes = uni(0, 2) ? 0 : static_cast<std::size_t>(uni(0, 4) * 1000);
      p.rules.push_back(rs);
    }
    auto const got = detail::swept_deciding_rules(p, st);  // the sweep itself (small inputs loop)
    ASSERT_EQ(p.deciding_rules(st), got);
    std::vector<placement> decisions;
    std::size_t pair = 0;
    for (std::uint32_t l = 0; l < st.layer_count(); ++l)
      for (auto const& s : st.layer(l).slots) {
        ASSERT_LT(pair, got.size());
        ASSERT_EQ(got[pair], p.deciding_rule(l, s)) << "trial " << trial << ", layer " << l << ", slot " << s.name;
        ++pair;
        decisions.push_back(static_cast<placement>(uni(0, 2)));
      }
    ASSERT_EQ(got.size(), pair);
    auto const q = policy_from_decisions(st, decisions);
    pair = 0;
    for (std::uint32_t l = 0; l < st.layer_count(); ++l)
      for (auto const& s : st.layer(l).slots) ASSERT_EQ(q.decide(l, s), decisions[pair++]) << "trial " << trial;
  }
}

// tide::name under hostile input: embedded NULs, a megabyte, the empty string, and many threads
// interning the same names at once (one copy each; ThreadSanitizer runs this too). A schedule
// keeps two slots whose names differ only after a NUL apart.
TEST(Names, HostileNamesInternWholeAndOnceAcrossThreads) {
  std::string const nul_a("s\0a", 3), nul_b("s\0b", 3);
  EXPECT_EQ(tide::name(nul_a).size(), 3u);
  EXPECT_NE(tide::name(nul_a), tide::name(nul_b));
  EXPECT_NE(tide::name(nul_a), tide::name("s"));
  std::string const huge(1 << 20, 'x');
  tide::name const h(huge);
  EXPECT_EQ(h, huge);
  EXPECT_NE(static_cast<void const*>(h.data()), static_cast<void const*>(huge.data()));  // a copy, not a view of `huge`
  EXPECT_TRUE(tide::name(std::string()).empty());
  EXPECT_EQ(tide::name(""), tide::name{});

  constexpr int threads = 4, per_thread = 500;
  std::vector<std::vector<char const*>> seen(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&seen, t] {
      for (int i = 0; i < per_thread; ++i) seen[t].push_back(tide::name("hostile_" + std::to_string(i)).data());
    });
  for (auto& th : pool) th.join();
  std::set<char const*> distinct;
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(seen[t], seen[0]) << "thread " << t << " got other copies of the same names";
    distinct.insert(seen[t].begin(), seen[t].end());
  }
  EXPECT_EQ(distinct.size(), std::size_t{per_thread});

  stack_spec st;
  st.independent_layers = true;
  st.append({std::string("t\0x", 3), {{nul_a, 64}, {nul_b, 128}}}, 2);
  auto const s = build_schedule(st, {.policy = {rule_spec{.where = placement::remat, .slots = {nul_b}}}});
  ASSERT_EQ(s.slots.size(), 4u);
  EXPECT_EQ(s.slots[0].where, placement::keep);
  EXPECT_EQ(s.slots[1].where, placement::remat);
  EXPECT_EQ(s.layers[1].type_name, std::string_view("t\0x", 3));
}
