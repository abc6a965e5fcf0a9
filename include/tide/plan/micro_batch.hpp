#pragma once
//! \file
//! Throughput as the objective, the micro-batch as a decision. `plan_micro_batches` plans each
//! micro-batch it is given (the fastest plan that fits its budgets, `make_plan`), turns each step
//! into tokens per second with an upper bound from the plan's lower bound on the step, and marks
//! the micro-batch with the most tokens per second.
//!
//! The cost model separates what grows with the micro-batch from what does not. Every op's time
//! is `fixed + work(b) / (peak x eff(work))` with a saturating efficiency
//! `eff(w) = u x w / (w + w_half)`, which makes it `fixed + w_half / (peak x u) + work(b) /
//! (peak x u)`: a line in the micro-batch b, so two calibrated micro-batches determine it
//! (`fit_micro_batch_costs`) and tokens per second grow with b towards the rate of the work alone.
//! For the transformer presets (`transformer_micro_batch_problems`) the parts that do not grow with
//! b are, per op, kernel launches (`batch_efficiency::kernel_launch_us`, an assumption) and the
//! weights a matrix product reads from HBM once per pass (`w_half` at the roofline's ridge: the
//! work at which reading the weights takes as long as the arithmetic, from the preset's peak and
//! HBM bandwidth); per layer, FSDP's gathers and reduce-scatters (already in `transformer_costs`,
//! they never depended on b); and per step, the optimizer step (`transformer_optimizer_us`).
//! `make_plan` and `transformer_costs` are unchanged: one micro-batch planned alone is planned as
//! before. docs/planning.md ("Throughput and the micro-batch") states the assumptions.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/error.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/planner.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/transformer.hpp>
#if TIDE_DEFINITIONS
#include <tide/plan/detail/micro_batch_search.hpp>
#endif

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! One micro-batch's planning problem: what `plan_micro_batches` plans at each micro-batch.
struct micro_batch_problem {
  stack_spec stack{};      //!< the stack at this micro-batch (its slots grow with it)
  cost_table costs{};      //!< its costs at this micro-batch
  plan_options options{};  //!< budgets at this micro-batch (resident memory grows with it) and search settings
  double tokens = 0;       //!< tokens (or samples) one step processes: what "per second" counts
  //! Time per step outside the schedule, e.g. the optimizer step (microseconds).
  double outside_step_us = 0;
};

//! The problem at a micro-batch (at least 1). May throw `tide::error`, which `plan_micro_batches`
//! passes on.
using micro_batch_problem_fn = std::function<micro_batch_problem(std::uint64_t micro_batch)>;

//! One micro-batch's answer.
struct micro_batch_result {
  std::uint64_t micro_batch = 0;  //!< the micro-batch planned
  plan chosen{};                  //!< the fastest plan found that fits (`chosen.fits` false: none found)
  double tokens = 0;              //!< `micro_batch_problem::tokens`
  double outside_step_us = 0;     //!< `micro_batch_problem::outside_step_us`
  //! `chosen.step_us + outside_step_us`; infinity when nothing fits.
  double step_us = std::numeric_limits<double>::infinity();
  double tokens_per_second = 0;  //!< `tokens` over `step_us`; 0 when nothing fits
  //! No schedule of this micro-batch within its budgets processes more tokens per second:
  //! `tokens / (chosen.lower_bound_us + outside_step_us)` (0 when no schedule can fit).
  double bound_tokens_per_second = 0;

  //! True when a plan fits this micro-batch's budgets.
  [[nodiscard]] constexpr bool fits() const noexcept { return chosen.fits; }
};

//! `plan_micro_batches`' answer.
struct micro_batch_plan {
  std::vector<micro_batch_result> results{};  //!< one per micro-batch given, in that order
  //! The index in `results` of the most tokens per second (the smaller micro-batch on a tie);
  //! empty when nothing fits at any micro-batch.
  std::optional<std::size_t> best{};

  //! No schedule at any micro-batch given, within its budgets, processes more tokens per second:
  //! the largest of the results' bounds.
  [[nodiscard]] double bound_tokens_per_second() const noexcept {
    double r = 0;
    for (auto const& x : results) r = std::max(r, x.bound_tokens_per_second);
    return r;
  }
  //! How far the best can be from the best possible: `bound / best - 1` (0 when nothing fits).
  [[nodiscard]] double gap_to_bound() const noexcept {
    if (!best || results[*best].tokens_per_second <= 0) return 0;
    return bound_tokens_per_second() / results[*best].tokens_per_second - 1;
  }
};

