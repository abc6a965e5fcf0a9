// The whole device in the model: resident memory from the dimensions and the layout, host
// capacity, shared host links, collectives from the fabric, precision, and the published GB200
// experiment (examples/plan --published) from physics.
#include <gtest/gtest.h>

#include <tide/tide.hpp>

#include "published.hpp"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

using namespace tide;

namespace {

// The published rows of setup `i` on GB200, computed once for the tests that read them (each run
// plans at several micro-batches: seconds under a sanitizer).
std::vector<published::row> const& published_rows(std::size_t i) {
  static std::optional<std::vector<published::row>> rows[2];  // each on first use: a test may need one
  if (!rows[i]) rows[i] = published::run(published::setups()[i], hardware::gb200());
  return *rows[i];
}
double gib(std::size_t b) { return static_cast<double>(b) / double(1ull << 30); }
std::size_t const GB = std::size_t{1000} * 1000 * 1000;
}  // namespace

// Parameter counts from the dimensions match the models' published totals (671B, 405B).
TEST(Model, ParameterCountsMatchThePublishedTotals) {
  auto const ds = transformer_parameters(models::deepseek_v3());
  EXPECT_NEAR(ds.total / 1e9, 671, 671 * 0.01);
  EXPECT_GT(ds.experts / ds.total, 0.95);  // almost all of it in routed experts
  auto const ll = transformer_parameters(models::llama3_405b());
  EXPECT_NEAR(ll.total / 1e9, 405, 405 * 0.01);
  EXPECT_EQ(ll.experts, 0);
}

