#pragma once
//! \file
//! Stage orders: in which order a pipeline stage runs its micro-batches' forwards and backwards.
//! A model split into `stages` consecutive parts (stage 0 first) trains `micro_batches`
//! micro-batches a step; each stage runs every micro-batch's forward over its layers and, later,
//! its backward, in the order its `stage_order` says:
//!
//! - `stage_order::gpipe`: every forward, then every backward (Huang et al., GPipe, 2019). Every
//!   micro-batch's saved data is in flight on every stage at the turn.
//! - `stage_order::one_f_one_b`: `stages - stage - 1` warm-up forwards, then one forward and one
//!   backward in turn, then the cool-down backwards (PipeDream-Flush; Megatron-LM's default). Stage
//!   `s` holds at most `stages - s` micro-batches' saved data; the ones whose forwards run before
//!   its first backward wait longest for their backward (`time_stages` times the waits).
//!
//! - `stage_order::interleaved`: each stage holds `virtual_stages` (v) chunks of the model, v
//!   non-contiguous groups of layers (stage s's chunk c is virtual stage c * stages + s, so a
//!   micro-batch passes every stage v times, stage S - 1's chunk c feeding stage 0's chunk c + 1),
//!   in Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21): forwards in groups of `stages`
//!   micro-batches per chunk, backwards likewise from the last chunk, `(stages - stage - 1) * 2 +
//!   (v - 1) * stages` warm-up forwards (every one when `micro_batches == stages`). The bubble
//!   shrinks v times, to (S - 1) / (v M) of the compute time; each stage holds more (chunk, micro-batch)
//!   units in flight, each 1/v of its layers. It needs `micro_batches` a multiple of `stages`.
//!
//! Under GPipe and 1F1B backwards run in micro-batch order, so weight gradients accumulate in the
//! same order on every stage and in a one-process run of the same micro-batches; interleaved, each
//! chunk's backwards run in micro-batch order (each chunk's weights are its own).
//!
//! "Stage" and "stage order" are this header's words: `pipeline_spec` is the copy pipeline
//! (prefetch distance, chunks, latency hiding) and `schedule` the op program of one stage's step.
//! `stage_steps` gives the order at run time; `stage_steps_v` the same as a `constexpr` array.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/error.hpp>

