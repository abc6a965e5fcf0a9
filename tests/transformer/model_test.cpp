// The transformer example's model: finite-difference gradients of every parameter kind, bitwise
// recompute from the layer input, the loss falling on a copy task, and run-to-run determinism.

#include "model.hpp"
#include "task.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using transformer::basic_model;
using transformer::config;
using transformer::tensor_index;
using transformer::layer_kind;
using transformer::shape;
using transformer::tensor;
using transformer::tensor_count;
using transformer::tensor_set;

config tiny(bool renormalize = true) {
  config c;
  c.vocab = 32;
  c.width = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.layers = 2;
  c.dense_layers = 1;
  c.mlp_hidden = 48;
  c.experts = 4;
  c.top_k = 2;
  c.expert_hidden = 16;
  c.shared_hidden = 24;
  c.renormalize_top_k = renormalize;
  return c;
}

constexpr shape tiny_shape{2, 8};

struct batch {
  std::vector<std::int32_t> tokens, targets;
};

batch random_batch(config const& c, shape s, std::uint64_t seed) {
  transformer::rng r{seed};
  batch b;
  for (std::size_t t = 0; t < s.tokens(); ++t) {
    b.tokens.push_back(static_cast<std::int32_t>(r.below(c.vocab)));
    b.targets.push_back(t % 5 == 3 ? -1 : static_cast<std::int32_t>(r.below(c.vocab)));  // a few masked
  }
  return b;
}