// Resident state is sharded by FSDP and counted field by field; what is left of HBM is the
// activation budget; a model whose state does not fit leaves none.
TEST(Model, ResidentMemoryFollowsTheLayout) {
  auto const m = models::llama3_405b(8192, 2, 1);
  auto const hw = hardware::gb200();
  training_spec t{.layout = {.gpus = 128, .fsdp = 128}};
  auto const r128 = transformer_resident_memory(m, hw, t);
  auto const params = transformer_parameters(m).total;
  EXPECT_NEAR(static_cast<double>(r128.weights), params * 4 / 128, 1e6);
  EXPECT_NEAR(static_cast<double>(r128.optimizer), params * 8 / 128, 1e6);
  EXPECT_GT(r128.gathered_weights, 0u);
  EXPECT_GT(r128.logits, 0u);
  EXPECT_EQ(r128.layer_workspace, 0u);  // dense: no all-to-all
  // Two gathered layers (BF16) and one layer's FP32 gradients; every Llama layer is alike.
  double const layer = (params - 2.0 * m.vocab * m.hidden) / m.layer_count;
  EXPECT_NEAR(static_cast<double>(r128.gathered_weights), 2 * 2 * layer, 1e3);
  EXPECT_NEAR(static_cast<double>(r128.gradient_buffer), 4 * layer, 1e3);
  EXPECT_EQ(r128.logits, std::size_t{16384} * 128256 * 4);
  EXPECT_EQ(r128.fragmentation, static_cast<std::size_t>(std::llround(0.05 * static_cast<double>(hw.hbm_bytes))));
  EXPECT_EQ(activation_budget(hw, r128), hw.hbm_bytes - r128.total());
  t.layout.fsdp = 16;  // 405B x 16 bytes / 16 GPUs: far beyond 186 GB
  EXPECT_EQ(activation_budget(hw, transformer_resident_memory(m, hw, t)), 0u);
  // Logits and the MoE all-to-all buffers grow with the micro-batch.
  auto const ds = [&](std::uint64_t mb) {
    return transformer_resident_memory(models::deepseek_v3(4096, mb), hw, {.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}});
  };
  EXPECT_EQ(ds(8).logits, 8 * ds(1).logits);
  EXPECT_GT(ds(8).layer_workspace, 7 * ds(1).layer_workspace);
  // Hostile layouts and counts, refused by name before any arithmetic (an FSDP degree of 0
  // divided by zero; negative bytes and shares reached llround and a size_t).
  auto says = [&](training_spec const& bad, hardware_spec const& h, char const* what) {
    try {
      (void)transformer_resident_memory(m, h, bad);
      ADD_FAILURE() << "no error; wanted " << what;
    } catch (cost_model_error const& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  says({.layout = {.gpus = 128, .fsdp = 0}}, hw, "fsdp 0");
  says({.layout = {.gpus = 128, .fsdp = 128}, .master_weight_bytes = -4}, hw, "training_spec::master_weight_bytes is -4.000000");
  says({.layout = {.gpus = 128, .fsdp = 128}, .fragmentation_reserve = 1.5}, hw, "fragmentation_reserve is 1.500000");
  auto odd = hw;
  odd.pinnable_fraction = -0.5;
  says({.layout = {.gpus = 128, .fsdp = 128}}, odd, "hardware_spec::pinnable_fraction is -0.500000");
}

// The GB200 superchip's NVLink-C2C and Grace memory are shared by its two GPUs.
TEST(Model, SharedLinkAndHostCapacity) {
  auto hw = hardware::gb200();
  auto const shared = hw.link().d2h.bytes_per_second;
  hw.link_shared_by = 1;
  EXPECT_DOUBLE_EQ(hw.link().d2h.bytes_per_second, 2 * shared);
  EXPECT_EQ(hardware::gb200().host_bytes, 240 * GB);
  EXPECT_LT(hardware::gb200().pinnable_host_bytes(), 240 * GB);
  EXPECT_EQ(hardware_spec{}.pinnable_host_bytes(), static_cast<std::size_t>(-1));  // unknown: no cap
  EXPECT_EQ(hardware::vera_rubin().link_shared_by, 2u);
  EXPECT_GT(hardware::vera_rubin().link().d2h.bytes_per_second, hardware::gb200().link().d2h.bytes_per_second);
  // Per direction: NVLink-C2C as measured on GH200 (375 GB/s to the device, 297 from it, of 450),
  // halved by the superchip's two GPUs; PCIe presets keep one assumed share both ways.
  EXPECT_NEAR(hardware::gb200().link().h2d.bytes_per_second, 375e9 / 2, 1e3);
  EXPECT_NEAR(hardware::gb200().link().d2h.bytes_per_second, 297e9 / 2, 1e3);
  EXPECT_NEAR(hardware::gh200().link().d2h.bytes_per_second, 297e9, 1e3);
  EXPECT_DOUBLE_EQ(hardware::h100_sxm().link().h2d.bytes_per_second, hardware::h100_sxm().link().d2h.bytes_per_second);
  auto one_way = hardware::h100_sxm();
  one_way.d2h_link_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(one_way.link().d2h.bytes_per_second, 0.5 * one_way.link_bytes_per_second);
  EXPECT_DOUBLE_EQ(one_way.link().h2d.bytes_per_second, 0.85 * one_way.link_bytes_per_second);
  // A share a copy cannot reach is refused by the cost model, naming the field.
  for (double bad : {1.5, -0.1, std::nan("")}) {
    auto wrong = hardware::gb200();
    wrong.d2h_link_efficiency = bad;
    try {
      (void)transformer_costs(models::deepseek_v3(4096, 1, 1), wrong);
      ADD_FAILURE() << "accepted d2h_link_efficiency " << bad;
    } catch (cost_model_error const& e) {
      EXPECT_NE(std::string(e.what()).find("d2h_link_efficiency"), std::string::npos) << e.what();
    }
  }
  // Halving the link slows the offload that cannot hide (copies on the compute stream).
  auto const m = models::deepseek_v3(4096, 2, 1);
  auto const st = transformer_stack(m);
  strategy_options o;
  o.offload_slots = {"mlp_up"};
  o.include_plan = false;
  auto one = hardware::gb200();
  one.link_shared_by = 1;
  auto const a = compare_strategies(st, transformer_costs(m, one), o);
  auto const b = compare_strategies(st, transformer_costs(m, hardware::gb200()), o);
  ASSERT_EQ(a[2].key, "offload-naive");
  EXPECT_GT(b[2].step_us, a[2].step_us);
}

// The planner and the strategy table honour the host capacity: a row whose host bytes exceed the
// cap does not fit, and the plan stays within it.
TEST(Model, HostCapacityBinds) {
  auto const hw = hardware::gb200();
  auto s = published::setups(10, 2)[0];  // DeepSeek-V3 at micro-batch 10: 181 GiB to offload
  auto const rows = published::rows_of(s, hw, true);
  bool saw_lhs = false, saw_plan = false;
  for (auto const& r : rows) {
    if (r.key == "offload-lhs") {
      saw_lhs = true;
      EXPECT_GT(r.host_bytes, hw.pinnable_host_bytes());
      EXPECT_FALSE(r.fits);
    }
    if (r.key == "planner") {
      saw_plan = true;
      EXPECT_LE(r.host_bytes, hw.pinnable_host_bytes());
      EXPECT_TRUE(r.fits);
    }
  }
  EXPECT_TRUE(saw_lhs);
  EXPECT_TRUE(saw_plan);  // the planner found a plan within the cap
}

// Collectives from message sizes and the fabric: hierarchical all-gathers cross the network
// once per domain; an all-to-all's remote share crosses each GPU's port.
TEST(Model, CollectivesFromTheFabric) {
  auto const hw = hardware::gb200();
  double const S = 1e9;
  double const eff_up = hw.scale_up_bytes_per_second * hw.collective_efficiency;
  double const eff_out = hw.scale_out_bytes_per_second * hw.collective_efficiency;
  EXPECT_DOUBLE_EQ(all_gather_seconds(S, 1, 1, hw), 0);
  EXPECT_NEAR(all_gather_seconds(S, 64, 64, hw), hw.collective_latency_us * 1e-6 + S * 63 / 64 / eff_up, 1e-12);
  EXPECT_NEAR(all_gather_seconds(S, 128, 64, hw), hw.collective_latency_us * 1e-6 + S * 127 / 128 / eff_up + S / 128 / eff_out, 1e-12);
  EXPECT_NEAR(all_to_all_seconds(S, 128, 64, hw), hw.collective_latency_us * 1e-6 + S * 63 / 128 / eff_up + S * 64 / 128 / eff_out, 1e-12);
  EXPECT_EQ(job_domain_gpus(128, hw), 64u);
  EXPECT_EQ(job_domain_gpus(64, hw), 64u);
  EXPECT_EQ(job_domain_gpus(144, hw), 72u);
  auto no_network = hw;
  no_network.scale_out_bytes_per_second = 0;
  EXPECT_THROW(all_gather_seconds(S, 128, 64, no_network), cost_model_error);
  // FSDP: each layer gathers before forward and backward and reduces after; the hooks are there.
  auto const m = models::deepseek_v3(4096, 1, 1);
  training_spec t{.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}};
  auto const c = transformer_costs(m, hw, t);
  for (auto const& l : c.layers) {
    EXPECT_GT(l.gather_us, 0);
    EXPECT_DOUBLE_EQ(l.regather_us, l.gather_us);
    EXPECT_GT(l.reduce_us, l.gather_us);  // FP32 gradients against BF16 weights
  }
  // Each routed expert's state is sharded over fsdp / expert_parallel = 2 GPUs, 64 apart: one in
  // each rack, so half of this GPU's experts' weights come over the network.
  auto const expert_bytes = transformer_parameters(m).experts / 58 / 64 * 2;
  EXPECT_GE(c.layers[10].gather_us, 1e6 * expert_bytes / 2 / eff_out);
  EXPECT_LT(c.layers[0].gather_us, c.layers[10].gather_us);  // a dense layer: no experts
  auto const col = training_collectives(t);
  EXPECT_TRUE(col.before_forward && col.before_backward && col.after_backward);
  EXPECT_THROW(transformer_costs(m, hw, {.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 48}}), cost_model_error);
  EXPECT_THROW(transformer_costs(m, hw, {.layout = {.gpus = 64, .fsdp = 128}}), cost_model_error);
}

