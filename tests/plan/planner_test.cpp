// The planner: exact == exhaustive on random small instances, heuristic near exact up to 14
// decisions, the lower bound under every plan, plans on presets fit their budget in the sim and
// beat every strategy-table row and hand-written policy, within a few percent of the bound.
#include <gtest/gtest.h>

#include <tide/backends/sim/sim_backend.hpp>
#include <tide/plan/compare.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/policy_codegen.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/plan/transformer.hpp>
#include <tide/tide.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>

using namespace tide;

namespace {

struct instance {
  stack_spec stack;
  cost_table costs;
  std::size_t budget;
};

// A random stack of 2-3 layers with 2-3 slots (at most 9 decisions), costs and a link so that
// offload, remat and keep all compete, and a budget between the smallest and the keep-all peak.
instance random_instance(std::mt19937& rng) {
  std::uniform_int_distribution<int> layers(2, 3), slots(2, 3);
  std::uniform_real_distribution<double> u(0, 1);
  static constexpr std::string_view names[] = {"s0", "s1", "s2"};
  instance in;
  int const L = layers(rng);
  int const S = L == 3 ? 2 + (u(rng) < 0.3) : slots(rng);
  layer_spec t{"blk", {}};
  for (int k = 0; k < S; ++k) t.slots.push_back({names[k], static_cast<std::size_t>(1024 * (1 + rng() % 16))});
  in.stack.independent_layers = true;
  in.stack.append(t, static_cast<std::uint32_t>(L));
  for (int l = 0; l < L; ++l) {
    layer_cost c{.forward_us = 50 + 100 * u(rng), .backward_us = 100 + 200 * u(rng)};
    for (int k = 0; k < S; ++k) c.slot_recompute_us.push_back(5 + 60 * u(rng));
    c.recompute_us = c.forward_us;
    in.costs.layers.push_back(c);
  }
  in.costs.link = host_link::symmetric(1024 * (50 + 400 * u(rng)) * 1e6 / 1e3 / 1e3 * 1e3, 5 * u(rng),
                                       u(rng) < 0.7);
  auto keep = build_schedule(in.stack, strategy{});
  auto remat = build_schedule(in.stack, {.policy = {rule_spec{.where = placement::remat}}});
  auto const lo = remat.peak_device_bytes(), hi = keep.peak_device_bytes();
  in.budget = lo + static_cast<std::size_t>(static_cast<double>(hi - lo) * (0.2 + 0.7 * u(rng)));
  return in;
}

// The reference: every assignment with every candidate strategy, simulated, no pruning.
double exhaustive_step_us(instance const& in) {
  std::size_t n = 0;
  for (std::uint32_t l = 0; l < in.stack.layer_count(); ++l) n += in.stack.layer(l).slots.size();
  auto const candidates = default_candidates(in.stack);
  std::vector<placement> d(n);
  double best = std::numeric_limits<double>::infinity();
  std::size_t total = 1;
  for (std::size_t i = 0; i < n; ++i) total *= 3;
  for (std::size_t code = 0; code < total; ++code) {
    auto c = code;
    for (std::size_t i = 0; i < n; ++i, c /= 3) d[i] = static_cast<placement>(c % 3);
    auto pol = policy_from_decisions(in.stack, d);
    for (auto how : candidates) {
      how.policy = pol;
      auto s = build_schedule(in.stack, how);
      if (s.peak_device_bytes() > in.budget) continue;
      best = std::min(best, simulate_step_us(s, in.costs));
    }
  }
  return best;
}

// Random cases of the heuristic-against-exact test: TIDE_PLANNER_CASES from the environment
// (sanitizer builds run fewer), else 125.
int planner_cases() {
  if (char const* e = std::getenv("TIDE_PLANNER_CASES"))
    if (int const n = std::atoi(e); n > 0) return n;
  return 125;
}

// Under a sanitizer (TIDE_SANITIZE, from tests/meson.build) the search tests run smaller
// instances: the same code paths, at a size the -O0 ASan build runs in about a minute.
bool sanitized() {
  char const* e = std::getenv("TIDE_SANITIZE");
  return e && *e && std::string_view(e) != "none";
}

struct capped_instance {
  stack_spec stack;
  cost_table costs;
  std::size_t budget = 0;
};

// A random stack of `layers` layers with `slots` slots each (one or two layer types), costs where
// a layer's slot recomputes often add up past its forward (so the cap on a layer's recompute
// matters), a link on which offloads hide or not, and a device budget between the all-remat and
// the keep-all peak (so remat alone always fits, whatever the host cap).
capped_instance random_stack(std::mt19937& rng, int layers, int slots) {
  static constexpr std::string_view names[] = {"s0", "s1", "s2", "s3", "s4", "s5"};
  std::uniform_real_distribution<double> u(0, 1);
  capped_instance in;
  layer_spec a{"a", {}}, b{"b", {}};
  for (int k = 0; k < slots; ++k) {
    a.slots.push_back({names[k], static_cast<std::size_t>(1024 * (1 + rng() % 16))});
    b.slots.push_back({names[k], static_cast<std::size_t>(1024 * (1 + rng() % 16))});
  }
  bool const two_types = u(rng) < 0.3;
  in.stack.independent_layers = true;
  for (int l = 0; l < layers; ++l) in.stack.append(two_types && l % 2 == 1 ? b : a);
  for (int l = 0; l < layers; ++l) {
    layer_cost c{.forward_us = 50 + 100 * u(rng), .backward_us = 100 + 200 * u(rng)};
    for (int k = 0; k < slots; ++k) c.slot_recompute_us.push_back(5 + 60 * u(rng));
    in.costs.layers.push_back(c);
  }
  in.costs.link = host_link::symmetric(1024e3 * (50 + 400 * u(rng)), 5 * u(rng), u(rng) < 0.7);
  auto const lo = build_schedule(in.stack, {.policy = {rule_spec{.where = placement::remat}}}).peak_device_bytes();
  auto const hi = build_schedule(in.stack, strategy{}).peak_device_bytes();
  in.budget = lo + static_cast<std::size_t>(static_cast<double>(hi - lo) * (0.1 + 0.8 * u(rng)));
  return in;
}

// The host bytes of offloading every slot.
std::size_t all_offloaded_host_bytes(stack_spec const& st) {
  return build_schedule(st, {.policy = {rule_spec{.where = placement::offload}}}).peak_host_bytes();
}

}  // namespace

