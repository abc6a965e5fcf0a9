// The transformer under tide (examples/transformer/tide_model.hpp): every published policy, the
// residual stream's checkpoints (with segment recomputation, one tier and two) and a planned
// schedule train bitwise equal to the model without tide, with tide's debug checks and schedule
// checker on; the stack names its slots as MaxText does.
#include "task.hpp"
#include "tide_model.hpp"
#include "workload.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using transformer::config;
using transformer::shape;

config small() {
  return {.vocab = 16, .width = 32, .heads = 4, .kv_heads = 2, .layers = 5, .dense_layers = 2, .mlp_hidden = 48,
          .experts = 4, .top_k = 2, .expert_hidden = 16, .shared_hidden = 16};
}

struct batch {
  std::vector<std::int32_t> tokens, targets;
};

std::vector<batch> batches(config const& c, std::size_t micro_batch, int steps) {
  transformer::copy_task task{.length = 6, .vocab = c.vocab};
  transformer::rng r{7};
  std::vector<batch> b(static_cast<std::size_t>(steps));
  for (auto& x : b) task.sample(r, micro_batch, x.tokens, x.targets);
  return b;
}

//! The gradient checksum after each of the steps, trained by the model alone.
std::vector<std::uint64_t> reference(config const& c, shape s, std::vector<batch> const& data) {
  transformer::model m(c);
  std::vector<std::uint64_t> r;
  for (auto const& b : data) {
    m.compute_gradients(b.tokens, b.targets, s);
    r.push_back(transformer::fnv1a(std::as_bytes(m.gradients())));
    m.adamw_step({});
  }
  return r;
}

std::vector<std::uint64_t> under_tide(config const& c, shape s, std::vector<batch> const& data, tide::strategy const& how,
                                      tide::host_backend_options bo = {}) {
  auto const st = transformer::make_stack(c, s);
  auto const sched = tide::build_schedule(st, how);
  tide::host_backend backend(bo);
  tide::executor ex(backend, sched, {.debug_checks = true, .check_schedule = true});
  transformer::trainer tr(c, s);
  std::vector<std::uint64_t> r;
  for (auto const& b : data) {
    tr.step(ex, b.tokens, b.targets);
    r.push_back(tr.gradient_checksum());
    tr.net().adamw_step({});
  }
  return r;
}

TEST(TransformerUnderTide, StackNamesItsSlotsAsMaxTextDoes) {
  auto const c = small();
  auto const st = transformer::make_stack(c, {2, 12});
  EXPECT_EQ(st.layer_count(), 5u);
  EXPECT_EQ(st.carry.name, "decoder_layer_input");
  EXPECT_EQ(st.carry.bytes, 2u * 12 * 32 * sizeof(float));
  auto has = [&](std::uint32_t l, std::string_view n) {
    for (auto const& s : st.layer(l).slots)
      if (s.name == n) return true;
    return false;
  };
  for (auto n : {"query_proj", "key_proj", "value_proj", "attention_out", "out_proj", "mlpwi_0", "mlpwi_1"}) EXPECT_TRUE(has(0, n)) << n;
  for (auto n : {"query_proj", "router_logits", "moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo", "shared_mlpwi_0"}) EXPECT_TRUE(has(4, n)) << n;
  EXPECT_FALSE(has(0, "decoder_layer_input"));  // the carry, not a slot
  EXPECT_FALSE(has(4, "mlpwi_0"));
}

TEST(TransformerUnderTide, EveryPolicyTrainsBitwiseEqualToTheModelAlone) {
  auto const c = small();
  shape const s{3, 12};
  auto const data = batches(c, s.batch, 3);
  auto const want = reference(c, s, data);
  tide::host_backend_options paced;
  paced.d2h = paced.h2d = {.bytes_per_second = 2e9, .latency_us = 20};
  for (auto const& p : transformer::published_strategies())
    EXPECT_EQ(under_tide(c, s, data, p.strategy, paced), want) << p.name;
  // The residual stream checkpointed: 2 of 5 carries on the device (segment recomputation), and
  // with a host tier.
  tide::strategy ck;
  for (auto const& p : transformer::published_strategies())
    if (p.name == "deepseek-lhs") ck = p.strategy;
  ASSERT_FALSE(ck.policy.rules.empty());
  auto const st = transformer::make_stack(c, s);
  ck.checkpoints.device_snapshots = 2;
  ASSERT_GT(tide::build_schedule(st, ck).carry.advances, 0u);  // dropped carries are recomputed
  EXPECT_EQ(under_tide(c, s, data, ck, paced), want) << "deepseek-lhs, 2 device snapshots";
  ck.checkpoints.host_snapshots = 2;
  ck.checkpoints.reversal = tide::two_tier_plan(5, 2, 2, tide::chain_costs::constant(10, 20, 5, 5)).actions;
  auto const two = tide::build_schedule(st, ck);
  ASSERT_GT(two.carry.host_snapshots, 0u);
  EXPECT_EQ(under_tide(c, s, data, ck, paced), want) << "deepseek-lhs, 2 device and 2 host snapshots";
}

// The storage tier: the published offload rows with their offloaded tensors spilled to a file
// (through io_uring where the machine has it, and through pread/pwrite), the rest as published.
TEST(TransformerUnderTide, SpilledToAFileTrainsBitwiseEqual) {
  auto const c = small();
  shape const s{3, 12};
  auto const data = batches(c, s.batch, 3);
  auto const want = reference(c, s, data);
  workload::temp_dir dir;
  for (auto io : {tide::storage_io::automatic, tide::storage_io::posix})
    for (auto const& p : transformer::published_strategies()) {
      auto how = p.strategy;
      bool spills = false;
      for (auto& r : how.policy.rules)
        if (r.where == tide::placement::offload) r.where = tide::placement::spill, spills = true;
      if (!spills) continue;
      tide::host_backend_options o;
      o.d2h = o.h2d = {.bytes_per_second = 2e9, .latency_us = 20};
      o.storage = {.directory = dir.path.string(), .io = io, .quiet = true};
      EXPECT_EQ(under_tide(c, s, data, how, o), want) << p.name << " spilled, " << tide::to_string(io);
    }
  EXPECT_TRUE(dir.empty());
}

TEST(TransformerUnderTide, ThePlannersChoiceTrainsBitwiseEqual) {
  auto const c = small();
  shape const s{2, 12};
  auto const data = batches(c, s.batch, 2);
  auto const st = transformer::make_stack(c, s);
  tide::host_backend cal;
  transformer::trainer tr(c, s);
  tr.prepare(data[0].tokens, data[0].targets);
  auto const costs = tide::calibrate(st, cal, [&](auto const& x) { tr.forward(x); }, [&](auto const& x) { tr.backward(x); });
  tide::plan_options po;
  po.device_budget = tide::build_schedule(st, tide::strategy{}).peak_device_bytes() / 2;
  auto const p = tide::make_plan(st, costs, po);
  ASSERT_TRUE(p.fits);
  EXPECT_LE(p.activation_bytes, po.device_budget);
  EXPECT_EQ(under_tide(c, s, data, p.strategy), reference(c, s, data));
}

}  // namespace