//! How `plan_micro_batches` walks its list.
struct micro_batch_options {
  //! Stop after the first micro-batch at which no plan fits (its result included): for a list in
  //! increasing order on a model whose memory grows with the micro-batch, the larger ones cannot
  //! fit either (what tide-plan's `--micro-batch auto` does).
  bool stop_at_first_misfit = false;
};

//! Plans each of `micro_batches` (distinct, each at least 1) with `make_plan` on the problem
//! `problem` builds for it, and marks the one with the most tokens per second. Throws
//! `cost_model_error` naming an empty list, a micro-batch of 0 or one given twice, and passes on
//! what `problem` and `make_plan` throw.
[[nodiscard]] TIDE_INLINE micro_batch_plan plan_micro_batches(std::span<std::uint64_t const> micro_batches,
                                                              micro_batch_problem_fn const& problem, micro_batch_options const& opt = {});

//! The parts of the transformer cost model that do not grow with the micro-batch (see the file
//! comment). Defaults are assumptions stated at each field; zeros leave `transformer_costs` as it is.
struct batch_efficiency {
  //! Launch and synchronization per kernel (microseconds). 4 us is an assumption of the order of a
  //! kernel launch and its stream synchronization on the host (the overhead NVIDIA's technical blog
  //! "Getting Started with CUDA Graphs", 2019, sets out to remove), not a measurement; CUDA graphs
  //! make it less. Calibrate (`fit_micro_batch_costs`) to replace it.
  double kernel_launch_us = 4;
  //! Kernels per op that produces a saved slot (the product and its elementwise epilogue); an
  //! assumption. A backward launches twice a forward's (data and weight gradients).
  double kernels_per_op = 2;
  //! Each matrix product reads its weights from HBM once per pass (a backward also writes the
  //! weight gradient): `w_half` at the roofline's ridge (see the file comment).
  bool weight_reads = true;
  //! The optimizer step once per step (`transformer_optimizer_us`).
  bool optimizer_step = true;
};

//! Adds the fixed work of `e` (kernel launches, weight reads) for `m` on `hw` with `t`'s layout to
//! `costs`, a table of `m` (`transformer_costs`' layers, dense then MoE): to each layer's forward,
//! backward, full recompute and per-slot recomputes. What `transformer_batch_costs` does; tide-plan
//! applies it after a calibration file replaced the link.
TIDE_INLINE void add_fixed_work(cost_table& costs, transformer_spec const& m, hardware_spec const& hw, training_spec const& t,
                                batch_efficiency const& e = {});

//! `transformer_costs(m, hw, t)` with the fixed work of `e` added (`add_fixed_work`).
[[nodiscard]] TIDE_INLINE cost_table transformer_batch_costs(transformer_spec const& m, hardware_spec const& hw, training_spec const& t,
                                                             batch_efficiency const& e = {});

//! The optimizer step of one GPU of `t`'s job (microseconds): Adam over its shard of the
//! parameters, bound by HBM bandwidth. It reads the master weights, the gradients and both
//! moments, writes the master weights and moments, and writes the compute copy:
//! `2 x master + gradient + 2 x optimizer + compute` bytes a parameter (30 with `training_spec`'s
//! defaults). Independent of the micro-batch.
[[nodiscard]] TIDE_INLINE double transformer_optimizer_us(transformer_spec const& m, hardware_spec const& hw, training_spec const& t);

//! The problems of `m` (its `micro_batch` replaced by each one asked) on `hw` with `t`'s layout:
//! the stack, `transformer_batch_costs` under `e`, the activation budget `device_memory` less the
//! resident memory at that micro-batch (0 when it does not fit: nothing is planned to fit), the
//! candidates with `training_collectives` (unless `base` gives candidates), the optimizer step
//! outside the schedule (with `e.optimizer_step`), and `seq_len x micro_batch` tokens. `base`
//! gives the host budget and the other planner settings.
[[nodiscard]] TIDE_INLINE micro_batch_problem_fn transformer_micro_batch_problems(transformer_spec const& m, hardware_spec const& hw,
                                                                                  training_spec const& t, std::size_t device_memory,
                                                                                  plan_options const& base = {}, batch_efficiency const& e = {});