bool bitwise_equal(std::span<float const> a, std::span<float const> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// The experts each MoE layer's tokens were routed to by the model's last forward.
template <class Real>
std::vector<std::uint32_t> selections(basic_model<Real> const& m, shape s) {
  std::vector<std::uint32_t> out;
  transformer::kernels::routing<Real> r;
  for (std::size_t l = 0; l < m.cfg().layers; ++l) {
    if (m.kind(l) != layer_kind::moe) continue;
    auto const& c = m.cfg();
    transformer::kernels::route(m.stored(l)[tensor_index(tensor::router_logits)].data(), s.tokens(), c.experts, c.top_k,
                                c.renormalize_top_k, r);
    out.insert(out.end(), r.expert.begin(), r.expert.end());
  }
  return out;
}

// ---- configuration and sizes -----------------------------------------------------------------

TEST(TransformerConfig, RejectsSizesThatDoNotFit) {
  auto message = [](config c) {
    try {
      transformer::validate(c);
    } catch (std::invalid_argument const& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  config c = tiny();
  c.heads = 5;
  EXPECT_EQ(message(c), "transformer::config: heads (5) must divide width (32)");
  c = tiny();
  c.kv_heads = 3;
  EXPECT_EQ(message(c), "transformer::config: kv_heads (3) must divide heads (4)");
  c = tiny();
  c.top_k = 5;
  EXPECT_EQ(message(c), "transformer::config: top_k (5) exceeds experts (4)");
  c = tiny();
  c.width = 0;
  EXPECT_EQ(message(c), "transformer::config: width must be positive");
  c = tiny();
  c.heads = 32;
  c.kv_heads = 1;
  EXPECT_EQ(message(c), "transformer::config: the head width (1) must be even: rotary embeddings rotate pairs");
  c = tiny();
  c.dense_layers = 3;
  EXPECT_EQ(message(c), "transformer::config: dense_layers (3) exceeds layers (2)");
  EXPECT_EQ(message(tiny()), "accepted");
  EXPECT_THROW(transformer::model{c}, std::invalid_argument);
}

TEST(TransformerConfig, SavedTensorsAndTheirSizes) {
  config const c = tiny();
  shape const s{3, 5};
  std::size_t const n = 15, f = 4;  // tokens, bytes per float
  auto dense = transformer::saved_tensors(c, layer_kind::dense, s);
  std::vector<std::string> names;
  std::size_t total = 0;
  for (auto const& t : dense) {
    names.emplace_back(t.name);
    EXPECT_EQ(t.bytes, t.elements * f);
    total += t.bytes;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"decoder_layer_input", "attention_norm_inv_rms", "query_proj", "key_proj",
                                             "value_proj", "attention_out", "attention_lse", "out_proj",
                                             "mlp_norm_inv_rms", "mlpwi_0", "mlpwi_1"}));
  // x, q, attention_out, out_proj: n d each; k, v: n K hd; two inv_rms: n; lse: n H; mlpwi_*: n f.
  EXPECT_EQ(total, f * n * (4 * 32 + 2 * 16 + 2 + 4 + 2 * 48));
  auto moe = transformer::saved_tensors(c, layer_kind::moe, s);
  ASSERT_EQ(moe.size(), 15u);
  EXPECT_EQ(moe[9].name, "router_logits");
  EXPECT_EQ(moe[9].bytes, f * n * 4);
  EXPECT_EQ(moe[10].name, "moe_mlpwi_0");
  EXPECT_EQ(moe[10].bytes, f * n * 2 * 16);  // every token's k slots
  EXPECT_EQ(moe[12].name, "moe_mlpwo");
  EXPECT_EQ(moe[12].bytes, f * n * 2 * 32);
  EXPECT_EQ(moe[14].name, "shared_mlpwi_1");
  EXPECT_EQ(moe[14].bytes, f * n * 24);
  EXPECT_EQ(transformer::saved_tensors<double>(c, layer_kind::moe, s)[12].bytes, 2 * moe[12].bytes);
}

// ---- 1. gradients against central differences ------------------------------------------------

// In double precision, the model's own code (basic_model<double>, cblas_dgemm), with the
// fourth-order central difference (8 (L(w+h) - L(w-h)) - (L(w+2h) - L(w-2h))) / 12h, h = 1e-4:
// its truncation error is ~h^4 |L^(5)| (a plain central difference's ~h^2 |L'''| reached 3e-6 of
// the largest gradient on the tied embedding), its rounding error ~1e-16 |L| / h ~ 4e-12, at
// most ~4e-9 of a tensor's largest gradient (1e-3 to 0.5 here). So analytic and numeric
// gradients must agree to 1e-7 of the largest gradient in the tensor (measured: under 2e-9); a
// wrong term in any backward shows as an error of order one. Per tensor: the coordinate of
// largest gradient (so that no check is vacuous) and four random ones. Top-k routing is
// discontinuous: every perturbed evaluation must route every token as the unperturbed one did.
class TransformerGradient : public testing::TestWithParam<bool> {};

TEST_P(TransformerGradient, MatchesCentralDifferencesForEveryParameter) {
  config const c = tiny(GetParam());
  basic_model<double> m(c, 3);
  batch const b = random_batch(c, tiny_shape, 11);
  m.compute_gradients(b.tokens, b.targets, tiny_shape);
  std::vector<double> const analytic(m.gradients().begin(), m.gradients().end());
  std::vector<std::uint32_t> const routed = selections(m, tiny_shape);

  auto params = m.parameters();
  double const h = 1e-4;
  auto loss_at = [&](std::size_t i, double w) {
    double const w0 = params[i];
    params[i] = w;
    double const loss = m.evaluate(b.tokens, b.targets, tiny_shape);
    params[i] = w0;
    return loss;
  };
  double worst = 0.0;
  transformer::rng pick{99};
  std::vector<std::string> kinds;
  for (auto const& t : m.parameter_tensors()) {
    std::size_t largest = t.offset;
    for (std::size_t i = t.offset; i < t.offset + t.size; ++i)
      if (std::abs(analytic[i]) > std::abs(analytic[largest])) largest = i;
    ASSERT_GT(std::abs(analytic[largest]), 1e-6) << t.name << " gets no gradient";
    std::vector<std::size_t> coords{largest};
    for (int j = 0; j < 4; ++j) coords.push_back(t.offset + pick.below(t.size));
    double tensor_worst = 0.0;
    for (std::size_t i : coords) {
      double const w0 = params[i];
      std::array<double, 4> loss{};
      std::array<double, 4> const steps{h, -h, 2 * h, -2 * h};
      for (std::size_t j = 0; j < 4; ++j) {
        loss[j] = loss_at(i, w0 + steps[j]);
        ASSERT_EQ(selections(m, tiny_shape), routed) << t.name << ": a step of " << steps[j] << " changed the routing";
      }
      double const numeric = (8 * (loss[0] - loss[1]) - (loss[2] - loss[3])) / (12 * h);
      double const error = std::abs(numeric - analytic[i]) / std::abs(analytic[largest]);
      EXPECT_LT(error, 1e-7) << t.name << " [" << i - t.offset << "]: analytic " << analytic[i] << ", numeric "
                             << numeric;
      tensor_worst = std::max(tensor_worst, error);
    }
    worst = std::max(worst, tensor_worst);
  }
  std::printf("worst relative gradient error over %zu tensors: %.2e\n", m.parameter_tensors().size(), worst);
}

INSTANTIATE_TEST_SUITE_P(TopK, TransformerGradient, testing::Values(true, false),
                         [](auto const& info) { return info.param ? "renormalized" : "plain"; });

// The float32 model runs the same code; its gradients agree with the double model's from the
// same weights to float rounding, amplified a little by depth.
TEST(TransformerGradient, FloatAgreesWithDouble) {
  config const c = tiny();
  transformer::model f(c, 5);
  basic_model<double> d(c, 5);
  std::copy(f.parameters().begin(), f.parameters().end(), d.parameters().begin());
  batch const b = random_batch(c, tiny_shape, 12);
  double const lf = f.compute_gradients(b.tokens, b.targets, tiny_shape);
  double const ld = d.compute_gradients(b.tokens, b.targets, tiny_shape);
  EXPECT_NEAR(lf, ld, 1e-5 * ld);
  double worst = 0.0;
  for (auto const& t : f.parameter_tensors()) {
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = t.offset; i < t.offset + t.size; ++i) {
      double const e = static_cast<double>(f.gradients()[i]) - d.gradients()[i];
      diff += e * e;
      norm += d.gradients()[i] * d.gradients()[i];
    }
    double const rel = std::sqrt(diff / norm);
    EXPECT_LT(rel, 1e-4) << t.name;
    worst = std::max(worst, rel);
  }
  std::printf("float vs double gradients: worst relative L2 error %.2e\n", worst);
}

