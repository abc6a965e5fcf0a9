#pragma once
//! \file
//! Transformer decoder stacks from public architecture dimensions: per-slot bytes from the
//! dimensions, per-layer compute time from FLOPs over throughput (`hardware_spec`).
//!
//! Each layer saves these slots (names are stable: policies and plans refer to them):
//! - `layer_input`  the residual stream entering the layer (sequence-parallel: sharded by TP);
//! - `attn_norm`    the normalized input to the attention projections (gathered: full width);
//! - `q_latent`, `kv_latent`  (multi-head latent attention only) the compressed query and
//!   key/value projections;
//! - `qkv`          the query, key and value heads the attention kernel reads;
//! - `attn_out`     the attention output, input to the output projection;
//! - `softmax_lse`  the attention kernel's per-row log-sum-exp (FP32), for its backward;
//! - `mlp_input`    the residual stream after attention;
//! - `router`       (mixture-of-experts only) the router logits (FP32);
//! - `expert_input` (MoE only) the routed copies of the tokens on the experts' GPUs, after the
//!   dispatch all-to-all: the experts' up projection reads them for its weight gradient;
//! - `mlp_up`       the gate and up projections (for MoE: of the routed and shared experts);
//! - `mlp_act`      the gated activation, input to the down projection;
//! - `expert_out`   (MoE only) the routed experts' outputs back on the tokens' GPUs, after the
//!   down projection and the combine all-to-all, before the gate weights: the router's gradient
//!   reads them.
//!
//! Compute: a layer's forward is the sum of its matrix products (2 FLOPs per multiply-add) and
//! causal attention over `hardware_spec::mfu` of peak, plus elementwise work over HBM
//! bandwidth (a MoE layer's token permutations before the dispatch and after the combine
//! included). Backward is twice the matrix work and 2.5 times the attention (flash-attention's
//! backward recomputes the scores). Recomputing a slot costs its producing op, once per op
//! (`layer_cost::slot_producer`: `attn_out` and `softmax_lse` come from one attention kernel),
//! with the collectives before it: so rematerializing every slot but the input reruns the whole
//! forward but the shared expert's down projection and the residual add, which no backward reads
//! (MaxText's `remat_policy: full`). `layer_input` is the layer's input (`slot_spec::input`): only
//! rerunning the previous layers could rebuild it, so it is kept or offloaded, never
//! rematerialized. A layer's memory-bound share (`layer_cost::memory_bound_share`) is its
//! elementwise time over its forward: host copies beside it slow it (`cost_table::
//! hbm_bytes_per_second`, the preset's HBM bandwidth).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/stack.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/transformer_spec.hpp>

#if TIDE_DEFINITIONS
#include <tide/plan/detail/transformer_cost_model.hpp>
#include <tide/plan/detail/transformer_layers.hpp>
#endif

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! The stack of `m`: one layer type "dense" and, with experts, one "moe". Slot names are string
//! literals, so the stack does not refer to `m`.
TIDE_INLINE stack_spec transformer_stack(transformer_spec const& m);

//! Per-layer costs of `m` on `hw` for one GPU of a job laid out as `t` says: forward, backward,
//! per-slot recompute (matrix products at `m.matmul`'s rate, attention in BF16), `hw`'s host link
//! (this GPU's share), and the collectives of `training.hpp` (FSDP gathers and reduce-scatters
//! as the layers' collective hooks; tensor-parallel and expert-parallel exchanges on the compute
//! path, paid again by the recomputes that need them).
TIDE_INLINE cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw, training_spec const& t);

//! Per-layer costs of `m` on `hw` without communication: compute and the host link only (the
//! tensor- and expert-parallel exchanges and FSDP's collectives left out).
TIDE_INLINE cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw);

//! A model's parameters: all, and those of the routed experts.
struct parameter_count {
  double total = 0;    //!< every parameter, embedding and output head included
  double experts = 0;  //!< those of the routed experts (part of `total`)
};
//! `m`'s parameters, whole (not split over GPUs), embedding and output head included.
TIDE_INLINE parameter_count transformer_parameters(transformer_spec const& m);

//! Model FLOPs of one training step of `m` on one GPU (its tensor-parallel share): three times the
//! forward's matrix products and causal attention, the usual count for FLOP/s per device
//! (recomputation not counted; the embedding and output head, which the stack leaves out, neither).
TIDE_INLINE double transformer_step_flops(transformer_spec const& m);

//! What one GPU of `t`'s job keeps resident for `m` besides activations (`resident_memory`).
TIDE_INLINE resident_memory transformer_resident_memory(transformer_spec const& m, hardware_spec const& hw, training_spec const& t);

//! The HBM left for activations once `resident` is placed (0 when it does not fit at all).
inline std::size_t activation_budget(hardware_spec const& hw, resident_memory const& resident) noexcept {
  return resident.total() >= hw.hbm_bytes ? 0 : hw.hbm_bytes - resident.total();
}

#if TIDE_DEFINITIONS
TIDE_INLINE stack_spec transformer_stack(transformer_spec const& m) {
  stack_spec s;
  for (std::uint32_t l = 0; l < m.layer_count; ++l) {
    bool const moe = m.is_moe(l);
    auto const desc = detail::describe_layer(m, moe);
    layer_spec t{moe ? "moe" : "dense", {}};
    for (auto const& sl : desc.slots)
      t.slots.push_back({sl.name, static_cast<std::size_t>(sl.bytes), sl.whole_forward});  // layer_input: the input
    s.append(t);
  }
  return s;
}

