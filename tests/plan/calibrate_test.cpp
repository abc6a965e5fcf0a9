// Calibration recovers known costs of a synthetic host workload; the sim's prediction of a
// paced host run; the strategy table; planned schedules on presets (scaled down) run on the host
// backend within their budget.
#include <gtest/gtest.h>

#include <tide/backends/host/host_backend.hpp>
#include <tide/backends/sim/sim_backend.hpp>
#include <tide/plan/calibrate.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/micro_batch.hpp>
#include <tide/plan/compare.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/simulate.hpp>
#include <tide/plan/transformer.hpp>
#include <tide/tide.hpp>

#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

using namespace tide;

namespace {

void spin_us(double us) {
  auto const until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

double forward_cost(std::uint32_t l) { return 300 + 150 * (l % 2); }

// Known costs: forward 300 or 450 us, backward twice that, recompute as forward.
struct synthetic {
  void operator()(forward_context<stream_role> const& c) const {
    spin_us(forward_cost(c.layer));
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (c.produces(k)) c.slot(k)[0] = std::byte{static_cast<unsigned char>(c.layer + k)};
  }
  void operator()(backward_context<stream_role> const& c) const {
    spin_us(2 * forward_cost(c.layer));
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (c.slot(k)[0] != std::byte{static_cast<unsigned char>(c.layer + k)}) throw std::runtime_error("bad slot data");
  }
};

stack_spec small_stack() {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"a", 64 << 10}, {"b", 192 << 10}}}, 4);
  return st;
}

host_backend_options paced() {
  host_backend_options o;
  o.d2h = {.bytes_per_second = 200e6, .latency_us = 20};
  o.h2d = {.bytes_per_second = 200e6, .latency_us = 20};
  return o;
}

}  // namespace

// Calibrated at two micro-batches, the line through them (`fit_micro_batch_costs`) predicts a
// third (issue 42): a workload whose ops take 200 us plus 100 us per sequence (backward twice
// that), measured on the host backend at micro-batches 1 and 4, predicts 2 and recovers the fixed
// part. Retried as the test below is (timing on a shared machine).
TEST(Calibrate, TwoMicroBatchesFitTheLineOfFixedAndPerSampleWork) {
  struct by_micro_batch {
    double b = 1;
    void operator()(forward_context<stream_role> const& c) const {
      spin_us(200 + 100 * b);
      for (std::uint16_t k = 0; k < c.slot_count(); ++k)
        if (c.produces(k)) c.slot(k)[0] = std::byte{1};
    }
    void operator()(backward_context<stream_role> const&) const { spin_us(2 * (200 + 100 * b)); }
  };
  auto stack_at = [](std::size_t b) {
    stack_spec st;
    st.independent_layers = true;
    st.append({"blk", {{"a", (16 << 10) * b}}}, 3);
    return st;
  };
  host_backend backend;
  std::string why;
  for (int attempt = 0; attempt < 6; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250 * attempt));
    why.clear();
    std::vector<measured_costs> points;
    for (std::uint64_t b : {1, 4}) {
      by_micro_batch w{static_cast<double>(b)};
      points.push_back({.micro_batch = b,
                        .costs = calibrate(stack_at(b), backend, w, w,
                                           {.repeats = 7, .measure_recompute = false, .measure_link = false, .measure_sync = false})});
    }
    auto const line = fit_micro_batch_costs(points);
    auto const at2 = line.at(2);
    for (std::uint32_t l = 0; l < 3; ++l) {
      // The intercept and slope are extrapolated from two noisy points: their tolerance is wider.
      auto near = [&](char const* what, double got, double want, double share = 0.15) {
        if (std::abs(got - want) > share * want + 40)
          why += std::string(what) + " L" + std::to_string(l) + ": " + std::to_string(got) + " us, want " + std::to_string(want) + "\n";
      };
      near("forward at 2", at2.layers[l].forward_us, 400);
      near("backward at 2", at2.layers[l].backward_us, 800);
      near("fixed forward", line.fixed.layers[l].forward_us, 200, 0.3);
      near("per-sample forward", line.per_sample.layers[l].forward_us, 100, 0.3);
    }
    if (why.empty()) return;
  }
  FAIL() << why;
}

