#pragma once
//! \file
//! What the executor appends to an `out_of_memory` from the backend's setup: each way to fit
//! (offload, remat, fewer stored carries, spill, the planner), with the device and host bytes each
//! would take on this very stack, from schedules built with this one's buffers and pipeline.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/schedule.hpp>
#if TIDE_DEFINITIONS
#include <tide/core/build.hpp>
#include <tide/core/stack.hpp>
#endif

namespace tide::detail {

//! The lines after an out-of-memory message: for the arena that did not fit (`host`: the pinned
//! host arena, else the device arena), what each alternative strategy needs on this stack and
//! whether that fits in `room` (the budget less what other live executors hold).
TIDE_INLINE std::string fit_hint(schedule_view s, bool host, std::size_t room, bool has_storage);

#if TIDE_DEFINITIONS

//! The stack `s` was built from, as far as its view tells: layer types with their slots (names,
//! sizes, inputs) and the carry. Names refer to `s`'s storage.
inline stack_spec stack_of(schedule_view s) {
  stack_spec st;
  for (std::uint32_t l = 0; l < s.layer_count(); ++l) {
    layer_spec t{s.layers[l].type_name, {}};
    for (auto const& b : s.slots_of(l)) t.slots.push_back({b.name, b.bytes, b.input});
    st.append(t);
  }
  st.carry = {s.carry.name, s.carry.bytes};
  st.independent_layers = !st.has_carry();  // only peaks are asked for: the inputs keep their flag
  return st;
}

TIDE_INLINE std::string fit_hint(schedule_view s, bool host, std::size_t room, bool has_storage) {
  std::string out = ". Ways to fit this stack (each built here with this schedule's buffers and pipeline; device / pinned host" +
                    std::string(has_storage ? " / file" : "") + " bytes):";
  try {
    auto const st = stack_of(s);
    std::vector<tide::name> not_inputs;  // what remat may take: every slot name but the inputs
    for (auto const& t : st.types)
      for (auto const& sl : t.slots)
        if (!sl.input) {
          bool seen = false;
          for (auto n : not_inputs) seen = seen || n == sl.name;
          if (!seen) not_inputs.push_back(sl.name);
        }
    auto const base = [&](placement where, bool only_not_inputs) {
      strategy how{.buffers = s.buffers, .pipeline = s.pipeline, .collectives = s.collectives};
      rule_spec r{.where = where};
      if (only_not_inputs) r.slots = not_inputs;
      how.policy = {r};
      how.policy.allow_unused_rules = true;
      return how;
    };
    auto const line = [&](std::string const& what, strategy const& how) {
      auto const a = build_schedule(st, how);
      auto const need = host ? a.peak_host_bytes() : a.peak_device_bytes();
      out += "\n  " + what + ": " + std::to_string(a.peak_device_bytes()) + " / " + std::to_string(a.peak_host_bytes());
      if (has_storage) out += " / " + std::to_string(a.peak_storage_bytes());
      out += need <= room ? " (fits)" : " (does not fit)";
    };
    auto const try_line = [&](std::string const& what, strategy const& how) {
      try {
        line(what, how);
      } catch (error const&) {  // an alternative the builder refuses on this stack: left out
      }
    };
    std::string const now = "\n  this schedule: " + std::to_string(s.arena.device_bytes) + " / " + std::to_string(s.arena.host_bytes) +
                            (has_storage ? " / " + std::to_string(s.arena.storage_bytes) : std::string());
    out += now;
    try_line("keep every slot (tide::strategy{})", strategy{.buffers = s.buffers, .pipeline = s.pipeline, .collectives = s.collectives});
    try_line("offload every slot to pinned host memory (rule_spec{.where = placement::offload})", base(placement::offload, false));
    if (!not_inputs.empty())
      try_line("rematerialize every slot but the layer inputs (placement::remat): one more forward per layer",
               base(placement::remat, true));
    if (st.has_carry() && s.layer_count() > 2) {
      // Two snapshots on a short stack; on a long one about sqrt(L), so that the hint's own program
      // stays small (Revolve with s snapshots recomputes about L^(1 + 1/s) forwards).
      std::uint32_t k = 2;
      while (s.layer_count() > 64 && k * k < s.layer_count()) ++k;
      auto how = base(placement::remat, true);
      how.checkpoints = {.device_snapshots = k};
      auto const n = std::to_string(k);
      try_line("and store " + n + " carries, recomputing the rest (strategy::checkpoints = {.device_snapshots = " + n + "})", how);
    }
    if (has_storage)
      try_line("spill every slot to a file (placement::spill, with the backend's storage_options::directory)",
               base(placement::spill, false));
    else
      out += "\n  spill to a file (placement::spill): on a backend with a storage tier (host_backend or cuda_backend "
             "with storage_options::directory)";
    out += "\n  or let the planner choose per (layer, slot) within the budget: tide::make_plan(stack, "
           "tide::calibrate(stack, backend, forward, backward), {." +
           std::string(host ? "host_budget" : "device_budget") + " = " + std::to_string(room) + "}) (docs/porting.md)";
  } catch (...) {  // the hint is help, never a second failure
  }
  return out;
}

#endif  // TIDE_DEFINITIONS

}  // namespace tide::detail