//! A cost table measured at one micro-batch (`calibrate` on the stack at that micro-batch).
struct measured_costs {
  std::uint64_t micro_batch = 0;  //!< the micro-batch the table was measured at
  cost_table costs{};             //!< what `calibrate` measured
};

//! A cost table as a line in the micro-batch b: every compute and collective time is
//! `fixed + per_sample x b` (the file comment's efficiency model); the link, sync latency and
//! dispatch overhead do not depend on b and are `fixed`'s.
struct micro_batch_costs {
  cost_table fixed{};       //!< the intercepts, with the link and overheads
  cost_table per_sample{};  //!< the slopes (microseconds per unit of micro-batch)

  //! The table at micro-batch `b` (at least 1; `memory_bound_share` from `fixed`).
  [[nodiscard]] cost_table at(std::uint64_t b) const {
    if (b == 0) throw cost_model_error("tide: micro_batch_costs::at(0): give a micro-batch of at least 1");
    // The two tables must describe one stack, or the slopes would be read past their end.
    if (per_sample.layers.size() != fixed.layers.size())
      throw cost_model_error("tide: micro_batch_costs: `fixed` has " + std::to_string(fixed.layers.size()) + " layers and `per_sample` " +
                             std::to_string(per_sample.layers.size()) + ": give both tables for the same stack (fit_micro_batch_costs does)");
    for (std::size_t l = 0; l < fixed.layers.size(); ++l)
      if (per_sample.layers[l].slot_recompute_us.size() != fixed.layers[l].slot_recompute_us.size())
        throw cost_model_error("tide: micro_batch_costs: layer " + std::to_string(l) + " has " +
                               std::to_string(fixed.layers[l].slot_recompute_us.size()) + " per-slot recompute costs in `fixed` and " +
                               std::to_string(per_sample.layers[l].slot_recompute_us.size()) +
                               " in `per_sample`: give both tables for the same stack");
    for (std::size_t l = 0; l < fixed.layers.size(); ++l)
      if (fixed.layers[l].recompute_us.has_value() != per_sample.layers[l].recompute_us.has_value())
        throw cost_model_error("tide: micro_batch_costs: layer " + std::to_string(l) + " has " +
                               (fixed.layers[l].recompute_us ? "a measured recompute_us in `fixed` and none (\"as forward_us\") in `per_sample`: give its "
                                                               "recompute slope, 0 or more microseconds per sample"
                                                             : "no recompute_us (\"as forward_us\") in `fixed` and one in `per_sample`: give both, or neither"));
    auto c = fixed;
    auto const x = static_cast<double>(b);
    for (std::size_t l = 0; l < c.layers.size(); ++l) {
      auto& o = c.layers[l];
      auto const& s = per_sample.layers[l];
      o.forward_us += s.forward_us * x;
      o.backward_us += s.backward_us * x;
      if (o.recompute_us) *o.recompute_us += *s.recompute_us * x;
      for (std::size_t k = 0; k < o.slot_recompute_us.size(); ++k) o.slot_recompute_us[k] += s.slot_recompute_us[k] * x;
      o.gather_us += s.gather_us * x;
      o.regather_us += s.regather_us * x;
      o.reduce_us += s.reduce_us * x;
    }
    return c;
  }
};

//! Fits `micro_batch_costs` to tables measured at two or more distinct micro-batches (least
//! squares per field; a negative intercept refitted through the origin, a negative slope as a
//! constant). The link, sync latency, dispatch overhead and HBM bandwidth are the first table's.
//! Throws `cost_model_error` naming fewer than two micro-batches, one given twice, or tables that
//! differ in layers or slots.
[[nodiscard]] TIDE_INLINE micro_batch_costs fit_micro_batch_costs(std::span<measured_costs const> points);

