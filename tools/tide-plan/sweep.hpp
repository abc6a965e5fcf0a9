#pragma once
// tide-plan's per-micro-batch table (`--micro-batch 1-8`, `2,4,8` or `auto`; issue 42): each
// micro-batch planned as tide-plan plans one (the strategy table's rows and a policy file as
// seeds), with the cost model's fixed work per op (`tide::add_fixed_work`) and the optimizer step
// outside the schedule (`tide::transformer_optimizer_us`), by `tide::plan_micro_batches`; the one
// with the most tokens per second is marked. main.cpp then prints that micro-batch's strategy
// table and writes its plan.

#include "args.hpp"

#include <tide/io/json.hpp>
#include <tide/plan/compare.hpp>
#include <tide/plan/micro_batch.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace tide_plan {

//! The per-micro-batch plans and what the table shows besides them.
struct sweep_result {
  tide::micro_batch_plan plan;
  //! The same micro-batches planned on the device alone (keep and remat; no host memory, no spill
  //! file): the study's comparison, the best device-resident micro-batch against offload.
  tide::micro_batch_plan device_only;
  std::vector<std::size_t> resident_bytes;  // per result: what the device holds besides activations
  std::vector<std::size_t> device_budget;   // per result: the activations' budget (0: the resident bytes alone exceed the device)
};

//! The micro-batches `a` asks for: its list, or 1 to `max_micro_batches` for auto.
inline std::vector<std::uint64_t> sweep_micro_batches(args const& a) {
  if (!a.micro_batch_auto) return a.micro_batches;
  std::vector<std::uint64_t> r(max_micro_batches);
  std::iota(r.begin(), r.end(), std::uint64_t{1});
  return r;
}

//! Plans every micro-batch `a` asks for. `make_problem(args)` is tide-plan's problem (stack, costs
//! with a calibration's link, `strategy_options`) for one micro-batch; `device_memory` what the
//! whole step may use. A micro-batch whose resident memory alone exceeds it is not planned but
//! shown as not fitting.
template <class MakeProblem>
sweep_result plan_sweep(args const& a, tide::hardware_spec const& hw, std::size_t device_memory, MakeProblem&& make_problem) {
  using namespace tide;
  sweep_result r;
  bool offload = true;
  // Progress on stderr once planning takes over a second (TIDE_PLAN_PROGRESS_AFTER: seconds), as
  // for one micro-batch: the micro-batch being planned on a terminal, one line otherwise.
  auto const t0 = std::chrono::steady_clock::now();
  double after = 1.0;
  if (char const* e = std::getenv("TIDE_PLAN_PROGRESS_AFTER")) after = std::atof(e);
  bool const tty = isatty(STDERR_FILENO) != 0;
  bool shown = false;
  auto const seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto const progress = [&](std::uint64_t b) {
    if (a.quiet || seconds() < after) return;
    if (tty) std::fprintf(stderr, "\rtide-plan: planning micro-batch %llu%s... %.0f s", static_cast<unsigned long long>(b),
                          offload ? "" : " on the device alone", seconds());
    else if (!shown) std::fprintf(stderr, "tide-plan: planning the micro-batches (more than %g s)...\n", after);
    shown = true;
  };
  auto problem = [&](std::uint64_t b) {
    progress(b);
    auto ab = a;
    ab.micro_batch = b;
    ab.micro_batches.clear();
    ab.micro_batch_auto = false;
    auto const [m, t] = preset_model(ab);
    micro_batch_problem q{.tokens = static_cast<double>(m.tokens()), .outside_step_us = transformer_optimizer_us(m, hw, t)};
    auto const resident = transformer_resident_memory(m, hw, t).total();
    if (offload) r.resident_bytes.push_back(resident);
    if (resident >= device_memory) {
      // Nothing left for activations: a budget of 0, so that nothing is planned to fit.
      q.stack = transformer_stack(m);
      q.costs = transformer_batch_costs(m, hw, t);
      q.options = {.device_budget = 0, .host_budget = 0, .method = plan_method::heuristic, .resident_bytes = resident};
      if (offload) r.device_budget.push_back(0);
      return q;
    }
    auto p = make_problem(ab);
    add_fixed_work(p.costs, m, hw, t);
    auto o = p.options;
    o.include_plan = false;
    if (!offload) o.host_budget = 0, o.storage_budget = 0;
    // Seeded as tide-plan seeds one micro-batch's plan (`plan_seeded_by`): the rows and a policy file.
    std::vector<strategy> seeds;
    for (auto const& row : compare_strategies(p.stack, p.costs, o)) seeds.push_back(row.strategy);
    if (!a.policy.empty()) seeds.push_back(io::read_policy_file(a.policy, p.stack));
    for (auto& s : seeds) s.collectives = o.collectives;
    q.options = {.device_budget = o.device_budget,
                 .host_budget = o.host_budget,
                 .max_decisions = o.max_decisions,
                 .candidates = default_candidates(p.stack, o.chunk_bytes, o.collectives),
                 .resident_bytes = o.resident_bytes,
                 .seeds = std::move(seeds),
                 .storage_budget = o.storage_budget};
    q.stack = std::move(p.stack);
    q.costs = std::move(p.costs);
    if (offload) r.device_budget.push_back(o.device_budget);
    return q;
  };
  auto const list = sweep_micro_batches(a);
  r.plan = plan_micro_batches(list, problem, {.stop_at_first_misfit = a.micro_batch_auto});
  // On the device alone, the micro-batches planned above (fewer fit: auto stops where they end).
  offload = false;
  std::vector<std::uint64_t> planned;
  for (auto const& x : r.plan.results) planned.push_back(x.micro_batch);
  r.device_only = plan_micro_batches(planned, problem, {.stop_at_first_misfit = a.micro_batch_auto});
  if (shown) std::fprintf(stderr, "%stide-plan: planned %zu micro-batches in %.1f s\n", tty ? "\r" : "", planned.size(), seconds());
  return r;
}

