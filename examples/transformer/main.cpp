// The main demo: a small decoder-only transformer (GQA attention with rotary embeddings, dense
// SwiGLU layers then DeepSeek-style mixture-of-experts layers) trained on a copy task on the
// host backend, under the published experiment's policies (examples/transformer/tide_model.hpp):
// keep-all, full remat, Llama's QKV offload and DeepSeek's projection offload with copies on the
// compute stream, with latency hiding and pipelined, and the planner's choice. The cost model is
// calibrated on this machine at a few micro-batches (a line per op, `fit_micro_batch_costs`).
// Above the tables, the device budget (by default keep-all's peak at micro-batch 2, the study's
// "micro-batch 2 without offload"). Table 1, every policy at the demo's micro-batch: whether it
// fits the budget, predicted and measured step (medians of interleaved rounds, `tide::tune`),
// tokens/s, predicted and measured device peak, host bytes, exposed copy time, overlap, loss and
// the gradient checksum, bitwise equal across every policy and equal to the model trained
// without tide. Table 2, under the budget: each policy at its best micro-batch by measured
// tokens/s (its best predicted micro-batches measured, interleaved, on a backend that enforces
// the budget), the planner's row the tuned choice among `plan_micro_batches`' best.
//
//   transformer [--small] [--json] [--trace FILE] [--policy-out FILE] [--steps N] [--micro-batch N] [--budget BYTES] ...
#include "example.hpp"
#include "task.hpp"
#include "tide_model.hpp"

#include <tide/tide.hpp>
#if TIDE_DEMO_POLICY_FILES
#include <tide/io/json.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using transformer::config;
using transformer::shape;

struct options {
  config net{.vocab = 32,
             .width = 64,
             .heads = 4,
             .kv_heads = 2,
             .layers = 8,
             .dense_layers = 2,
             .mlp_hidden = 192,
             .experts = 8,
             .top_k = 2,
             .expert_hidden = 64,
             .shared_hidden = 64};
  std::size_t length = 24;  // copy task: seq = 2 * length
  std::size_t micro_batch = 4;
  std::size_t max_micro_batch = 16;
  int steps = 4;
  int repeats = 5;  // interleaved measured rounds per configuration (medians)
  int settle = 2;   // uncounted steps at the start of each configuration's turn (tide::tune_options::settle)
  int calibration_rounds = 3;  // calibrations per micro-batch, interleaved; the model takes their medians
  double link_ratio = 0.7;  // copy time over the compute time it can hide behind
  std::size_t budget = 0;   // 0: keep-all's device peak at micro-batch 2
  bool small = false;
  bool json = false;
  std::string trace;
  std::string policy_out;
};