#if TIDE_DEFINITIONS
TIDE_INLINE micro_batch_plan plan_micro_batches(std::span<std::uint64_t const> micro_batches,
                                                micro_batch_problem_fn const& problem, micro_batch_options const& opt) {
  if (micro_batches.empty())
    throw cost_model_error("tide: plan_micro_batches needs at least one micro-batch: give e.g. {1, 2, 4, 8}");
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    if (micro_batches[i] == 0) throw cost_model_error("tide: plan_micro_batches: micro-batch 0 processes nothing: give micro-batches of at least 1");
    for (std::size_t k = 0; k < i; ++k)
      if (micro_batches[k] == micro_batches[i])
        throw cost_model_error("tide: plan_micro_batches: micro-batch " + std::to_string(micro_batches[i]) +
                               " is given twice: give each once");
  }
  if (!problem) throw cost_model_error("tide: plan_micro_batches needs a problem function (e.g. transformer_micro_batch_problems)");
  micro_batch_plan r;
  for (auto const b : micro_batches) {
    auto const p = problem(b);
    if (!(p.tokens > 0 && p.tokens < std::numeric_limits<double>::infinity()) || !(p.outside_step_us >= 0 && p.outside_step_us <= cost_table::max_time_us))
      throw cost_model_error("tide: the problem at micro-batch " + std::to_string(b) +
                             " has tokens " + std::to_string(p.tokens) + " and outside_step_us " + std::to_string(p.outside_step_us) +
                             ": give finite tokens above 0 and a time from 0 to 1e12 microseconds");
    micro_batch_result x{.micro_batch = b, .chosen = make_plan(p.stack, p.costs, p.options), .tokens = p.tokens,
                         .outside_step_us = p.outside_step_us};
    if (x.chosen.fits) {
      x.step_us = x.chosen.step_us + p.outside_step_us;
      x.tokens_per_second = detail::per_second(p.tokens, x.step_us);
    }
    x.bound_tokens_per_second = detail::per_second(p.tokens, x.chosen.lower_bound_us + p.outside_step_us);
    if (x.fits() && (!r.best || x.tokens_per_second > r.results[*r.best].tokens_per_second ||
                     (x.tokens_per_second == r.results[*r.best].tokens_per_second && b < r.results[*r.best].micro_batch)))
      r.best = r.results.size();
    bool const stop = opt.stop_at_first_misfit && !x.fits();
    r.results.push_back(std::move(x));
    if (stop) break;
  }
  return r;
}

TIDE_INLINE micro_batch_costs fit_micro_batch_costs(std::span<measured_costs const> points) {
  if (points.size() < 2)
    throw cost_model_error("tide: fit_micro_batch_costs needs tables at two or more micro-batches, and has " +
                           std::to_string(points.size()) + ": calibrate at two micro-batches at least (e.g. 1 and 4)");
  auto const& first = points.front().costs;
  for (std::size_t i = 0; i < points.size(); ++i) {
    auto const& p = points[i];
    p.costs.check();
    if (p.micro_batch == 0) throw cost_model_error("tide: fit_micro_batch_costs: a table at micro-batch 0: give micro-batches of at least 1");
    for (std::size_t k = 0; k < i; ++k)
      if (points[k].micro_batch == p.micro_batch)
        throw cost_model_error("tide: fit_micro_batch_costs: micro-batch " + std::to_string(p.micro_batch) +
                               " is given twice: give tables at distinct micro-batches");
    if (p.costs.layers.size() != first.layers.size())
      throw cost_model_error("tide: fit_micro_batch_costs: the table at micro-batch " + std::to_string(p.micro_batch) + " has " +
                             std::to_string(p.costs.layers.size()) + " layers and the first " + std::to_string(first.layers.size()) +
                             ": calibrate the same stack at each micro-batch");
    for (std::size_t l = 0; l < first.layers.size(); ++l)
      if (p.costs.layers[l].slot_recompute_us.size() != first.layers[l].slot_recompute_us.size() ||
          p.costs.layers[l].recompute_us.has_value() != first.layers[l].recompute_us.has_value())
        throw cost_model_error("tide: fit_micro_batch_costs: layer " + std::to_string(l) + " of the table at micro-batch " +
                               std::to_string(p.micro_batch) + " has other slots or recompute entries than the first table's");
  }
  micro_batch_costs r{.fixed = first, .per_sample = first};
  std::vector<double> b, y;
  for (auto const& p : points) b.push_back(static_cast<double>(p.micro_batch));
  auto fit = [&](auto field, double& fixed, double& slope) {
    y.clear();
    for (auto const& p : points) y.push_back(field(p.costs));
    std::tie(fixed, slope) = detail::fit_line(b, y);
  };
  for (std::size_t l = 0; l < first.layers.size(); ++l) {
    auto& f = r.fixed.layers[l];
    auto& s = r.per_sample.layers[l];
    fit([&](cost_table const& c) { return c.layers[l].forward_us; }, f.forward_us, s.forward_us);
    fit([&](cost_table const& c) { return c.layers[l].backward_us; }, f.backward_us, s.backward_us);
    if (f.recompute_us) fit([&](cost_table const& c) { return *c.layers[l].recompute_us; }, *f.recompute_us, *s.recompute_us);
    for (std::size_t k = 0; k < f.slot_recompute_us.size(); ++k)
      fit([&](cost_table const& c) { return c.layers[l].slot_recompute_us[k]; }, f.slot_recompute_us[k], s.slot_recompute_us[k]);
    fit([&](cost_table const& c) { return c.layers[l].gather_us; }, f.gather_us, s.gather_us);
    fit([&](cost_table const& c) { return c.layers[l].regather_us; }, f.regather_us, s.regather_us);
    fit([&](cost_table const& c) { return c.layers[l].reduce_us; }, f.reduce_us, s.reduce_us);
  }
  return r;
}