TEST(Planner, PolicyFromDecisionsRoundTrips) {
  std::mt19937 rng(7);
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"dense", {{"x", 512}, {"q", 4096}, {"up", 10000}}}, 3).append({"moe", {{"x", 512}, {"e", 7777}}}, 6);
  std::size_t n = 3 * 3 + 6 * 2;
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<placement> d(n);
    for (auto& p : d) p = static_cast<placement>(rng() % 3);
    if (trial % 5 == 0) std::fill(d.begin(), d.end(), placement::offload);
    auto pol = policy_from_decisions(st, d);
    auto s = build_schedule(st, {.policy = pol});
    ASSERT_EQ(s.slots.size(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(s.slots[i].where, d[i]) << "trial " << trial << " slot " << i;
  }
  std::vector<placement> d(n, placement::keep);
  for (std::size_t i = 9; i < n; i += 2) d[i] = placement::offload;  // x of every moe layer... index 9 = layer 3 x
  auto pol = policy_from_decisions(st, d);
  ASSERT_EQ(pol.rules.size(), 1u);  // one range rule
  EXPECT_EQ(pol.rules[0].first_layer, 3u);
  EXPECT_EQ(pol.rules[0].last_layer, all_layers);
  EXPECT_THROW(policy_from_decisions(st, std::vector<placement>(3)), schedule_error);
}

TEST(Planner, ExactMatchesExhaustiveAndTheBoundIsUnderIt) {
  std::mt19937 rng(2024);
  int fitting = 0, worst_case = -1;
  double worst = 0;
  int const trials = sanitized() ? 3 : 20;
  for (int trial = 0; trial < trials; ++trial) {
    auto in = random_instance(rng);
    auto const want = exhaustive_step_us(in);
    plan_options opt;
    opt.device_budget = in.budget;
    opt.method = plan_method::exact;
    auto exact = make_plan(in.stack, in.costs, opt);
    ASSERT_EQ(exact.fits, std::isfinite(want)) << "trial " << trial;
    if (!exact.fits) continue;
    ++fitting;
    EXPECT_TRUE(exact.exact);
    EXPECT_NEAR(exact.step_us, want, 1e-6 * want) << "trial " << trial;
    // The bound is under the best of every assignment with every pipeline, found by enumeration.
    EXPECT_LE(exact.lower_bound_us, want * (1 + 1e-9)) << "trial " << trial;
    EXPECT_GT(exact.lower_bound_us, 0);
    EXPECT_LE(exact.activation_bytes, in.budget);
    // The plan rebuilds to the schedule it was scored on.
    auto s = exact.build(in.stack);
    EXPECT_EQ(s.peak_device_bytes(), exact.activation_bytes);
    EXPECT_DOUBLE_EQ(simulate_step_us(s, in.costs), exact.step_us);

    opt.method = plan_method::heuristic;
    auto h = make_plan(in.stack, in.costs, opt);
    ASSERT_TRUE(h.fits) << "trial " << trial;
    EXPECT_LE(h.activation_bytes, in.budget);
    EXPECT_GE(h.step_us, exact.step_us - 1e-9);
    EXPECT_LE(h.step_us, 1.05 * exact.step_us) << "trial " << trial << ": heuristic " << h.step_us << " exact "
                                               << exact.step_us;
    auto const ratio = h.step_us / exact.step_us - 1;
    if (ratio > worst) worst = ratio, worst_case = trial;
  }
  EXPECT_GE(fitting, trials * 3 / 4);
  std::printf("heuristic vs exact on %d fitting instances: worst %.2f%% (trial %d)\n", fitting, 100 * worst, worst_case);
}

TEST(Planner, CannotFitReportsTheSmallestPeak) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"a", 4096}, {"b", 8192}}}, 4);
  auto costs = uniform_costs(4, {.forward_us = 100, .backward_us = 200}, host_link::symmetric(1e9));
  plan_options opt;
  opt.device_budget = 1000;  // below any schedule's peak
  for (auto m : {plan_method::exact, plan_method::heuristic}) {
    opt.method = m;
    auto p = make_plan(st, costs, opt);
    EXPECT_FALSE(p.fits);
    EXPECT_GT(p.smallest_activation_bytes, 1000u);
    EXPECT_LE(p.smallest_activation_bytes, 8192u + 4096u);  // everything rematted: one layer's scratch
  }
}

TEST(Planner, KeepAllWhenItFitsAndCppTypesText) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"a", 4096}, {"b", 8192}}}, 6);
  auto costs = uniform_costs(6, {.forward_us = 100, .backward_us = 200, .slot_recompute_us = {10, 40}},
                             host_link::symmetric(8192 / 50e-6));
  plan_options opt;
  auto p = make_plan(st, costs, opt);
  EXPECT_TRUE(p.fits);
  EXPECT_TRUE(p.strategy.policy.rules.empty());
  EXPECT_DOUBLE_EQ(p.step_us, 1800);
  // Tight budget: b is offloaded where its copy hides (8192 bytes in 50 us < 100 us forward).
  opt.device_budget = build_schedule(st, strategy{}).peak_device_bytes() / 2;
  opt.method = plan_method::heuristic;
  p = make_plan(st, costs, opt);
  ASSERT_TRUE(p.fits);
  EXPECT_LE(p.activation_bytes, opt.device_budget);
  ASSERT_FALSE(p.strategy.policy.rules.empty());
  auto text = to_cpp_types(p.strategy);
  EXPECT_EQ(text.rfind("using planned = tide::strategy_of<\n    tide::policy<", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 3), ">;\n") << text;
  // Knobs at their defaults are left out; the others are spelled.
  auto const& pl = p.strategy.pipeline;
  EXPECT_EQ(text.find("tide::pipeline<") != std::string::npos, pl != pipeline_spec{}) << text;
  if (pl.prefetch_distance != pipeline_spec{}.prefetch_distance) {
    EXPECT_NE(text.find("tide::prefetch_distance<" + std::to_string(pl.prefetch_distance) + ">"), std::string::npos) << text;
  }
  auto const staging = p.strategy.buffers.staging_buffers;
  EXPECT_EQ(text.find("tide::staging_buffers<" + std::to_string(staging) + ">") != std::string::npos,
            staging != buffer_spec{}.staging_buffers)
      << text;
  EXPECT_EQ(text.find("tide::collectives<"), std::string::npos) << text;  // none planned for
  for (auto const& r : p.strategy.policy.rules)
    EXPECT_NE(text.find("tide::" + std::string(to_string(r.where)) + "<tide::slot_names<\"" + std::string(r.slots[0])),
              std::string::npos)
        << text;
  EXPECT_EQ(to_cpp_types(p.strategy, "mine").rfind("using mine = tide::strategy_of<", 0), 0u);
}

