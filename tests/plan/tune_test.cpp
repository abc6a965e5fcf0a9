// Tuning by measurement (issue 42, item 2): `tune` measures candidates round-robin with a
// deterministic fake backend, keeps the most tokens per second measured (not predicted), reports
// prediction beside measurement, refuses hostile input by name, names the candidate whose step
// threw; the chosen plan saved as a policy file and read back builds the same schedule.
#include <gtest/gtest.h>

#include <tide/io/json.hpp>
#include <tide/plan/micro_batch.hpp>
#include <tide/plan/tune.hpp>

#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

using namespace tide;

namespace {

// Two slots a layer whose bytes grow with the micro-batch; compute `10 + 20 x b` a layer's
// forward (fixed work amortized: tokens per second grow with b while everything fits).
stack_spec stack_at(std::uint64_t b) {
  stack_spec s;
  s.independent_layers = true;
  s.append({"blk", {{"a", 4096 * b}, {"b", 2048 * b}}}, 3);
  return s;
}

micro_batch_problem problem(std::uint64_t b) {
  auto const x = static_cast<double>(b);
  cost_table c;
  for (int l = 0; l < 3; ++l)
    c.layers.push_back({.forward_us = 10 + 20 * x, .backward_us = 20 + 40 * x, .recompute_us = 10 + 20 * x,
                        .slot_recompute_us = {5 + 10 * x, 5 + 10 * x}});
  c.link.d2h = c.link.h2d = {.bytes_per_second = 1e9, .latency_us = 1};
  return {.stack = stack_at(b), .costs = c, .options = {.device_budget = 40 * 1024}, .tokens = 16 * x};
}

std::string what_of(auto&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

bool has(std::string const& s, char const* what) { return s.find(what) != std::string::npos; }

}  // namespace

// The measured best wins over the predicted best; medians resist one outlier; round-robin order.
TEST(Tune, KeepsTheMeasuredBestAndReportsPredictions) {
  std::vector<tune_candidate> const c = {
      {.name = "a", .micro_batch = 2, .tokens = 32, .predicted_step_us = 100},  // predicted 320k tok/s
      {.name = "b", .micro_batch = 4, .tokens = 64, .predicted_step_us = 180},  // predicted best: 356k tok/s
      {.name = "c", .micro_batch = 1, .tokens = 16, .predicted_step_us = 0},    // no prediction
  };
  std::map<std::string, double> const truth = {{"a", 90}, {"b", 240}, {"c", 80}};  // a measures best: 356k tok/s
  std::vector<std::string> order;
  int calls = 0;
  auto const r = tune(c, [&](tune_candidate const& x) {
    order.push_back(x.name);
    ++calls;
    return truth.at(x.name) * (calls == 4 ? 10.0 : 1.0);  // one outlier (a's first measured round)
  }, {.repeats = 3, .warmups = 1});
  ASSERT_EQ(r.results.size(), 3u);
  EXPECT_EQ(calls, 12);
  EXPECT_EQ((std::vector<std::string>(order.begin(), order.begin() + 6)), (std::vector<std::string>{"a", "b", "c", "a", "b", "c"}));
  EXPECT_EQ(r.best, 0u);
  EXPECT_EQ(r.chosen().candidate.name, "a");
  ASSERT_TRUE(r.predicted_best.has_value());
  EXPECT_EQ(*r.predicted_best, 1u);
  EXPECT_DOUBLE_EQ(r.results[0].median_us, 90);
  EXPECT_EQ(r.results[0].samples_us.size(), 3u);
  EXPECT_DOUBLE_EQ(r.results[0].tokens_per_second, 32 / 90e-6);
  EXPECT_NEAR(r.results[1].prediction_error(), 180.0 / 240 - 1, 1e-12);
  EXPECT_DOUBLE_EQ(r.results[2].prediction_error(), 0);
  EXPECT_DOUBLE_EQ(r.results[2].predicted_tokens_per_second, 0);
  EXPECT_NEAR(r.worst_prediction_error(), 0.25, 1e-12);
  EXPECT_NEAR(r.results[0].spread(), (900.0 - 90) / 90, 1e-12);
}

// settle: each turn runs the settling steps back to back before the counted one; only the counted
// step of a measured round is a sample (here a candidate whose first step after a switch is slow,
// as a host backend's on a 2-vCPU VM: the switch cost does not reach the median).
TEST(Tune, SettleStepsAreBackToBackAndUncounted) {
  std::vector<tune_candidate> const c = {{.name = "a", .micro_batch = 1, .tokens = 8, .predicted_step_us = 10},
                                         {.name = "b", .micro_batch = 2, .tokens = 16, .predicted_step_us = 20}};
  std::vector<std::string> order;
  std::string last;
  auto const step = [&](tune_candidate const& x) {
    bool const switched = x.name != last;
    last = x.name;
    order.push_back(x.name);
    double const base = x.name == "a" ? 10 : 20;
    return switched ? 3 * base : base + static_cast<double>(order.size()) * 1e-3;  // the counted step's index, readable
  };
  auto const r = tune(c, step, {.repeats = 3, .warmups = 1, .settle = 2});
  ASSERT_EQ(order.size(), 24u);  // (1 + 3) rounds x 2 candidates x (2 + 1) steps
  EXPECT_EQ((std::vector<std::string>(order.begin(), order.begin() + 9)),
            (std::vector<std::string>{"a", "a", "a", "b", "b", "b", "a", "a", "a"}));
  ASSERT_EQ(r.results[0].samples_us.size(), 3u);
  // a's counted steps are calls 9, 15 and 21 (1-based): the third of its turns in rounds 1 to 3.
  EXPECT_DOUBLE_EQ(r.results[0].samples_us[0], 10.009);
  EXPECT_DOUBLE_EQ(r.results[0].samples_us[2], 10.021);
  EXPECT_DOUBLE_EQ(r.results[1].samples_us[1], 20.018);
  EXPECT_LT(r.worst_prediction_error(), 0.01);  // the switch cost (3x) is not in the medians
  // Without settling, the same candidates measure their switch: every sample is the slow first step.
  last.clear();
  order.clear();
  auto const unsettled = tune(c, step, {.repeats = 3, .warmups = 1});
  EXPECT_EQ(order.size(), 8u);
  EXPECT_DOUBLE_EQ(unsettled.results[0].median_us, 30);
  EXPECT_NEAR(unsettled.results[0].prediction_error(), -2.0 / 3, 1e-12);
  // A settling step that fails says so, with its round.
  auto const m = what_of([&] {
    int calls = 0;
    (void)tune(c, [&](tune_candidate const&) { return ++calls == 5 ? 0.0 : 1.0; }, {.repeats = 1, .warmups = 0, .settle = 2});
  });
  EXPECT_TRUE(has(m, "candidate 'b' (micro-batch 2), round 1, settling step 2")) << m;
}

TEST(Tune, RefusesHostileInputByName) {
  std::vector<tune_candidate> const one = {{.name = "x", .micro_batch = 1, .tokens = 8}};
  auto const ok = [](tune_candidate const&) { return 1.0; };
  EXPECT_TRUE(has(what_of([&] { (void)tune({}, ok); }), "at least one candidate"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, ok, {.repeats = 0}); }), "repeats is 0: give 1 to 100000"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, ok, {.repeats = -3}); }), "repeats is -3"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, ok, {.warmups = -1}); }), "warmups is -1"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, ok, {.settle = -2}); }), "settle is -2: give 0 to 100000"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, tune_step_fn{}); }), "needs a callable"));
  std::vector<tune_candidate> twice = {one[0], one[0]};
  EXPECT_TRUE(has(what_of([&] { (void)tune(twice, ok); }), "has the name of candidate 0"));
  std::vector<tune_candidate> zero = {{.name = "z", .micro_batch = 0, .tokens = 8}};
  EXPECT_TRUE(has(what_of([&] { (void)tune(zero, ok); }), "micro-batch 0"));
  std::vector<tune_candidate> none = {{.name = "n", .micro_batch = 1, .tokens = 0}};
  EXPECT_TRUE(has(what_of([&] { (void)tune(none, ok); }), "has tokens"));
  // A step time that is not a time names the candidate.
  auto const m = what_of([&] { (void)tune(one, [](tune_candidate const&) { return -1.0; }); });
  EXPECT_TRUE(has(m, "candidate 'x' (micro-batch 1)")) << m;
  EXPECT_TRUE(has(m, "positive finite")) << m;
  EXPECT_TRUE(has(what_of([&] { (void)tune_candidates({}, 0); }), "count of 0"));
  // Counts that would overflow `warmups + repeats` (then a median of nothing) or never end, refused
  // before any step runs.
  int calls = 0;
  auto const counting = [&](tune_candidate const&) { return ++calls, 1.0; };
  constexpr int big = std::numeric_limits<int>::max();
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, counting, {.repeats = big}); }), "repeats is 2147483647: give 1 to 100000"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, counting, {.warmups = big}); }), "warmups is 2147483647: give 0 to 100000"));
  EXPECT_TRUE(has(what_of([&] { (void)tune(one, counting, {.settle = big}); }), "settle is 2147483647: give 0 to 100000"));
  EXPECT_EQ(calls, 0);
  // A rate that overflows (1e308 tokens, or a step of 5e-324 us) would beat every finite one.
  std::vector<tune_candidate> const vast = {{.name = "vast", .micro_batch = 1, .tokens = 1e308}, {.name = "y", .micro_batch = 1, .tokens = 8}};
  auto const inf = what_of([&] { (void)tune(vast, ok); });
  EXPECT_TRUE(has(inf, "candidate 'vast'")) << inf;
  EXPECT_TRUE(has(inf, "is not a finite rate")) << inf;
  auto const tiny = what_of([&] { (void)tune(one, [](tune_candidate const&) { return 5e-324; }); });
  EXPECT_TRUE(has(tiny, "candidate 'x'") && has(tiny, "measured (median) step")) << tiny;
  std::vector<tune_candidate> const fast_guess = {{.name = "g", .micro_batch = 1, .tokens = 1e300, .predicted_step_us = 1e-300}};
  EXPECT_TRUE(has(what_of([&] { (void)tune(fast_guess, [](tune_candidate const&) { return 1e100; }); }), "predicted step"));
}