// Recomputing a MoE layer pays its dispatch all-to-all again: full remat loses more to keep-all
// with expert parallelism than without it, by at least the dispatches of the recomputes (no
// FSDP and no collective hooks here, so that only the all-to-all differs).
TEST(Model, FullRematPaysTheAllToAllAgain) {
  auto const hw = hardware::gb200();
  auto const m = models::deepseek_v3(4096, 2, 1);
  auto const st = transformer_stack(m);
  auto gap = [&](std::uint32_t ep, double* dispatch_us) {
    training_spec t{.layout = {.gpus = 64, .expert_parallel = ep}};
    auto const costs = transformer_costs(m, hw, t);
    *dispatch_us = all_to_all_seconds(static_cast<double>(m.tokens()) * m.top_k * m.hidden * 2, ep, ep, hw) * 1e6;
    strategy_options o;
    o.include_plan = false;
    auto const rows = compare_strategies(st, costs, o);
    EXPECT_EQ(rows[0].key, "keep-all");
    EXPECT_EQ(rows[1].key, "full-remat");
    return rows[1].step_us - rows[0].step_us;
  };
  double a2a_1 = 0, a2a_64 = 0;
  auto const g1 = gap(1, &a2a_1), g64 = gap(64, &a2a_64);
  EXPECT_EQ(a2a_1, 0);
  EXPECT_GT(a2a_64, 0);
  EXPECT_GE(g64 - g1, 0.99 * 58 * a2a_64) << "remat gap with EP 64: " << g64 << " us, with EP 1: " << g1 << " us";
}