TEST(Planner, PresetPlansFitTheirBudgetInTheSim) {
  struct cfg {
    transformer_spec model;
    hardware_spec hw;
  };
  for (auto const& c : {cfg{models::deepseek_v3(4096, 1, 1), hardware::h100_sxm()},
                        cfg{models::llama3_405b(8192, 1, 8), hardware::gh200()},
                        cfg{models::deepseek_v3(4096, 2, 1), hardware::gb200()}}) {
    auto st = transformer_stack(c.model);
    auto costs = transformer_costs(c.model, c.hw);
    auto keep = build_schedule(st, strategy{}).peak_device_bytes();
    plan_options opt;
    opt.device_budget = keep / 3;
    auto t0 = std::chrono::steady_clock::now();
    auto p = make_plan(st, costs, opt);
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(p.fits) << c.model.name << " on " << c.hw.name;
    EXPECT_LE(p.activation_bytes, opt.device_budget);
    auto s = p.build(st);
    auto r = simulate(s, costs, {.device_budget = opt.device_budget});
    EXPECT_DOUBLE_EQ(r.summary.step_us, p.step_us);
    EXPECT_LE(r.summary.measured_device_bytes, opt.device_budget);
    EXPECT_GE(p.step_us, costs.compute_us() * (1 - 1e-9));
    std::printf("%s on %s, budget 1/3 of keep-all: step %.1f ms (compute %.1f ms), %zu evaluations, %.1f ms planning\n",
                std::string(c.model.name).c_str(), std::string(c.hw.name).c_str(), p.step_us / 1e3,
                costs.compute_us() / 1e3, p.evaluations, ms);
  }
}

// The preset cases of issue 22, planned as tide-plan plans them (the strategy table's rows as
// seeds, the budgets the whole device leaves): each plan is no slower than every row that fits
// and every hand-written policy below that fits, and its gap to the bound is printed. On
// DeepSeek-V3 / GB200 / micro-batch 8 the plan beats the latency-hidden row, a five-rule policy
// that beats that row by about 4%, and the bound within 3%.
namespace {
struct preset_case {
  std::string name;
  transformer_spec model;
  training_spec training;
  hardware_spec hw;
  std::vector<tide::name> offload;  // what the table's offload rows offload (tide-plan's choice)
  std::vector<policy_spec> hand_written;
};
}  // namespace