// ---- 2. recompute ----------------------------------------------------------------------------

// Drives the layers through their public calls with caller-owned saved tensors, as a scheduler
// would, and keeps everything a replay needs.
struct driven {
  config c;
  transformer::model m;
  batch b;
  std::vector<std::vector<std::vector<float>>> data;  // [layer][tensor]
  std::vector<transformer::model::saved_spans> saved;
  std::vector<float> final_carry, gradients;

  explicit driven(config cfg) : c(cfg), m(cfg, 21), b(random_batch(cfg, tiny_shape, 13)) {
    std::size_t const n = tiny_shape.tokens() * c.width;
    data.resize(c.layers);
    saved.resize(c.layers);
    for (std::size_t l = 0; l < c.layers; ++l) {
      data[l].resize(tensor_count);
      for (auto const& t : transformer::saved_tensors(c, m.kind(l), tiny_shape)) {
        data[l][tensor_index(t.id)].assign(t.elements, std::numeric_limits<float>::quiet_NaN());
        saved[l][tensor_index(t.id)] = data[l][tensor_index(t.id)];
      }
    }
    std::vector<float> carry(n);
    m.embed(b.tokens, tiny_shape, carry);
    for (std::size_t l = 0; l < c.layers; ++l) m.layer_forward(l, tiny_shape, carry, saved[l], carry);
    final_carry = carry;
    gradients = backward(saved);
  }

  std::vector<float> backward(std::vector<transformer::model::saved_spans> const& from) {
    std::vector<float> grad(final_carry.size());
    m.zero_gradients();
    m.head(final_carry, b.targets, tiny_shape, grad);
    for (std::size_t l = c.layers; l-- > 0;) m.layer_backward(l, tiny_shape, from[l], grad, grad);
    m.embed_backward(b.tokens, tiny_shape, grad);
    return {m.gradients().begin(), m.gradients().end()};
  }
};

