// Stage orders (core/stage_order.hpp) and their timeline (plan/stage_timeline.hpp): GPipe and 1F1B
// orders as written out by hand, every micro-batch's forward before its backward and backwards in
// micro-batch order, the peak in flight in closed form, the compile-time form equal to the
// run-time one, the timeline's step and bubbles against the closed form (M + S - 1)(f + b), and
// hostile inputs refused by name.
#include <gtest/gtest.h>

#include <tide/core/stage_order.hpp>
#include <tide/plan/stage_timeline.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace tide;

namespace {

std::string text(std::vector<stage_step> const& v) {
  std::string r;
  for (auto const& x : v) r += (x.pass == stage_pass::forward ? "F" : "B") + std::to_string(x.micro_batch) + " ";
  return r;
}

template <class F>
std::string what(F&& f) {
  try {
    f();
  } catch (tide::error const& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace

TEST(StageOrder, WrittenOutByHand) {
  // 4 stages, 6 micro-batches: stage s warms up with 3 - s forwards under 1F1B.
  EXPECT_EQ(text(stage_steps({.stage = 0, .stages = 4, .micro_batches = 6})), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(text(stage_steps({.stage = 1, .stages = 4, .micro_batches = 6})), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5 ");
  EXPECT_EQ(text(stage_steps({.stage = 3, .stages = 4, .micro_batches = 6})), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  EXPECT_EQ(text(stage_steps({.stage = 2, .stages = 4, .micro_batches = 3, .order = stage_order::gpipe})), "F0 F1 F2 B0 B1 B2 ");
  EXPECT_EQ(to_string(stage_order::one_f_one_b), "1f1b");
  EXPECT_EQ(to_string(stage_order::gpipe), "gpipe");
}

// Every valid (order, stages, stage, micro-batches) up to 12 stages and 40 micro-batches: each
// micro-batch once forward and once backward, forward first, backwards in micro-batch order,
// forwards too; the peak in flight is M under GPipe and S - s under 1F1B.
TEST(StageOrder, EveryOrderIsWellFormed) {
  int checked = 0;
  for (auto order : {stage_order::gpipe, stage_order::one_f_one_b})
    for (std::uint32_t S = 1; S <= 12; ++S)
      for (std::uint32_t M = 1; M <= 40; ++M) {
        if (order == stage_order::one_f_one_b && M < S) continue;
        for (std::uint32_t s = 0; s < S; ++s) {
          stage_spec const spec{.stage = s, .stages = S, .micro_batches = M, .order = order};
          auto const v = stage_steps(spec);
          ASSERT_EQ(v.size(), 2u * M);
          std::vector<int> fwd_at(M, -1), bwd_at(M, -1);
          std::uint32_t next_f = 0, next_b = 0, live = 0, peak = 0;
          for (std::size_t i = 0; i < v.size(); ++i) {
            auto const m = v[i].micro_batch;
            ASSERT_LT(m, M);
            if (v[i].pass == stage_pass::forward) {
              ASSERT_EQ(m, next_f++) << "forwards out of order";
              fwd_at[m] = static_cast<int>(i);
              peak = std::max(peak, ++live);
            } else {
              ASSERT_EQ(m, next_b++) << "backwards out of micro-batch order";
              ASSERT_GE(fwd_at[m], 0) << "a backward before its forward";
              bwd_at[m] = static_cast<int>(i);
              --live;
            }
          }
          EXPECT_EQ(live, 0u);
          EXPECT_EQ(peak, order == stage_order::gpipe ? M : S - s);
          EXPECT_EQ(peak_in_flight(spec), peak);
          ++checked;
        }
      }
  EXPECT_GT(checked, 2000);
}

std::string units(std::vector<stage_step> const& v) {
  std::string r;
  for (auto const& x : v) r += (x.pass == stage_pass::forward ? "F" : "B") + std::to_string(x.chunk) + std::to_string(x.micro_batch) + " ";
  return r;
}

// Megatron-LM's interleaved 1F1B, 2 stages of 2 chunks, 4 micro-batches: forwards in groups of
// 2 micro-batches per chunk, backwards from the last chunk; (S - s - 1) * 2 + (v - 1) * S warm-up
// forwards (4 on stage 0, 2 on stage 1); all forwards first when M == S.
TEST(StageOrder, InterleavedWrittenOutByHand) {
  stage_spec const a{.stage = 0, .stages = 2, .micro_batches = 4, .order = stage_order::interleaved, .virtual_stages = 2};
  EXPECT_EQ(units(stage_steps(a)), "F00 F01 F10 F11 F02 B10 F03 B11 F12 B00 F13 B01 B12 B13 B02 B03 ");
  auto b = a;
  b.stage = 1;
  EXPECT_EQ(units(stage_steps(b)), "F00 F01 F10 B10 F11 B11 F02 B00 F03 B01 F12 B12 F13 B13 B02 B03 ");
  auto c = a;
  c.micro_batches = 2;
  EXPECT_EQ(units(stage_steps(c)), "F00 F01 F10 F11 B10 B11 B00 B01 ");
  EXPECT_EQ(to_string(stage_order::interleaved), "interleaved");
  EXPECT_EQ(peak_in_flight(a), 5u);  // the 4 warm-up units and the first steady one
  EXPECT_EQ(stage_unit(a, 1, 3), 7u);
}

// Every interleaved order up to 8 stages, 4 chunks, 4 groups of micro-batches: each unit once
// forward and once backward, forward first; each chunk's forwards and backwards in micro-batch
// order; a unit's forward on chunk c + 1 after its forward on chunk c, its backward before; the
// peak in flight one more than the warm-up (or every unit).
TEST(StageOrder, EveryInterleavedOrderIsWellFormed) {
  int checked = 0;
  for (std::uint32_t S = 2; S <= 8; ++S)
    for (std::uint32_t V = 2; V <= 4; ++V)
      for (std::uint32_t M = S; M <= 4 * S; M += S)
        for (std::uint32_t s = 0; s < S; ++s) {
          stage_spec const spec{.stage = s, .stages = S, .micro_batches = M, .order = stage_order::interleaved, .virtual_stages = V};
          auto const v = stage_steps(spec);
          ASSERT_EQ(v.size(), 2u * M * V);
          std::vector<int> fwd_at(M * V, -1), bwd_at(M * V, -1);
          std::vector<std::uint32_t> next_f(V, 0), next_b(V, 0);
          std::uint32_t live = 0, peak = 0;
          for (std::size_t i = 0; i < v.size(); ++i) {
            auto const u = stage_unit(spec, v[i].chunk, v[i].micro_batch);
            ASSERT_LT(v[i].chunk, V);
            ASSERT_LT(v[i].micro_batch, M);
            if (v[i].pass == stage_pass::forward) {
              ASSERT_EQ(v[i].micro_batch, next_f[v[i].chunk]++) << "a chunk's forwards out of order";
              ASSERT_EQ(fwd_at[u], -1);
              if (v[i].chunk > 0) {
                ASSERT_GE(fwd_at[u - M], 0) << "chunk c + 1's forward before chunk c's";
              }
              fwd_at[u] = static_cast<int>(i);
              peak = std::max(peak, ++live);
            } else {
              ASSERT_EQ(v[i].micro_batch, next_b[v[i].chunk]++) << "a chunk's backwards out of micro-batch order";
              ASSERT_GE(fwd_at[u], 0) << "a backward before its forward";
              if (v[i].chunk + 1 < V) {
                ASSERT_GE(bwd_at[u + M], 0) << "chunk c's backward before chunk c + 1's";
              }
              bwd_at[u] = static_cast<int>(i);
              --live;
            }
          }
          EXPECT_EQ(live, 0u);
          auto const w = std::min((S - s - 1) * 2 + (V - 1) * S, M * V);
          EXPECT_EQ(peak, M == S ? M * V : std::min(w + 1, M * V));
          EXPECT_EQ(peak_in_flight(spec), peak);
          ++checked;
        }
  EXPECT_GT(checked, 300);
}

TEST(StageOrder, CompileTimeFormEqualsRunTime) {
  constexpr auto v = stage_steps_v<stage_spec{.stage = 1, .stages = 4, .micro_batches = 8}>;
  static_assert(v.size() == 16);
  static_assert(v[0] == stage_step{stage_pass::forward, 0} && v[3] == stage_step{stage_pass::backward, 0});
  static_assert(peak_in_flight({.stage = 0, .stages = 16, .micro_batches = 32}) == 16);
  auto const r = stage_steps({.stage = 1, .stages = 4, .micro_batches = 8});
  EXPECT_TRUE(std::equal(v.begin(), v.end(), r.begin(), r.end()));
  constexpr auto g = stage_steps_v<stage_spec{.stage = 0, .stages = 2, .micro_batches = 3, .order = stage_order::gpipe}>;
  static_assert(g[2] == stage_step{stage_pass::forward, 2} && g[3] == stage_step{stage_pass::backward, 0});
}

TEST(StageOrder, HostileStagesAreRefusedByName) {
  EXPECT_NE(what([] { (void)stage_steps({.stage = 0, .stages = 0}); }).find("stage_spec::stages is 0"), std::string::npos);
  EXPECT_NE(what([] { (void)stage_steps({.stage = 4, .stages = 4, .micro_batches = 8}); }).find("stage_spec::stage is not below"), std::string::npos);
  EXPECT_NE(what([] { (void)stage_steps({.stage = 0, .stages = 2, .micro_batches = 0}); }).find("micro_batches is 0"), std::string::npos);
  // M < S under 1F1B: the order needs more; GPipe takes it.
  auto const m = what([] { (void)stage_steps({.stage = 0, .stages = 4, .micro_batches = 3}); });
  EXPECT_NE(m.find("1F1B needs at least as many micro-batches as stages"), std::string::npos) << m;
  EXPECT_NE(m.find("stage_order::gpipe"), std::string::npos) << m;
  EXPECT_EQ(stage_steps({.stage = 0, .stages = 4, .micro_batches = 3, .order = stage_order::gpipe}).size(), 6u);
  EXPECT_NE(what([] { (void)stage_steps({.stage = 0, .stages = max_stages + 1, .micro_batches = max_stages + 1}); }).find("max_stages"),
            std::string::npos);
  EXPECT_NE(what([] { (void)stage_steps({.stage = 0, .stages = 1, .micro_batches = max_micro_batches + 1}); }).find("max_micro_batches"),
            std::string::npos);
  EXPECT_NE(what([] { (void)stage_steps({.stage = 0, .stages = 1, .micro_batches = 1, .order = static_cast<stage_order>(7)}); })
                .find("not a stage_order"),
            std::string::npos);
  EXPECT_THROW((void)peak_in_flight({.stage = 2, .stages = 2}), schedule_error);
  // Interleaving: v > 1 only with its order, at least 2 chunks and 2 stages, M a multiple of S.
  auto const refused = [](stage_spec const& sp) { return what([&] { (void)stage_steps(sp); }); };
  auto m2 = refused({.stages = 2, .micro_batches = 4, .virtual_stages = 2});
  EXPECT_NE(m2.find("only stage_order::interleaved runs several chunks"), std::string::npos) << m2;
  m2 = refused({.stages = 2, .micro_batches = 4, .order = stage_order::interleaved});
  EXPECT_NE(m2.find("virtual_stages of 2 or more"), std::string::npos) << m2;
  m2 = refused({.stages = 1, .micro_batches = 4, .order = stage_order::interleaved, .virtual_stages = 2});
  EXPECT_NE(m2.find("needs 2 stages or more"), std::string::npos) << m2;
  m2 = refused({.stages = 4, .micro_batches = 6, .order = stage_order::interleaved, .virtual_stages = 2});
  EXPECT_NE(m2.find("a multiple of stages"), std::string::npos) << m2;
  m2 = refused({.stages = 2, .micro_batches = 4, .order = stage_order::interleaved, .virtual_stages = 0});
  EXPECT_NE(m2.find("virtual_stages is 0"), std::string::npos) << m2;
  m2 = refused({.stages = 2, .micro_batches = 4, .order = stage_order::interleaved, .virtual_stages = max_virtual_stages + 1});
  EXPECT_NE(m2.find("max_virtual_stages"), std::string::npos) << m2;
}

// The timeline of equal stages without transfer time: the step is (M + S - 1)(f + b) under both
// orders (each stage busy M (f + b), idle (S - 1)(f + b)); each micro-batch's wait in closed form;
// transfers add to a micro-batch's path by the hops it crosses.
TEST(StageTimeline, ClosedFormsOnEqualStages) {
  for (auto order : {stage_order::gpipe, stage_order::one_f_one_b})
    for (std::uint32_t S : {1u, 2u, 4u, 7u})
      for (std::uint32_t M : {7u, 8u, 16u}) {
        double const f = 1.5, b = 3;
        std::vector<stage_costs> const c{{.forward_us = f, .backward_us = b}};
        auto const t = time_stages(order, S, M, c);
        SCOPED_TRACE(std::string(to_string(order)) + " S " + std::to_string(S) + " M " + std::to_string(M));
        EXPECT_DOUBLE_EQ(t.step_us, (M + S - 1) * (f + b));
        for (std::uint32_t s = 0; s < S; ++s) {
          EXPECT_DOUBLE_EQ(t.busy_us[s], M * (f + b));
          EXPECT_DOUBLE_EQ(t.bubble_us(s), (S - 1) * (f + b));
          for (std::uint32_t m = 0; m < M; ++m) {
            EXPECT_GE(t.wait_us(s, m), 0);
            if (s > 0) {
              EXPECT_GE(t.forward_begin_us[t.index(s, m)], t.forward_end_us[t.index(s - 1, m)]);
            }
            if (s + 1 < S) {
              EXPECT_GE(t.backward_begin_us[t.index(s, m)], t.backward_end_us[t.index(s + 1, m)]);
            }
          }
        }
        // Each micro-batch's wait in closed form. Under 1F1B on stage s: (S - 1 - s)(f + b), and m
        // backwards more for the micro-batches 1 .. S - 1 - s whose forwards ran back to back
        // before the first backward (their backwards come at the steady rhythm, f + b apart).
        // Under GPipe: (S + M - 2 - s - m) f + (m + S - 1 - s) b.
        for (std::uint32_t s = 0; s < S; ++s)
          for (std::uint32_t m = 0; m < M; ++m)
            EXPECT_DOUBLE_EQ(t.wait_us(s, m), order == stage_order::gpipe ? (S + M - 2 - s - m) * f + (m + S - 1 - s) * b
                                                                          : (S - 1 - s) * (f + b) + (m <= S - 1 - s ? m * b : 0))
                << "stage " << s << " micro-batch " << m;
      }
  // 1F1B, 4 stages, f = 1, b = 2: micro-batch 0 ends its forward on stage 0 at 1; its backward
  // reaches stage 0 after the other three stages' forwards (3) and all four backwards but this
  // one (6): it starts at 10, a wait of 9. Micro-batches past the warm-up wait less.
  auto const t = time_stages(stage_order::one_f_one_b, 4, 8, std::vector<stage_costs>{{.forward_us = 1, .backward_us = 2}});
  EXPECT_DOUBLE_EQ(t.wait_us(0, 0), 9);
  // PipeOffload's rule: offload where the wait is at least three round trips. A round trip of 2:
  // waits of 6 or more.
  for (auto m : t.waits_at_least(0, 2)) EXPECT_GE(t.wait_us(0, m), 6);
  EXPECT_FALSE(t.waits_at_least(0, 2).empty());
  EXPECT_TRUE(t.waits_at_least(3, 2).empty());  // the last stage never waits
  // Transfers: each hop adds its time twice (forward and back) to the first micro-batch's path.
  auto const x = time_stages(stage_order::one_f_one_b, 4, 8, std::vector<stage_costs>{{.forward_us = 1, .backward_us = 2, .transfer_us = 0.25}});
  EXPECT_DOUBLE_EQ(x.backward_end_us[x.index(0, 0)], t.backward_end_us[t.index(0, 0)] + 6 * 0.25);
  EXPECT_GT(x.step_us, t.step_us);
}

TEST(StageTimeline, HostileInputsAreRefusedByName) {
  std::vector<stage_costs> two(2);
  EXPECT_NE(what([&] { (void)time_stages(stage_order::gpipe, 3, 4, two); }).find("2 stage_costs for 3 stages"), std::string::npos);
  std::vector<stage_costs> nan{{.forward_us = std::nan("")}};
  EXPECT_NE(what([&] { (void)time_stages(stage_order::gpipe, 3, 4, nan); }).find("stage_costs[0].forward_us is nan"), std::string::npos);
  std::vector<stage_costs> neg{{.transfer_us = -1}};
  EXPECT_NE(what([&] { (void)time_stages(stage_order::gpipe, 3, 4, neg); }).find("transfer_us"), std::string::npos);
  EXPECT_NE(what([&] { (void)time_stages(stage_order::one_f_one_b, 4, 2, std::vector<stage_costs>(1)); }).find("1F1B needs"),
            std::string::npos);
  // Past the pairs it times: refused before allocating (4096 x 2^20 pairs were 128 GiB).
  EXPECT_NE(what([] { (void)time_stages(stage_order::gpipe, max_stages, max_micro_batches, std::vector<stage_costs>(1)); })
                .find("max_stage_timeline_pairs"),
            std::string::npos);
  auto const t = time_stages(stage_order::gpipe, 2, 2, std::vector<stage_costs>(1));
  EXPECT_THROW((void)t.wait_us(2, 0), schedule_error);
  EXPECT_THROW((void)t.wait_us(0, 2), schedule_error);
}

// Random per-stage costs: the dependencies hold, no stage runs two passes at once, and the step
// is at least every stage's busy time and the first micro-batch's path through the pipeline.
TEST(StageTimeline, RandomStagesKeepTheirDependencies) {
  std::mt19937_64 rng(55);
  auto us = [&] { return static_cast<double>(rng() % 1000) / 100; };
  for (int i = 0; i < 300; ++i) {
    std::uint32_t const S = 1 + static_cast<std::uint32_t>(rng() % 8);
    auto const order = rng() % 2 ? stage_order::gpipe : stage_order::one_f_one_b;
    std::uint32_t const M = (order == stage_order::one_f_one_b ? S : 1) + static_cast<std::uint32_t>(rng() % 12);
    std::vector<stage_costs> c(S);
    for (auto& x : c) x = {.forward_us = us(), .backward_us = us(), .transfer_us = us() / 4};
    auto const t = time_stages(order, S, M, c);
    double path = 0;
    for (std::uint32_t s = 0; s < S; ++s) path += c[s].forward_us + c[s].backward_us + (s + 1 < S ? 2 * c[s].transfer_us : 0);
    EXPECT_GE(t.step_us, path - 1e-9);
    for (std::uint32_t s = 0; s < S; ++s) {
      EXPECT_GE(t.step_us, t.busy_us[s] - 1e-9);
      // The stage's passes, in its order, do not overlap.
      double end = 0;
      for (auto const& st : stage_steps({.stage = s, .stages = S, .micro_batches = M, .order = order})) {
        auto const k = t.index(s, st.micro_batch);
        double const b = st.pass == stage_pass::forward ? t.forward_begin_us[k] : t.backward_begin_us[k];
        double const e = st.pass == stage_pass::forward ? t.forward_end_us[k] : t.backward_end_us[k];
        ASSERT_GE(b, end - 1e-9);
        end = e;
      }
      for (std::uint32_t m = 0; m < M; ++m) {
        auto const k = t.index(s, m);
        if (s > 0) {
          ASSERT_GE(t.forward_begin_us[k], t.forward_end_us[t.index(s - 1, m)] + c[s - 1].transfer_us - 1e-9);
        }
        if (s + 1 < S) {
          ASSERT_GE(t.backward_begin_us[k], t.backward_end_us[t.index(s + 1, m)] + c[s].transfer_us - 1e-9);
        }
        ASSERT_GE(t.backward_begin_us[k], t.forward_end_us[k]);
      }
    }
  }
}
