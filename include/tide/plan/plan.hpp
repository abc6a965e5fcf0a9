#pragma once
//! \file
//! A planner's question and answer: the budgets and candidates `make_plan` takes
//! (`plan_options`), the plan it returns (`plan`), and the pipelines it tries by default.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/build.hpp>
#include <tide/core/strategy.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {


//! The chunk size of a chunked candidate when none is given: a quarter of the stack's largest
//! slot, rounded up to 4 KiB (one copy of a large slot then starts while its producer's
//! neighbours still run, without splitting small slots into many tiny copies).
inline std::size_t default_chunk_bytes(stack_spec const& stack) noexcept {
  return std::max<std::size_t>(align_up(stack.largest_slot_bytes() / 4, 4096), 4096);
}

//! The planner's candidates for `stack`: strategies whose buffers and pipeline it tries (it
//! chooses the policy): copies on the compute stream (least memory), latency hiding with one,
//! two and three staging buffers (prefetch distance 0, 1, 2), the deepest of those with copies
//! chunked (`chunk_bytes`, 0: `default_chunk_bytes`), and, on stacks of more than 8 layers,
//! chunked with prefetch distance 7 and eight staging buffers. Each keeps `collectives`.
TIDE_INLINE std::vector<strategy> default_candidates(stack_spec const& stack, std::size_t chunk_bytes = 0,
                                                     collective_spec collectives = {});

//! Which search `make_plan` runs (see the file comment).
enum class plan_method : std::uint8_t {
  automatic,  //!< exact up to `exact_max_decisions`, heuristic above
  exact,      //!< branch and bound: the fastest plan, at a cost exponential in the decisions
  heuristic,  //!< orders of moves and a local search: for stacks of any size
};

//! Budgets and search settings of `make_plan`.
struct plan_options {
  std::size_t device_budget = std::numeric_limits<std::size_t>::max();  //!< for the schedule's peak (activations)
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();  //!< for the schedule's pinned host bytes
  plan_method method = plan_method::automatic;                        //!< exact, heuristic, or by size
  std::size_t exact_max_decisions = 10;  //!< (layer, slot) pairs up to which `automatic` is exact
  std::size_t local_search_max_decisions = 64;  //!< the heuristic's local search runs up to this size
  std::size_t local_search_starts = 30;  //!< ... from at most this many distinct candidates, fastest first
  //! ... and builds at most this many schedules (per run: a host cap that binds runs twice);
  //! about 50 ms at 64 decisions.
  std::size_t local_search_max_evaluations = 5000;
  //! ... then restarts up to this many times from the best plan with two or three decisions
  //! changed at random (a fixed seed), building at most `local_search_kick_evaluations` more;
  //! then, per other candidate pipeline, a quarter of each from that pipeline's fastest plan.
  std::size_t local_search_kicks = 200;
  std::size_t local_search_kick_evaluations = 2000;  //!< see `local_search_kicks`
  //! Above `local_search_max_decisions`, the search over classes (a layer type's slot in every
  //! layer of the type; see planner.hpp) builds at most this many schedules per run, from at most
  //! `class_search_starts` distinct candidates, trying at most `class_search_pairs` paired moves
  //! at a time.
  std::size_t class_search_max_evaluations = 400;
  std::size_t class_search_starts = 2;  //!< see `class_search_max_evaluations`
  std::size_t class_search_pairs = 64;  //!< see `class_search_max_evaluations`
  //! Most (layer, slot) decisions `make_plan` takes: each of its few hundred candidate schedules
  //! is built whole, so its time grows faster than the stack (on this project's 2-core VM: 2,000
  //! decisions in 0.2 s, 40,000 in 7 s, 200,000 in 120 s). Beyond it, `make_plan` throws rather
  //! than look hung. Stacks of a few layer types repeated are planned as groups above
  //! `group_above_decisions` (100,000 layers of one 8-slot type in about 4 s): raise it for those.
  std::size_t max_decisions = 40000;
  //! The buffers, pipelines and collectives to try (their policies are ignored); empty:
  //! `default_candidates`.
  std::vector<strategy> candidates{};
  //! What the device holds besides activations (`transformer_resident_memory`): reported in
  //! `plan::whole_device_bytes()`; the budget above is what is left for the schedule.
  std::size_t resident_bytes = 0;
  //! Strategies the heuristic also evaluates, with every candidate pipeline, and starts its local
  //! search from (e.g. the strategy table's rows): the plan is never slower than one that fits.
  std::vector<strategy> seeds{};
  // Added after 0.3.0, last, so that positional initializers keep their meaning.
  //! Bytes of the storage tier (a spill file) the schedule may use: with a host budget that binds,
  //! the planner moves the offloads of the earliest layers to the file (`placement::spill`);
  //! 0: no storage tier. The cost table's `storage` link prices the stores and loads.
  std::size_t storage_budget = 0;
  //! Above this many (layer, slot) decisions, runs of identical layers (one type, equal costs), and
  //! of a repeating block of layers (`group_max_period`), are planned as groups (a run's ends
  //! layer by layer, its middle as a few blocks whose layers share a placement; planner.hpp), so
  //! planning grows with the distinct layers, not the stack's depth; the plan is built and simulated whole and its gap to the bound reported. SIZE_MAX:
  //! never. Not with a carry or a storage budget.
  std::size_t group_above_decisions = 20000;
  //! ... each run's middle as this many blocks (more: finer trades, slower planning).
  std::uint32_t group_blocks = 16;
  //! ... then, into the room the blocks leave, rematerialized slots kept or offloaded layer by
  //! layer: at most this many tries, each a whole build and simulation.
  std::size_t group_fill_tries = 12;
  //! ... runs of a repeating block of up to this many layers are grouped too (dense and MoE
  //! layers alternating: 2; a hybrid of one attention to seven state-space layers: 8); the run's
  //! stand-ins are whole blocks. 1: runs of one layer only. At most `max_group_period`.
  std::uint32_t group_max_period = 8;
};