options parse(int argc, char** argv) {
  options o;
  example::cli cli("transformer");
  cli.flag("--small", o.small, "a fast configuration for the test suite")
      .flag("--json", o.json, "print the results as JSON")
      .option("--trace", o.trace, "FILE", "write the deepseek-lhs run's timeline as Chrome trace JSON")
      .option("--policy-out", o.policy_out, "FILE", "write the planner's tuned choice as a policy file (needs nlohmann/json)")
      .option("--steps", o.steps, "N", "training steps per policy (at least 2; the first is a warm-up)")
      .option("--repeats", o.repeats, "N", "measured rounds per configuration, interleaved (medians; at least 1)")
      .option("--settle", o.settle, "N", "uncounted steps before each measured one, back to back (at least 0)")
      .option("--calibration-rounds", o.calibration_rounds, "N", "calibrations per micro-batch, interleaved (medians; at least 1)")
      .option("--micro-batch", o.micro_batch, "N", "sequences per step")
      .option("--max-micro-batch", o.max_micro_batch, "N", "the largest micro-batch the budget search tries")
      .option("--budget", o.budget, "BYTES", "device budget (default: keep-all's peak at micro-batch 2)")
      .option("--link-ratio", o.link_ratio, "R", "copy time over the compute time it can hide behind")
      .option("--length", o.length, "N", "copy-task length (sequences of 2N tokens)")
      .option("--vocab", o.net.vocab, "N", "vocabulary")
      .option("--width", o.net.width, "N", "residual width")
      .option("--heads", o.net.heads, "N", "query heads")
      .option("--kv-heads", o.net.kv_heads, "N", "key/value heads")
      .option("--layers", o.net.layers, "N", "decoder layers")
      .option("--dense-layers", o.net.dense_layers, "N", "dense layers first (the rest are MoE)")
      .option("--mlp-hidden", o.net.mlp_hidden, "N", "dense SwiGLU hidden width")
      .option("--experts", o.net.experts, "N", "routed experts per MoE layer")
      .option("--top-k", o.net.top_k, "N", "experts per token")
      .option("--expert-hidden", o.net.expert_hidden, "N", "routed expert hidden width")
      .option("--shared-hidden", o.net.shared_hidden, "N", "shared expert hidden width");
  cli.parse(argc, argv);
  if (o.small) {
    o.net.layers = std::min<std::size_t>(o.net.layers, 4);
    o.net.dense_layers = std::min<std::size_t>(o.net.dense_layers, 1);
    o.length = std::min<std::size_t>(o.length, 8);
    o.max_micro_batch = std::min<std::size_t>(o.max_micro_batch, 8);
    o.steps = std::min(o.steps, 3);
    o.repeats = std::min(o.repeats, 3);
    o.settle = std::min(o.settle, 1);
    o.calibration_rounds = std::min(o.calibration_rounds, 1);
  }
  if (o.steps < 2) cli.fail("--steps must be at least 2");
  if (o.repeats < 1) cli.fail("--repeats must be at least 1");
  if (o.settle < 0) cli.fail("--settle must be at least 0");
  if (o.calibration_rounds < 1) cli.fail("--calibration-rounds must be at least 1");
#if !TIDE_DEMO_POLICY_FILES
  if (!o.policy_out.empty()) cli.fail("--policy-out needs tide built with nlohmann/json (-Djson=enabled)");
#endif
  if (o.micro_batch == 0 || o.length == 0) cli.fail("--micro-batch and --length must be positive");
  if (o.max_micro_batch < 2) cli.fail("--max-micro-batch must be at least 2");
  if (!(o.link_ratio > 0) || o.link_ratio > 10) cli.fail("--link-ratio must be in (0, 10]");
  if (o.net.vocab < 2 || o.net.vocab > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    cli.fail("--vocab must be at least 2 (a separator and a content token) and fit in int32");
  if (o.net.dense_layers == 0 || o.net.dense_layers >= o.net.layers)
    cli.fail("--dense-layers must be at least 1 and below --layers (the policies name tensors of both layer kinds)");
  try {
    transformer::validate(o.net);
    transformer::validate(shape{o.micro_batch, 2 * o.length});
  } catch (std::exception const& e) {
    cli.fail(e.what());
  }
  return o;
}

struct run_result {
  std::string name;
  tide::step_summary summary;
  double step_ms = 0, tokens_per_s = 0;
  double loss_first = 0, loss_last = 0;
  std::uint64_t checksum = 0;
  std::string error;
};

//! The batches every policy trains on (the same for all): one batch of the copy task, repeated,
//! so that a few steps show the loss falling (a fresh batch each step would hide it in noise).
struct data {
  std::vector<std::vector<std::int32_t>> tokens, targets;
};
data make_data(options const& o, std::size_t micro_batch, int steps) {
  transformer::copy_task task{.length = o.length, .vocab = o.net.vocab};
  transformer::rng r{2026};
  std::vector<std::int32_t> tokens, targets;
  task.sample(r, micro_batch, tokens, targets);
  data d;
  d.tokens.assign(static_cast<std::size_t>(steps), tokens);
  d.targets.assign(static_cast<std::size_t>(steps), targets);
  return d;
}

//! Trains `o.steps` steps under schedule `s` on a host backend with `bo`.
run_result train(std::string name, options const& o, std::size_t micro_batch, tide::schedule const& s,
                 tide::host_backend_options bo, data const& d, tide::timeline* keep_trace = nullptr) {
  run_result r;
  r.name = std::move(name);
  shape const sh{micro_batch, 2 * o.length};
  try {
    tide::host_backend backend(bo);
    tide::timeline tl;
    tide::executor exec(backend, s, {.timeline = &tl});
    transformer::trainer tr(o.net, sh);
    transformer::adamw const opt{.learning_rate = 1e-2};  // a few steps must show the loss falling
    double total_ms = 0;
    for (int i = 0; i < o.steps; ++i) {
      auto const k = static_cast<std::size_t>(i);
      auto const t0 = std::chrono::steady_clock::now();
      double const loss = tr.step(exec, d.tokens[k], d.targets[k]);
      auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) total_ms += ms;  // the first step warms caches and threads
      if (i == 0) r.loss_first = loss;
      r.loss_last = loss;
      r.checksum = tr.gradient_checksum();
      tr.net().adamw_step(opt);
    }
    r.step_ms = total_ms / (o.steps - 1);
    r.tokens_per_s = static_cast<double>(sh.tokens()) / (r.step_ms / 1e3);
    r.summary = tide::summarize(tl, s);  // the last step's
    if (keep_trace) *keep_trace = tl;
  } catch (std::exception const& e) {  // tide's errors (out_of_memory under a budget) and the model's
    r.error = e.what();
  }
  return r;
}

//! The same training without tide (the model's own store): the checksum every policy must equal.
std::uint64_t reference_checksum(options const& o, data const& d) {
  transformer::model m(o.net);
  shape const sh{o.micro_batch, 2 * o.length};
  std::uint64_t c = 0;
  for (int i = 0; i < o.steps; ++i) {
    auto const k = static_cast<std::size_t>(i);
    m.compute_gradients(d.tokens[k], d.targets[k], sh);
    c = transformer::fnv1a(std::as_bytes(m.gradients()));
    m.adamw_step({.learning_rate = 1e-2});
  }
  return c;
}

