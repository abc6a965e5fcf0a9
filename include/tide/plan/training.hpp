#pragma once
//! \file
//! The whole device in the model: what a training job keeps resident besides activations
//! (weights, gradients, optimizer state, gathered weights, gradient buffers, workspaces,
//! collective buffers, an allocator reserve) from the model's dimensions and the parallel layout,
//! and what its collectives cost from message sizes and the fabric (`hardware_spec`'s NVLink
//! domain and network).
//!
//! Collectives, per layer of a transformer (`transformer_costs(model, hardware, training)`):
//! - FSDP / ZeRO-3 (`parallel_layout::fsdp` > 1): an all-gather of the layer's weights before its
//!   forward and again before its recompute and backward, a reduce-scatter of its gradients after
//!   its backward. They are the schedule's collective hooks (`training_collectives`) on the
//!   communication stream, so the sim overlaps them with compute where the schedule allows.
//! - Tensor parallel (sequence parallel): an all-gather before and a reduce-scatter after the
//!   attention block and the MLP, in forward, backward and a recompute of the slots behind them.
//!   The next matrix product needs their result: they are on the compute path.
//! - Expert parallel: an all-to-all that dispatches the routed tokens and one that combines them,
//!   in forward and backward; a recompute of the experts' up projection dispatches again. On the
//!   compute path for the same reason.
//!
//! Collectives move their bytes at the NVLink rate inside a domain and at the network rate across
//! domains (a job spreads evenly over as few domains as hold it), times `collective_efficiency`,
//! plus `collective_latency_us`: all-gathers and reduce-scatters hierarchically (a domain imports
//! each other domain's data once, over all its GPUs' ports), all-to-alls point to point.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/pipeline.hpp>
#include <tide/plan/hardware.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! How a training job is spread over GPUs. Tensor parallelism is the model's
//! (`transformer_spec::tensor_parallel`: it shapes the saved slots). Groups are consecutive:
//! tensor parallel innermost, then FSDP, then pipeline stages; the data-parallel replicas
//! (`gpus / (fsdp x tensor_parallel x pipeline_parallel)`, hybrid sharding) are outermost and
//! all-reduce each GPU's gradient shard after the reduce-scatter.
struct parallel_layout {
  std::uint32_t gpus = 1;             //!< GPUs in the job
  //! FSDP / ZeRO-3: weights, gradients and optimizer state sharded over this many GPUs (1: each
  //! GPU holds a whole replica of its tensor-parallel share).
  std::uint32_t fsdp = 1;
  std::uint32_t expert_parallel = 1;  //!< a MoE layer's routed experts split over this many GPUs
  //! Pipeline stages. The model given (`transformer_spec::layer_count`) is then one stage: its
  //! layers are what the stage runs and holds; the stages only space the data-parallel replicas.
  std::uint32_t pipeline_parallel = 1;
};

//! What a training step keeps besides activations, per parameter and in fixed buffers. Defaults
//! are assumptions stated here, for mixed-precision Adam with FP32 master weights (the common
//! recipe); replace them with your framework's.
struct training_spec {
  parallel_layout layout{};         //!< how the job is spread over GPUs
  double master_weight_bytes = 4;   //!< per parameter, sharded (FP32)
  double gradient_bytes = 4;        //!< per parameter, sharded (FP32 accumulation)
  double optimizer_bytes = 8;       //!< per parameter, sharded (Adam's two FP32 moments)
  double compute_weight_bytes = 2;  //!< per parameter of a gathered layer (BF16 copies for the matrix products)
  //! Gathered layers held at once: the gather ring of two (`build_schedule` runs gathers one
  //! layer ahead) or, without FSDP, none (the weights are resident).
  std::uint32_t gathered_layers = 2;
  //! cuBLAS/cuDNN workspaces, attention kernels' scratch, the loss and logits: 4 GiB, an assumption.
  std::size_t workspace_bytes = std::size_t{4} << 30;
  //! NCCL's channel buffers: 2 GiB, an assumption (the all-to-all buffers are counted from the
  //! tokens, in `resident_memory::layer_workspace`).
  std::size_t collective_buffer_bytes = std::size_t{2} << 30;
  //! Bytes per logit of the output head: FP32 logits for the loss, an assumption (chunked loss
  //! kernels need less; set it to what yours keeps).
  double logit_bytes = 4;
  //! Allocator fragmentation: this share of HBM is never usable. 5%, an assumption.
  double fragmentation_reserve = 0.05;
};

//! A device's memory besides activations, by what holds it (bytes).
struct resident_memory {
  std::size_t weights = 0;            //!< this GPU's shard of the master weights
  std::size_t gradients = 0;          //!< ... of the gradients
  std::size_t optimizer = 0;          //!< ... of the optimizer state
  std::size_t gathered_weights = 0;   //!< the gathered layers (or, without FSDP, the compute copies)
  std::size_t gradient_buffer = 0;    //!< one layer's unsharded gradients before its reduce-scatter
  std::size_t workspace = 0;          //!< `training_spec::workspace_bytes`
  std::size_t logits = 0;             //!< the output head's logits for the micro-batch's tokens
  //! The largest layer's working set beyond its saved slots: the all-to-all send buffer of a MoE
  //! layer's routed tokens (the receive buffers are its saved slots `expert_input`, `expert_out`).
  std::size_t layer_workspace = 0;
  std::size_t collective_buffers = 0;  //!< `training_spec::collective_buffer_bytes`
  std::size_t fragmentation = 0;       //!< the HBM share `training_spec::fragmentation_reserve` sets aside

