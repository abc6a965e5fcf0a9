#pragma once
//! \file
//! The cost table: what each op of a schedule costs in time, as the sim backend and the
//! planner consume it. Compute ops take their time per layer (forward, backward, recompute as a
//! function of which slots are rematted), copies take latency plus bytes over bandwidth on a
//! per-direction link, collectives take their time per layer. A table comes from a model
//! (`transformer.hpp`), from a measured run (`calibrate.hpp`), or is written by hand.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include <tide/core/host_link.hpp>  // the same pacing the host backend applies
#include <tide/core/storage_link.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>

namespace tide {

//! What one layer's ops cost, in microseconds.
struct layer_cost {
  double forward_us = 0;   //!< the layer's forward
  double backward_us = 0;  //!< the layer's backward
  //! A recompute that produces every slot of the layer; empty: the same as `forward_us` (the
  //! layer's unchanged forward, as most recomputes are).
  std::optional<double> recompute_us = {};
  //! Optional, one per slot of the layer's type: the time to produce only that slot again (its
  //! producing op). A recompute then costs the sum over the rematted slots, capped at
  //! `full_recompute_us()`, because a partial recompute runs only the ops it needs.
  std::vector<double> slot_recompute_us = {};
  double gather_us = 0;      //!< the collective before the layer's forward (e.g. a weight gather)
  double reduce_us = 0;  //!< the reduce hook after the layer's backward (e.g. a gradient reduce)
  double regather_us = 0;    //!< the collective before the layer's recompute and backward (the weights again)
  // Added after 0.3.0, last, so that positional initializers keep their meaning.
  //! Optional, one per slot: which op of the layer produces it (any numbering). Slots with one
  //! producer come from one run of it (attention's output and its log-sum-exp from one kernel),
  //! so a recompute of several of them charges that op once: the largest of their
  //! `slot_recompute_us`. Empty: each slot its own op.
  std::vector<std::uint16_t> slot_producer = {};
  //! Share of the layer's op times bound by HBM bandwidth (elementwise work, in [0, 1]): a host
  //! copy beside it slows it (`cost_table::hbm_bytes_per_second`). 0: compute-bound.
  double memory_bound_share = 0;

  //! A recompute of the whole layer: `recompute_us`, or `forward_us` where that is empty.
  constexpr double full_recompute_us() const noexcept { return recompute_us.value_or(forward_us); }
  //! Recompute time when the slots bound as `remat` in `slots` are rematted.
  constexpr double recompute_time_us(std::span<slot_binding const> slots) const noexcept {
    return recompute_time_us_if(slots.size(), [&](std::size_t k) { return slots[k].where == placement::remat; });
  }
  //! Recompute time when the slots flagged in `remat` (one flag per slot) are rematted.
  constexpr double recompute_time_us(std::span<bool const> remat) const noexcept {
    return recompute_time_us_if(remat.size(), [&](std::size_t k) { return static_cast<bool>(remat[k]); });
  }

 private:
  // The cost slot `k` adds to a recompute of the slots flagged by `remat(j)`, taken in order:
  // its own, less what an earlier flagged slot of its producer already charged.
  template <class Remat>
  constexpr double added_recompute_us(std::size_t k, Remat&& remat) const noexcept {
    if (slot_producer.size() != slot_recompute_us.size()) return slot_recompute_us[k];
    bool shared = false;
    double charged = 0;
    for (std::size_t j = 0; j < k; ++j)
      if (slot_producer[j] == slot_producer[k] && remat(j)) shared = true, charged = std::max(charged, slot_recompute_us[j]);
    return shared ? std::max(0.0, slot_recompute_us[k] - charged) : slot_recompute_us[k];
  }
  template <class Remat>
  constexpr double recompute_time_us_if(std::size_t n, Remat&& remat) const noexcept {
    if (slot_recompute_us.size() != n) return full_recompute_us();
    double t = 0;
    for (std::size_t k = 0; k < n; ++k)
      if (remat(k)) t += added_recompute_us(k, remat);
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
  //! The device's HBM bandwidth (bytes per second). Above zero, a host copy running beside a
  //! compute op takes its share of it: a DMA reads (to the host) or writes (from it) device
  //! memory at the link's rate, which the op's memory-bound part (`layer_cost::
  //! memory_bound_share`) loses, so the op runs longer by the overlap times that share times the
  //! copy's rate over this bandwidth. 0: copies never slow compute.
  double hbm_bytes_per_second = 0;
  //! What stores and loads of spilled slots cost (the storage tier); unpaced by default.
  storage_link storage{};

  //! `layers.size()`, as the schedule's layer index type.
  std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(layers.size()); }
  //! Compute time of a keep-all step: the lower bound of any schedule's step time.
  double compute_us() const noexcept {
    double t = 0;
    for (auto const& l : layers) t += l.forward_us + l.backward_us;
    return t;
  }
  //! The longest time an entry may give, in microseconds (11.6 days): what the file readers take.
  static constexpr double max_time_us = 1e12;

