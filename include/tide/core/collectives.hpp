#pragma once
//! \file
//! Collectives: which hooks the schedule makes room for, on the communication stream. The value
//! `collective_spec` is what the core works on; `tide::collectives<knobs...>` spells it as a type,
//! each knob named and in any order. Included by `core/pipeline.hpp`.

#include <tide/core/vocabulary.hpp>

namespace tide {

//! Collective hooks the schedule makes room for, on the communication stream; named as the
//! `tide::hooks` fields that fill them, and declared in the order they run (0.3: `before_backward`
//! moved before `after_backward`).
struct collective_spec {
  bool before_forward = false;  //!< a gather hook before each layer's forward (e.g. its weights), one layer ahead
  //! A regather hook before each layer's recompute and backward (e.g. its weights again, as FSDP
  //! and ZeRO-3 free them after the forward), one layer ahead.
  bool before_backward = false;
  bool after_backward = false;  //!< a reduce hook after each layer's backward (e.g. its gradients)
  //! The hooks on the communication stream, a layer ahead, overlapped with compute (true); or on
  //! the compute stream just before the op that needs them, none overlapped (false): the baseline
  //! a schedule without latency hiding is (XLA's latency-hiding scheduler governs collectives
  //! as well as host copies), for comparing against one.
  bool overlap = true;
  friend constexpr bool operator==(collective_spec const&, collective_spec const&) = default;
};

// ---------------------------------------------------------------------------------------------
// Collective knobs

//! `collective_spec::before_forward`: make room for a gather hook before each layer's forward.
struct before_forward : detail::field_knob<collective_spec, &collective_spec::before_forward, true, "before_forward"> {};
//! `collective_spec::before_backward`: make room for a regather hook before each layer's recompute and backward.
struct before_backward : detail::field_knob<collective_spec, &collective_spec::before_backward, true, "before_backward"> {};
//! `collective_spec::after_backward`: make room for a reduce hook after each layer's backward.
struct after_backward : detail::field_knob<collective_spec, &collective_spec::after_backward, true, "after_backward"> {};

//! `collective_spec::overlap`: `tide::overlap_collectives<false>` runs the hooks on the compute
//! stream, none overlapped with compute.
template <bool On>
struct overlap_collectives : detail::field_knob<collective_spec, &collective_spec::overlap, On, "overlap_collectives"> {};

//! The collective hooks a schedule makes room for: `tide::collectives<tide::after_backward>`.
template <class... Knobs>
struct collectives {
  static_assert((detail::knob_for<Knobs, collective_spec> && ...),
                "tide::collectives<...>: each argument must be tide::before_forward, tide::before_backward, tide::after_backward "
                "or tide::overlap_collectives<bool>");
  static_assert(detail::distinct_knobs<Knobs...>(), "tide::collectives<...>: a knob is given twice: give each once");
  using tide_collectives_tag = void;  //!< Marks this type as the collectives part of `tide::strategy_of`.
  //! The `collective_spec` the knobs spell.
  static constexpr collective_spec spec() { return detail::apply_knobs<collective_spec, Knobs...>(); }
};
//! No collective hooks (the default).
using no_collectives = collectives<>;

}  // namespace tide