//! One policy's schedule on a persistent backend, executor and trainer: `tune`'s measuring
//! callable runs one training step of it per call (no optimizer step: every call does the same
//! work), so setup stays outside the measured time.
struct stepper {
  tide::host_backend backend;
  tide::schedule sched;
  tide::executor<tide::host_backend> exec;
  transformer::trainer tr;
  data batch;
  stepper(options const& o, std::size_t micro_batch, tide::schedule s, tide::host_backend_options bo)
      : backend(bo), sched(std::move(s)), exec(backend, sched), tr(o.net, {micro_batch, 2 * o.length}),
        batch(make_data(o, micro_batch, 1)) {}
  double step_us() {
    auto const t0 = std::chrono::steady_clock::now();
    (void)tr.step(exec, batch.tokens[0], batch.targets[0]);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
};

//! One configuration the demo measures: a policy's schedule at a micro-batch, its prediction.
struct config_run {
  std::string policy;
  tide::tune_candidate candidate;
  tide::schedule sched;
};

//! Measures `runs` round-robin with `tide::tune` (`repeats` rounds after a warm-up), each on its
//! own stepper over a backend with `bo`.
tide::tune_report measure(options const& o, std::vector<config_run> const& runs, tide::host_backend_options bo, int repeats) {
  std::vector<tide::tune_candidate> cands;
  std::map<std::string, std::unique_ptr<stepper>> steppers;
  for (auto const& r : runs) cands.push_back(r.candidate);
  return tide::tune(cands, [&](tide::tune_candidate const& c) {
    auto& s = steppers[c.name];
    if (!s) {  // first call (the warm-up round): build it, outside the measured time
      auto const& r = *std::find_if(runs.begin(), runs.end(), [&](auto const& x) { return x.candidate.name == c.name; });
      s = std::make_unique<stepper>(o, c.micro_batch, r.sched, bo);
    }
    return s->step_us();
  }, {.repeats = repeats, .warmups = 1, .settle = o.settle});
}

//! The demo's cost model: tables calibrated at a few micro-batches, exact there and linear between
//! neighbouring points (`tide::fit_micro_batch_costs` on the two, extended past the ends): the
//! work per op grows less than linearly at small micro-batches, which one line through every point
//! would miss at both ends. The time a step spends outside the schedule (embedding, head and loss,
//! gradient zeroing) is keep-all's measured step less its simulated schedule at each point,
//! interpolated the same way. Where keep-all measured faster than its calibrated schedule (the
//! calibration's own steps ran slow: fresh threads, another schedule beside them), that point's
//! compute and collective times are scaled down to the measured step and nothing is outside: the
//! whole-step measurement is the steadier of the two.
struct cost_model {
  std::vector<std::uint64_t> points;          // calibrated micro-batches, ascending
  std::vector<tide::micro_batch_costs> segments;  // segments[i]: the line through points i and i + 1
  std::vector<double> outside_at;             // outside the schedule at each point, microseconds
  std::vector<double> scale_at;               // the factor each point's compute was scaled by (1: none)
  std::vector<tide::cost_table> at_points;    // each point's own table (after scaling): exact there
  //! The segment whose line gives micro-batch `b` (the first or last past the ends).
  [[nodiscard]] std::size_t segment(std::uint64_t b) const {
    std::size_t i = 0;
    while (i + 2 < points.size() && b > points[i + 1]) ++i;
    return i;
  }
  //! Where `b` is among the calibrated points, if it is one.
  [[nodiscard]] std::optional<std::size_t> point(std::uint64_t b) const {
    auto const k = std::find(points.begin(), points.end(), b);
    if (k == points.end()) return std::nullopt;
    return static_cast<std::size_t>(k - points.begin());
  }
  //! At a calibrated point its own table (a line through two fits per-op overheads from its left
  //! point and may be adjusted to stay non-negative), between and past them the segment's line.
  [[nodiscard]] tide::cost_table costs_at(std::uint64_t b) const {
    if (auto const k = point(b)) return at_points[*k];
    return segments[segment(b)].at(b);
  }
  [[nodiscard]] double outside_us(std::uint64_t b) const {
    auto const i = segment(b);
    auto const x0 = static_cast<double>(points[i]), x1 = static_cast<double>(points[i + 1]);
    return std::max(0.0, outside_at[i] + (outside_at[i + 1] - outside_at[i]) * (static_cast<double>(b) - x0) / (x1 - x0));
  }
  //! The predicted step of `s` (a schedule at micro-batch `b`), microseconds.
  [[nodiscard]] double step_us(tide::schedule const& s, std::uint64_t b) const {
    return tide::simulate_step_us(s, costs_at(b)) + outside_us(b);
  }
};

//! `c` with every compute and collective time times `f` (the link, overheads and latencies as they are).
tide::cost_table scaled_compute(tide::cost_table c, double f) {
  for (auto& l : c.layers) {
    l.forward_us *= f;
    l.backward_us *= f;
    if (l.recompute_us) *l.recompute_us *= f;
    for (auto& x : l.slot_recompute_us) x *= f;
    l.gather_us *= f;
    l.regather_us *= f;
    l.reduce_us *= f;
  }
  return c;
}

cost_model calibrate_model(options const& o, tide::host_backend_options const& paced) {
  cost_model m;
  for (std::uint64_t b : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{o.micro_batch}, std::uint64_t{8}}) {
    b = std::min<std::uint64_t>(b, std::max<std::size_t>(o.max_micro_batch, o.micro_batch));
    if (std::find(m.points.begin(), m.points.end(), b) == m.points.end()) m.points.push_back(b);
  }
  if (m.points.size() < 2) m.points.push_back(m.points[0] + 1);
  std::sort(m.points.begin(), m.points.end());
  // One calibration per point per round, the points interleaved within each round, and the
  // field-by-field median over rounds (tide::median_costs): a burst of noise on the machine
  // reaches one round's table, not the model.
  struct point {
    shape sh;
    tide::stack_spec stack;
    data d;
    std::unique_ptr<transformer::trainer> tr;
    std::vector<tide::cost_table> rounds;
  };
  std::vector<point> at;
  std::vector<tide::schedule> keep;
  for (auto const b : m.points) {
    shape const sh{b, 2 * o.length};
    auto& p = at.emplace_back(point{sh, transformer::make_stack(o.net, sh), make_data(o, b, 1),
                                    std::make_unique<transformer::trainer>(o.net, sh), {}});
    p.tr->prepare(p.d.tokens[0], p.d.targets[0]);
    keep.push_back(tide::build_schedule(p.stack, tide::strategy{}));
  }
  for (int round = 0; round < o.calibration_rounds; ++round) {
    for (auto& p : at) {
      tide::host_backend cal(paced);
      tide::calibration_options co;
      co.repeats = static_cast<std::uint32_t>(std::clamp(o.repeats, 1, 5));  // as many as the measured rounds, up to 5
      // The host backend's copies are memcpy on a worker thread each way: with one core computing and
      // one left (2 cores), an offload and a prefetch at once share that core, a half-duplex link.
      co.full_duplex = std::thread::hardware_concurrency() > 2;
      co.input = [&](std::span<std::byte> in) {  // the real batch's embeddings, so the routers route as in training
        p.tr->net().embed(p.d.tokens[0], p.sh, {reinterpret_cast<float*>(in.data()), in.size() / sizeof(float)});
      };
      auto& tr = *p.tr;
      p.rounds.push_back(tide::calibrate(p.stack, cal, [&](auto const& c) { tr.forward(c); }, [&](auto const& c) { tr.backward(c); }, co));
    }
  }
  std::vector<tide::measured_costs> tables;
  for (std::size_t i = 0; i < at.size(); ++i) tables.push_back({m.points[i], tide::median_costs(at[i].rounds)});
  // Keep-all's whole measured step at each point (median of interleaved rounds).
  std::vector<config_run> runs;
  for (std::size_t i = 0; i < m.points.size(); ++i)
    runs.push_back({"keep-all",
                    {.name = "keep-all @ " + std::to_string(m.points[i]), .micro_batch = m.points[i], .tokens = 1.0},
                    keep[i]});
  auto const r = measure(o, runs, paced, o.repeats);
  for (std::size_t i = 0; i < m.points.size(); ++i) {
    auto& c = tables[i].costs;
    double const measured = r.results[i].median_us, sim = tide::simulate_step_us(keep[i], c);
    double scale = 1;
    if (measured < sim) {
      // Keep-all's simulated step is linear in a common factor on the compute and collective
      // times (its ops run back to back; overheads and waits stay): solve for the measured step.
      double const fixed = tide::simulate_step_us(keep[i], scaled_compute(c, 0));
      if (sim > fixed && measured > fixed) {
        scale = (measured - fixed) / (sim - fixed);
        c = scaled_compute(c, scale);
      }
    }
    m.scale_at.push_back(scale);
    m.outside_at.push_back(std::max(0.0, measured - tide::simulate_step_us(keep[i], c)));
    m.at_points.push_back(c);
  }
  for (std::size_t i = 0; i + 1 < tables.size(); ++i) m.segments.push_back(tide::fit_micro_batch_costs(std::span(tables).subspan(i, 2)));
  return m;
}