TEST(Planner, PresetPlansBeatEveryRowAndHandWrittenPolicy) {
  using R = rule_spec;
  auto const cheap = std::vector<tide::name>{"attn_norm", "mlp_act", "qkv", "router"};
  // DeepSeek-V3 on GB200: the cheap slots rematerialized; the layer inputs, the residual after
  // attention, the MoE up-projections and the latent projections offloaded up to layer 54 (where
  // the host is full); the attention output kept in the first `k` layers; the rest rematerialized.
  auto deepseek_policy = [&](std::uint32_t keep_attention) {
    return policy_spec{R{.where = placement::remat, .slots = cheap},
                       R{.where = placement::offload, .slots = {"layer_input", "mlp_input", "mlp_up", "q_latent", "kv_latent"}, .last_layer = 54},
                       R{.where = placement::keep, .slots = {"attn_out", "softmax_lse"}, .last_layer = keep_attention},
                       R{.where = placement::offload, .slots = {"layer_input"}},
                       R{.where = placement::remat}};
  };
  auto llama = models::llama3_405b(8192, 2, 1);
  llama.matmul = precision::fp8;
  std::vector<preset_case> cases{
      {"DeepSeek-V3 on GB200, micro-batch 8", models::deepseek_v3(4096, 8, 1),
       {.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}}, hardware::gb200(), {"q_latent", "kv_latent", "mlp_up"},
       {deepseek_policy(20), deepseek_policy(35),
        policy_spec{R{.where = placement::remat, .slots = {"attn_norm", "mlp_act", "qkv", "router", "attn_out", "softmax_lse"}},
                    R{.where = placement::offload, .slots = {"layer_input", "mlp_input", "mlp_up", "q_latent", "kv_latent"}, .last_layer = 54},
                    R{.where = placement::offload, .slots = {"layer_input"}}, R{.where = placement::remat}}}},
      {"DeepSeek-V3 on H200, micro-batch 1", models::deepseek_v3(4096, 1, 1),
       {.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}}, hardware::h200_sxm(), {"q_latent", "kv_latent", "mlp_up"},
       {policy_spec{R{.where = placement::remat, .slots = cheap}, R{.where = placement::offload, .slots = {"layer_input", "mlp_up"}},
                    R{.where = placement::remat, .slots = {"expert_input", "expert_out"}}},
        policy_spec{R{.where = placement::offload, .slots = {"mlp_up", "attn_out"}, .last_layer = 58},
                    R{.where = placement::remat, .slots = {"expert_input", "expert_out"}}}}},
      {"Llama-3.1-405B on GB200, batch 2, FP8", llama, {.layout = {.gpus = 128, .fsdp = 128}}, hardware::gb200(), {"qkv"},
       {policy_spec{R{.where = placement::remat, .slots = {"attn_norm", "mlp_act", "mlp_up"}},
                    R{.where = placement::offload, .slots = {"layer_input", "mlp_input", "qkv"}, .last_layer = 100},
                    R{.where = placement::offload, .slots = {"layer_input"}}, R{.where = placement::remat}}}},
  };
  for (auto const& c : cases) {
    // Under a sanitizer the first preset alone: the others run the same code on other numbers,
    // and each plans a 61- or 126-layer stack (tens of seconds at -O0 with ASan).
    if (sanitized() && &c != &cases.front()) continue;
    auto const st = transformer_stack(c.model);
    auto const costs = transformer_costs(c.model, c.hw, c.training);
    strategy_options o;
    o.resident_bytes = transformer_resident_memory(c.model, c.hw, c.training).total();
    ASSERT_LT(o.resident_bytes, c.hw.hbm_bytes) << c.name;
    o.device_budget = c.hw.hbm_bytes - o.resident_bytes;
    o.host_budget = c.hw.pinnable_host_bytes();
    o.collectives = training_collectives(c.training);
    o.offload_slots = c.offload;
    o.remat_rest = true;
    o.include_plan = false;
    auto const rows = compare_strategies(st, costs, o);
    auto const t0 = std::chrono::steady_clock::now();
    auto const p = plan_seeded_by(st, costs, o, rows);
    auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(p.fits) << c.name;
    EXPECT_LE(p.activation_bytes, o.device_budget) << c.name;
    EXPECT_LE(p.host_bytes, o.host_budget) << c.name;
    auto const built = p.build(st);
    EXPECT_DOUBLE_EQ(simulate_step_us(built, costs), p.step_us) << c.name;
    EXPECT_LE(p.lower_bound_us, p.step_us * (1 + 1e-9)) << c.name;
    double seed_us = std::numeric_limits<double>::infinity();
    for (auto const& r : rows)
      if (r.fits) {
        EXPECT_LE(p.step_us, r.step_us) << c.name << ": row " << r.key;
        seed_us = std::min(seed_us, r.step_us);
      }
    int fitting = 0;
    for (std::size_t k = 0; k < c.hand_written.size(); ++k) {
      auto s = default_candidates(st, 0, o.collectives)[2];  // latency hiding, prefetch distance 1
      s.policy = c.hand_written[k];
      auto const r = evaluate_strategy(st, costs, s, o, "hand", "hand-written");
      std::printf("  %s: hand-written policy %zu: %.2f ms%s\n", c.name.c_str(), k, r.step_us / 1e3, r.fits ? "" : " (does not fit)");
      if (!r.fits) continue;
      ++fitting;
      EXPECT_LE(p.step_us, r.step_us) << c.name << ": hand-written policy " << k;
    }
    EXPECT_GE(fitting, 1) << c.name;
    std::printf("%s: fastest row %.2f ms, plan %.2f ms, bound %.2f ms (gap %.2f%%), %zu schedules built, %.0f ms planning\n",
                c.name.c_str(), seed_us / 1e3, p.step_us / 1e3, p.lower_bound_us / 1e3, 100 * p.gap_to_bound(), p.evaluations, ms);
    if (c.name.starts_with("DeepSeek-V3 on GB200")) {
      double lhs = 0;
      for (auto const& r : rows)
        if (r.key == "offload-lhs") lhs = r.step_us;
      EXPECT_LT(p.step_us, lhs);
      EXPECT_LE(p.gap_to_bound(), 0.03);
      auto s = default_candidates(st, 0, o.collectives)[2];
      s.policy = c.hand_written[0];
      auto const five_rules = evaluate_strategy(st, costs, s, o, "hand", "hand-written");
      EXPECT_TRUE(five_rules.fits);
      EXPECT_LE(five_rules.step_us, 0.97 * lhs) << "the five-rule policy beats the latency-hidden row by about 4%";
    }
  }
}

// A host cap that does not bind never makes the heuristic worse. On this preset the planner used
// to drop every move order whose full length exceeded the cap, and to binary-search prefixes as
// if more moves only helped the host bytes fit: 3,414.96 ms with a 240 GB cap against
// 3,342.13 ms (134.6 GiB of host) without one.
TEST(Planner, HostCapThatDoesNotBindIsNeverWorseOnDeepSeekV3Gb200) {
  // Two plans of a 61-layer preset: 18 s at -O0 under ASan, on the code paths of the random-stack
  // cap test above and of the preset tests. The main build runs it.
  if (sanitized()) GTEST_SKIP() << "a preset's two plans: the main build's (18 s under ASan at -O0)";
  auto const m = models::deepseek_v3(4096, 4, 1);
  auto const hw = hardware::gb200();
  auto const st = transformer_stack(m);
  auto const costs = transformer_costs(m, hw);
  plan_options opt;
  opt.device_budget = hw.hbm_bytes;
  opt.method = plan_method::heuristic;
  auto const free = make_plan(st, costs, opt);
  ASSERT_TRUE(free.fits);
  opt.host_budget = std::size_t{240} * 1000 * 1000 * 1000;
  ASSERT_LE(free.host_bytes, opt.host_budget);  // the cap does not bind
  auto const capped = make_plan(st, costs, opt);
  ASSERT_TRUE(capped.fits);
  EXPECT_LE(capped.host_bytes, opt.host_budget);
  EXPECT_LE(capped.activation_bytes, opt.device_budget);
  EXPECT_LE(capped.step_us, free.step_us) << "capped " << capped.step_us << " us, uncapped " << free.step_us << " us";
  auto s = capped.build(st);
  EXPECT_DOUBLE_EQ(simulate_step_us(s, costs), capped.step_us);
  std::printf("DeepSeek-V3-like, micro-batch 4, on GB200: %.2f ms uncapped (%.1f GiB host), %.2f ms with a 240 GB cap\n",
              free.step_us / 1e3, static_cast<double>(free.host_bytes) / (1 << 30), capped.step_us / 1e3);
  // A cap that binds costs a little and stays within it (it used to fall back to remat only).
  opt.host_budget = std::size_t{100} << 30;
  auto const tight = make_plan(st, costs, opt);
  ASSERT_TRUE(tight.fits);
  EXPECT_LE(tight.host_bytes, opt.host_budget);
  EXPECT_LE(tight.step_us, 1.01 * free.step_us);
}