namespace tide {

//! How a stage orders its micro-batches' forwards and backwards (see the file comment).
enum class stage_order : std::uint8_t {
  gpipe,        //!< all forwards, then all backwards
  one_f_one_b,  //!< warm-up forwards, one forward one backward, cool-down backwards
  interleaved,  //!< 1F1B over `virtual_stages` chunks per stage (Megatron-LM's interleaved schedule)
};

//! "gpipe", "1f1b" or "interleaved", as the examples' `--pp-schedule` spells them.
[[nodiscard]] constexpr std::string_view to_string(stage_order o) noexcept {
  return o == stage_order::gpipe ? "gpipe" : o == stage_order::one_f_one_b ? "1f1b" : "interleaved";
}

//! A stage's place in its pipeline and its order, by name:
//! `tide::stage_spec{.stage = 1, .stages = 4, .micro_batches = 8}`.
struct stage_spec {
  std::uint32_t stage = 0;          //!< this stage, from 0 (the first: it reads the inputs)
  std::uint32_t stages = 1;         //!< stages in the pipeline (the last computes the loss)
  std::uint32_t micro_batches = 1;  //!< micro-batches a step
  stage_order order = stage_order::one_f_one_b;  //!< the order of its forwards and backwards
  //! Chunks per stage (v): 1 but under `stage_order::interleaved`, which takes 2 or more
  std::uint32_t virtual_stages = 1;
  //! Units of the step: (chunk, micro-batch) pairs, `micro_batches * virtual_stages` (of a spec
  //! `check_stage` accepts: at most 2^28; unchecked fields may wrap).
  [[nodiscard]] constexpr std::uint32_t units() const noexcept { return micro_batches * virtual_stages; }
};

//! Where chunk `chunk`'s micro-batch `micro_batch` is in per-unit tables (`stage_policies::of_micro_batch`,
//! a stage schedule's tables): `chunk * micro_batches + micro_batch`.
[[nodiscard]] constexpr std::uint32_t stage_unit(stage_spec const& s, std::uint32_t chunk, std::uint32_t micro_batch) noexcept {
  return chunk * s.micro_batches + micro_batch;
}

//! Most stages a stage order takes.
inline constexpr std::uint32_t max_stages = 4096;
//! Most micro-batches a step (a stage's order is 2 x micro_batches x virtual_stages entries).
inline constexpr std::uint32_t max_micro_batches = 1u << 20;
//! Most chunks a stage holds under `stage_order::interleaved`.
inline constexpr std::uint32_t max_virtual_stages = 256;

//! A forward or a backward of one micro-batch over all of a stage's layers (of one chunk's,
//! interleaved).
enum class stage_pass : std::uint8_t { forward, backward };

//! One entry of a stage's order.
struct stage_step {
  stage_pass pass = stage_pass::forward;  //!< a forward or a backward
  std::uint32_t micro_batch = 0;          //!< of which micro-batch
  std::uint32_t chunk = 0;                //!< over which of the stage's chunks (0 but interleaved)
  friend constexpr bool operator==(stage_step const&, stage_step const&) = default;
};

namespace detail {
//! The first problem with `s`, or empty.
constexpr std::string_view stage_spec_problem(stage_spec const& s) noexcept {
  if (s.stages == 0) return "stage_spec::stages is 0: give at least 1";
  if (s.stages > max_stages) return "stage_spec::stages is above tide::max_stages (4096)";
  if (s.stage >= s.stages) return "stage_spec::stage is not below stage_spec::stages: stages count from 0";
  if (s.micro_batches == 0) return "stage_spec::micro_batches is 0: give at least 1";
  if (s.micro_batches > max_micro_batches) return "stage_spec::micro_batches is above tide::max_micro_batches (1048576)";
  if (s.order != stage_order::gpipe && s.order != stage_order::one_f_one_b && s.order != stage_order::interleaved)
    return "stage_spec::order is not a stage_order";
  if (s.virtual_stages == 0) return "stage_spec::virtual_stages is 0: give 1 (one chunk a stage), or 2 or more with stage_order::interleaved";
  if (s.virtual_stages > max_virtual_stages) return "stage_spec::virtual_stages is above tide::max_virtual_stages (256)";
  if (s.order != stage_order::interleaved && s.virtual_stages != 1)
    return "stage_spec::virtual_stages is above 1, but only stage_order::interleaved runs several chunks a stage: give "
           ".order = tide::stage_order::interleaved, or virtual_stages 1";
  if (s.order == stage_order::one_f_one_b && s.micro_batches < s.stages)
    return "1F1B needs at least as many micro-batches as stages (stage_spec::micro_batches >= stages) to reach its steady state; "
           "with fewer, every stage runs all its forwards before a backward: give more micro-batches, or stage_order::gpipe";
  if (s.order == stage_order::interleaved) {
    if (s.virtual_stages < 2)
      return "stage_order::interleaved needs stage_spec::virtual_stages of 2 or more (chunks per stage); with one chunk a "
             "stage, give stage_order::one_f_one_b";
    if (s.stages < 2) return "stage_order::interleaved needs 2 stages or more: a single stage has no one to interleave with";
    if (s.micro_batches % s.stages != 0)
      return "stage_order::interleaved needs stage_spec::micro_batches to be a multiple of stages (its forwards run in groups of "
             "`stages` micro-batches per chunk, as Megatron-LM's do): round the micro-batches to a multiple of the stages";
  }
  return {};
}

//! The forwards `s` runs before its steady state (`s` valid): every one under GPipe.
constexpr std::uint32_t warmup_length(stage_spec const& s) noexcept {
  auto const total = s.units();
  if (s.order == stage_order::gpipe) return total;
  if (s.order == stage_order::one_f_one_b) return s.stages - s.stage - 1;  // <= M - 1: 1F1B needs M >= stages
  if (s.micro_batches == s.stages) return total;  // Megatron-LM: all forwards, then all backwards
  auto const w = std::uint64_t{s.stages - s.stage - 1} * 2 + std::uint64_t{s.virtual_stages - 1} * s.stages;
  return w < total ? static_cast<std::uint32_t>(w) : total;
}

//! The `k`-th forward (or backward) of `s`'s order: its (chunk, micro-batch) unit.
constexpr stage_step nth_pass(stage_spec const& s, stage_pass pass, std::uint32_t k) noexcept {
  if (s.order != stage_order::interleaved) return {pass, k, 0};
  auto const group = s.stages * s.virtual_stages;  // `stages` micro-batches of each chunk in turn
  auto const c = (k % group) / s.stages;
  auto const m = (k / group) * s.stages + k % s.stages;
  return {pass, m, pass == stage_pass::forward ? c : s.virtual_stages - 1 - c};
}

//! Entry `i` of `s`'s order (`s` valid, `i < 2 * units`): the warm-up forwards, then a forward
//! and a backward in turn, then the cool-down backwards.
constexpr stage_step stage_step_at(stage_spec const& s, std::uint32_t i) noexcept {
  auto const total = s.units();
  auto const warmup = warmup_length(s);
  if (i < warmup) return nth_pass(s, stage_pass::forward, i);
  auto const j = i - warmup;  // the steady state's pairs, then the cool-down
  if (j < 2 * (total - warmup))
    return j % 2 == 0 ? nth_pass(s, stage_pass::forward, warmup + j / 2) : nth_pass(s, stage_pass::backward, j / 2);
  return nth_pass(s, stage_pass::backward, (total - warmup) + (j - 2 * (total - warmup)));
}
}  // namespace detail

//! Throws `schedule_error` naming the field when `s` is not a stage of a pipeline it can order.
constexpr void check_stage(stage_spec const& s) {
  if (auto const p = detail::stage_spec_problem(s); !p.empty()) throw schedule_error("tide: " + std::string(p));
}

//! The order of `s`'s step: 2 x units entries (micro-batches x virtual stages), each unit's
//! forward before its backward. Throws `schedule_error` for a stage `check_stage` refuses.
[[nodiscard]] inline std::vector<stage_step> stage_steps(stage_spec const& s) {
  check_stage(s);
  std::vector<stage_step> r(2 * static_cast<std::size_t>(s.units()));
  for (std::uint32_t i = 0; i < r.size(); ++i) r[i] = detail::stage_step_at(s, i);
  return r;
}

//! Units (micro-batches; interleaved, (chunk, micro-batch) pairs) whose forward ran and whose
//! backward has not, most at once over `s`'s step (their saved data is what the stage holds):
//! `micro_batches` under GPipe, `stages - stage` under 1F1B, interleaved one more than its
//! warm-up (each unit 1/v of the stage's layers).
[[nodiscard]] constexpr std::uint32_t peak_in_flight(stage_spec const& s) {
  if (auto const p = detail::stage_spec_problem(s); !p.empty()) throw schedule_error("tide: " + std::string(p));
  std::uint32_t live = 0, peak = 0;
  for (std::uint32_t i = 0; i < 2 * s.units(); ++i) {
    if (detail::stage_step_at(s, i).pass == stage_pass::forward) peak = live + 1 > peak ? live + 1 : peak, ++live;
    else --live;
  }
  return peak;
}

//! `stage_steps` at compile time: `tide::stage_steps_v<tide::stage_spec{.stage = 0, .stages = 4,
//! .micro_batches = 8}>`. A stage `check_stage` refuses does not compile.
template <stage_spec S>
inline constexpr auto stage_steps_v = [] {
  static_assert(detail::stage_spec_problem(S).empty(),
                "tide::stage_steps_v: the stage_spec is refused (tide::check_stage names why; 1F1B needs micro_batches >= stages)");
  std::array<stage_step, 2 * std::size_t{S.micro_batches} * S.virtual_stages> r{};
  for (std::uint32_t i = 0; i < r.size(); ++i) r[i] = detail::stage_step_at(S, i);
  return r;
}();

}  // namespace tide