  //! Every part: what the device holds besides activations.
  constexpr std::size_t total() const noexcept {
    return weights + gradients + optimizer + gathered_weights + gradient_buffer + workspace + logits + layer_workspace +
           collective_buffers + fragmentation;
  }
};

//! GPUs of a job of `gpus` in one NVLink domain: the job spreads evenly over as few domains as
//! hold it (128 GPUs on NVL72 racks: two domains of 64).
constexpr std::uint32_t job_domain_gpus(std::uint32_t gpus, hardware_spec const& hw) noexcept {
  auto const d = std::max<std::uint32_t>(hw.scale_up_gpus, 1);
  auto const domains = (std::max<std::uint32_t>(gpus, 1) + d - 1) / d;
  return std::max<std::uint32_t>(gpus, 1) / domains;
}

//! Seconds for a collective step in which a GPU moves `near` bytes over NVLink and `far` bytes
//! over its network port (see the file comment).
TIDE_INLINE double collective_seconds(double near, double far, hardware_spec const& hw);
//! An all-gather (or reduce-scatter) of a tensor of `bytes` (whole) over `n` GPUs, `in_domain` of
//! them in each NVLink domain. Hierarchically (as NCCL's rings over rails do): each GPU receives
//! the n - 1 shards it lacks over NVLink, and each domain imports the other domains' shards once,
//! spread over its GPUs' network ports.
TIDE_INLINE double all_gather_seconds(double bytes, std::uint32_t n, std::uint32_t in_domain, hardware_spec const& hw);
//! An all-to-all in which each GPU of `n` (`in_domain` per NVLink domain) sends `bytes` spread
//! evenly over the group: what goes to other domains crosses this GPU's own network port.
TIDE_INLINE double all_to_all_seconds(double bytes, std::uint32_t n, std::uint32_t in_domain, hardware_spec const& hw);
//! A ring all-reduce of `bytes` over `n` GPUs: a reduce-scatter and an all-gather.
TIDE_INLINE double all_reduce_seconds(double bytes, std::uint32_t n, std::uint32_t in_domain, hardware_spec const& hw);

//! The collective hooks a training step with `t`'s layout needs: with FSDP, gathers before
//! forward and backward and a reduce after backward; with plain data parallelism, the reduce.
inline collective_spec training_collectives(training_spec const& t) {
  bool const fsdp = t.layout.fsdp > 1;
  return {.before_forward = fsdp, .before_backward = fsdp, .after_backward = fsdp || t.layout.gpus > 1};
}

#if TIDE_DEFINITIONS
TIDE_INLINE double collective_seconds(double near, double far, hardware_spec const& hw) {
  if (near <= 0 && far <= 0) return 0;
  if (near > 0 && !(hw.scale_up_bytes_per_second > 0))
    throw cost_model_error("tide: hardware '" + std::string(hw.name) + "' has no scale_up_bytes_per_second for a collective");
  if (far > 0 && !(hw.scale_out_bytes_per_second > 0))
    throw cost_model_error("tide: hardware '" + std::string(hw.name) + "': a collective leaves the NVLink domain of " +
                           std::to_string(hw.scale_up_gpus) + " GPUs but scale_out_bytes_per_second is 0");
  // The two phases are added, an upper bound: NCCL may overlap a hierarchical collective's phases.
  double t = hw.collective_latency_us * 1e-6;
  if (near > 0) t += near / (hw.scale_up_bytes_per_second * hw.collective_efficiency);
  if (far > 0) t += far / (hw.scale_out_bytes_per_second * hw.collective_efficiency);
  return t;
}

TIDE_INLINE double all_gather_seconds(double bytes, std::uint32_t n, std::uint32_t in_domain, hardware_spec const& hw) {
  if (n <= 1) return 0;
  in_domain = std::clamp<std::uint32_t>(in_domain, 1, n);
  double const domains = std::ceil(static_cast<double>(n) / in_domain);
  double const near = in_domain > 1 ? bytes * (n - 1) / n : 0;
  return collective_seconds(near, bytes * (domains - 1) / n, hw);
}

TIDE_INLINE double all_to_all_seconds(double bytes, std::uint32_t n, std::uint32_t in_domain, hardware_spec const& hw) {
  if (n <= 1) return 0;
  in_domain = std::clamp<std::uint32_t>(in_domain, 1, n);
  return collective_seconds(bytes * (in_domain - 1) / n, bytes * (n - in_domain) / n, hw);
}

TIDE_INLINE double all_reduce_seconds(double bytes, std::uint32_t n, std::uint32_t in_domain, hardware_spec const& hw) {
  return 2 * all_gather_seconds(bytes, n, in_domain, hw);
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