TIDE_INLINE cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw, training_spec const& t) {
  return detail::transformer_costs(m, hw, t, true);
}

TIDE_INLINE cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw) {
  return detail::transformer_costs(m, hw, training_spec{}, false);
}

TIDE_INLINE parameter_count transformer_parameters(transformer_spec const& m) {
  parameter_count r;
  double per_type[2][2] = {};
  for (int moe = 0; moe < 2; ++moe) {
    if (moe == 1 && m.experts == 0) continue;
    auto const d = detail::describe_layer(m, moe == 1);
    per_type[moe][0] = d.params;
    per_type[moe][1] = d.expert_params;
  }
  for (std::uint32_t l = 0; l < m.layer_count; ++l) {
    auto const& p = per_type[m.is_moe(l) ? 1 : 0];
    r.total += p[0] + p[1];
    r.experts += p[1];
  }
  r.total += 2.0 * static_cast<double>(m.vocab) * static_cast<double>(m.hidden);  // embedding and output head
  return r;
}

TIDE_INLINE double transformer_step_flops(transformer_spec const& m) {
  double r = 0;
  for (std::uint32_t l = 0; l < m.layer_count; ++l) {
    auto const d = detail::describe_layer(m, m.is_moe(l));
    double f = d.extra_flops;
    for (auto const& s : d.slots) f += s.flops + (s.name == "attn_out" ? s.attention_flops : 0);
    r += 3 * f;
  }
  return r;
}

TIDE_INLINE resident_memory transformer_resident_memory(transformer_spec const& m, hardware_spec const& hw, training_spec const& t) {
  auto const& lay = t.layout;
  // Its divisions and the byte counts below (an FSDP degree of 0 divided by zero; a negative byte
  // count reached llround and a size_t), checked by name first.
  check_parallel_layout(m, lay);
  for (auto const& [v, what] : {std::pair{t.master_weight_bytes, "master_weight_bytes"}, {t.gradient_bytes, "gradient_bytes"},
                                {t.optimizer_bytes, "optimizer_bytes"}, {t.compute_weight_bytes, "compute_weight_bytes"},
                                {t.logit_bytes, "logit_bytes"}})
    if (!(v >= 0 && v <= 1024))
      throw cost_model_error("tide: training_spec::" + std::string(what) + " is " + std::to_string(v) +
                             ": give bytes per parameter (or logit) from 0 to 1024");
  if (!(t.fragmentation_reserve >= 0 && t.fragmentation_reserve < 1))
    throw cost_model_error("tide: training_spec::fragmentation_reserve is " + std::to_string(t.fragmentation_reserve) +
                           ": give a share of device memory in [0, 1)");
  if (!(hw.pinnable_fraction >= 0 && hw.pinnable_fraction <= 1))
    throw cost_model_error("tide: hardware_spec::pinnable_fraction is " + std::to_string(hw.pinnable_fraction) + ": give a share in [0, 1]");
  auto const p = transformer_parameters(m);
  // ZeRO-3: every parameter's state lives on one GPU of the fsdp x TP group. `m` is the stage
  // (with pipeline parallelism its layers are the stage's; its embedding and output head are
  // counted, as the first and last stages hold them).
  double const shard = static_cast<double>(lay.fsdp) * m.tensor_parallel;
  double const dense_state = (p.total - p.experts) / shard;
  // The routed experts are split over expert_parallel first; FSDP shards what each holds over
  // the rest of its group (at least one GPU).
  double const expert_shard = std::max<double>(shard, static_cast<double>(lay.expert_parallel) * m.tensor_parallel);
  double const local = dense_state + p.experts / expert_shard;
  resident_memory r;
  auto const bytes = [](double x) { return static_cast<std::size_t>(std::llround(x)); };
  r.weights = bytes(local * t.master_weight_bytes);
  r.gradients = bytes(local * t.gradient_bytes);
  r.optimizer = bytes(local * t.optimizer_bytes);
  double largest = 0;  // the largest layer's gathered parameters on this GPU
  for (int moe = 0; moe < 2; ++moe) {
    if (moe == 1 && m.experts == 0) continue;
    auto const d = detail::describe_layer(m, moe == 1);
    largest = std::max(largest, d.params / m.tensor_parallel + d.expert_params / m.tensor_parallel / lay.expert_parallel);
  }
  if (lay.fsdp > 1) {
    r.gathered_weights = bytes(largest * t.compute_weight_bytes * t.gathered_layers);
    r.gradient_buffer = bytes(largest * t.gradient_bytes);
  } else {
    r.gathered_weights = bytes(local * t.compute_weight_bytes);  // the compute copies of the whole share
  }
  r.workspace = t.workspace_bytes;
  double const T = static_cast<double>(m.tokens());
  r.logits = bytes(T * static_cast<double>(m.vocab) / m.tensor_parallel * t.logit_bytes);
  // The all-to-alls' send buffer (the dispatch's, reused by the combine); their receive buffers
  // are the saved slots `expert_input` and `expert_out`, counted as activations.
  if (m.experts > 0 && lay.expert_parallel > 1)
    r.layer_workspace = bytes(T * m.top_k * static_cast<double>(m.hidden) * m.bytes_per_element / m.tensor_parallel);
  r.collective_buffers = t.collective_buffer_bytes;
  r.fragmentation = bytes(static_cast<double>(hw.hbm_bytes) * t.fragmentation_reserve);
  return r;
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
