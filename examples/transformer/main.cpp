// The main demo: a small decoder-only transformer (GQA attention with rotary embeddings, dense
// SwiGLU layers then DeepSeek-style mixture-of-experts layers) trained on a copy task on the
// host backend, under the published experiment's policies (examples/transformer/tide_model.hpp):
// keep-all, full remat, Llama's QKV offload and DeepSeek's projection offload with copies on the
// compute stream, with latency hiding and pipelined, and the planner's choice from a calibration
// on this machine. One table: step time, tokens/s, predicted and measured device peak, host
// bytes, exposed copy time, overlap, loss and the gradient checksum, bitwise equal across every
// policy and equal to the model trained without tide. Then, under a device budget (by default
// keep-all's peak at micro-batch 2, the study's "micro-batch 2 without offload"), the largest
// micro-batch each policy fits and its tokens/s.
//
//   transformer [--small] [--json] [--trace FILE] [--steps N] [--micro-batch N] [--budget BYTES] ...
#include "example.hpp"
#include "task.hpp"
#include "tide_model.hpp"

#include <tide/tide.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
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
  double link_ratio = 0.7;  // copy time over the compute time it can hide behind
  std::size_t budget = 0;   // 0: keep-all's device peak at micro-batch 2
  bool small = false;
  bool json = false;
  std::string trace;
};

options parse(int argc, char** argv) {
  options o;
  example::cli cli("transformer");
  cli.flag("--small", o.small, "a fast configuration for the test suite")
      .flag("--json", o.json, "print the results as JSON")
      .option("--trace", o.trace, "FILE", "write the deepseek-lhs run's timeline as Chrome trace JSON")
      .option("--steps", o.steps, "N", "training steps per policy (at least 2; the first is a warm-up)")
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
  }
  if (o.steps < 2) cli.fail("--steps must be at least 2");
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

//! `c` with every compute time scaled by `f` (compute grows with the tokens of a micro-batch).
tide::cost_table scaled(tide::cost_table c, double f) {
  for (auto& l : c.layers) {
    l.forward_us *= f;
    l.backward_us *= f;
    if (l.recompute_us >= 0) l.recompute_us *= f;
    for (auto& x : l.slot_recompute_us) x *= f;
  }
  return c;
}

struct largest {
  std::string policy;
  std::size_t micro_batch = 0;
  double tokens_per_s = 0;
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

  // The planner, from costs measured on this machine with this link.
  tide::cost_table costs;
  {
    tide::host_backend cal(paced);
    transformer::trainer tr(o.net, sh);
    tr.prepare(d.tokens[0], d.targets[0]);
    tide::calibration_options co;
    co.input = [&](std::span<std::byte> in) {  // the real batch's embeddings, so the routers route as in training
      tr.net().embed(d.tokens[0], sh, {reinterpret_cast<float*>(in.data()), in.size() / sizeof(float)});
    };
    costs = tide::calibrate(stack, cal, [&](auto const& c) { tr.forward(c); }, [&](auto const& c) { tr.backward(c); }, co);
  }
  tide::plan_options po;
  po.device_budget = budget;
  std::vector<tide::strategy> seeds;
  for (auto const& p : strategies) seeds.push_back(p.strategy);
  po.seeds = seeds;
  auto const plan = tide::make_plan(stack, costs, po);
  if (plan.fits) {
    strategies.push_back({"planner", plan.strategy});
    schedules.push_back(plan.build(stack));
  } else if (!o.json) {
    std::printf("planner: nothing fits the budget at micro-batch %zu (smallest peak %zu bytes)\n", o.micro_batch,
                plan.smallest_activation_bytes);
  }

  tide::timeline trace;
  std::vector<run_result> runs;
  for (std::size_t i = 0; i < strategies.size(); ++i)
    runs.push_back(train(std::string(strategies[i].name), o, o.micro_batch, schedules[i], paced, d,
                         strategies[i].name == "deepseek-lhs" ? &trace : nullptr));
  auto const reference = reference_checksum(o, d);
  bool same = true;
  for (auto const& r : runs)
    if (!r.error.empty() || r.checksum != reference) same = false;
  bool const descended = runs[0].loss_last < runs[0].loss_first;

  // The largest micro-batch each policy fits under the budget (predicted peaks are exact: the
  // arena is sized before the step), then its tokens/s measured.
  std::vector<largest> fit;
  auto under_budget = paced;
  under_budget.device_budget = budget;
  for (auto const& p : strategies) {
    largest f{std::string(p.name)};
    tide::strategy fitting;  // the strategy at the largest micro-batch that fits
    for (std::size_t mb = 1; mb <= o.max_micro_batch; ++mb) {
      auto const st = transformer::make_stack(o.net, {mb, 2 * o.length});
      tide::strategy how = p.strategy;
      if (p.name == "planner") {  // planned anew: the calibrated compute scaled to the micro-batch
        auto const pm = tide::make_plan(st, scaled(costs, static_cast<double>(mb) / static_cast<double>(o.micro_batch)), po);
        if (!pm.fits) break;
        how = pm.strategy;
      }
      tide::schedule s;
      if (tide::try_build_schedule_into(s, st, how) || s.peak_device_bytes() > budget) break;
      f.micro_batch = mb;
      fitting = how;
    }
    if (f.micro_batch > 0) {
      auto const st = transformer::make_stack(o.net, {f.micro_batch, 2 * o.length});
      auto oo = o;
      oo.steps = 3;  // a warm-up and two timed steps
      auto const r = train(f.policy, oo, f.micro_batch, tide::build_schedule(st, fitting), under_budget,
                           make_data(o, f.micro_batch, oo.steps));
      f.tokens_per_s = r.error.empty() ? r.tokens_per_s : 0;
    }
    fit.push_back(f);
  }