// FP8 matrix products run at the FP8 rate; attention stays BF16.
TEST(Model, PrecisionSetsTheMatmulRate) {
  auto const hw = hardware::gb200();
  EXPECT_DOUBLE_EQ(hw.matmul_seconds(1e15, precision::fp8), hw.matmul_seconds(1e15) / 2);
  auto m = models::llama3_405b(8192, 1, 8);
  auto const bf16 = transformer_costs(m, hw);
  m.matmul = precision::fp8;
  auto const fp8 = transformer_costs(m, hw);
  EXPECT_LT(fp8.layers[0].forward_us, bf16.layers[0].forward_us);
  EXPECT_GT(fp8.layers[0].forward_us, bf16.layers[0].forward_us / 2);  // attention and elementwise work remain
  EXPECT_DOUBLE_EQ(transformer_step_flops(m), transformer_step_flops(models::llama3_405b(8192, 1, 8)));
}

// The published experiment, predicted: the orderings the study measured, the host bytes of its
// DeepSeek-V3 offload (145.1 GiB: our slot sizes give it from the dimensions alone), prefetch
// buffers costing HBM, and the planner never slower than the rows it is given.
TEST(Model, PublishedExperimentFromPhysics) {
  // The whole published table (every row's largest micro-batch, the planner on both models): 72 s
  // at -O0 under ASan, single-threaded arithmetic whose code paths the tests around it run. The
  // main build checks its values; a sanitizer build (TIDE_SANITIZE) skips it.
  if (char const* e = std::getenv("TIDE_SANITIZE"); e && *e && std::string_view(e) != "none")
    GTEST_SKIP() << "the published table is checked in the main build (72 s under ASan at -O0)";
  auto const hw = hardware::gb200();
  auto const s = published::setups();
  auto const& ds = published_rows(0);
  auto const& ll = published_rows(1);
  auto get = [](std::vector<published::row> const& rows, std::string_view k) {
    for (auto const& r : rows)
      if (r.strategy == k) return r;
    ADD_FAILURE() << "no row " << k;
    return published::row{};
  };
  auto const lhs = get(ds, "offload-lhs"), remat = get(ds, "full-remat"), naive = get(ds, "offload-naive"),
             pipe = get(ds, "offload-lhs-pipelined"), keep = get(ds, "keep-all");
  EXPECT_NEAR(lhs.host_gib, 145.1, 0.1);
  EXPECT_LT(lhs.step_ms, remat.step_ms);
  EXPECT_LT(lhs.step_ms, naive.step_ms);
  EXPECT_TRUE(lhs.fits);
  EXPECT_FALSE(keep.fits);
  EXPECT_GT(pipe.device_peak_gib, lhs.device_peak_gib);  // deeper prefetch: more staging in HBM
  EXPECT_GT(lhs.device_peak_gib, naive.device_peak_gib);
  for (auto const* rows : {&ds, &ll})  // the planner is never slower than a row that fits
    for (auto const& r : *rows)
      if (r.fits) {
        EXPECT_LE(get(*rows, "planner").step_ms, r.step_ms * (1 + 1e-9)) << r.model << " " << r.strategy;
      }
  EXPECT_GE(lhs.largest_microbatch, 8u);
  EXPECT_LE(lhs.device_peak_gib, gib(hw.hbm_bytes));
  // Llama: offloading QKV with latency hiding gains a few percent over recomputing them; the
  // naive offload is slower than no offload.
  auto const l_lhs = get(ll, "offload-lhs"), l_remat = get(ll, "full-remat"), l_naive = get(ll, "offload-naive");
  EXPECT_LT(l_lhs.step_ms, l_remat.step_ms);
  EXPECT_LT(l_remat.step_ms / l_lhs.step_ms, 1.06);
  EXPECT_GT(l_naive.step_ms, l_remat.step_ms);
  EXPECT_TRUE(l_lhs.fits);
  EXPECT_GE(l_lhs.largest_microbatch, 2u);
}

