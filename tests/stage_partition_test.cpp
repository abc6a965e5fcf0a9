// Partitions of a model's layers over pipeline stages (core/stage_partition.hpp,
// plan/partition.hpp): uneven partitions are checked and located, the even one is lighter at the
// ends as Llama 3 405B's, the cost-based one is optimal against every partition of small models,
// and hostile partitions and costs are refused by name.
#include <gtest/gtest.h>
#include <tide/core/stage_partition.hpp>
#include <tide/plan/partition.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

std::string refusal(auto&& f) {
  try {
    f();
  } catch (tide::schedule_error const& e) {
    return e.what();
  }
  return "accepted";
}

// The slowest stage of `p` under `cost` and `ends`.
double slowest(tide::stage_partition const& p, std::vector<double> const& cost, tide::partition_ends ends) {
  double worst = 0;
  auto const S = static_cast<std::uint32_t>(p.layers.size());
  for (std::uint32_t s = 0, at = 0; s < S; at += p.layers[s++]) {
    double t = (s == 0 ? ends.first_stage_us : 0) + (s + 1 == S ? ends.last_stage_us : 0);
    for (std::uint32_t l = at; l < at + p.layers[s]; ++l) t += cost[l];
    worst = std::max(worst, t);
  }
  return worst;
}

// Every partition of `L` layers over `S` stages (each stage at least one layer).
void each_partition(std::uint32_t L, std::uint32_t S, std::function<void(tide::stage_partition const&)> const& f) {
  tide::stage_partition p{std::vector<std::uint32_t>(S, 1)};
  std::function<void(std::uint32_t, std::uint32_t)> go = [&](std::uint32_t s, std::uint32_t left) {
    if (s + 1 == S) {
      p.layers[s] = left;
      return f(p);
    }
    for (std::uint32_t n = 1; n + (S - s - 1) <= left; ++n) {
      p.layers[s] = n;
      go(s + 1, left - n);
    }
  };
  go(0, L);
}

}  // namespace

TEST(StagePartition, AnUnevenPartitionLocatesEveryLayer) {
  tide::stage_partition const p{{3, 5, 5, 3}};
  tide::check_partition(p, 4, 16);
  EXPECT_EQ(tide::first_layer(p, 0), 0u);
  EXPECT_EQ(tide::first_layer(p, 1), 3u);
  EXPECT_EQ(tide::first_layer(p, 3), 13u);
  for (std::uint32_t s = 0, l = 0; s < 4; ++s)
    for (std::uint32_t k = 0; k < p.layers[s]; ++k, ++l) EXPECT_EQ(tide::stage_of_layer(p, l), s) << l;
}

TEST(StagePartition, EvenPartitionsAreLighterAtTheEnds) {
  // Llama 3 405B: 126 layers over 16 stages, the first and last a layer lighter (arXiv 2407.21783).
  auto const llama = tide::even_partition(126, 16);
  std::vector<std::uint32_t> want(16, 8);
  want.front() = want.back() = 7;
  EXPECT_EQ(llama.layers, want);
  EXPECT_EQ(tide::even_partition(10, 4).layers, (std::vector<std::uint32_t>{2, 3, 3, 2}));
  EXPECT_EQ(tide::even_partition(11, 3).layers, (std::vector<std::uint32_t>{4, 4, 3}));
  EXPECT_EQ(tide::even_partition(8, 4).layers, (std::vector<std::uint32_t>{2, 2, 2, 2}));
  for (std::uint32_t S = 1; S <= 16; ++S)
    for (std::uint32_t L = S; L <= 40; ++L) EXPECT_NO_THROW(tide::check_partition(tide::even_partition(L, S), S, L)) << L << " " << S;
}

TEST(StagePartition, PartitionByCostMakesTheEndsLighterForTheEmbeddingAndHead) {
  std::vector<double> const cost(126, 100.0);
  auto const p = tide::partition_by_cost(cost, 16, {.first_stage_us = 100, .last_stage_us = 100});
  EXPECT_EQ(p.layers, tide::even_partition(126, 16).layers);
  // Without the ends, 8 layers a stage at most: the first stage takes as few as it can (6).
  auto const plain = tide::partition_by_cost(cost, 16);
  EXPECT_EQ(slowest(plain, cost, {}), 800.0);
  std::vector<std::uint32_t> want(16, 8);
  want.front() = 6;
  EXPECT_EQ(plain.layers, want);
  // Ties at the bottleneck go to fewer layers on the earlier stages: {1, 2, 2} (stage times 1, 5,
  // 5), not {2, 1, 2} (3, 3, 5), which is as good.
  EXPECT_EQ(tide::partition_by_cost(std::vector<double>{1, 2, 3, 0, 5}, 3).layers, (std::vector<std::uint32_t>{1, 2, 2}));
}