//! "kept / offloaded / remat[ / spilled]" counts of a plan's decisions.
struct placement_counts {
  std::size_t kept = 0, offloaded = 0, remat = 0, spilled = 0;
};
inline placement_counts count_placements(tide::plan const& p) {
  placement_counts c;
  for (auto d : p.decisions) {
    c.kept += d == tide::placement::keep;
    c.offloaded += d == tide::placement::offload;
    c.remat += d == tide::placement::remat;
    c.spilled += d == tide::placement::spill;
  }
  return c;
}

//! A plan's pipeline in a few words: copies on the compute stream, or hidden with its prefetch
//! distance and staging buffers (chunked where it is).
inline std::string pipeline_words(tide::strategy const& s) {
  if (!s.pipeline.latency_hiding) return "copies on compute";
  auto r = "hidden, prefetch " + std::to_string(s.pipeline.prefetch_distance) + ", " + std::to_string(s.buffers.staging_buffers) + " buf";
  if (s.pipeline.chunk_bytes > 0) r += ", chunked";
  return r;
}

//! The per-micro-batch table as text: one line per micro-batch, the best marked with `*`.
inline std::string format_sweep(sweep_result const& s) {
  std::string r = "  per micro-batch (step = the schedule's + the optimizer step; * the most tokens/s; bound: no schedule of that micro-batch "
                  "within its budgets is faster):\n";
  char line[512];
  std::snprintf(line, sizeof line, "    %11s %12s %12s %6s %6s %6s %6s  %-28s %10s %12s %12s %14s  %s\n", "micro-batch", "resident",
                "act. budget", "kept", "off", "remat", "spill", "pipeline", "step ms", "tokens/s", "bound tok/s", "no offload", "fits");
  r += line;
  auto const& rs = s.plan.results;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    auto const& x = rs[i];
    auto const c = count_placements(x.chosen);
    bool const best = s.plan.best == i;
    // Tokens/s on the device alone (keep and remat), "-" where nothing fits there.
    std::string device_only = "-";
    if (i < s.device_only.results.size() && s.device_only.results[i].fits()) {
      char d[32];
      std::snprintf(d, sizeof d, "%.0f%s", s.device_only.results[i].tokens_per_second, s.device_only.best == i ? " *" : "");
      device_only = d;
    }
    auto const bytes = [](std::size_t b) { return tide::format_bytes(static_cast<double>(b)); };
    if (x.fits())
      std::snprintf(line, sizeof line, "  %s %11llu %12s %12s %6zu %6zu %6zu %6zu  %-28s %10.2f %12.0f %12.0f %14s  %s\n", best ? "*" : " ",
                    static_cast<unsigned long long>(x.micro_batch), bytes(s.resident_bytes[i]).c_str(), bytes(s.device_budget[i]).c_str(),
                    c.kept, c.offloaded, c.remat, c.spilled, pipeline_words(x.chosen.strategy).c_str(), x.step_us / 1e3,
                    x.tokens_per_second, x.bound_tokens_per_second, device_only.c_str(), "yes");
    else
      std::snprintf(line, sizeof line, "    %11llu %12s %12s %6s %6s %6s %6s  %-28s %10s %12s %12.0f %14s  %s\n",
                    static_cast<unsigned long long>(x.micro_batch), bytes(s.resident_bytes[i]).c_str(), bytes(s.device_budget[i]).c_str(),
                    "-", "-", "-", "-", "-", "-", "-", x.bound_tokens_per_second, "-",
                    s.device_budget[i] == 0 ? "no (resident memory exceeds the device)" : "no");
    r += line;
  }
  if (s.plan.best) {
    auto const& b = rs[*s.plan.best];
    std::snprintf(line, sizeof line,
                  "  best: micro-batch %llu, %.0f tokens/s (optimizer step %.2f ms); no micro-batch listed exceeds %.0f tokens/s in the "
                  "sim: within %.2f%%\n",
                  static_cast<unsigned long long>(b.micro_batch), b.tokens_per_second, b.outside_step_us / 1e3,
                  s.plan.bound_tokens_per_second(), 100 * s.plan.gap_to_bound());
    r += line;
  }
  if (s.device_only.best) {
    auto const& d = s.device_only.results[*s.device_only.best];
    std::string more;
    if (s.plan.best && d.tokens_per_second > 0)
      more = " (the best with offload: " +
             std::to_string(std::lround(100 * (s.plan.results[*s.plan.best].tokens_per_second / d.tokens_per_second - 1))) + "% more)";
    std::snprintf(line, sizeof line, "  on the device alone (keep and remat, no host memory): best micro-batch %llu, %.0f tokens/s%s\n",
                  static_cast<unsigned long long>(d.micro_batch), d.tokens_per_second, more.c_str());
    r += line;
  } else {
    r += "  on the device alone (keep and remat, no host memory): no micro-batch listed fits\n";
  }
  return r;
}