TEST(TransformerRecompute, SubsetsRebuildBitwiseAndGiveTheSameGradients) {
  driven run(tiny());
  // The model's own driver gives the same gradients as the driven layers.
  run.m.compute_gradients(run.b.tokens, run.b.targets, tiny_shape);
  EXPECT_TRUE(bitwise_equal(run.m.gradients(), run.gradients));

  transformer::rng r{77};
  int recomputed = 0;
  for (int trial = 0; trial < 24; ++trial) {
    std::vector<std::vector<std::vector<float>>> data(run.c.layers);
    std::vector<transformer::model::saved_spans> saved(run.c.layers);
    std::vector<tensor_set> subsets(run.c.layers);
    for (std::size_t l = 0; l < run.c.layers; ++l) {
      data[l].resize(tensor_count);
      auto const own = transformer::layer_tensors(run.m.kind(l));
      for (tensor t : own) {
        bool const remat = t != tensor::decoder_layer_input &&
                           (trial == 0 || (trial > 1 && r.below(2) == 1));  // 0: all, 1: none
        subsets[l].set(tensor_index(t), remat);
        auto const& ref = run.data[l][tensor_index(t)];
        // A rematerialized tensor starts as a sentinel that recompute must overwrite; the
        // others are kept copies that recompute must leave alone.
        data[l][tensor_index(t)] = remat ? std::vector<float>(ref.size(), -12345.0f) : ref;
        saved[l][tensor_index(t)] = data[l][tensor_index(t)];
      }
      run.m.layer_recompute(l, tiny_shape, saved[l], subsets[l]);
      for (tensor t : own) {
        EXPECT_TRUE(bitwise_equal(data[l][tensor_index(t)], run.data[l][tensor_index(t)]))
            << "trial " << trial << ", layer " << l << ": " << transformer::name(t)
            << (subsets[l].test(tensor_index(t)) ? " recomputed" : " kept");
        recomputed += subsets[l].test(tensor_index(t));
      }
    }
    EXPECT_TRUE(bitwise_equal(run.backward(saved), run.gradients)) << "trial " << trial;
  }
  EXPECT_GT(recomputed, 100);
}

// With the kept tensors passed as available, recompute reads them instead of rebuilding them
// (tide's recompute: kept and prefetched slots hold their data), bitwise equal all the same; and
// it really reads them: a changed query projection changes the recomputed attention.
TEST(TransformerRecompute, AvailableTensorsAreReadNotRebuilt) {
  driven run(tiny());
  transformer::rng r{91};
  for (int trial = 0; trial < 24; ++trial) {
    std::vector<std::vector<std::vector<float>>> data(run.c.layers);
    std::vector<transformer::model::saved_spans> saved(run.c.layers);
    for (std::size_t l = 0; l < run.c.layers; ++l) {
      data[l].resize(tensor_count);
      tensor_set remat, kept;
      auto const own = transformer::layer_tensors(run.m.kind(l));
      for (tensor t : own) {
        bool const r_t = t != tensor::decoder_layer_input && r.below(2) == 1;
        (r_t ? remat : kept).set(tensor_index(t));
        auto const& ref = run.data[l][tensor_index(t)];
        data[l][tensor_index(t)] = r_t ? std::vector<float>(ref.size(), -12345.0f) : ref;
        saved[l][tensor_index(t)] = data[l][tensor_index(t)];
      }
      run.m.layer_recompute(l, tiny_shape, saved[l], remat, kept);
      for (tensor t : own)
        EXPECT_TRUE(bitwise_equal(data[l][tensor_index(t)], run.data[l][tensor_index(t)]))
            << "trial " << trial << ", layer " << l << ": " << transformer::name(t);
    }
    EXPECT_TRUE(bitwise_equal(run.backward(saved), run.gradients)) << "trial " << trial;
  }
  auto spans = run.saved[0];
  std::vector<float> q = run.data[0][tensor_index(tensor::query_proj)], out(run.data[0][tensor_index(tensor::attention_out)].size());
  // Token 3 of the first sequence (its own query, attending to four keys; token 0 attends to
  // itself alone, so its query does not matter), every query feature.
  std::size_t const qw = run.c.heads * run.c.head_dim();
  for (std::size_t i = 0; i < qw; ++i) q[3 * qw + i] += 1.0f;
  spans[tensor_index(tensor::query_proj)] = q;
  spans[tensor_index(tensor::attention_out)] = out;
  tensor_set const want = tensor_set{}.set(tensor_index(tensor::attention_out));
  tensor_set available;
  for (tensor t : {tensor::query_proj, tensor::key_proj, tensor::value_proj}) available.set(tensor_index(t));
  run.m.layer_recompute(0, tiny_shape, spans, want, available);
  EXPECT_FALSE(bitwise_equal(out, run.data[0][tensor_index(tensor::attention_out)]));
  run.m.layer_recompute(0, tiny_shape, spans, want);  // without: rebuilt from the input alone
  EXPECT_TRUE(bitwise_equal(out, run.data[0][tensor_index(tensor::attention_out)]));
}