// What the study's rows ran, in the model (issue 24), each item with a check that fails without it.
TEST(Model, PublishedRowsModelWhatTheStudyRan) {
  auto const hw = hardware::gb200();
  auto const s = published::setups();
  auto const& ds_setup = s[0];
  auto const st = transformer_stack(ds_setup.model);
  auto const costs = transformer_costs(ds_setup.model, hw, ds_setup.training);
  auto const moe_layer = ds_setup.model.dense_layers;  // the first MoE layer
  auto const& slots = st.layer(moe_layer).slots;
  auto const& c = costs.layers[moe_layer];
  auto index_of = [&](std::string_view n) {
    for (std::size_t k = 0; k < slots.size(); ++k)
      if (slots[k].name == n) return k;
    ADD_FAILURE() << "no slot " << n;
    return std::size_t{0};
  };
  auto recompute = [&](std::vector<tide::name> const& names) {
    std::unique_ptr<bool[]> f(new bool[slots.size()]());
    for (auto n : names) f[index_of(n)] = true;
    return c.recompute_time_us(std::span<bool const>(f.get(), slots.size()));
  };
  std::vector<tide::name> all_but_input;
  for (auto const& x : slots)
    if (!x.input) all_but_input.push_back(x.name);
  auto const a2a_us = all_to_all_seconds(static_cast<double>(ds_setup.model.tokens()) * ds_setup.model.top_k * ds_setup.model.hidden * 2,
                                         64, 64, hw) * 1e6;
  // Item 2: full remat reruns the forward a backward needs: the experts' down projection and the
  // combine (the router's gradient reads the experts' outputs); all but the shared expert's down
  // projection and the residual add.
  EXPECT_GT(recompute(all_but_input), 0.95 * c.forward_us);
  EXPECT_GT(recompute({"expert_out"}), a2a_us);
  // Item 3: attention's output and log-sum-exp come from one kernel: one charge.
  EXPECT_DOUBLE_EQ(recompute({"attn_out", "softmax_lse"}), recompute({"attn_out"}));
  // Item 4: the offload rows (q_latent, kv_latent, mlp_up offloaded, the rest rematerialized)
  // dispatch the tokens again (the experts' up projection reads them) and combine again.
  std::vector<tide::name> offload_rest;
  for (auto n : all_but_input)
    if (n != "q_latent" && n != "kv_latent" && n != "mlp_up") offload_rest.push_back(n);
  EXPECT_GE(recompute(offload_rest), 2 * a2a_us + recompute({"router"}));
  EXPECT_GE(recompute({"expert_input"}), a2a_us);

  auto const& rows = published_rows(0);
  auto get = [&](std::string_view k) {
    for (auto const& r : rows)
      if (r.strategy == k) return r;
    ADD_FAILURE() << "no row " << k;
    return published::row{};
  };
  auto const naive = get("offload-naive"), lhs = get("offload-lhs"), pipe = get("offload-lhs-pipelined"), dev = get("on-device");
  // Item 1: without latency hiding the collectives run on the compute stream, all exposed.
  EXPECT_GT(naive.exposed_collective_ms, 100 * lhs.exposed_collective_ms);
  EXPECT_GT(naive.step_ms - lhs.step_ms, naive.exposed_collective_ms);
  // Item 6: a window of 7 layers holds several layers of offloaded tensors more than one layer's.
  EXPECT_GT(pipe.device_peak_gib - naive.device_peak_gib, 5 * (lhs.device_peak_gib - naive.device_peak_gib));
  // Item 7: the offload policy with its tensors on the device fits a micro-batch, not the study's 8.
  EXPECT_FALSE(dev.fits);
  EXPECT_GE(dev.largest_microbatch, 1u);
  EXPECT_LT(dev.largest_microbatch, 8u);
  EXPECT_GE(lhs.largest_microbatch, 8u);
  // Item 8: host copies beside memory-bound work slow it (HBM contention).
  strategy_options o;
  o.collectives = training_collectives(ds_setup.training);
  auto lhs_strategy = strategy{.policy = {rule_spec{.where = placement::offload, .slots = {"q_latent", "kv_latent", "mlp_up"}},
                                          rule_spec{.where = placement::remat, .slots = offload_rest}}};
  auto no_contention = costs;
  no_contention.hbm_bytes_per_second = 0;
  auto const with = evaluate_strategy(st, costs, lhs_strategy, o, "lhs", "lhs");
  auto const without = evaluate_strategy(st, no_contention, lhs_strategy, o, "lhs", "lhs");
  EXPECT_GT(with.step_us, without.step_us);
  EXPECT_GT(c.memory_bound_share, 0);
  // Item 9: the ceiling. Full remat over the latency-hidden run is at most 1 + F / (F + B) when
  // the remat run exposes nothing; the model's ratio is under it, the published 1.57x above it.
  auto const ceiling = published::ceiling_of(ds_setup, hw, rows, 1.57);
  EXPECT_NEAR(ceiling.bound, 1 + lhs.forward_ms / (lhs.forward_ms + lhs.backward_ms), 1e-12);
  EXPECT_GT(ceiling.bound, 1.3);
  EXPECT_LT(ceiling.bound, 1.4);
  EXPECT_LE(ceiling.ratio, ceiling.bound);
  EXPECT_GT(1.57, ceiling.bound);
  // The what-if: the remat run's collectives not overlapped expose them, but not the 1.57x's gap.
  EXPECT_GT(ceiling.remat_without_overlap_ms, get("full-remat").step_ms);
  EXPECT_GT(ceiling.exposed_needed_ms, ceiling.remat_without_overlap_ms - get("full-remat").step_ms);
}

// A step's tokens (seq_len x micro_batch) past 2^40, or wrapping past 2^64 to a small count that
// passed the "above zero" check: refused by name wherever the layers are described.
TEST(Model, TokensPastTheBoundAreRefusedByName) {
  auto m = models::llama3_405b(8192, 1, 1);
  m.seq_len = std::uint64_t{1} << 33;
  m.micro_batch = std::uint64_t{1} << 31;  // the product wraps to 0 mod 2^64
  try {
    (void)transformer_stack(m);
    ADD_FAILURE() << "no error";
  } catch (cost_model_error const& e) {
    EXPECT_NE(std::string(e.what()).find("has seq_len 8589934592 x micro_batch 2147483648: give at most 2^40 tokens"), std::string::npos)
        << e.what();
  }
  m.seq_len = 8192;
  m.micro_batch = (std::uint64_t{1} << 62) + 1;  // alone past the bound
  EXPECT_THROW((void)transformer_stack(m), cost_model_error);
  m.micro_batch = 2;
  EXPECT_NO_THROW((void)transformer_stack(m));
}