TIDE_INLINE void add_fixed_work(cost_table& costs, transformer_spec const& m, hardware_spec const& hw, training_spec const& t,
                                batch_efficiency const& e) {
  if (!(e.kernel_launch_us >= 0 && e.kernel_launch_us <= 1e6) || !(e.kernels_per_op >= 0 && e.kernels_per_op <= 1e4))
    throw cost_model_error("tide: batch_efficiency has kernel_launch_us " + std::to_string(e.kernel_launch_us) + " and kernels_per_op " +
                           std::to_string(e.kernels_per_op) + ": give a time from 0 to 1e6 microseconds and a count from 0 to 10000");
  if (costs.layers.size() != m.layer_count)
    throw cost_model_error("tide: add_fixed_work: the cost table has " + std::to_string(costs.layers.size()) + " layers and '" +
                           std::string(m.name) + "' " + std::to_string(m.layer_count) + ": give the model's own table");
  detail::layer_fixed_work per_type[2];
  for (int moe = 0; moe < 2; ++moe)
    if (moe == 0 || m.experts > 0)
      per_type[moe] = detail::fixed_work(m, hw, t, moe == 1, e.kernel_launch_us, e.kernels_per_op, e.weight_reads);
  for (std::uint32_t l = 0; l < m.layer_count; ++l) {
    auto const& w = per_type[m.is_moe(l) ? 1 : 0];
    auto& c = costs.layers[l];
    c.forward_us += w.forward_us;
    c.backward_us += w.backward_us;
    if (c.recompute_us) *c.recompute_us += w.forward_us;
    for (std::size_t k = 0; k < c.slot_recompute_us.size() && k < w.slot_us.size(); ++k) c.slot_recompute_us[k] += w.slot_us[k];
  }
}

TIDE_INLINE cost_table transformer_batch_costs(transformer_spec const& m, hardware_spec const& hw, training_spec const& t,
                                               batch_efficiency const& e) {
  auto c = transformer_costs(m, hw, t);
  add_fixed_work(c, m, hw, t, e);
  return c;
}

TIDE_INLINE double transformer_optimizer_us(transformer_spec const& m, hardware_spec const& hw, training_spec const& t) {
  if (!(hw.hbm_bytes_per_second > 0)) return 0;
  auto const r = transformer_resident_memory(m, hw, t);
  double const params = t.master_weight_bytes > 0 ? static_cast<double>(r.weights) / t.master_weight_bytes : 0;
  double const bytes = params * (2 * t.master_weight_bytes + t.gradient_bytes + 2 * t.optimizer_bytes + t.compute_weight_bytes);
  return bytes / hw.hbm_bytes_per_second * 1e6;
}

TIDE_INLINE micro_batch_problem_fn transformer_micro_batch_problems(transformer_spec const& m, hardware_spec const& hw,
                                                                    training_spec const& t, std::size_t device_memory,
                                                                    plan_options const& base, batch_efficiency const& e) {
  return [=](std::uint64_t b) {
    auto mb = m;
    mb.micro_batch = b;
    micro_batch_problem p{.stack = transformer_stack(mb), .costs = transformer_batch_costs(mb, hw, t, e), .options = base};
    auto const resident = transformer_resident_memory(mb, hw, t).total();
    p.options.resident_bytes = resident;
    p.options.device_budget = resident < device_memory ? device_memory - resident : 0;
    if (p.options.candidates.empty()) p.options.candidates = default_candidates(p.stack, 0, training_collectives(t));
    p.tokens = static_cast<double>(mb.tokens());
    p.outside_step_us = e.optimizer_step ? transformer_optimizer_us(mb, hw, t) : 0;
    return p;
  };
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