// The storage tier: a host budget too small for the offloads a device budget needs leaves no plan
// (or a slow one); a storage budget lets the planner spill the earliest layers' offloads to the
// file. The plan fits all three budgets, builds, passes the checker, its simulated step is the
// plan's, and the bound stays under it; spilled slots are priced at the drive's rate (a slower
// drive never gives a faster plan).
TEST(Planner, AStorageBudgetSpillsWhatTheHostCannotHold) {
  stack_spec st;
  st.independent_layers = true;
  st.append(layer_spec{"blk", {{"a", std::size_t{64} << 20}, {"b", std::size_t{32} << 20}}}, 12);
  cost_table costs;
  for (int l = 0; l < 12; ++l) costs.layers.push_back({.forward_us = 8000, .backward_us = 16000, .recompute_us = 8000,
                                                      .slot_recompute_us = {6000, 6000}});
  costs.link = host_link::symmetric(20e9, 5);
  costs.storage = {.write = {12e9, 100}, .read = {14e9, 100}};  // four drives' worth: a layer's 96 MiB in 8 ms
  plan_options opt;
  opt.device_budget = std::size_t{300} << 20;  // of 1.1 GiB kept
  opt.host_budget = std::size_t{256} << 20;
  opt.method = plan_method::heuristic;
  opt.local_search_max_decisions = 0;  // the orders of moves alone: this is about the tiers, not the search
  auto const host_only = make_plan(st, costs, opt);
  opt.storage_budget = std::size_t{2} << 30;
  auto const tiered = make_plan(st, costs, opt);
  ASSERT_TRUE(host_only.fits);  // by rematerializing what the host cannot hold
  ASSERT_TRUE(tiered.fits);
  EXPECT_LT(tiered.step_us, 0.95 * host_only.step_us) << "host only " << host_only.step_us << " us, with storage " << tiered.step_us << " us";
  EXPECT_GT(std::count(tiered.decisions.begin(), tiered.decisions.end(), placement::spill), 0);
  EXPECT_LE(tiered.activation_bytes, opt.device_budget);
  EXPECT_LE(tiered.host_bytes, opt.host_budget);
  EXPECT_LE(tiered.storage_bytes, opt.storage_budget);
  EXPECT_GT(tiered.storage_bytes, 0u);
  auto const s = tiered.build(st);
  check_schedule(s);
  EXPECT_EQ(s.peak_storage_bytes(), tiered.storage_bytes);
  EXPECT_DOUBLE_EQ(simulate_step_us(s, costs), tiered.step_us);
  EXPECT_LE(tiered.lower_bound_us, tiered.step_us);
  // A tenth of the drive's rate: the same decisions cost more, and no plan is faster than before.
  auto slow = costs;
  slow.storage = {.write = {12e8, 100}, .read = {14e8, 100}};
  EXPECT_GT(simulate_step_us(s, slow), tiered.step_us);
  auto const slower = make_plan(st, slow, opt);
  EXPECT_GE(slower.step_us, tiered.step_us);
  // A storage budget the plan cannot use (no host cap) changes nothing.
  opt.host_budget = std::numeric_limits<std::size_t>::max();
  auto const free = make_plan(st, costs, opt);
  EXPECT_EQ(std::count(free.decisions.begin(), free.decisions.end(), placement::spill), 0);
  std::printf("12 layers of 96 MiB, 300 MiB device, 256 MiB host: %.1f ms host only, %.1f ms with a 2 GiB spill file (%.0f MiB stored)\n",
              host_only.step_us / 1e3, tiered.step_us / 1e3, static_cast<double>(tiered.storage_bytes) / (1 << 20));
}

// The same on random stacks (with and without the local search): a cap at or above the host
// bytes of the uncapped plan gives the same or a better step time.
TEST(Planner, HostCapAtOrAboveTheUncappedPlansHostBytesIsNeverWorse) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> u(0, 1);
  int const cases = sanitized() ? 1 : std::max(10, planner_cases() / 4);
  int with_host = 0;
  for (int trial = 0; trial < cases; ++trial) {
    int const layers = 4 + static_cast<int>(rng() % (sanitized() ? 7 : 21)), slots = 2 + static_cast<int>(rng() % 5);
    auto in = random_stack(rng, layers, slots);
    plan_options opt;
    opt.device_budget = in.budget;
    opt.method = plan_method::heuristic;
    auto const free = make_plan(in.stack, in.costs, opt);
    ASSERT_TRUE(free.fits) << "trial " << trial;
    with_host += free.host_bytes > 0;
    for (double extra : {0.0, 0.5 * u(rng)}) {
      opt.host_budget = free.host_bytes + static_cast<std::size_t>(extra * static_cast<double>(free.host_bytes));
      auto const capped = make_plan(in.stack, in.costs, opt);
      ASSERT_TRUE(capped.fits) << "trial " << trial;
      EXPECT_LE(capped.host_bytes, opt.host_budget) << "trial " << trial;
      EXPECT_LE(capped.step_us, free.step_us) << "trial " << trial << " (" << layers << " layers x " << slots
                                              << " slots), cap " << opt.host_budget << " bytes, uncapped plan "
                                              << free.host_bytes << " bytes";
    }
  }
  EXPECT_GE(with_host, cases / 2);  // most uncapped plans offload something
}

// A layer's recompute costs its rematted slots' recomputes capped at one forward, so once a layer
// recomputes, its other slots come cheap. Here each layer's three slots cost 60 + 75 + 80 us to
// recompute one by one but 100 us together; the budget takes two layers' worth of slots, and
// offloads cannot hide (the link is slow). The best plan rematerializes two whole layers
// (200 us); ranking slots one at a time rematerialized parts of three (260 us).
TEST(Planner, HeuristicRematerializesWholeLayersWhenTheRecomputeCapPays) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"a", 16384}, {"b", 8192}, {"c", 12288}}}, 3);
  auto costs = uniform_costs(3, {.forward_us = 100, .backward_us = 200, .slot_recompute_us = {60, 75, 80}},
                             host_link::symmetric(20e6));
  plan_options opt;
  opt.device_budget = 73728;
  opt.method = plan_method::exact;
  auto const exact = make_plan(st, costs, opt);
  ASSERT_TRUE(exact.fits);
  EXPECT_DOUBLE_EQ(exact.step_us, 1100);
  opt.method = plan_method::heuristic;
  auto const h = make_plan(st, costs, opt);
  ASSERT_TRUE(h.fits);
  EXPECT_LE(h.activation_bytes, opt.device_budget);
  EXPECT_DOUBLE_EQ(h.step_us, exact.step_us);
}

