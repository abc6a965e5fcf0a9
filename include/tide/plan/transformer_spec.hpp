#pragma once
//! \file
//! A decoder-only transformer's dimensions (`transformer_spec`), the published presets
//! (`tide::models`) and the checks of a job's parallel layout against them. What
//! `<tide/plan/transformer.hpp>` derives slots, costs and memory from.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/name.hpp>
#include <tide/plan/training.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! A decoder-only transformer's dimensions and run shape, from which `transformer_stack`,
//! `transformer_costs` and `transformer_resident_memory` derive slots, costs and memory.
struct transformer_spec {
  tide::name name{};               //!< what reports call the model
  std::uint32_t layer_count = 0;   //!< layers in the stack (with pipeline parallelism: one stage's)
  std::uint32_t dense_layers = 0;  //!< the first layers use the dense MLP; the rest MoE when experts > 0
  std::uint64_t hidden = 0;        //!< width of the residual stream
  std::uint32_t heads = 0;         //!< query heads
  std::uint32_t kv_heads = 0;      //!< grouped-query attention (== heads: multi-head)
  std::uint32_t head_dim = 0;      //!< query and key head dimension without latent attention
  //! Multi-head latent attention (DeepSeek-V2/V3): the rank and head-dimension fields below
  //! replace `head_dim` for queries and keys.
  bool latent_attention = false;
  std::uint32_t q_lora_rank = 0;       //!< rank of the compressed query projection
  std::uint32_t kv_lora_rank = 0;      //!< rank of the compressed key/value projection
  std::uint32_t qk_nope_head_dim = 0;  //!< per-head query/key dimension without rotary embedding
  std::uint32_t qk_rope_head_dim = 0;  //!< per-head query/key dimension that carries the rotary embedding
  std::uint32_t v_head_dim = 0;        //!< value head dimension (0: `head_dim`), also without latent attention
  // MLP
  std::uint64_t ffn = 0;           //!< dense MLP intermediate width
  std::uint32_t experts = 0;       //!< routed experts (0: dense only)
  std::uint32_t top_k = 0;         //!< routed experts per token
  std::uint32_t shared_experts = 0;  //!< experts every token of a MoE layer goes through besides its routed ones
  std::uint64_t expert_ffn = 0;    //!< intermediate width of one expert
  // Run shape
  std::uint64_t seq_len = 4096;         //!< tokens per sequence
  std::uint64_t micro_batch = 1;        //!< sequences per micro-batch
  std::uint32_t bytes_per_element = 2;  //!< BF16 activations
  std::uint32_t tensor_parallel = 1;    //!< heads and MLP widths are split over this many GPUs
  std::uint64_t vocab = 0;              //!< embedding and output head rows (resident weights only)
  precision matmul = precision::bf16;   //!< the matrix products' data type (attention stays BF16)

  //! Tokens per micro-batch.
  constexpr std::uint64_t tokens() const noexcept { return seq_len * micro_batch; }
  //! True when `layer` has the MoE MLP: the model has experts and `layer` is past the dense ones.
  constexpr bool is_moe(std::uint32_t layer) const noexcept { return experts > 0 && layer >= dense_layers; }
};

//! Published architectures as `transformer_spec`s (sources at each).
namespace models {

//! DeepSeek-V3-like: 61 layers (3 dense, 58 MoE), hidden 7168, 128 heads with multi-head latent
//! attention (q rank 1536, kv rank 512, head dims 128 + 64 rope, v 128), 256 routed experts of
//! width 2048 with top-8 plus one shared expert, dense MLP width 18432.
//! Source: DeepSeek-V3 Technical Report, arXiv:2412.19437, and its published config.json.
constexpr transformer_spec deepseek_v3(std::uint64_t seq_len = 4096, std::uint64_t micro_batch = 1,
                                       std::uint32_t tensor_parallel = 1) {
  return {.name = "DeepSeek-V3-like",
          .layer_count = 61,
          .dense_layers = 3,
          .hidden = 7168,
          .heads = 128,
          .kv_heads = 128,
          .head_dim = 192,
          .latent_attention = true,
          .q_lora_rank = 1536,
          .kv_lora_rank = 512,
          .qk_nope_head_dim = 128,
          .qk_rope_head_dim = 64,
          .v_head_dim = 128,
          .ffn = 18432,
          .experts = 256,
          .top_k = 8,
          .shared_experts = 1,
          .expert_ffn = 2048,
          .seq_len = seq_len,
          .micro_batch = micro_batch,
          .tensor_parallel = tensor_parallel,
          .vocab = 129280};
}

//! Llama-3.1-405B-like: 126 dense layers, hidden 16384, 128 query heads and 8 key/value heads
//! of dimension 128, MLP width 53248.
//! Source: The Llama 3 Herd of Models, arXiv:2407.21783, Table 3.
constexpr transformer_spec llama3_405b(std::uint64_t seq_len = 8192, std::uint64_t micro_batch = 1,
                                       std::uint32_t tensor_parallel = 8) {
  return {.name = "Llama-3.1-405B-like",
          .layer_count = 126,
          .hidden = 16384,
          .heads = 128,
          .kv_heads = 8,
          .head_dim = 128,
          .v_head_dim = 128,
          .ffn = 53248,
          .seq_len = seq_len,
          .micro_batch = micro_batch,
          .tensor_parallel = tensor_parallel,
          .vocab = 128256};
}

}  // namespace models

