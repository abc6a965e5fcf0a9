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
//! Backwards run in micro-batch order in both, so weight gradients accumulate in the same order on
//! every stage and in a one-process run of the same micro-batches.
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
};

//! "gpipe" or "1f1b", as the examples' `--pp-schedule` spells them.
[[nodiscard]] constexpr std::string_view to_string(stage_order o) noexcept {
  return o == stage_order::gpipe ? "gpipe" : "1f1b";
}

//! A stage's place in its pipeline and its order, by name:
//! `tide::stage_spec{.stage = 1, .stages = 4, .micro_batches = 8}`.
struct stage_spec {
  std::uint32_t stage = 0;          //!< this stage, from 0 (the first: it reads the inputs)
  std::uint32_t stages = 1;         //!< stages in the pipeline (the last computes the loss)
  std::uint32_t micro_batches = 1;  //!< micro-batches a step
  stage_order order = stage_order::one_f_one_b;  //!< the order of its forwards and backwards
};

//! Most stages a stage order takes.
inline constexpr std::uint32_t max_stages = 4096;
//! Most micro-batches a step (a stage's order is 2 x micro_batches entries).
inline constexpr std::uint32_t max_micro_batches = 1u << 20;

//! A forward or a backward of one micro-batch over all of a stage's layers.
enum class stage_pass : std::uint8_t { forward, backward };

//! One entry of a stage's order.
struct stage_step {
  stage_pass pass = stage_pass::forward;  //!< a forward or a backward
  std::uint32_t micro_batch = 0;          //!< of which micro-batch
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
  if (s.order != stage_order::gpipe && s.order != stage_order::one_f_one_b) return "stage_spec::order is not a stage_order";
  if (s.order == stage_order::one_f_one_b && s.micro_batches < s.stages)
    return "1F1B needs at least as many micro-batches as stages (stage_spec::micro_batches >= stages) to reach its steady state; "
           "with fewer, every stage runs all its forwards before a backward: give more micro-batches, or stage_order::gpipe";
  return {};
}

//! Entry `i` of `s`'s order (`s` valid, `i < 2 * micro_batches`).
constexpr stage_step stage_step_at(stage_spec const& s, std::uint32_t i) noexcept {
  auto const m = s.micro_batches;
  if (s.order == stage_order::gpipe)
    return i < m ? stage_step{stage_pass::forward, i} : stage_step{stage_pass::backward, i - m};
  auto const warmup = s.stages - s.stage - 1;  // <= m - 1: one_f_one_b needs m >= stages
  if (i < warmup) return {stage_pass::forward, i};
  auto const j = i - warmup;                // the steady state's pairs, then the cool-down
  if (j < 2 * (m - warmup)) return j % 2 == 0 ? stage_step{stage_pass::forward, warmup + j / 2} : stage_step{stage_pass::backward, j / 2};
  return {stage_pass::backward, (m - warmup) + (j - 2 * (m - warmup))};
}
}  // namespace detail

//! Throws `schedule_error` naming the field when `s` is not a stage of a pipeline it can order.
constexpr void check_stage(stage_spec const& s) {
  if (auto const p = detail::stage_spec_problem(s); !p.empty()) throw schedule_error("tide: " + std::string(p));
}

//! The order of `s`'s step: 2 x micro_batches entries, each micro-batch's forward before its
//! backward. Throws `schedule_error` for a stage `check_stage` refuses.
[[nodiscard]] inline std::vector<stage_step> stage_steps(stage_spec const& s) {
  check_stage(s);
  std::vector<stage_step> r(2 * static_cast<std::size_t>(s.micro_batches));
  for (std::uint32_t i = 0; i < r.size(); ++i) r[i] = detail::stage_step_at(s, i);
  return r;
}

//! Micro-batches whose forward ran and whose backward has not, most at once over `s`'s step
//! (their saved data is what the stage holds): `micro_batches` under GPipe, `stages - stage`
//! under 1F1B.
[[nodiscard]] constexpr std::uint32_t peak_in_flight(stage_spec const& s) {
  if (auto const p = detail::stage_spec_problem(s); !p.empty()) throw schedule_error("tide: " + std::string(p));
  std::uint32_t live = 0, peak = 0;
  for (std::uint32_t i = 0; i < 2 * s.micro_batches; ++i) {
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
  std::array<stage_step, 2 * std::size_t{S.micro_batches}> r{};
  for (std::uint32_t i = 0; i < r.size(); ++i) r[i] = detail::stage_step_at(S, i);
  return r;
}();

}  // namespace tide