  if (!o.trace.empty()) {
    std::ofstream out(o.trace);
    tide::write_chrome_trace(out, trace, schedules[deepseek], "tide transformer: deepseek-lhs");
    if (!out) {
      std::fprintf(stderr, "transformer: cannot write the trace to %s\n", o.trace.c_str());
      return 1;
    }
  }

  if (o.json) {
    std::vector<example::json_object> rows, fits;
    for (auto const& r : runs) {
      auto& j = rows.emplace_back();
      j.field("policy", r.name);
      if (!r.error.empty()) {
        j.field("error", r.error);
        continue;
      }
      auto const& s = r.summary;
      j.field("step_ms", r.step_ms, 3)
          .field("tokens_per_s", r.tokens_per_s, 1)
          .field("device_peak_bytes", s.predicted_device_bytes)
          .field("measured_device_peak_bytes", s.measured_device_bytes)
          .field("host_bytes", s.predicted_host_bytes)
          .field("exposed_ms", s.exposed_transfer_us / 1000, 3)
          .field("overlap", s.overlap_fraction, 3)
          .field("loss_first", r.loss_first)
          .field("loss_last", r.loss_last)
          .field("checksum", example::hex(r.checksum));
    }
    for (auto const& f : fit)
      fits.emplace_back().field("policy", f.policy).field("microbatch", f.micro_batch).field("tokens_per_s", f.tokens_per_s, 1);
    example::json_object out;
    out.field("layers", o.net.layers)
        .field("dense_layers", o.net.dense_layers)
        .field("width", o.net.width)
        .field("experts", o.net.experts)
        .field("top_k", o.net.top_k)
        .field("seq", 2 * o.length)
        .field("microbatch", o.micro_batch)
        .field("steps", o.steps)
        .field("d2h_bytes_per_second", paced.d2h.bytes_per_second, 0)
        .field("h2d_bytes_per_second", paced.h2d.bytes_per_second, 0)
        .field("device_budget", budget)
        .field("reference_checksum", example::hex(reference))
        .field("checksums_equal", same)
        .field("loss_decreased", descended)
        .raw("runs", example::json_array(rows))
        .raw("largest_microbatch", example::json_array(fits));
    std::printf("%s\n", out.str().c_str());
  } else {
    std::printf("tide transformer demo: %zu layers (%zu dense, %zu MoE with %zu experts, top-%zu), width %zu, %zu heads "
                "(%zu KV), seq %zu, micro-batch %zu, %d steps of a copy task; link paced at %.1f MB/s d2h, %.1f MB/s h2d "
                "(DeepSeek's copies = %.0f%% of the compute they can hide behind)\n\n",
                o.net.layers, o.net.dense_layers, o.net.layers - o.net.dense_layers, o.net.experts, o.net.top_k, o.net.width,
                o.net.heads, o.net.kv_heads, 2 * o.length, o.micro_batch, o.steps, paced.d2h.bytes_per_second / 1e6,
                paced.h2d.bytes_per_second / 1e6, o.link_ratio * 100);
    example::table t({{"policy", -24},
                      {"step ms", 9},
                      {"tokens/s", 10},
                      {"pred device", 12},
                      {"meas device", 12},
                      {"host", 11},
                      {"exposed ms", 11},
                      {"overlap", 8},
                      {"loss", 9},
                      {"grad checksum", -16, 2}});
    for (auto const& r : runs) {
      if (!r.error.empty()) {
        t.note(r.name, r.error);
        continue;
      }
      auto const& s = r.summary;
      t.row({r.name, example::fixed(r.step_ms, 2), example::fixed(r.tokens_per_s, 0),
             tide::format_bytes(static_cast<double>(s.predicted_device_bytes)),
             tide::format_bytes(static_cast<double>(s.measured_device_bytes)),
             tide::format_bytes(static_cast<double>(s.predicted_host_bytes)), example::fixed(s.exposed_transfer_us / 1000, 2),
             s.predicted_host_bytes > 0 ? example::percent(s.overlap_fraction) : std::string("-"),
             example::fixed(r.loss_last, 4), example::hex(r.checksum)});
    }
    t.print();
    std::printf("\ngradient checksums %s (the model without tide: %s); loss %s (%.4f -> %.4f)\n",
                same ? "bitwise equal" : "DIFFER", example::hex(reference).c_str(), descended ? "decreased" : "did NOT decrease",
                runs[0].loss_first, runs[0].loss_last);
    std::printf("\nlargest micro-batch under a device budget of %s (%s):\n", tide::format_bytes(static_cast<double>(budget)).c_str(),
                o.budget != 0 ? "given" : "keep-all's peak at micro-batch 2");
    example::table f({{"policy", -24}, {"micro-batch", 12}, {"tokens/s", 10}}, "  ");
    for (auto const& x : fit)
      f.row({x.policy, x.micro_batch ? std::to_string(x.micro_batch) : "none", x.micro_batch ? example::fixed(x.tokens_per_s, 0) : "-"});
    f.print();
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