//! The per-micro-batch table as JSON (`"micro_batches"` in tide-plan's --json output).
inline tide::io::json sweep_json(sweep_result const& s) {
  using tide::io::json;
  json j;
  j["best"] = s.plan.best ? json(s.plan.results[*s.plan.best].micro_batch) : json(nullptr);
  j["bound_tokens_per_second"] = s.plan.bound_tokens_per_second();
  j["gap_to_bound"] = s.plan.gap_to_bound();
  j["best_device_only"] = s.device_only.best ? json(s.device_only.results[*s.device_only.best].micro_batch) : json(nullptr);
  j["rows"] = json::array();
  for (std::size_t i = 0; i < s.plan.results.size(); ++i) {
    auto const& x = s.plan.results[i];
    auto const c = count_placements(x.chosen);
    auto const or_null = [&](double v) { return x.fits() ? json(v) : json(nullptr); };
    j["rows"].push_back({{"micro_batch", x.micro_batch},
                         {"best", s.plan.best == i},
                         {"fits", x.fits()},
                         {"tokens", x.tokens},
                         {"resident_bytes", s.resident_bytes[i]},
                         {"device_budget_bytes", s.device_budget[i]},
                         {"step_us", or_null(x.step_us)},
                         {"schedule_step_us", or_null(x.chosen.step_us)},
                         {"optimizer_us", x.outside_step_us},
                         {"tokens_per_second", x.tokens_per_second},
                         {"bound_tokens_per_second", x.bound_tokens_per_second},
                         {"device_only_tokens_per_second",
                          i < s.device_only.results.size() ? s.device_only.results[i].tokens_per_second : 0.0},
                         {"kept", c.kept},
                         {"offloaded", c.offloaded},
                         {"rematerialized", c.remat},
                         {"spilled", c.spilled},
                         {"pipeline", x.fits() ? json(pipeline_words(x.chosen.strategy)) : json(nullptr)}});
  }
  return j;
}

}  // namespace tide_plan