// Tables of two stacks: the slopes were read past their end (a heap overflow under ASan).
TEST(Tune, MicroBatchCostsOfTwoStacksAreRefused) {
  micro_batch_costs m;
  m.fixed.layers.resize(3);
  m.per_sample.layers.resize(2);
  EXPECT_TRUE(has(what_of([&] { (void)m.at(2); }), "`fixed` has 3 layers and `per_sample` 2"));
  m.per_sample.layers.resize(3);
  m.fixed.layers[1].slot_recompute_us = {1, 2};
  m.per_sample.layers[1].slot_recompute_us = {1};
  EXPECT_TRUE(has(what_of([&] { (void)m.at(2); }), "layer 1 has 2 per-slot recompute costs in `fixed` and 1 in `per_sample`"));
  m.per_sample.layers[1].slot_recompute_us = {0.5, 0.25};
  EXPECT_EQ(m.at(2).layers[1].slot_recompute_us, (std::vector<double>{2, 2.5}));
  // A measured recompute whose slope is the "as forward" marker (a hand-built per_sample keeps
  // the default -1: it became -1 us per sample).
  m.fixed.layers[2].recompute_us = 10;
  EXPECT_TRUE(has(what_of([&] { (void)m.at(2); }), "layer 2 has a measured recompute_us in `fixed` and none (\"as forward_us\") in `per_sample`"));
  m.per_sample.layers[2].recompute_us = 3;
  EXPECT_DOUBLE_EQ(m.at(2).layers[2].recompute_us.value(), 16);
}