// The heuristic against the exact search on random stacks of 6 to 14 decisions (3-7 layers of 2-3
// slots), each without a host cap and with one that binds: within 2% on every one (issue 22), and
// the lower bound under the exact plan. On other seeds the heuristic is not always within 2%:
// docs/planning.md ("Quality") gives the figures.
TEST(Planner, HeuristicIsNearExactOnRandomStacksUpToFourteenDecisions) {
  std::mt19937 rng(2025);
  std::uniform_real_distribution<double> u(0, 1);
  int const cases = planner_cases();
  double worst = 0;
  std::string worst_case = "none";
  int compared = 0, bound = 0;
  for (int trial = 0; trial < cases; ++trial) {
    static constexpr std::pair<int, int> shapes[] = {{3, 2}, {3, 3}, {4, 2}, {5, 2}, {4, 3}, {6, 2}, {7, 2}};  // layers, slots
    auto const [layers, slots] = shapes[rng() % (sanitized() ? 4 : 7)];  // sanitized: up to 10 decisions
    auto in = random_stack(rng, layers, slots);
    plan_options opt;
    opt.device_budget = in.budget;
    // Per-slot recompute costs describe a selective recompute (it rebuilds only produces() slots),
    // whose schedules lend no recompute scratch (buffer_spec::lend_recompute_scratch): the device
    // peaks the costs go with. (With the scratch, remat also takes a layer's other slots' bytes
    // during its recompute, which the greedy orders do not rank: 5.2% worst on this seed.)
    opt.candidates = default_candidates(in.stack);
    for (auto& c : opt.candidates) c.buffers.lend_recompute_scratch = false;
    for (int capped = 0; capped < 2; ++capped) {
      opt.method = plan_method::exact;
      auto const exact = make_plan(in.stack, in.costs, opt);
      ASSERT_TRUE(exact.fits) << "trial " << trial;  // remat alone fits the budget
      EXPECT_LE(exact.host_bytes, opt.host_budget);
      EXPECT_LE(exact.lower_bound_us, exact.step_us * (1 + 1e-9)) << "trial " << trial;
      opt.method = plan_method::heuristic;
      auto const h = make_plan(in.stack, in.costs, opt);
      ASSERT_TRUE(h.fits) << "trial " << trial;
      EXPECT_LE(h.activation_bytes, opt.device_budget) << "trial " << trial;
      EXPECT_LE(h.host_bytes, opt.host_budget) << "trial " << trial;
      EXPECT_GE(h.step_us, exact.step_us * (1 - 1e-9)) << "trial " << trial;
      EXPECT_DOUBLE_EQ(h.lower_bound_us, exact.lower_bound_us);
      auto const what = "trial " + std::to_string(trial) + " (" + std::to_string(layers) + " layers x " +
                        std::to_string(slots) + " slots, " + (capped ? "host cap " + std::to_string(opt.host_budget) : "no host cap") + ")";
      EXPECT_LE(h.step_us, 1.02 * exact.step_us) << what << ": heuristic " << h.step_us << " us, exact " << exact.step_us;
      ++compared;
      if (auto const r = h.step_us / exact.step_us - 1; r > worst) worst = r, worst_case = what;
      if (capped) break;
      // A cap under the exact plan's host bytes (or, when it offloads nothing, under the host
      // bytes of offloading everything): it binds.
      auto const host = exact.host_bytes > 0 ? exact.host_bytes : all_offloaded_host_bytes(in.stack);
      opt.host_budget = static_cast<std::size_t>(static_cast<double>(host) * (0.2 + 0.7 * u(rng)));
      bound += exact.host_bytes > opt.host_budget;
    }
  }
  EXPECT_EQ(compared, 2 * cases);
  std::printf("heuristic vs exact on %d random stacks of 6-14 decisions, each without and with a host cap (%d caps "
              "below the exact plan's host bytes): worst %.2f%% (%s)\n",
              cases, bound, 100 * worst, worst_case.c_str());
}

