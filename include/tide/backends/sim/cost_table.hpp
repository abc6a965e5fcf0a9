#pragma once
//! \file
//! The cost table: what each op of a schedule costs in time, as the sim backend and the
//! planner consume it. Compute ops take their time per layer (forward, backward, recompute as a
//! function of which slots are rematted), copies take latency plus bytes over bandwidth on a
//! per-direction link, collectives take their time per layer. A table comes from a model
//! (`transformer.hpp`), from a measured run (`calibrate.hpp`), or is written by hand.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tide/core/host_link.hpp>  // the same pacing the host backend applies
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>

namespace tide {

//! What one layer's ops cost, in microseconds.
struct layer_cost {
  double forward_us = 0;   //!< the layer's forward
  double backward_us = 0;  //!< the layer's backward
  //! A recompute that produces every slot of the layer; below zero: the same as `forward_us`.
  double recompute_us = -1;
  //! Optional, one per slot of the layer's type: the time to produce only that slot again (its
  //! producing op). A recompute then costs the sum over the rematted slots, capped at
  //! `full_recompute_us()`, because a partial recompute runs only the ops it needs.
  std::vector<double> slot_recompute_us = {};
  double gather_us = 0;      //!< the collective before the layer's forward (e.g. a weight gather)
  double reduce_us = 0;  //!< the reduce hook after the layer's backward (e.g. a gradient reduce)
  double regather_us = 0;    //!< the collective before the layer's recompute and backward (the weights again)

  //! A recompute of the whole layer: `recompute_us`, or `forward_us` where that is below zero.
  constexpr double full_recompute_us() const noexcept { return recompute_us < 0 ? forward_us : recompute_us; }
  //! Recompute time when the slots bound as `remat` in `slots` are rematted.
  constexpr double recompute_time_us(std::span<slot_binding const> slots) const noexcept {
    if (slot_recompute_us.size() != slots.size()) return full_recompute_us();
    double t = 0;
    for (std::size_t k = 0; k < slots.size(); ++k)
      if (slots[k].where == placement::remat) t += slot_recompute_us[k];
    return std::min(t, full_recompute_us());
  }
  //! Recompute time when the slots flagged in `remat` (one flag per slot) are rematted.
  double recompute_time_us(std::span<bool const> remat) const noexcept {
    if (slot_recompute_us.size() != remat.size()) return full_recompute_us();
    double t = 0;
    for (std::size_t k = 0; k < remat.size(); ++k)
      if (remat[k]) t += slot_recompute_us[k];
    return std::min(t, full_recompute_us());
  }
};

//! Deprecated (0.3): the host link is `tide::host_link` (`<tide/core/host_link.hpp>`).
using link_spec [[deprecated("use tide::host_link (<tide/core/host_link.hpp>); its latencies are latency_us")]] = host_link;

//! Per-layer costs for a whole stack, plus the link. `layers.size()` is the stack's layer count.
struct cost_table {
  std::vector<layer_cost> layers{};  //!< one per layer of the stack, in order
  host_link link{};                  //!< what copies between host and device cost
  //! Time from an event's record to the waiting stream resuming, when the wait blocks (thread
  //! wake-up on the host backend, a few microseconds on a GPU). `calibrate` measures it.
  double sync_latency_us = 0;
  //! Time a stream spends between two ops of its own (dispatch; launch overhead on a GPU).
  double op_overhead_us = 0;

  //! `layers.size()`, as the schedule's layer index type.
  std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(layers.size()); }
  //! Compute time of a keep-all step: the lower bound of any schedule's step time.
  double compute_us() const noexcept {
    double t = 0;
    for (auto const& l : layers) t += l.forward_us + l.backward_us;
    return t;
  }
  //! Throws `cost_model_error` naming the mismatch when the table does not describe `stack`.
  void check_against(stack_spec const& stack) const {
    if (layers.size() != stack.layer_count())
      throw cost_model_error("tide: the cost table has " + std::to_string(layers.size()) + " layers but the stack has " +
                           std::to_string(stack.layer_count()) + ": give one layer_cost per layer");
    for (std::uint32_t l = 0; l < stack.layer_count(); ++l) {
      auto const& c = layers[l];
      if (!c.slot_recompute_us.empty() && c.slot_recompute_us.size() != stack.layer(l).slots.size())
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has " +
                             std::to_string(c.slot_recompute_us.size()) + " slot recompute costs but layer type '" +
                             std::string(stack.layer(l).name) + "' has " +
                             std::to_string(stack.layer(l).slots.size()) + " slots");
      if (c.forward_us < 0 || c.backward_us < 0)
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has a negative compute time");
    }
  }
};

//! A table with the same costs for every one of `layer_count` layers.
inline cost_table uniform_costs(std::uint32_t layer_count, layer_cost const& each, host_link link = {}) {
  return {std::vector<layer_cost>(layer_count, each), link};
}

}  // namespace tide
