#pragma once
//! \file
//! Tuning by measurement: the planner's choice checked on the real backend. A plan's step time is
//! a prediction (the sim under a cost table); two plans predicted within a few percent of each
//! other may measure in either order. `tune` runs a few candidates (e.g. the best micro-batches
//! of `plan_micro_batches`, `tune_candidates`) through a callable that runs one step of a
//! candidate on the real backend and returns its time, round-robin (every round measures every
//! candidate once, so drift in the machine's load reaches all of them alike) and repeated, takes
//! each candidate's median, and keeps the most tokens (or samples) per second measured. The report
//! puts each candidate's prediction beside its measurement.
//!
//! Training runs a configuration's steps back to back; round-robin switches configurations every
//! step. Where switching costs something of its own (on a 2-vCPU VM, a host-backend schedule
//! switched in after another measured up to 40% slower for its next few steps: its copy threads
//! woke late, and the lateness grew over rounds), `tune_options::settle` runs that many uncounted
//! steps at the start of each candidate's turn, so that the counted one is measured as training
//! would run it, while the rounds stay interleaved.
//!
//! The chosen candidate is a micro-batch and a `strategy`: `build_schedule(stack_at(micro_batch),
//! strategy)` replays it exactly, and a policy file (`io::write_policy_file`, <tide/io/json.hpp>)
//! saves the strategy (from `tests/plan/tune_test.cpp`):
//! \snippet plan/tune_test.cpp tune_save_replay

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/strategy.hpp>
#include <tide/plan/detail/median.hpp>
#include <tide/plan/micro_batch.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! One configuration `tune` measures: a strategy at a micro-batch, with its prediction.
struct tune_candidate {
  std::string name{};             //!< what reports and errors call it (e.g. "planner @ 2")
  std::uint64_t micro_batch = 0;  //!< the micro-batch (at least 1)
  tide::strategy strategy{};      //!< builds the schedule at that micro-batch
  double tokens = 0;              //!< tokens (or samples) one step processes: what "per second" counts
  //! The predicted step (microseconds; the sim's step plus what runs outside the schedule); 0: none.
  double predicted_step_us = 0;
};

//! Runs one step of a candidate on the real backend and returns its time in microseconds (above
//! 0). Called `(tune_options::warmups + repeats) x (1 + settle)` times per candidate, a turn of
//! `1 + settle` calls at a time, interleaved with the others; it may keep per-candidate state (an
//! executor, a model) between calls.
using tune_step_fn = std::function<double(tune_candidate const&)>;

//! How `tune` measures.
struct tune_options {
  //! The most rounds `repeats` and `warmups` may each ask for, and `settle` steps: each round runs
  //! every candidate once, a real training step, so more is a mistake (and their sum must not overflow).
  static constexpr int max_rounds = 100'000;
  int repeats = 5;  //!< measured rounds (at least 1); each candidate's time is the median of these
  int warmups = 1;  //!< rounds run first and not counted (at least 0): caches, arenas, threads
  //! Uncounted steps at the start of each candidate's turn in every round (at least 0), back to
  //! back before the counted one: the counted step then runs as the second or later of a run of
  //! steps, as in training, not the first after another candidate's (see the file comment).
  int settle = 0;
};

//! One candidate's measurement.
struct tune_result {
  tune_candidate candidate{};  //!< what was measured
  std::vector<double> samples_us{};  //!< the measured steps, in the order taken (one per round)
  double median_us = 0;              //!< the median of `samples_us`
  double tokens_per_second = 0;      //!< `tokens` over the median step
  //! `tokens` over the predicted step (0: no prediction).
  double predicted_tokens_per_second = 0;
  //! How far the prediction is from the measurement: `predicted / median - 1` (0: no prediction).
  [[nodiscard]] double prediction_error() const noexcept {
    return candidate.predicted_step_us > 0 && median_us > 0 ? candidate.predicted_step_us / median_us - 1 : 0;
  }
  //! The spread of the samples: `(max - min) / median` (the measurement's noise, roughly).
  [[nodiscard]] double spread() const noexcept {
    if (samples_us.empty() || !(median_us > 0)) return 0;
    auto const [lo, hi] = std::minmax_element(samples_us.begin(), samples_us.end());
    return (*hi - *lo) / median_us;
  }
};