// A step that throws: the error names the candidate and the round and nests the original; the
// callable's own state (here a counter of live resources) is released by its owner.
TEST(Tune, AStepThatThrowsNamesTheCandidate) {
  std::vector<tune_candidate> const c = {{.name = "fine", .micro_batch = 1, .tokens = 8},
                                         {.name = "broken", .micro_batch = 2, .tokens = 16}};
  int live = 0;
  struct resource {
    int& n;
    explicit resource(int& c) : n(c) { ++n; }
    ~resource() { --n; }
  };
  int rounds = 0;
  try {
    (void)tune(c, [&](tune_candidate const& x) {
      resource r(live);
      if (x.name == "broken" && ++rounds == 2) throw std::runtime_error("out of memory: 3 MiB over");
      return 10.0;
    }, {.repeats = 3, .warmups = 1});
    FAIL() << "no exception";
  } catch (tide::error const& e) {
    std::string const m = e.what();
    EXPECT_TRUE(has(m, "candidate 'broken' (micro-batch 2), round 1")) << m;
    EXPECT_TRUE(has(m, "out of memory: 3 MiB over")) << m;
    try {
      std::rethrow_if_nested(e);
      FAIL() << "not nested";
    } catch (std::runtime_error const& inner) {
      EXPECT_STREQ(inner.what(), "out of memory: 3 MiB over");
    }
  }
  EXPECT_EQ(live, 0);
}