//! What `check_parallel_layout` calls each degree in its messages: the fields by default; a tool
//! passes its flags (tide-plan: "--tp", "--gpus", ...).
struct layout_names {
  std::string_view tensor_parallel = "tensor_parallel";      //!< the tensor-parallel degree
  std::string_view gpus = "gpus";                            //!< the GPU count
  std::string_view fsdp = "fsdp";                            //!< the FSDP degree
  std::string_view expert_parallel = "expert_parallel";      //!< the expert-parallel degree
  std::string_view pipeline_parallel = "pipeline_parallel";  //!< the pipeline-parallel degree
};

//! Checks that `m`'s tensor-parallel degree splits its heads and MLP widths evenly; throws
//! `cost_model_error` naming the degree, its value and the constraint.
inline void check_tensor_parallel(transformer_spec const& m, layout_names const& n = {}) {
  auto const tp = m.tensor_parallel;
  auto fail = [&](std::string const& what) {
    throw cost_model_error("tide: " + std::string(n.tensor_parallel) + " " + std::to_string(tp) + " " + what + " of '" +
                           std::string(m.name) + "'");
  };
  if (tp == 0) fail("must be at least 1");
  if (m.heads % tp != 0) fail("does not divide the " + std::to_string(m.heads) + " attention heads");
  // Grouped-query attention: the key/value heads are split, or each replicated over tp / kv_heads GPUs.
  if (!m.latent_attention && m.kv_heads > 0 && m.kv_heads % tp != 0 && tp % m.kv_heads != 0)
    fail("neither divides nor is a multiple of the " + std::to_string(m.kv_heads) + " key/value heads");
  if ((m.experts == 0 || m.dense_layers > 0) && m.ffn % tp != 0) fail("does not divide the MLP width " + std::to_string(m.ffn));
  if (m.experts > 0 && m.expert_ffn % tp != 0) fail("does not divide the expert MLP width " + std::to_string(m.expert_ffn));
}

//! The one check of a job's layout for `m`: the tensor-parallel split (`check_tensor_parallel`);
//! every degree at least 1; tensor x FSDP x pipeline and tensor x expert x pipeline groups tiling
//! the GPUs (dividing `gpus`); expert parallelism only with experts, dividing them; FSDP and expert
//! parallelism nested (one divides the other: each expert's state is sharded over
//! fsdp / expert_parallel GPUs). Throws `cost_model_error` naming the degree (as `n` spells it),
//! its value and the constraint. `transformer_costs` calls it; tools call it to refuse a layout
//! before planning.
inline void check_parallel_layout(transformer_spec const& m, parallel_layout const& lay, layout_names const& n = {}) {
  auto fail = [&](std::string_view name, std::uint64_t value, std::string const& what) {
    throw cost_model_error("tide: " + std::string(name) + " " + std::to_string(value) + " " + what);
  };
  if (lay.gpus == 0) fail(n.gpus, 0, "must be at least 1");
  if (lay.fsdp == 0) fail(n.fsdp, 0, "must be at least 1");
  if (lay.expert_parallel == 0) fail(n.expert_parallel, 0, "must be at least 1");
  if (lay.pipeline_parallel == 0) fail(n.pipeline_parallel, 0, "must be at least 1");
  check_tensor_parallel(m, n);
  std::uint64_t const tp = m.tensor_parallel, pp = lay.pipeline_parallel;
  auto const group = [&](std::string_view name, std::uint64_t degree) {
    auto const size = degree * tp * pp;
    if (size > lay.gpus || lay.gpus % size != 0)
      fail(name, degree, "x " + std::string(n.tensor_parallel) + " " + std::to_string(tp) + " x " + std::string(n.pipeline_parallel) + " " +
                             std::to_string(pp) + " = " + std::to_string(size) + " GPUs does not divide " + std::string(n.gpus) + " " +
                             std::to_string(lay.gpus));
  };
  group(n.fsdp, lay.fsdp);
  if (lay.expert_parallel > 1) {
    if (m.experts == 0) fail(n.expert_parallel, lay.expert_parallel, "on '" + std::string(m.name) + "', which has no experts");
    if (m.experts % lay.expert_parallel != 0)
      fail(n.expert_parallel, lay.expert_parallel, "does not divide the " + std::to_string(m.experts) + " experts of '" + std::string(m.name) + "'");
    group(n.expert_parallel, lay.expert_parallel);
    auto const hi = std::max(lay.fsdp, lay.expert_parallel), lo = std::min(lay.fsdp, lay.expert_parallel);
    if (hi % lo != 0)
      fail(n.expert_parallel, lay.expert_parallel,
           "and " + std::string(n.fsdp) + " " + std::to_string(lay.fsdp) + " must divide one another (each expert's state is sharded over " +
               std::string(n.fsdp) + " / " + std::string(n.expert_parallel) + " GPUs)");
  }
}

}  // namespace tide

TIDE_DESIGNATED_INIT_END