// Timing on a shared machine is noisy (other processes take the cores the spinning lambdas
// need), so an attempt that misses is retried after a pause (a burst of load on the VM's host
// made four attempts in a row miss once, in 2 s); a systematic error fails every attempt.
TEST(Calibrate, RecoversKnownCostsOfASyntheticWorkload) {
  auto st = small_stack();
  host_backend backend(paced());
  synthetic w;
  std::string why;
  for (int attempt = 0; attempt < 6; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250 * attempt));
    why.clear();
    auto c = calibrate(st, backend, w, w, {.repeats = 5});
    if (c.layer_count() != 4u) FAIL() << "layers: " << c.layer_count();
    auto check = [&](char const* what, std::uint32_t l, double got, double want) {
      if (std::abs(got - want) > 0.15 * want + 40)
        why += std::string(what) + " L" + std::to_string(l) + ": " + std::to_string(got) + " us, want " +
               std::to_string(want) + "\n";
    };
    for (std::uint32_t l = 0; l < 4; ++l) {
      check("forward", l, c.layers[l].forward_us, forward_cost(l));
      check("backward", l, c.layers[l].backward_us, 2 * forward_cost(l));
      check("recompute", l, c.layers[l].full_recompute_us(), forward_cost(l));
    }
    // 200 MB/s paced copies: the fitted bandwidth within 25% (sleep overshoot goes to latency).
    for (auto const* l : {&c.link.d2h, &c.link.h2d})
      if (l->bytes_per_second < 0.75 * 200e6 || l->bytes_per_second > 1.25 * 200e6)
        why += "bandwidth " + std::to_string(l->bytes_per_second / 1e6) + " MB/s, want 200\n";

    // The sim, fed the calibrated table, predicts a latency-hiding offload step of the same run.
    auto s = build_schedule(st, {.policy = {rule_spec{.where = placement::offload, .slots = {"b"}}},
                                 .pipeline = {.prefetch_distance = 1}});
    auto const predicted = simulate_step_us(s, c);
    executor<host_backend> ex(backend, s);
    timeline t;
    std::vector<double> measured;
    ex.step(w, w);
    for (int i = 0; i < 5; ++i) {
      ex.record_timeline(&t);
      ex.step(w, w);
      measured.push_back(summarize(t, s).step_us);
    }
    ex.record_timeline(nullptr);
    auto const m = detail::median(measured);
    if (std::abs(predicted - m) > 0.15 * m)
      why += "predicted " + std::to_string(predicted) + " us, measured " + std::to_string(m) + "\n";
    std::printf("attempt %d: fwd L0 %.0f us (300), L1 %.0f us (450), d2h %.1f MB/s + %.0f us, h2d %.1f MB/s + %.0f us "
                "(200 MB/s + 20 us), sync %.0f us; offload b hidden: predicted %.0f us, measured %.0f us (%+.1f%%)\n",
                attempt, c.layers[0].forward_us, c.layers[1].forward_us, c.link.d2h.bytes_per_second / 1e6,
                c.link.d2h.latency_us, c.link.h2d.bytes_per_second / 1e6, c.link.h2d.latency_us,
                c.sync_latency_us, predicted, m, 100 * (predicted - m) / m);
    if (why.empty()) break;
  }
  EXPECT_TRUE(why.empty()) << why;
}

// A stack that declares its layers' input slot (as the transformer preset does): calibration
// rematerializes every other slot to time recomputes, never the input (which the builder rejects).
TEST(Calibrate, StackWithInputSlots) {
  stack_spec st;
  st.independent_layers = true;  // no layer reads another's output
  st.append({"blk", {{"in", 4096, true}, {"a", 4096}}}, 3);
  host_backend backend;
  synthetic w;
  auto const c = calibrate(st, backend, w, w, {.repeats = 1, .measure_link = false});
  ASSERT_EQ(c.layer_count(), 3u);
  for (auto const& l : c.layers) EXPECT_GE(l.recompute_us.value_or(-1), 0) << "a recompute was timed";
}