  //! Throws `cost_model_error` naming the field and its value when a number of the table is not
  //! one the cost model can use: a time (compute, slot recompute, collective, overhead, latency)
  //! that is negative, NaN or above `max_time_us`, a bandwidth that is negative, NaN or infinite, a
  //! `memory_bound_share` outside [0, 1]. With such values a plan could beat its lower bound or
  //! cost nothing. The one check of a table: the planner, the lower bound, `compare_strategies`
  //! (through `check_against`) and the calibration file's reader and writer all run it.
  void check() const {
    // The names are built only for the value refused: a deep table is checked on every
    // simulation, and building them for every field took a sixth of tide-plan's time at 100,000
    // layers.
    auto num = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.17g", v);
      return std::string(b);
    };
    auto time_ok = [](double v) { return v >= 0 && v <= max_time_us; };
    auto refuse_time = [&](double v, std::string const& what) {
      throw cost_model_error("tide: the cost table's " + what + " is " + num(v) + ": give a time from 0 to 1e12 microseconds");
    };
    // 0 (unpaced) or at least a byte per second, as the calibration file's reader takes it: a
    // 1e-300 B/s link made every row's step infinite.
    auto rate = [&](double v, std::string const& what) {
      if (!(v == 0 || (v >= 1 && v < std::numeric_limits<double>::infinity())))
        throw cost_model_error("tide: the cost table's " + what + " is " + num(v) +
                               ": give a finite bandwidth of at least 1 byte per second, or 0 for unpaced");
    };
    for (std::size_t l = 0; l < layers.size(); ++l) {
      auto const& c = layers[l];
      auto at = [l](char const* field) { return "layer " + std::to_string(l) + " " + field; };
      if (!time_ok(c.forward_us)) refuse_time(c.forward_us, at("forward_us"));
      if (!time_ok(c.backward_us)) refuse_time(c.backward_us, at("backward_us"));
      if (c.recompute_us && !time_ok(*c.recompute_us))
        throw cost_model_error("tide: the cost table's " + at("recompute_us") + " is " + num(*c.recompute_us) +
                               ": give a time from 0 to 1e12 microseconds, or leave it empty for forward_us");
      for (std::size_t k = 0; k < c.slot_recompute_us.size(); ++k)
        if (!time_ok(c.slot_recompute_us[k]))
          refuse_time(c.slot_recompute_us[k], at("slot_recompute_us[") + std::to_string(k) + "]");
      if (!time_ok(c.gather_us)) refuse_time(c.gather_us, at("gather_us"));
      if (!time_ok(c.reduce_us)) refuse_time(c.reduce_us, at("reduce_us"));
      if (!time_ok(c.regather_us)) refuse_time(c.regather_us, at("regather_us"));
      if (!(c.memory_bound_share >= 0 && c.memory_bound_share <= 1))
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has memory_bound_share " +
                               num(c.memory_bound_share) + ": give a share in [0, 1]");
    }
    if (!time_ok(sync_latency_us)) refuse_time(sync_latency_us, "sync_latency_us");
    if (!time_ok(op_overhead_us)) refuse_time(op_overhead_us, "op_overhead_us");
    rate(hbm_bytes_per_second, "hbm_bytes_per_second");
    for (auto const& [d, what] : {std::pair{&link.d2h, "link d2h"}, {&link.h2d, "link h2d"}, {&storage.write, "storage write"},
                                  {&storage.read, "storage read"}}) {
      rate(d->bytes_per_second, std::string(what) + " bytes_per_second");
      if (!time_ok(d->latency_us)) refuse_time(d->latency_us, std::string(what) + " latency_us");
    }
  }

  //! Throws `cost_model_error` naming the mismatch when the table does not describe `stack`, or a
  //! value `check()` refuses.
  void check_against(stack_spec const& stack) const {
    check();
    if (layers.size() != stack.layer_count())
      throw cost_model_error("tide: the cost table has " + std::to_string(layers.size()) + " layers but the stack has " +
                           std::to_string(stack.layer_count()) + ": give one layer_cost per layer");
    if (!(hbm_bytes_per_second >= 0) || hbm_bytes_per_second == std::numeric_limits<double>::infinity())
      throw cost_model_error("tide: the cost table's hbm_bytes_per_second is " + std::to_string(hbm_bytes_per_second) +
                             ": give a finite bandwidth, or 0 for copies that never slow compute");
    for (std::uint32_t l = 0; l < stack.layer_count(); ++l) {
      auto const& c = layers[l];
      if (!c.slot_recompute_us.empty() && c.slot_recompute_us.size() != stack.layer(l).slots.size())
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has " +
                             std::to_string(c.slot_recompute_us.size()) + " slot recompute costs but layer type '" +
                             std::string(stack.layer(l).name) + "' has " +
                             std::to_string(stack.layer(l).slots.size()) + " slots");
      if (!c.slot_producer.empty() && c.slot_producer.size() != c.slot_recompute_us.size())
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has " +
                               std::to_string(c.slot_producer.size()) + " slot producers but " +
                               std::to_string(c.slot_recompute_us.size()) + " slot recompute costs: give one of each per slot");
      if (c.forward_us < 0 || c.backward_us < 0)
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has a negative compute time");
      if (!(c.memory_bound_share >= 0 && c.memory_bound_share <= 1))
        throw cost_model_error("tide: layer " + std::to_string(l) + " of the cost table has memory_bound_share " +
                               std::to_string(c.memory_bound_share) + ": give a share in [0, 1]");
    }
  }
};

//! A table with the same costs for every one of `layer_count` layers.
inline cost_table uniform_costs(std::uint32_t layer_count, layer_cost const& each, host_link link = {}) {
  return {std::vector<layer_cost>(layer_count, each), link};
}

}  // namespace tide