//! A policy's best micro-batch under the budget, measured.
struct best_row {
  std::string policy;
  std::size_t micro_batch = 0;  // 0: nothing fits
  std::size_t device_bytes = 0;
  double predicted_step_ms = 0, step_ms = 0, predicted_tokens_per_s = 0, tokens_per_s = 0, spread = 0;
  std::size_t candidates = 0;
};

int run(options const& o) {
  shape const sh{o.micro_batch, 2 * o.length};
  auto const stack = transformer::make_stack(o.net, sh);
  auto const d = make_data(o, o.micro_batch, o.steps);
  auto strategies = transformer::published_strategies();
  auto const index_of = [&](std::string_view name) {
    for (std::size_t i = 0; i < strategies.size(); ++i)
      if (strategies[i].name == name) return i;
    throw std::logic_error("transformer: no policy " + std::string(name));
  };
  auto const tokens_at = [&](std::size_t b) { return static_cast<double>(b * 2 * o.length); };

  // The device budget: keep-all's peak at micro-batch 2 unless given. One below every policy's
  // peak at micro-batch 1 fits nothing: say so before training.
  auto const budget = o.budget != 0 ? o.budget
                                    : tide::build_schedule(transformer::make_stack(o.net, {2, 2 * o.length}), tide::strategy{})
                                          .peak_device_bytes();
  {
    std::size_t smallest = std::numeric_limits<std::size_t>::max();
    std::string_view who;
    auto const one = transformer::make_stack(o.net, {1, 2 * o.length});
    for (auto const& p : strategies)
      if (auto const peak = tide::build_schedule(one, p.strategy).peak_device_bytes(); peak < smallest) smallest = peak, who = p.name;
    if (budget < smallest) {
      std::fprintf(stderr,
                   "transformer: --budget %zu bytes is below the smallest schedule's device peak, %zu bytes (%.*s at "
                   "micro-batch 1): give at least that\n",
                   budget, smallest, static_cast<int>(who.size()), who.data());
      return 2;
    }
  }

  // Pace the link so that DeepSeek's offloads take `link_ratio` of the forward compute they hide
  // behind, and its prefetches `link_ratio` of the backward.
  std::vector<tide::schedule> schedules;
  for (auto const& p : strategies) schedules.push_back(tide::build_schedule(stack, p.strategy));
  auto const base = train("keep-all", o, o.micro_batch, schedules[0], {}, d);
  if (!base.error.empty()) {
    std::fprintf(stderr, "transformer: %s\n", base.error.c_str());
    return 1;
  }
  auto const deepseek = index_of("deepseek-lhs");  // an index: the planner's schedule is appended below
  auto const bytes = static_cast<double>(schedules[deepseek].peak_host_bytes());
  tide::host_backend_options paced;
  paced.d2h = {.bytes_per_second = bytes / (o.link_ratio * base.summary.forward_us * 1e-6)};
  paced.h2d = {.bytes_per_second = bytes / (o.link_ratio * base.summary.backward_us * 1e-6)};

  // The cost model, calibrated on this machine with this link at a few micro-batches.
  auto const model = calibrate_model(o, paced);
  tide::plan_options po;
  po.device_budget = budget;
  std::vector<tide::strategy> seeds;
  for (auto const& p : strategies) seeds.push_back(p.strategy);
  po.seeds = seeds;

  // Table 1: every policy at the demo's micro-batch (fits or not), and the planner's plan for it
  // under the budget.
  auto const plan = tide::make_plan(stack, model.costs_at(o.micro_batch), po);
  if (plan.fits) {
    strategies.push_back({"planner", plan.strategy});
    schedules.push_back(plan.build(stack));
  } else if (!o.json) {
    std::printf("planner: nothing fits the budget at micro-batch %zu (smallest peak %zu bytes)\n", o.micro_batch,
                plan.smallest_activation_bytes);
  }
  tide::timeline trace;
  std::vector<run_result> runs;
  std::vector<config_run> at_mb;
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    runs.push_back(train(std::string(strategies[i].name), o, o.micro_batch, schedules[i], paced, d,
                         strategies[i].name == "deepseek-lhs" ? &trace : nullptr));
    at_mb.push_back({std::string(strategies[i].name),
                     {.name = std::string(strategies[i].name), .micro_batch = o.micro_batch, .strategy = strategies[i].strategy,
                      .tokens = tokens_at(o.micro_batch), .predicted_step_us = model.step_us(schedules[i], o.micro_batch)},
                     schedules[i]});
  }
  auto const table1 = measure(o, at_mb, paced, o.repeats);
  auto const reference = reference_checksum(o, d);
  bool same = true;
  for (auto const& r : runs)
    if (!r.error.empty() || r.checksum != reference) same = false;
  bool const descended = runs[0].loss_last < runs[0].loss_first;

  // Table 2: under the budget, each policy's micro-batches that fit (predicted peaks are exact:
  // the arena is sized before the step), its best few by predicted tokens/s measured; the
  // planner's best few micro-batches (`plan_micro_batches`) the same way. One interleaved
  // measurement of them all (`tide::tune`) on a backend that enforces the budget.
  std::vector<config_run> cands;
  std::size_t const per_policy = 2, per_planner = 3;
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    if (strategies[i].name == "planner") continue;
    std::vector<config_run> fit;
    for (std::size_t mb = 1; mb <= o.max_micro_batch; ++mb) {
      tide::schedule s;
      if (tide::try_build_schedule_into(s, transformer::make_stack(o.net, {mb, 2 * o.length}), strategies[i].strategy) ||
          s.peak_device_bytes() > budget)
        break;
      auto const name = std::string(strategies[i].name) + " @ " + std::to_string(mb);
      fit.push_back({std::string(strategies[i].name),
                     {.name = name, .micro_batch = mb, .strategy = strategies[i].strategy, .tokens = tokens_at(mb),
                      .predicted_step_us = model.step_us(s, mb)},
                     std::move(s)});
    }
    std::stable_sort(fit.begin(), fit.end(), [](auto const& a, auto const& b) {
      return a.candidate.tokens / a.candidate.predicted_step_us > b.candidate.tokens / b.candidate.predicted_step_us;
    });
    if (fit.size() > per_policy) fit.resize(per_policy);
    for (auto& f : fit) cands.push_back(std::move(f));
  }
  std::vector<std::uint64_t> mbs;
  for (std::size_t mb = 1; mb <= o.max_micro_batch; ++mb) mbs.push_back(mb);
  auto const planned = tide::plan_micro_batches(mbs, [&](std::uint64_t b) {
    return tide::micro_batch_problem{.stack = transformer::make_stack(o.net, {b, 2 * o.length}), .costs = model.costs_at(b),
                                     .options = po, .tokens = tokens_at(b), .outside_step_us = model.outside_us(b)};
  }, {.stop_at_first_misfit = true});
  auto const planner_cands = planned.best ? tide::tune_candidates(planned, per_planner, "planner") : std::vector<tide::tune_candidate>{};
  for (auto const& c : planner_cands)
    cands.push_back({"planner", c, tide::build_schedule(transformer::make_stack(o.net, {c.micro_batch, 2 * o.length}), c.strategy)});
  auto under_budget = paced;
  under_budget.device_budget = budget;
  auto const tuned = measure(o, cands, under_budget, o.repeats);
  std::vector<best_row> best;
  for (auto const& p : strategies) {
    best_row b{std::string(p.name)};
    std::optional<std::size_t> at;
    for (std::size_t i = 0; i < cands.size(); ++i)
      if (cands[i].policy == p.name) {
        ++b.candidates;
        if (!at || tuned.results[i].tokens_per_second > tuned.results[*at].tokens_per_second) at = i;
      }
    if (at) {
      auto const& r = tuned.results[*at];
      b.micro_batch = r.candidate.micro_batch;
      b.device_bytes = cands[*at].sched.peak_device_bytes();
      b.predicted_step_ms = r.candidate.predicted_step_us / 1e3;
      b.step_ms = r.median_us / 1e3;
      b.predicted_tokens_per_s = r.predicted_tokens_per_second;
      b.tokens_per_s = r.tokens_per_second;
      b.spread = r.spread();
    }
    best.push_back(b);
  }
  if (plan.fits != planned.best.has_value() && !o.json)
    std::printf("planner: %s\n", planned.best ? "fits at other micro-batches only" : "fits at no micro-batch up to the largest tried");
  if (std::none_of(best.begin(), best.end(), [](auto const& b) { return b.policy == "planner"; }))
    best.push_back({"planner"});

  // The planner's tuned choice saved as a policy file, read back and rebuilt: the same schedule.
  std::string saved;
  if (!o.policy_out.empty()) {
#if TIDE_DEMO_POLICY_FILES
    std::optional<std::size_t> kept;
    for (std::size_t i = 0; i < cands.size(); ++i)
      if (cands[i].policy == "planner" && (!kept || tuned.results[i].tokens_per_second > tuned.results[*kept].tokens_per_second)) kept = i;
    if (!kept) {
      std::fprintf(stderr, "transformer: --policy-out: the planner fits no micro-batch under the budget: nothing to write\n");
      return 1;
    }
    auto const& c = cands[*kept].candidate;
    auto const st = transformer::make_stack(o.net, {c.micro_batch, 2 * o.length});
    tide::io::write_policy_file(o.policy_out, c.strategy);
    auto const back = tide::build_schedule(st, tide::io::read_policy_file(o.policy_out, st));
    auto const& orig = cands[*kept].sched;
    if (back.ops != orig.ops || back.slots != orig.slots || back.arena != orig.arena) {
      std::fprintf(stderr, "transformer: %s read back builds another schedule than the planner's\n", o.policy_out.c_str());
      return 1;
    }
    saved = "the planner's tuned choice (micro-batch " + std::to_string(c.micro_batch) + ") written to " + o.policy_out +
            "; read back, it builds the same schedule";
#endif
  }

  if (!o.trace.empty()) {
    std::ofstream out(o.trace);
    tide::write_chrome_trace(out, trace, schedules[deepseek], "tide transformer: deepseek-lhs");
    if (!out) {
      std::fprintf(stderr, "transformer: cannot write the trace to %s\n", o.trace.c_str());
      return 1;
    }
  }

  auto const fits = [&](run_result const& r) { return r.summary.predicted_device_bytes <= budget; };
  auto const pct = [](double pred, double meas) { return meas > 0 ? (pred / meas - 1) * 100 : 0.0; };
  std::string points;
  for (auto const b : model.points) points += (points.empty() ? "" : ", ") + std::to_string(b);
  // Keep-all at the demo's micro-batch (a calibrated point) is predicted as its own step measured
  // during calibration: its error in the first table is how far this machine's speed moved since,
  // which every other row's error includes.
  auto const keep_all = index_of("keep-all");
  bool const drifted = runs[keep_all].error.empty();
  double const drift =
      drifted ? pct(table1.results[keep_all].candidate.predicted_step_us, table1.results[keep_all].median_us) : 0.0;
  if (o.json) {
    std::vector<example::json_object> rows, bests, tuning;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      auto const& r = runs[i];
      auto& j = rows.emplace_back();
      j.field("policy", r.name);
      if (!r.error.empty()) {
        j.field("error", r.error);
        continue;
      }
      auto const& s = r.summary;
      auto const& m = table1.results[i];
      j.field("fits", fits(r))
          .field("predicted_step_ms", m.candidate.predicted_step_us / 1e3, 3)
          .field("step_ms", m.median_us / 1e3, 3)
          .field("tokens_per_s", m.tokens_per_second, 1)
          .field("device_peak_bytes", s.predicted_device_bytes)
          .field("measured_device_peak_bytes", s.measured_device_bytes)
          .field("host_bytes", s.predicted_host_bytes)
          .field("exposed_ms", s.exposed_transfer_us / 1000, 3)
          .field("overlap", s.overlap_fraction, 3)
          .field("loss_first", r.loss_first)
          .field("loss_last", r.loss_last)
          .field("checksum", example::hex(r.checksum));
    }
    for (auto const& b : best)
      bests.emplace_back()
          .field("policy", b.policy)
          .field("microbatch", b.micro_batch)
          .field("candidates", b.candidates)
          .field("device_peak_bytes", b.device_bytes)
          .field("predicted_step_ms", b.predicted_step_ms, 3)
          .field("step_ms", b.step_ms, 3)
          .field("predicted_tokens_per_s", b.predicted_tokens_per_s, 1)
          .field("tokens_per_s", b.tokens_per_s, 1)
          .field("spread", b.spread, 3);
    for (std::size_t i = 0; i < cands.size(); ++i) {
      auto const& r = tuned.results[i];
      tuning.emplace_back()
          .field("name", r.candidate.name)
          .field("policy", cands[i].policy)
          .field("microbatch", r.candidate.micro_batch)
          .field("predicted_step_ms", r.candidate.predicted_step_us / 1e3, 3)
          .field("step_ms", r.median_us / 1e3, 3)
          .field("tokens_per_s", r.tokens_per_second, 1);
    }
    std::vector<example::json_object> pts;
    std::string scales = "[";
    for (auto const x : model.scale_at) scales += (scales.size() > 1 ? ", " : "") + example::fixed(x, 4);
    scales += "]";
    example::json_object out;
    out.field("layers", o.net.layers)
        .field("dense_layers", o.net.dense_layers)
        .field("width", o.net.width)
        .field("experts", o.net.experts)
        .field("top_k", o.net.top_k)
        .field("seq", 2 * o.length)
        .field("microbatch", o.micro_batch)
        .field("steps", o.steps)
        .field("repeats", o.repeats)
        .field("settle", o.settle)
        .field("calibration_rounds", o.calibration_rounds)
        .field("calibrated_microbatches", points)
        .raw("machine_drift_pct", drifted ? example::fixed(drift, 1) : std::string("null"))
        .raw("calibration_scale", scales)
        .field("d2h_bytes_per_second", paced.d2h.bytes_per_second, 0)
        .field("h2d_bytes_per_second", paced.h2d.bytes_per_second, 0)
        .field("device_budget", budget)
        .field("reference_checksum", example::hex(reference))
        .field("checksums_equal", same)
        .field("loss_decreased", descended)
        .field("policy_file", o.policy_out)
        .raw("runs", example::json_array(rows))
        .raw("best_under_budget", example::json_array(bests))
        .raw("tuning", example::json_array(tuning));
    std::printf("%s\n", out.str().c_str());
  } else {
    std::printf("tide transformer demo: %zu layers (%zu dense, %zu MoE with %zu experts, top-%zu), width %zu, %zu heads "
                "(%zu KV), seq %zu, micro-batch %zu, %d steps of a copy task; link paced at %.1f MB/s d2h, %.1f MB/s h2d "
                "(DeepSeek's copies = %.0f%% of the compute they can hide behind)\n",
                o.net.layers, o.net.dense_layers, o.net.layers - o.net.dense_layers, o.net.experts, o.net.top_k, o.net.width,
                o.net.heads, o.net.kv_heads, 2 * o.length, o.micro_batch, o.steps, paced.d2h.bytes_per_second / 1e6,
                paced.h2d.bytes_per_second / 1e6, o.link_ratio * 100);
    std::printf("device budget: %s (%s); \"fits\": the schedule's predicted device peak is within it\n",
                tide::format_bytes(static_cast<double>(budget)).c_str(),
                o.budget != 0 ? "given" : "keep-all's peak at micro-batch 2");
    std::string outside, scaled;
    for (auto const x : model.outside_at) outside += (outside.empty() ? "" : ", ") + example::fixed(x / 1e3, 2);
    for (std::size_t i = 0; i < model.points.size(); ++i)
      if (model.scale_at[i] != 1)
        scaled += (scaled.empty() ? "; compute scaled to keep-all's measured step at micro-batch " : ", ") +
                  std::to_string(model.points[i]) + " (x" + example::fixed(model.scale_at[i], 2) + ")";
    std::printf("predicted step: the sim under costs calibrated at micro-batches %s (medians of %d rounds; exact there, linear between) plus "
                "the time outside the schedule (embedding, head, loss: %s ms there, keep-all's measured steps less their "
                "schedule%s); measured: median of %d interleaved rounds, each configuration's step the last of %d back to "
                "back\n\n",
                points.c_str(), o.calibration_rounds, outside.c_str(), scaled.c_str(), o.repeats, o.settle + 1);
    std::printf("every policy at micro-batch %zu (the planner's plan under the budget):\n", o.micro_batch);
    example::table t({{"policy", -24},
                      {"fits", -4, 2},
                      {"pred ms", 8},
                      {"step ms", 8},
                      {"err", 5},
                      {"tokens/s", 9},
                      {"pred device", 12},
                      {"meas device", 12},
                      {"host", 11},
                      {"exposed ms", 11},
                      {"overlap", 8},
                      {"loss", 7},
                      {"grad checksum", -16, 2}});
    for (std::size_t i = 0; i < runs.size(); ++i) {
      auto const& r = runs[i];
      if (!r.error.empty()) {
        t.note(r.name, r.error);
        continue;
      }
      auto const& s = r.summary;
      auto const& m = table1.results[i];
      t.row({r.name, fits(r) ? "yes" : "no", example::fixed(m.candidate.predicted_step_us / 1e3, 2), example::fixed(m.median_us / 1e3, 2),
             example::fixed(pct(m.candidate.predicted_step_us, m.median_us), 0) + "%", example::fixed(m.tokens_per_second, 0),
             tide::format_bytes(static_cast<double>(s.predicted_device_bytes)),
             tide::format_bytes(static_cast<double>(s.measured_device_bytes)),
             tide::format_bytes(static_cast<double>(s.predicted_host_bytes)), example::fixed(s.exposed_transfer_us / 1000, 2),
             s.predicted_host_bytes > 0 ? example::percent(s.overlap_fraction) : std::string("-"),
             example::fixed(r.loss_last, 4), example::hex(r.checksum)});
    }
    t.print();
    if (drifted)
      std::printf("keep-all's prediction is its own step measured during calibration: its err (%.0f%%) is how far this "
                  "machine's speed moved since, and is in every row's\n",
                  drift);
    std::printf("\ngradient checksums %s (the model without tide: %s); loss %s (%.4f -> %.4f)\n",
                same ? "bitwise equal" : "DIFFER", example::hex(reference).c_str(), descended ? "decreased" : "did NOT decrease",
                runs[0].loss_first, runs[0].loss_last);
    std::printf("\nunder the budget, each policy at its best micro-batch by measured tokens/s (its %zu best predicted that fit; "
                "the planner: plan_micro_batches' %zu best, tuned by measurement), all interleaved:\n",
                per_policy, per_planner);
    example::table f({{"policy", -24}, {"micro-batch", 11}, {"fits", -4, 2}, {"device", 11}, {"pred ms", 8}, {"step ms", 8},
                      {"err", 5}, {"pred tok/s", 10}, {"tokens/s", 9}, {"spread", 7}},
                     "  ");
    for (auto const& x : best) {
      if (x.micro_batch == 0) {
        f.note(x.policy, "nothing fits");
        continue;
      }
      f.row({x.policy, std::to_string(x.micro_batch), "yes", tide::format_bytes(static_cast<double>(x.device_bytes)),
             example::fixed(x.predicted_step_ms, 2), example::fixed(x.step_ms, 2), example::fixed(pct(x.predicted_step_ms, x.step_ms), 0) + "%",
             example::fixed(x.predicted_tokens_per_s, 0), example::fixed(x.tokens_per_s, 0), example::percent(x.spread)});
    }
    f.print();
    for (auto const& x : best)
      if (x.policy == "keep-all" && x.micro_batch != 0 && model.point(x.micro_batch))
        std::printf("keep-all at micro-batch %zu is calibrated there too: its err (%.0f%%) is the machine's drift in this table\n",
                    x.micro_batch, pct(x.predicted_step_ms, x.step_ms));
    if (!planner_cands.empty()) {
      std::printf("\nthe planner's candidates (predicted best first; * the measured best, kept):\n");
      example::table c({{"candidate", -16}, {"pred ms", 8}, {"step ms", 8}, {"err", 5}, {"pred tok/s", 10}, {"tokens/s", 9}}, "  ");
      std::size_t kept = 0;
      for (std::size_t i = 0; i < cands.size(); ++i)
        if (cands[i].policy == "planner" && (kept == 0 || tuned.results[i].tokens_per_second > tuned.results[kept].tokens_per_second)) kept = i;
      for (std::size_t i = 0; i < cands.size(); ++i) {
        if (cands[i].policy != "planner") continue;
        auto const& r = tuned.results[i];
        c.row({(i == kept ? "* " : "  ") + r.candidate.name, example::fixed(r.candidate.predicted_step_us / 1e3, 2),
               example::fixed(r.median_us / 1e3, 2), example::fixed(pct(r.candidate.predicted_step_us, r.median_us), 0) + "%",
               example::fixed(r.predicted_tokens_per_second, 0), example::fixed(r.tokens_per_second, 0)});
      }
      c.print();
    }
    if (!saved.empty()) std::printf("\n%s\n", saved.c_str());
  }
  return same && descended ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto const o = parse(argc, argv);
  try {
    return run(o);
  } catch (std::invalid_argument const& e) {  // sizes the model or the task cannot take
    std::fprintf(stderr, "transformer: %s\n", e.what());
    return 2;
  } catch (std::length_error const& e) {
    std::fprintf(stderr, "transformer: %s\n", e.what());
    return 2;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "transformer: %s\n", e.what());
    return 1;
  }
}