TEST(Calibrate, FitLineRecoversLatencyAndBandwidth) {
  std::vector<std::pair<double, double>> xy;
  for (double b : {1e3, 5e3, 2e4, 1e5}) xy.push_back({b, 10 + 1e6 * b / 1e9});  // microseconds
  auto l = detail::fit_link(xy);
  EXPECT_NEAR(l.bytes_per_second, 1e9, 1e3);
  EXPECT_NEAR(l.latency_us, 10, 1e-3);
  auto flat = detail::fit_link({{4096, 1e6 * 4096 / 2e9}, {4096, 1e6 * 4096 / 2e9}});
  EXPECT_NEAR(flat.bytes_per_second, 2e9, 1);
  EXPECT_EQ(flat.latency_us, 0);
}

// median_costs: field by field, so one round slowed by a burst of noise (here every field of
// round 1 tripled) does not reach the result; tables of different stacks are refused by name.
TEST(Calibrate, MedianCostsIgnoresOneNoisyRoundFieldByField) {
  auto table = [](double scale, double bandwidth) {
    cost_table c;
    for (int l = 0; l < 2; ++l)
      c.layers.push_back({.forward_us = scale * (100 + l), .backward_us = scale * (200 + l), .recompute_us = scale * 90,
                          .slot_recompute_us = {scale * 40, scale * 50}, .gather_us = scale * 3});
    c.link = {.d2h = {.bytes_per_second = bandwidth, .latency_us = scale * 5}, .h2d = {.bytes_per_second = bandwidth / 2}, .full_duplex = false};
    c.sync_latency_us = scale * 7;
    return c;
  };
  std::vector<cost_table> const rounds = {table(1.0, 4e9), table(3.0, 1e9), table(1.1, 5e9)};
  auto const m = median_costs(rounds);
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_DOUBLE_EQ(m.layers[0].forward_us, 110);   // 100, 300, 110
  EXPECT_DOUBLE_EQ(m.layers[1].backward_us, 221.1);  // 201, 603, 221.1
  EXPECT_DOUBLE_EQ(m.layers[1].recompute_us.value(), 99);
  EXPECT_DOUBLE_EQ(m.layers[0].slot_recompute_us[1], 55);
  EXPECT_DOUBLE_EQ(m.layers[0].gather_us, 3.3);
  EXPECT_DOUBLE_EQ(m.link.d2h.bytes_per_second, 4e9);  // 4, 1, 5: the slow round's link is out too
  EXPECT_DOUBLE_EQ(m.link.h2d.bytes_per_second, 2e9);
  EXPECT_DOUBLE_EQ(m.link.d2h.latency_us, 5.5);
  EXPECT_FALSE(m.link.full_duplex);
  EXPECT_DOUBLE_EQ(m.sync_latency_us, 7.7);
  // Two tables: the mean of the two.
  EXPECT_DOUBLE_EQ(median_costs(std::span(rounds).first(2)).layers[0].forward_us, 200);
  // Hostile input.
  auto what = [](auto&& f) -> std::string {
    try {
      f();
    } catch (cost_model_error const& e) {
      return e.what();
    }
    return "(nothing thrown)";
  };
  EXPECT_NE(what([] { (void)median_costs({}); }).find("at least one cost table"), std::string::npos);
  auto fewer = rounds;
  fewer[2].layers.pop_back();
  EXPECT_NE(what([&] { (void)median_costs(fewer); }).find("table 2 has 1 layers and table 0 2"), std::string::npos);
  auto other = rounds;
  other[1].layers[1].slot_recompute_us.clear();
  EXPECT_NE(what([&] { (void)median_costs(other); }).find("table 1 layer 1 has other per-slot entries"), std::string::npos);
  // A NaN has no median (it was taken as a value), named with its table and field.
  auto nan = rounds;
  nan[2].layers[1].backward_us = std::numeric_limits<double>::quiet_NaN();
  auto const m_nan = what([&] { (void)median_costs(nan); });
  EXPECT_NE(m_nan.find("median_costs: table 2: tide: the cost table's layer 1 backward_us is nan"), std::string::npos) << m_nan;
  // "As forward_us" (none) in one table, a measured time in another: the median mixed them.
  auto mixed = rounds;
  mixed[0].layers[0].recompute_us.reset();
  auto const m_mixed = what([&] { (void)median_costs(mixed); });
  EXPECT_NE(m_mixed.find("table 1 layer 0 has recompute_us 270"), std::string::npos) << m_mixed;
  EXPECT_NE(m_mixed.find("same measure_recompute"), std::string::npos) << m_mixed;
  for (auto& c : mixed) c.layers[0].recompute_us.reset();  // "as forward" in every table: accepted
  EXPECT_FALSE(median_costs(mixed).layers[0].recompute_us.has_value());
  // Unpaced (0) beside a paced link: the midpoint was half a rate, or 0.5 B/s.
  auto unpaced = rounds;
  unpaced[1].link.h2d.bytes_per_second = 0;
  auto const m_unpaced = what([&] { (void)median_costs(unpaced); });
  EXPECT_NE(m_unpaced.find("table 1 has link h2d bytes_per_second 0.000000 and table 0 2000000000.000000: one unpaced (0), one paced"),
            std::string::npos) << m_unpaced;
}