//! `tune`'s answer: every candidate measured, in the order given, and the measured best.
struct tune_report {
  std::vector<tune_result> results{};  //!< one per candidate, in the order given
  std::size_t best = 0;  //!< the index of the most tokens per second measured (the earlier on a tie)
  //! The predicted best's index (the most predicted tokens per second), or none when no candidate
  //! has a prediction: where measurement and prediction disagree, the two differ.
  std::optional<std::size_t> predicted_best{};

  //! The measured best.
  [[nodiscard]] tune_result const& chosen() const { return results.at(best); }
  //! The largest `|prediction_error()|` over the candidates with a prediction.
  [[nodiscard]] double worst_prediction_error() const noexcept {
    double r = 0;
    for (auto const& x : results) r = std::max(r, std::abs(x.prediction_error()));
    return r;
  }
};

//! Measures `candidates` with `measure` (see the file comment) and keeps the most tokens per
//! second. Throws `cost_model_error` naming no candidates, a candidate without a name, at
//! micro-batch 0 or without tokens, two with one name, `repeats`, `warmups` or `settle` outside
//! their ranges (up to `tune_options::max_rounds`), no callable, a step time that is not a
//! positive finite number, and tokens over a step that are not a finite rate (naming the candidate); what
//! `measure` throws is rethrown as a `tide::error` that names the candidate and the round and
//! nests the original (`std::rethrow_if_nested`).
[[nodiscard]] TIDE_INLINE tune_report tune(std::span<tune_candidate const> candidates, tune_step_fn const& measure,
                                      tune_options const& opt = {});

//! The `count` micro-batches of `p` with the most predicted tokens per second (that fit), best
//! first, as candidates named `prefix + " @ " + micro-batch`. Empty when nothing fits; throws
//! `cost_model_error` for a count of 0.
[[nodiscard]] TIDE_INLINE std::vector<tune_candidate> tune_candidates(micro_batch_plan const& p, std::size_t count,
                                                                 std::string const& prefix = "plan");

