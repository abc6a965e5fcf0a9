#pragma once
//! \file
//! How a model's layers are split over a pipeline's stages: one contiguous group a stage, in model
//! order, of any size. Llama 3 405B's first and last stages hold one layer fewer, as they also run
//! the embedding and the head (Meta, arXiv 2407.21783, section 3.3.2). Each stage builds its step
//! from its own group (`build_stage_schedule` takes any stack), so an uneven partition needs only
//! the layer counts; this header says which layers a stage runs and refuses a partition that does
//! not cover the model. `tide::partition_by_cost` (plan/partition.hpp) derives one from per-layer
//! costs.

#include <cstdint>
#include <string>
#include <vector>

#include <tide/core/error.hpp>

namespace tide {

//! The model's layers per stage, in pipeline order: stage `s` runs `layers[s]` consecutive layers,
//! after those of the stages before it. Interleaved (v chunks a stage), one entry per virtual
//! stage, in model order: stage s's chunk c is entry `c * stages + s` (stage 0's chunks 0 and 1 of
//! a 2-stage pipeline are entries 0 and 2); check it with `stages * v` stages.
struct stage_partition {
  std::vector<std::uint32_t> layers{};  //!< per (virtual) stage: how many of the model's layers it runs
};

//! Throws `schedule_error` naming what is wrong when `p` does not split `model_layers` layers over
//! `stages` stages: another number of entries, a stage with no layer, a sum that is not the model's.
constexpr void check_partition(stage_partition const& p, std::uint32_t stages, std::uint32_t model_layers) {
  auto const fail = [](std::string const& m) { throw schedule_error("tide::check_partition: " + m); };
  if (p.layers.size() != stages)
    fail("stage_partition::layers has " + std::to_string(p.layers.size()) + " entries for " + std::to_string(stages) +
         " stages: give one layer count per stage");
  std::uint64_t sum = 0;
  for (std::size_t s = 0; s < p.layers.size(); ++s) {
    if (p.layers[s] == 0) fail("stage " + std::to_string(s) + " gets no layer: give every stage at least one");
    sum += p.layers[s];
  }
  if (sum != model_layers)
    fail("the partition gives " + std::to_string(sum) + " layers to its stages, but the model has " +
         std::to_string(model_layers) + ": the counts must add up to the model's layers");
}

namespace detail {
constexpr void check_partition_size(stage_partition const& p, std::uint32_t stages, std::uint32_t virtual_stages) {
  if (stages == 0 || virtual_stages == 0 || p.layers.size() != std::size_t{stages} * virtual_stages)
    throw schedule_error("tide::chunks_of: the partition has " + std::to_string(p.layers.size()) + " entries, not one per chunk of " +
                         std::to_string(stages) + " stages of " + std::to_string(virtual_stages) +
                         " chunks: give stages x virtual_stages layer counts");
}
}  // namespace detail

//! How a stage's layers split into its chunks under `stage_order::interleaved`
//! (`build_stage_schedule`): chunk c runs `layers[c]` of them, after the chunks before it. Empty:
//! as many to each chunk.
struct stage_chunks {
  std::vector<std::uint32_t> layers{};  //!< per chunk: how many of the stage's layers it runs
};

//! Stage `stage`'s chunks in an interleaved partition `p` of `stages * virtual_stages` entries
//! (checked): entries `stage`, `stages + stage`, ...
[[nodiscard]] constexpr stage_chunks chunks_of(stage_partition const& p, std::uint32_t stage, std::uint32_t stages,
                                               std::uint32_t virtual_stages) {
  detail::check_partition_size(p, stages, virtual_stages);
  if (stage >= stages)
    throw schedule_error("tide::chunks_of: stage " + std::to_string(stage) + " of " + std::to_string(stages) + ": stages count from 0");
  stage_chunks r;
  for (std::uint32_t c = 0; c < virtual_stages; ++c) r.layers.push_back(p.layers[std::size_t{c} * stages + stage]);
  return r;
}

//! The model's layers stage `stage` runs, in the stage's order (its chunks' in turn: what
//! `ctx.layer` counts), under `p` with one entry per virtual stage (`stages * virtual_stages`,
//! checked as `chunks_of` checks it).
[[nodiscard]] constexpr std::vector<std::uint32_t> model_layers_of(stage_partition const& p, std::uint32_t stage, std::uint32_t stages,
                                                                  std::uint32_t virtual_stages = 1) {
  auto const chunks = chunks_of(p, stage, stages, virtual_stages);
  std::vector<std::uint32_t> r;
  for (std::uint32_t c = 0; c < virtual_stages; ++c) {
    std::uint32_t first = 0;
    for (std::uint32_t j = 0; j < c * stages + stage; ++j) first += p.layers[j];
    for (std::uint32_t l = 0; l < chunks.layers[c]; ++l) r.push_back(first + l);
  }
  return r;
}

//! The first of the model's layers (virtual) stage `stage` runs (`p` checked, `stage` below its stages).
[[nodiscard]] constexpr std::uint32_t first_layer(stage_partition const& p, std::uint32_t stage) noexcept {
  std::uint32_t first = 0;
  for (std::uint32_t s = 0; s < stage; ++s) first += p.layers[s];
  return first;
}

//! The stage that runs the model's layer `layer` (`p` checked, `layer` below the model's layers).
[[nodiscard]] constexpr std::uint32_t stage_of_layer(stage_partition const& p, std::uint32_t layer) noexcept {
  std::uint32_t s = 0;
  for (std::uint32_t end = p.layers[0]; layer >= end; end += p.layers[++s]) {
  }
  return s;
}

//! `model_layers` over `stages` as evenly as counts allow, the extra layers to the middle stages
//! (so the first and last, which also run the embedding and the head, are the lighter ones).
//! Throws `schedule_error` for no stage, or more stages than layers.
[[nodiscard]] constexpr stage_partition even_partition(std::uint32_t model_layers, std::uint32_t stages) {
  if (stages == 0) throw schedule_error("tide::even_partition: no stages: give at least 1");
  if (model_layers < stages)
    throw schedule_error("tide::even_partition: " + std::to_string(model_layers) + " layers cannot give each of " +
                         std::to_string(stages) + " stages one: use fewer stages");
  stage_partition p{std::vector<std::uint32_t>(stages, model_layers / stages)};
  // The extra layers to the stages nearest the middle (ties: the earlier stage).
  auto const off_centre = [&](std::uint32_t s) { return 2 * s > stages - 1 ? 2 * s - (stages - 1) : (stages - 1) - 2 * s; };
  for (auto extra = model_layers % stages; extra > 0; --extra) {
    std::uint32_t pick = stages;
    for (std::uint32_t s = 0; s < stages; ++s)
      if (p.layers[s] == model_layers / stages && (pick == stages || off_centre(s) < off_centre(pick))) pick = s;
    ++p.layers[pick];
  }
  return p;
}

}  // namespace tide