// Mid-size random stacks (40 to 300 decisions, one to three layer types, an input slot per type,
// host caps that bind and that do not): every plan is at or above the lower bound and within 30%
// of it (measured: mean about 4%, worst about 24%, the worst where offloads are link-bound:
// docs/planning.md says why the bound is loosest there).
TEST(Planner, PlansOfMidSizeStacksAreWithinAStatedGapOfTheBound) {
  std::mt19937 rng(22);
  std::uniform_real_distribution<double> u(0, 1);
  static constexpr std::string_view names[] = {"in", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"};
  int const cases = sanitized() ? 3 : std::max(6, planner_cases() * 8 / 35);  // 28 with the default 125
  double worst = 0, sum = 0;
  int plans = 0, capped_plans = 0;
  for (int trial = 0; trial < cases; ++trial) {
    int const types = 1 + static_cast<int>(rng() % 3), slots = 4 + static_cast<int>(rng() % 7);
    int const layers = std::max(4, static_cast<int>((40 + rng() % 261) / static_cast<unsigned>(slots)));
    std::vector<layer_spec> ts;
    std::vector<layer_cost> per_type;
    for (int t = 0; t < types; ++t) {
      layer_spec spec{t == 0 ? "a" : t == 1 ? "b" : "c", {}};
      spec.slots.push_back({names[0], static_cast<std::size_t>(1024 * (1 + rng() % 8)), true});  // the layer's input
      for (int k = 1; k < slots; ++k) spec.slots.push_back({names[k], static_cast<std::size_t>(1024 * (1 + rng() % 32))});
      ts.push_back(spec);
      layer_cost c{.forward_us = 50 + 100 * u(rng), .backward_us = 100 + 200 * u(rng)};
      for (int k = 0; k < slots; ++k) c.slot_recompute_us.push_back(k == 0 ? c.forward_us : 2 + 40 * u(rng));
      per_type.push_back(c);
    }
    stack_spec st;
    cost_table costs;
    for (int l = 0; l < layers; ++l) {
      st.append(ts[static_cast<std::size_t>(l % types)]);
      costs.layers.push_back(per_type[static_cast<std::size_t>(l % types)]);
    }
    costs.link = host_link::symmetric(1024e3 * (50 + 400 * u(rng)), 5 * u(rng), u(rng) < 0.7);
    policy_spec const least{rule_spec{.where = placement::offload, .slots = {"in"}}, rule_spec{.where = placement::remat}};
    auto const lo = build_schedule(st, {.policy = least}).peak_device_bytes();
    auto const hi = build_schedule(st, strategy{}).peak_device_bytes();
    plan_options opt;
    opt.device_budget = lo + static_cast<std::size_t>(static_cast<double>(hi - lo) * (0.1 + 0.6 * u(rng)));
    for (int capped = 0; capped < 2; ++capped) {
      auto const p = make_plan(st, costs, opt);
      ASSERT_TRUE(p.fits) << "trial " << trial;
      EXPECT_LE(p.host_bytes, opt.host_budget) << "trial " << trial;
      EXPECT_GE(p.gap_to_bound(), -1e-9) << "trial " << trial << ": the bound is above a plan";
      EXPECT_LE(p.gap_to_bound(), 0.30) << "trial " << trial << " (" << types << " types, " << layers << " layers x " << slots
                                        << " slots, " << (capped ? "host cap" : "no host cap") << ")";
      worst = std::max(worst, p.gap_to_bound());
      sum += p.gap_to_bound();
      ++plans;
      if (capped) break;
      opt.host_budget = static_cast<std::size_t>(static_cast<double>(p.host_bytes) * (0.3 + 0.6 * u(rng)));
      capped_plans += p.host_bytes > 0;
      if (p.host_bytes == 0) break;
    }
  }
  EXPECT_GE(capped_plans, cases / 2);
  std::printf("mid-size random stacks: %d plans, gap to the bound mean %.2f%%, worst %.2f%%\n", plans, 100 * sum / plans, 100 * worst);
}

// Hardening, second pass (issue 21, item 2): on a chain written without saying where a layer's
// input comes from, the planner used to pick a plan that rematerializes the input in 22 of 48
// cases. It now refuses the stack by name, and plans it once the input slot is declared (never
// rematerializing it). Item 11: a stack past max_decisions is refused by name, not planned for
// minutes.
TEST(Planner, RefusesAStackThatDoesNotSayWhereItsInputComesFrom) {
  stack_spec st;
  st.append({"blk", {{"input", 4096}, {"h", 8192}}}, 6);
  auto const costs = uniform_costs(6, {.forward_us = 100, .backward_us = 200, .slot_recompute_us = {5, 40}});
  plan_options opt;
  opt.device_budget = 6 * 4096 + 8192 + 4096;  // binding: something must leave the device
  try {
    (void)make_plan(st, costs, opt);
    FAIL() << "planned a stack whose input is undeclared";
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("layer type 'blk' does not say where its input comes from"), std::string::npos)
        << e.what();
  }
  st.types[0].slots[0].input = true;
  auto const p = make_plan(st, costs, opt);
  ASSERT_TRUE(p.fits);
  for (std::size_t l = 0; l < 6; ++l) EXPECT_NE(p.decisions[2 * l], placement::remat) << "layer " << l;
  opt.max_decisions = 11;
  try {
    (void)make_plan(st, costs, opt);
    FAIL() << "planned past max_decisions";
  } catch (schedule_error const& e) {
    EXPECT_NE(std::string(e.what()).find("at most 11 (layer, slot) decisions (plan_options::max_decisions)"), std::string::npos)
        << e.what();
  }
}

namespace {

// The reference with the storage tier: every assignment of keep, offload, remat and spill with
// every candidate pipeline (and, for spills, the spill ring of the candidate or of one buffer, as
// the planner tries), built and simulated, no pruning; the fastest within all three budgets.
double exhaustive_step_with_storage_us(capped_instance const& in, std::size_t host_budget, std::size_t storage_budget, bool& spilled) {
  std::size_t n = 0;
  for (std::uint32_t l = 0; l < in.stack.layer_count(); ++l) n += in.stack.layer(l).slots.size();
  auto const candidates = default_candidates(in.stack);
  std::vector<placement> d(n);
  double best = std::numeric_limits<double>::infinity();
  std::size_t total = 1;
  for (std::size_t i = 0; i < n; ++i) total *= 4;
  constexpr placement order[] = {placement::keep, placement::offload, placement::remat, placement::spill};
  schedule s;
  for (std::size_t code = 0; code < total; ++code) {
    auto c = code;
    bool spills = false;
    for (std::size_t i = 0; i < n; ++i, c /= 4) d[i] = order[c % 4], spills = spills || d[i] == placement::spill;
    auto const pol = policy_from_decisions(in.stack, d);
    for (auto how : candidates) {
      how.policy = pol;
      for (std::uint32_t ring : {std::max(how.buffers.spill_buffers, 1u), 1u}) {
        how.buffers.spill_buffers = ring;
        if (try_build_schedule_into(s, in.stack, how)) continue;
        if (s.peak_device_bytes() > in.budget || s.peak_host_bytes() > host_budget || s.peak_storage_bytes() > storage_budget) continue;
        if (double const t = simulate_step_us(s, in.costs); t < best) best = t, spilled = spills;
        if (!spills) break;  // the ring matters only to spills
      }
    }
  }
  return best;
}

}  // namespace