// From plan_micro_batches to a tuned choice, saved as a policy file and replayed: the same schedule.
TEST(Tune, ChosenPlanSavesAndReplaysExactly) {
  std::vector<std::uint64_t> const mbs = {1, 2, 3, 4, 6};
  auto const plans = plan_micro_batches(mbs, problem);
  ASSERT_TRUE(plans.best.has_value());
  auto const cands = tune_candidates(plans, 3, "planner");
  ASSERT_EQ(cands.size(), 3u);
  EXPECT_EQ(cands[0].micro_batch, plans.results[*plans.best].micro_batch);
  for (std::size_t i = 1; i < cands.size(); ++i)
    EXPECT_GE(cands[i - 1].tokens / cands[i - 1].predicted_step_us, cands[i].tokens / cands[i].predicted_step_us);
  // A fake backend that is 30% slower than predicted on the predicted best: the runner-up wins.
  auto const r = tune(cands, [&](tune_candidate const& x) {
    return x.predicted_step_us * (x.micro_batch == cands[0].micro_batch ? 1.3 : 1.0);
  });
  EXPECT_EQ(r.best, 1u);
  EXPECT_EQ(*r.predicted_best, 0u);
  //! [tune_save_replay]
  auto const& chosen = r.chosen().candidate;
  auto const stack = stack_at(chosen.micro_batch);
  std::string const saved = io::to_json(chosen.strategy).dump();  // or io::write_policy_file(path, ...)
  strategy const back = io::strategy_from_json(io::parse_json(saved, "tuned plan"), stack);
  schedule const replayed = build_schedule(stack, back);
  //! [tune_save_replay]
  auto const original = build_schedule(stack, chosen.strategy);
  EXPECT_EQ(replayed.ops, original.ops);
  EXPECT_EQ(replayed.slots, original.slots);
  EXPECT_EQ(replayed.layers, original.layers);
  EXPECT_EQ(replayed.waits, original.waits);
  EXPECT_EQ(replayed.arena, original.arena);
  EXPECT_EQ(replayed.peak_device_bytes(), original.peak_device_bytes());
  EXPECT_EQ(io::to_json(back), io::to_json(chosen.strategy));
  EXPECT_LE(replayed.peak_device_bytes(), 40u * 1024);
}