TEST(TransformerRecompute, SingleTensorsNeedOnlyTheInput) {
  driven run(tiny());
  for (std::size_t l = 0; l < run.c.layers; ++l)
    for (tensor t : transformer::layer_tensors(run.m.kind(l))) {
      if (t == tensor::decoder_layer_input) continue;
      transformer::model::saved_spans only{};
      only[tensor_index(tensor::decoder_layer_input)] = run.saved[l][tensor_index(tensor::decoder_layer_input)];
      std::vector<float> out(run.data[l][tensor_index(t)].size(), 0.0f);
      only[tensor_index(t)] = out;
      run.m.layer_recompute(l, tiny_shape, only, tensor_set{}.set(tensor_index(t)));
      EXPECT_TRUE(bitwise_equal(out, run.data[l][tensor_index(t)])) << "layer " << l << ": " << transformer::name(t);
    }
}

TEST(TransformerRecompute, RejectsWhatItCannotRebuild) {
  driven run(tiny());
  tensor_set const input = tensor_set{}.set(tensor_index(tensor::decoder_layer_input));
  EXPECT_THROW(run.m.layer_recompute(0, tiny_shape, run.saved[0], input), std::invalid_argument);
  EXPECT_THROW(run.m.layer_recompute(1, tiny_shape, run.saved[1], tensor_set{}.set(tensor_index(tensor::mlpwi_0))),
               std::invalid_argument);  // layer 1 is MoE
  auto missing = run.saved[0];
  missing[tensor_index(tensor::query_proj)] = {};
  EXPECT_THROW(run.m.layer_recompute(0, tiny_shape, missing, tensor_set{}.set(tensor_index(tensor::query_proj))),
               std::invalid_argument);
  std::vector<float> carry(run.final_carry.size());
  std::vector<std::int32_t> bad(run.b.tokens);
  bad[3] = 32;
  EXPECT_THROW(run.m.embed(bad, tiny_shape, carry), std::out_of_range);
}

// ---- 3. training -----------------------------------------------------------------------------

config copy_config() {
  config c = tiny();
  c.vocab = 16;
  c.mlp_hidden = 64;
  c.expert_hidden = 32;
  c.shared_hidden = 32;
  return c;
}

std::vector<double> train(transformer::model& m, int steps, std::uint64_t data_seed) {
  transformer::copy_task const task{8, m.cfg().vocab, false};
  transformer::rng data{data_seed};
  transformer::adamw h;
  h.learning_rate = 1e-2;
  std::size_t const batch_size = 8;
  std::vector<std::int32_t> tokens, targets;
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    task.sample(data, batch_size, tokens, targets);
    losses.push_back(m.compute_gradients(tokens, targets, task.batch_shape(batch_size)));
    m.adamw_step(h);
  }
  return losses;
}

TEST(TransformerTraining, LossFallsOnTheCopyTask) {
  transformer::model m(copy_config(), 7);
  auto const losses = train(m, 200, 123);
  double last = 0.0;
  for (std::size_t i = losses.size() - 10; i < losses.size(); ++i) last += losses[i] / 10;
  std::printf("copy task loss: step 0 %.3f (ln 15 = %.3f)", losses[0], std::log(15.0));
  for (std::size_t i = 50; i <= losses.size(); i += 50) std::printf(", step %zu %.3f", i - 1, losses[i - 1]);
  std::printf("; mean of the last 10 %.3f\n", last);
  EXPECT_NEAR(losses[0], std::log(15.0), 0.5);
  EXPECT_LT(last, 0.5 * losses[0]);
  EXPECT_LT(last, 0.2);  // it has learnt to copy, not merely the token frequencies
}

// ---- 4. determinism --------------------------------------------------------------------------

TEST(TransformerTraining, TwoRunsGiveBitwiseEqualParameters) {
  transformer::model a(copy_config(), 9), b(copy_config(), 9);
  auto const la = train(a, 15, 5);
  auto const lb = train(b, 15, 5);
  EXPECT_EQ(la, lb);
  EXPECT_TRUE(bitwise_equal(a.parameters(), b.parameters()));
  EXPECT_EQ(a.steps(), 15u);
}

}  // namespace