//! The largest `plan_options::group_max_period`: finding runs costs up to this many passes over a
//! run's layers.
inline constexpr std::uint32_t max_group_period = 64;

//! A planner's answer.
struct plan {
  bool fits = false;                      //!< false: nothing found fits; see `smallest_activation_bytes`
  std::vector<placement> decisions{};     //!< per (layer, slot), layers in order, slots in type order
  tide::strategy strategy{};              //!< the policy for `decisions`, with the candidate's other parts
  double step_us = 0;                     //!< simulated step time
  std::size_t activation_bytes = 0;       //!< the schedule's device peak (activations; 0.2: device_bytes)
  std::size_t resident_bytes = 0;         //!< `plan_options::resident_bytes`
  std::size_t host_bytes = 0;             //!< the schedule's pinned host bytes
  std::size_t smallest_activation_bytes = 0;  //!< when it does not fit: the smallest peak reached
  std::size_t evaluations = 0;            //!< schedules built
  //! Found by the exact search and the fastest over every placement the planner may choose: false
  //! with a storage budget and a host budget (spills are placed by a rule, not searched), so
  //! `fits == false` then means none found, not none exists.
  bool exact = false;
  //! No schedule of the stack within the budgets steps faster than this (`step_lower_bound`, with
  //! the candidates and seeds as its strategies); microseconds.
  double lower_bound_us = 0;
  // Added after 0.3.0, last, so that positional initializers keep their meaning.
  std::size_t storage_bytes = 0;          //!< the schedule's storage file (spilled slots)
  //! Layers planned as copies of a group's block (`plan_options::group_above_decisions`); 0: none.
  std::size_t grouped_layers = 0;

  //! How far the plan can be from the best possible: `step_us / lower_bound_us - 1` (0 when it
  //! does not fit or there is no bound).
  [[nodiscard]] constexpr double gap_to_bound() const noexcept {
    return fits && lower_bound_us > 0 ? step_us / lower_bound_us - 1 : 0;
  }

  //! The whole device's peak: resident bytes plus the schedule's.
  constexpr std::size_t whole_device_bytes() const noexcept { return resident_bytes + activation_bytes; }
  //! The schedule of this plan for `stack` (the stack it was planned for).
  schedule build(stack_spec const& stack) const { return build_schedule(stack, strategy); }
};

#if TIDE_DEFINITIONS
TIDE_INLINE std::vector<strategy> default_candidates(stack_spec const& stack, std::size_t chunk_bytes,
                                                     collective_spec collectives) {
  if (chunk_bytes == 0) chunk_bytes = default_chunk_bytes(stack);
  auto const L = stack.layer_count();
  auto dist = [&](std::uint32_t d) { return std::min<std::uint32_t>(d, L == 0 ? 0 : L - 1); };
  std::vector<strategy> r;
  auto add = [&](pipeline_spec p, std::uint32_t staging) {
    r.push_back({.buffers = {.staging_buffers = staging}, .pipeline = p, .collectives = collectives});
  };
  add({.latency_hiding = false, .prefetch_distance = 0, .max_offloads_in_flight = 1}, 1);
  add({.prefetch_distance = dist(0), .max_offloads_in_flight = 1}, 1);
  add({.prefetch_distance = dist(1)}, 2);
  add({.prefetch_distance = dist(2)}, 3);
  add({.prefetch_distance = dist(2), .chunk_bytes = chunk_bytes}, 3);
  // A deep window: eight layers' prefetches in flight (the published DeepSeek-V3 run's latency
  // hiding held about eight layers of offloaded tensors more than its run without it).
  // On stacks of at most 8 layers such a window is the whole backward: left out.
  if (L > 8) add({.prefetch_distance = 7, .chunk_bytes = chunk_bytes}, 8);
  return r;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