// Hardening, third pass (issue 40, item 6): with a storage budget the exact method said
// exact = true while its spills were placed by a rule (the earliest layers' offloads), up to 46%
// slower than the best over every placement, or "does not fit" where schedules did. The
// brute force above covers spill: an exact plan is the optimum over keep, offload, remat and
// spill, and fits exactly when some schedule does; any plan fits its budgets and is never
// faster than the optimum.
TEST(Planner, ExactIsExactOverEveryPlacementWithAStorageBudget) {
  std::mt19937 rng(40);
  std::uniform_real_distribution<double> u(0, 1);
  // Under a sanitizer two trials: 0 (host and storage budgets: spills by rule, not exact) and 4
  // (no host cap: exact), so that both claims are still checked.
  int const trials = sanitized() ? 2 : 30;
  int exact_claims = 0, not_exact = 0, slower = 0, missed = 0, spilling = 0;
  for (int i = 0; i < trials; ++i) {
    int const trial = sanitized() ? 4 * i : i;
    // Layers of tens of MiB, recomputes dear, a drive about as fast as the link: offload,
    // remat and spill all compete (the shape of AStorageBudgetSpillsWhatTheHostCannotHold).
    capped_instance in;
    int const layers = trial % 2 == 0 ? 2 : 3;
    layer_spec t{"blk", {{"a", static_cast<std::size_t>(16 + rng() % 48) << 20}, {"b", static_cast<std::size_t>(16 + rng() % 48) << 20}}};
    in.stack.independent_layers = true;
    in.stack.append(t, static_cast<std::uint32_t>(layers));
    for (int l = 0; l < layers; ++l) {
      double const f = 4000 + 8000 * u(rng);
      in.costs.layers.push_back({.forward_us = f, .backward_us = 2 * f, .recompute_us = f,
                                 .slot_recompute_us = {f * (0.3 + 0.6 * u(rng)), f * (0.3 + 0.6 * u(rng))}});
    }
    in.costs.link = host_link::symmetric(10e9 + 20e9 * u(rng), 5);
    in.costs.storage = {.write = {4e9 + 16e9 * u(rng), 100}, .read = {4e9 + 16e9 * u(rng), 100}};
    auto const lo = build_schedule(in.stack, {.policy = {rule_spec{.where = placement::remat}}}).peak_device_bytes();
    auto const hi = build_schedule(in.stack, strategy{}).peak_device_bytes();
    in.budget = lo + static_cast<std::size_t>(static_cast<double>(hi - lo) * (0.1 + 0.6 * u(rng)));
    auto const all_host = all_offloaded_host_bytes(in.stack);
    plan_options opt;
    opt.device_budget = in.budget;
    opt.method = plan_method::exact;
    // A host budget that binds (or none), a storage budget from none to room for every slot.
    opt.host_budget = trial % 5 == 4 ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(static_cast<double>(all_host) * (0.1 + 0.6 * u(rng)));
    opt.storage_budget = trial % 7 == 6 ? 0 : static_cast<std::size_t>(static_cast<double>(2 * all_host) * (0.3 + u(rng)));
    bool optimum_spills = false;
    auto const want = exhaustive_step_with_storage_us(in, opt.host_budget, opt.storage_budget, optimum_spills);
    spilling += optimum_spills;
    auto const p = make_plan(in.stack, in.costs, opt);
    std::string const what = "trial " + std::to_string(trial) + ": host budget " + std::to_string(opt.host_budget) + ", storage budget " +
                             std::to_string(opt.storage_budget) + ", optimum " + std::to_string(want) + " us, plan " +
                             (p.fits ? std::to_string(p.step_us) + " us" : std::string("does not fit")) + (p.exact ? " (exact)" : "");
    if (p.exact) {
      ++exact_claims;
      EXPECT_EQ(p.fits, std::isfinite(want)) << what;
      if (p.fits && std::isfinite(want)) {
        EXPECT_NEAR(p.step_us, want, 1e-6 * want) << what;
      }
    } else {
      ++not_exact;
      missed += !p.fits && std::isfinite(want);
    }
    if (p.fits) {
      ASSERT_TRUE(std::isfinite(want)) << what;
      EXPECT_GE(p.step_us, want * (1 - 1e-9)) << what;
      slower += p.step_us > want * (1 + 1e-9);
      EXPECT_LE(p.activation_bytes, opt.device_budget) << what;
      EXPECT_LE(p.host_bytes, opt.host_budget) << what;
      EXPECT_LE(p.storage_bytes, opt.storage_budget) << what;
      auto const s = p.build(in.stack);
      EXPECT_DOUBLE_EQ(simulate_step_us(s, in.costs), p.step_us) << what;
    }
  }
  EXPECT_GT(exact_claims, 0);  // no storage budget, or no host cap: still exact
  EXPECT_GT(not_exact, 0);
  std::printf("exact method with a storage budget on %d small stacks: %d exact (each the optimum over keep, offload, remat and "
              "spill), %d not exact (%d of those slower than the optimum, %d found nothing that fits where a schedule does); "
              "the optimum spills on %d\n",
              trials, exact_claims, not_exact, slower, missed, spilling);
}

// Issue 40, item 4: a row that does not fit only because of the storage budget said a bare "does
// not fit", and the text table had no storage column. The row says which budget, with the bytes.
TEST(Planner, AStrategyRowSaysWhichBudgetItExceeds) {
  stack_spec st;
  st.independent_layers = true;
  st.append(layer_spec{"blk", {{"a", std::size_t{64} << 20}, {"b", std::size_t{32} << 20}}}, 4);
  auto const costs = uniform_costs(4, {.forward_us = 100, .backward_us = 200}, host_link::symmetric(20e9));
  strategy spill{.policy = {rule_spec{.where = placement::spill}}, .buffers = {.spill_buffers = 1}};
  strategy_options o;  // no storage budget
  auto const row = evaluate_strategy(st, costs, spill, o, "policy-file", "policy file");
  EXPECT_FALSE(row.fits);
  EXPECT_GT(row.storage_bytes, 0u);
  EXPECT_EQ(row.over_budget, "storage " + format_bytes(static_cast<double>(row.storage_bytes)) + " > budget " + format_bytes(0));
  auto const text = format_strategy_table({row});
  EXPECT_NE(text.find(" storage "), std::string::npos) << text;
  EXPECT_NE(text.find("does not fit: storage "), std::string::npos) << text;
  // Two budgets exceeded: both named; a row that fits names none.
  o.device_budget = 1;
  o.storage_budget = row.storage_bytes;
  o.host_budget = 0;
  auto const two = evaluate_strategy(st, costs, spill, o, "policy-file", "policy file");
  EXPECT_NE(two.over_budget.find("activations "), std::string::npos) << two.over_budget;
  EXPECT_NE(two.over_budget.find("; host "), std::string::npos) << two.over_budget;
  EXPECT_EQ(two.over_budget.find("storage"), std::string::npos) << two.over_budget;
  auto const keep = evaluate_strategy(st, costs, {}, {}, "keep-all", "keep all");
  EXPECT_TRUE(keep.fits);
  EXPECT_TRUE(keep.over_budget.empty());
}