TEST(Strategy, TableShowsTheTrade) {
  auto m = models::llama3_405b(8192, 1, 8);
  auto st = transformer_stack(m);
  auto costs = transformer_costs(m, hardware::h100_sxm());
  strategy_options opt;
  opt.device_budget = build_schedule(st, strategy{}).peak_device_bytes() / 3;
  auto rows = compare_strategies(st, costs, opt);
  ASSERT_EQ(rows.size(), 6u) << format_strategy_table(rows);
  auto const& keep = rows[0];
  auto const& remat = rows[1];
  auto const& naive = rows[2];
  auto const& hiding = rows[3];
  auto const& deep = rows[4];
  auto const& planned = rows[5];
  EXPECT_FALSE(keep.fits);
  EXPECT_NEAR(keep.step_us, costs.compute_us(), 1e-9 * keep.step_us);
  EXPECT_GT(remat.step_us, keep.step_us);
  EXPECT_LT(hiding.step_us, naive.step_us);     // latency hiding pays
  EXPECT_GT(hiding.whole_device_bytes, naive.whole_device_bytes);  // with more buffers
  EXPECT_GT(deep.whole_device_bytes, hiding.whole_device_bytes);   // deeper prefetch costs device memory
  EXPECT_TRUE(planned.fits);
  EXPECT_LE(planned.whole_device_bytes, opt.device_budget);
  for (auto const& r : rows)
    if (r.fits) {
      EXPECT_LE(planned.step_us, r.step_us * (1 + 1e-9)) << r.name << "\n" << format_strategy_table(rows);
    }
  std::printf("%s", format_strategy_table(rows).c_str());
}

TEST(Strategy, PresetPlansFitOnTheHostBackendScaledDown) {
  for (auto m : {models::deepseek_v3(32, 1, 1), models::llama3_405b(64, 1, 8)}) {
    m.layer_count = 8;  // scaled down: the preset's dimensions, fewer layers and tokens
    auto st = transformer_stack(m);
    auto costs = transformer_costs(m, hardware::h100_sxm());
    plan_options opt;
    opt.device_budget = build_schedule(st, strategy{}).peak_device_bytes() / 3;
    auto p = make_plan(st, costs, opt);
    ASSERT_TRUE(p.fits) << m.name;
    auto s = p.build(st);
    host_backend_options ho;
    ho.device_budget = opt.device_budget;  // the arena throws above the budget
    host_backend backend(ho);
    timeline t;
    executor<host_backend> ex(backend, s, {.timeline = &t});
    auto fwd = [](forward_context<stream_role> const& c) {
      for (std::uint16_t k = 0; k < c.slot_count(); ++k)
        if (c.produces(k)) std::memset(c.slot(k).data(), static_cast<int>(c.layer + k), c.slot(k).size());
    };
    auto bwd = [](backward_context<stream_role> const& c) {
      for (std::uint16_t k = 0; k < c.slot_count(); ++k) {
        auto d = c.slot(k);
        if (d.front() != std::byte(c.layer + k) || d.back() != std::byte(c.layer + k))
          throw std::runtime_error("slot data lost");
      }
    };
    ASSERT_NO_THROW(ex.step(fwd, bwd)) << m.name;
    EXPECT_LE(backend.device_peak_bytes(), opt.device_budget);
    auto sum = summarize(t, s);
    EXPECT_LE(sum.measured_device_bytes, opt.device_budget) << m.name;
    EXPECT_EQ(sum.predicted_device_bytes, p.activation_bytes);
  }
}