TEST(StagePartition, PartitionByCostIsOptimalOnSmallModels) {
  std::mt19937_64 r(55);
  for (int trial = 0; trial < 300; ++trial) {
    auto const L = static_cast<std::uint32_t>(1 + r() % 9);
    auto const S = static_cast<std::uint32_t>(1 + r() % L);
    std::vector<double> cost(L);
    for (auto& c : cost) c = static_cast<double>(r() % 50);  // integers: sums are exact
    tide::partition_ends const ends{static_cast<double>(r() % 40), static_cast<double>(r() % 40)};
    auto const p = tide::partition_by_cost(cost, S, ends);
    ASSERT_NO_THROW(tide::check_partition(p, S, L));
    // The partitions come in lexicographic order: the first optimal one gives the earlier stages
    // the fewest layers, the tie-break partition_by_cost promises.
    double best = std::numeric_limits<double>::infinity();
    tide::stage_partition first;
    each_partition(L, S, [&](tide::stage_partition const& q) {
      if (auto const t = slowest(q, cost, ends); t < best) {
        best = t;
        first = q;
      }
    });
    EXPECT_EQ(slowest(p, cost, ends), best) << "trial " << trial << ": " << L << " layers, " << S << " stages";
    EXPECT_EQ(p.layers, first.layers) << "trial " << trial;
  }
}

TEST(StagePartition, HostilePartitionsAreRefusedByName) {
  auto const check = [](std::vector<std::uint32_t> layers, std::uint32_t S, std::uint32_t L) {
    return refusal([&] { tide::check_partition({layers}, S, L); });
  };
  EXPECT_NE(check({4, 4, 4}, 4, 12).find("has 3 entries for 4 stages"), std::string::npos);
  EXPECT_NE(check({}, 2, 12).find("has 0 entries for 2 stages"), std::string::npos);
  EXPECT_NE(check({4, 0, 4, 4}, 4, 12).find("stage 1 gets no layer"), std::string::npos);
  EXPECT_NE(check({4, 4, 4, 2}, 4, 16).find("gives 14 layers to its stages, but the model has 16"), std::string::npos);
  EXPECT_NE(check({4, 4, 4, 6}, 4, 16).find("gives 18 layers"), std::string::npos);
  // Counts whose sum wraps 32 bits are not taken for a small model.
  EXPECT_NE(check({0xFFFFFFFFu, 2}, 2, 1).find("gives 4294967297 layers"), std::string::npos);
  EXPECT_NE(refusal([] { (void)tide::even_partition(3, 4); }).find("3 layers cannot give each of 4 stages one"), std::string::npos);
  EXPECT_NE(refusal([] { (void)tide::even_partition(3, 0); }).find("no stages"), std::string::npos);
}

TEST(StagePartition, HostileCostsAreRefusedByName) {
  auto const by_cost = [](std::vector<double> cost, std::uint32_t S, tide::partition_ends e = {}) {
    return refusal([&] { (void)tide::partition_by_cost(cost, S, e); });
  };
  auto const nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_NE(by_cost({1, nan, 1}, 2).find("layer 1's cost is nan us"), std::string::npos);
  EXPECT_NE(by_cost({1, 1, -2}, 2).find("layer 2's cost is -2 us"), std::string::npos);
  EXPECT_NE(by_cost({1, -1e-9}, 2).find("layer 1's cost is -1e-09 us"), std::string::npos);
  EXPECT_NE(by_cost({inf, 1}, 2).find("layer 0's cost is inf"), std::string::npos);
  EXPECT_NE(by_cost({1, 2e12}, 2).find("layer 1's cost"), std::string::npos);
  EXPECT_NE(by_cost({1, 1}, 2, {.first_stage_us = nan}).find("partition_ends"), std::string::npos);
  EXPECT_NE(by_cost({1, 1}, 2, {.last_stage_us = -1}).find("partition_ends"), std::string::npos);
  EXPECT_NE(by_cost({1, 1}, 0).find("no stages"), std::string::npos);
  EXPECT_NE(by_cost({1, 1}, 3).find("2 layers cannot give each of 3 stages one"), std::string::npos);
  EXPECT_NE(by_cost(std::vector<double>(100000, 1.0), 16).find("group layers into blocks"), std::string::npos);
}

// Interleaved partitions: one entry per virtual stage (stage s's chunk c at c * S + s); a stage's
// chunks and its layers' places in the model, in its order.
TEST(StagePartition, InterleavedStagesTakeEveryStagesEntryInTurn) {
  tide::stage_partition const p{{1, 2, 3, 4, 5, 6}};  // 3 stages of 2 chunks, 21 layers
  tide::check_partition(p, 6, 21);
  EXPECT_EQ(tide::chunks_of(p, 0, 3, 2).layers, (std::vector<std::uint32_t>{1, 4}));
  EXPECT_EQ(tide::chunks_of(p, 2, 3, 2).layers, (std::vector<std::uint32_t>{3, 6}));
  EXPECT_EQ(tide::model_layers_of(p, 1, 3, 2), (std::vector<std::uint32_t>{1, 2, 10, 11, 12, 13, 14}));
  EXPECT_EQ(tide::model_layers_of(p, 0, 3, 2), (std::vector<std::uint32_t>{0, 6, 7, 8, 9}));
  EXPECT_EQ(tide::model_layers_of({{2, 3}}, 1, 2), (std::vector<std::uint32_t>{2, 3, 4}));  // one chunk a stage
  EXPECT_EQ(tide::stage_of_layer(p, 12) % 3, 1u);  // a layer's virtual stage modulo the stages: its stage
  EXPECT_THROW((void)tide::model_layers_of(p, 0, 4, 2), tide::schedule_error);
  EXPECT_THROW((void)tide::chunks_of(p, 3, 3, 2), tide::schedule_error);
}