#if TIDE_DEFINITIONS
TIDE_INLINE tune_report tune(std::span<tune_candidate const> candidates, tune_step_fn const& measure,
                                      tune_options const& opt) {
  if (candidates.empty())
    throw cost_model_error("tide: tune needs at least one candidate: give e.g. tune_candidates(plan_micro_batches(...), 3, ...)");
  auto const most = std::to_string(tune_options::max_rounds);
  if (opt.repeats < 1 || opt.repeats > tune_options::max_rounds)
    throw cost_model_error("tide: tune_options::repeats is " + std::to_string(opt.repeats) + ": give 1 to " + most +
                           " measured rounds (5 or more for a median that resists noise)");
  if (opt.warmups < 0 || opt.warmups > tune_options::max_rounds)
    throw cost_model_error("tide: tune_options::warmups is " + std::to_string(opt.warmups) + ": give 0 to " + most + " warm-up rounds");
  if (opt.settle < 0 || opt.settle > tune_options::max_rounds)
    throw cost_model_error("tide: tune_options::settle is " + std::to_string(opt.settle) + ": give 0 to " + most +
                           " uncounted steps at the start of each candidate's turn");
  if (!measure) throw cost_model_error("tide: tune needs a callable that runs one step of a candidate and returns its microseconds");
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    auto const& c = candidates[i];
    auto const who = "tide: tune: candidate " + std::to_string(i) + " ('" + c.name + "')";
    if (c.name.empty()) throw cost_model_error(who + " has no name: name each candidate (reports and errors use it)");
    if (c.micro_batch == 0) throw cost_model_error(who + " is at micro-batch 0: give a micro-batch of at least 1");
    if (!(c.tokens > 0) || !std::isfinite(c.tokens))
      throw cost_model_error(who + " has tokens " + std::to_string(c.tokens) + ": give the tokens (or samples) one step processes, above 0");
    if (!(c.predicted_step_us >= 0) || !std::isfinite(c.predicted_step_us))
      throw cost_model_error(who + " has predicted_step_us " + std::to_string(c.predicted_step_us) + ": give 0 (none) or a positive time");
    for (std::size_t k = 0; k < i; ++k)
      if (candidates[k].name == c.name) throw cost_model_error(who + " has the name of candidate " + std::to_string(k) + ": give each its own");
  }
  tune_report r;
  r.results.reserve(candidates.size());
  for (auto const& c : candidates) {
    auto& x = r.results.emplace_back();
    x.candidate = c;
    x.samples_us.reserve(static_cast<std::size_t>(opt.repeats));
  }
  // Round-robin: round k measures every candidate once, in the order given, each turn `settle`
  // uncounted steps and the counted one.
  for (int round = 0; round < opt.warmups + opt.repeats; ++round) {
    for (auto& x : r.results) {
      for (int step = 0; step <= opt.settle; ++step) {
        auto const& c = x.candidate;
        auto const where = "tide: tune: candidate '" + c.name + "' (micro-batch " + std::to_string(c.micro_batch) + "), " +
                           (round < opt.warmups ? "warm-up round " + std::to_string(round + 1)
                                                : "round " + std::to_string(round - opt.warmups + 1)) +
                           (step < opt.settle ? ", settling step " + std::to_string(step + 1) : std::string()) + ": ";
        double us = 0;
        try {
          us = measure(c);
        } catch (std::exception const& e) {
          std::throw_with_nested(error(where + "the step failed: " + e.what()));
        } catch (...) {
          std::throw_with_nested(error(where + "the step failed with a non-standard exception"));
        }
        if (!(us > 0) || !std::isfinite(us))
          throw cost_model_error(where + "the step took " + std::to_string(us) +
                                 " microseconds: return the step's time, a positive finite number of microseconds");
        if (round >= opt.warmups && step == opt.settle) x.samples_us.push_back(us);
      }
    }
  }
  for (std::size_t i = 0; i < r.results.size(); ++i) {
    auto& x = r.results[i];
    x.median_us = detail::midpoint_median(x.samples_us);
    x.tokens_per_second = x.candidate.tokens / (x.median_us * 1e-6);
    // Tokens over a time that is positive and finite can still overflow (1e308 tokens, a step of
    // 5e-324 us): an infinite rate would win every comparison.
    auto const rate_error = [&](char const* what, double step_us) {
      return cost_model_error("tide: tune: candidate '" + x.candidate.name + "': " + std::to_string(x.candidate.tokens) +
                              " tokens over a " + what + " step of " + std::to_string(step_us) +
                              " microseconds is not a finite rate: give the tokens one step processes and its time in microseconds");
    };
    if (!std::isfinite(x.tokens_per_second)) throw rate_error("measured (median)", x.median_us);
    if (x.candidate.predicted_step_us > 0) {
      x.predicted_tokens_per_second = x.candidate.tokens / (x.candidate.predicted_step_us * 1e-6);
      if (!std::isfinite(x.predicted_tokens_per_second)) throw rate_error("predicted", x.candidate.predicted_step_us);
      if (!r.predicted_best || x.predicted_tokens_per_second > r.results[*r.predicted_best].predicted_tokens_per_second)
        r.predicted_best = i;
    }
    if (x.tokens_per_second > r.results[r.best].tokens_per_second) r.best = i;
  }
  return r;
}

TIDE_INLINE std::vector<tune_candidate> tune_candidates(micro_batch_plan const& p, std::size_t count,
                                                                 std::string const& prefix) {
  if (count == 0) throw cost_model_error("tide: tune_candidates: a count of 0 tunes nothing: give at least 1 (e.g. 3)");
  std::vector<micro_batch_result const*> fit;
  for (auto const& x : p.results)
    if (x.fits()) fit.push_back(&x);
  std::stable_sort(fit.begin(), fit.end(), [](auto const* a, auto const* b) { return a->tokens_per_second > b->tokens_per_second; });
  if (fit.size() > count) fit.resize(count);
  std::vector<tune_candidate> r;
  for (auto const* x : fit)
    r.push_back({.name = prefix + " @ " + std::to_string(x->micro_batch),
                 .micro_batch = x->micro_batch,
                 .strategy = x->chosen.strategy,
                 .tokens = x->tokens,
                 .predicted_step_us = x->step_us});
  return r;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