// A trainer whose backward also applies the optimizer (common in hand-written C++ trainers):
// `tide::calibrate` runs it many times, and with ctx.calibrating honoured the live weights stay as
// they were; a training step afterwards updates them (the flag is off outside calibration). Layer
// i+1's input is layer i's output (the carry), and the forward is reused unchanged as the recompute.
TEST(Calibrate, TheCalibratingFlagLetsABackwardSkipTheOptimizer) {
  constexpr std::uint32_t L = 4;
  constexpr std::size_t n = 256;
  stack_spec st;
  st.append({"blk", {{"h", n * sizeof(float)}}}, L);
  st.carry = {"x", n * sizeof(float)};
  std::vector<float> w(L, 0.5f), grad(L, 0.0f);
  int backwards = 0, calibrating = 0;
  auto forward = [&](auto const& c) {
    auto const x = c.template carry_in<float>();
    auto const h = c.template slot_as<float>(0);
    auto const y = c.template carry_out<float>();
    for (std::size_t i = 0; i < n; ++i) h[i] = x[i] * w[c.layer], y[i] = h[i] + x[i];
  };
  auto backward = [&](auto const& c) {
    ++backwards;
    calibrating += c.calibrating ? 1 : 0;
    auto const h = c.template slot_as<float>(0);
    float g = 0;
    for (std::size_t i = 0; i < n; ++i) g += h[i];
    grad[c.layer] = g;
    if (!c.calibrating) w[c.layer] -= 1e-3f * g;  // the optimizer, inside the backward
  };
  auto const before = w;
  host_backend backend;
  calibration_options o;
  o.repeats = 2;
  o.input = [](std::span<std::byte> in) {
    auto const f = std::span(reinterpret_cast<float*>(in.data()), in.size() / sizeof(float));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = 0.25f + 0.001f * static_cast<float>(i);
  };
  auto const costs = calibrate(st, backend, forward, backward, o);
  EXPECT_EQ(costs.layer_count(), L);
  int const calls_before = backwards;
  calibration_options many = o;
  many.repeats = calibration_options::max_repeats + 1;  // each repeat a timeline held at once
  try {
    (void)calibrate(st, backend, forward, backward, many);
    ADD_FAILURE() << "no error";
  } catch (cost_model_error const& e) {
    EXPECT_NE(std::string(e.what()).find("calibration_options::repeats is 100001: give 1 to 100000"), std::string::npos) << e.what();
  }
  EXPECT_EQ(backwards, calls_before);
  // Five schedules (keep-all, remat-all, offload-all whole and in thirds, latency-hidden offload),
  // each repeats + 1 steps (a warm-up, then the measured ones), L backwards a step.
  EXPECT_EQ(backwards, 5 * 3 * static_cast<int>(L));
  EXPECT_EQ(calibrating, backwards);
  EXPECT_EQ(w, before) << "the calibration trained the live weights";
  auto const s = build_schedule(st, strategy{});
  executor ex(backend, s);
  o.input(ex.carry_input());
  ex.step(forward, backward);
  EXPECT_NE(w, before) << "a training step applies the optimizer";
  EXPECT_EQ(calibrating, 5 * 3 * static_cast<int>(L));
}
