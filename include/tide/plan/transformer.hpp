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

#include <tide/core/error.hpp>
#include <tide/core/stack.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! A decoder-only transformer's dimensions and run shape, from which `transformer_stack`,
//! `transformer_costs` and `transformer_resident_memory` derive slots, costs and memory.
struct transformer_spec {
  std::string_view name{};         //!< what reports call the model
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

namespace detail {

//! One slot of a transformer layer and the op that produces it.
struct transformer_slot {
  std::string_view name{};  //!< the slot's name
  double bytes = 0;
  double flops = 0;         //!< matrix work of the producing op (0: elementwise)
  double attention_flops = 0;
  double memory_bytes = 0;  //!< HBM traffic of the producing op when elementwise
  bool whole_forward = false;
  std::uint16_t producer = 0;  //!< the producing op (slots of one op share it)
  //! The collectives before the producing op, as tensor-parallel exchanges and all-to-alls.
  std::uint8_t tp_exchanges = 0, all_to_alls = 0;
};

struct transformer_layer {
  std::vector<transformer_slot> slots{};  //!< the saved slots, in order
  double extra_flops = 0;                 //!< matrix work that produces no saved slot (down projection)
  double extra_memory_bytes = 0;
  double params = 0;         //!< the layer's parameters but the routed experts' (whole, not split by TP)
  double expert_params = 0;  //!< the routed experts' parameters (all experts)
};

inline transformer_layer describe_layer(transformer_spec const& m, bool moe) {
  if (m.hidden == 0 || m.heads == 0 || m.layer_count == 0 || m.tensor_parallel == 0 || m.tokens() == 0)
    throw cost_model_error("tide: transformer '" + std::string(m.name) +
                         "' needs layers, hidden, heads, tensor_parallel, seq_len and micro_batch above zero");
  double const T = static_cast<double>(m.tokens());
  double const tp = m.tensor_parallel;
  double const e = m.bytes_per_element;
  double const h = static_cast<double>(m.hidden);
  double const H = m.heads / tp;  // heads on this GPU
  double const seq = static_cast<double>(m.seq_len);
  transformer_layer L;
  auto elementwise = [&](std::string_view n, double width, double elem = 0) {
    double const b = T * width * (elem > 0 ? elem : e);
    return transformer_slot{n, b, 0, 0, 2 * b};
  };
  L.slots.push_back({"layer_input", T * h / tp * e, 0, 0, 0, true});
  L.slots.push_back(elementwise("attn_norm", h));
  L.slots.back().tp_exchanges = 1;  // the gather before
  double d_qk = m.head_dim, d_v = m.v_head_dim > 0 ? m.v_head_dim : m.head_dim;
  if (m.latent_attention) {
    d_qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    double const kv_a = m.kv_lora_rank + m.qk_rope_head_dim;
    L.slots.push_back({"q_latent", T * m.q_lora_rank * e, 2 * T * h * m.q_lora_rank});
    L.slots.push_back({"kv_latent", T * kv_a * e, 2 * T * h * kv_a});
    double const q = H * d_qk, k = H * d_qk, v = H * d_v;
    L.slots.push_back({"qkv", T * (q + k + v) * e,
                       2 * T * (m.q_lora_rank * q + m.kv_lora_rank * (H * m.qk_nope_head_dim + v))});
    double const Hf = m.heads;
    L.params = h * m.q_lora_rank + m.q_lora_rank * Hf * d_qk + h * kv_a + m.kv_lora_rank * Hf * (m.qk_nope_head_dim + d_v) +
               Hf * d_v * h;
  } else {
    double const kvh = std::max(1.0, m.kv_heads / tp);
    double const width = (H + 2 * kvh) * d_qk;
    L.slots.push_back({"qkv", T * width * e, 2 * T * h * width});
    L.params = h * (m.heads + 2.0 * m.kv_heads) * d_qk + m.heads * d_v * h;
  }
  // Causal attention: each token attends to seq/2 keys on average, QK^T then PV.
  double const attn = 2 * T * (seq / 2) * H * (d_qk + d_v);
  L.slots.push_back({"attn_out", T * H * d_v * e, 0, attn});
  L.slots.push_back({"softmax_lse", T * H * 4, 0, attn});  // the same kernel: producer set below
  // The residual after attention needs the output projection again (and the scatter after it).
  L.slots.push_back({"mlp_input", T * h / tp * e, 2 * T * H * d_v * h, 0, 3 * T * h / tp * e});
  L.slots.back().tp_exchanges = 1;
  double width = 0;
  double const routed_width = static_cast<double>(m.top_k) * static_cast<double>(m.expert_ffn) / tp;
  double const routed = T * m.top_k * h * e / tp;  // the routed copies of the tokens
  if (moe) {
    width = static_cast<double>(m.top_k + m.shared_experts) * static_cast<double>(m.expert_ffn) / tp;
    L.slots.push_back({"router", T * m.experts * 4.0, 2 * T * h * m.experts});
    // The dispatch: the tokens permuted by expert (read and write), the gather before, the all-to-all.
    L.slots.push_back({"expert_input", routed, 0, 0, 2 * routed});
    L.slots.back().tp_exchanges = 1;
    L.slots.back().all_to_alls = 1;
    L.params += 3 * h * static_cast<double>(m.shared_experts * m.expert_ffn) + h * m.experts;
    L.expert_params = 3 * h * static_cast<double>(m.experts) * static_cast<double>(m.expert_ffn);
  } else {
    width = static_cast<double>(m.ffn) / tp;
    L.params += 3 * h * static_cast<double>(m.ffn);
  }
  L.slots.push_back({"mlp_up", T * 2 * width * e, 2 * T * h * 2 * width});
  if (!moe) L.slots.back().tp_exchanges = 1;  // the gather before (a MoE layer's is the dispatch's)
  L.slots.push_back(elementwise("mlp_act", width));
  if (moe) {
    // The routed experts' down projection, the combine all-to-all, the tokens permuted back.
    L.slots.push_back({"expert_out", routed, 2 * T * routed_width * h, 0, 2 * routed});
    L.slots.back().all_to_alls = 1;
    L.extra_flops = 2 * T * (width - routed_width) * h;  // the shared experts' down projection
  } else {
    L.extra_flops = 2 * T * width * h;  // down projection
  }
  L.extra_memory_bytes = 2 * T * h / tp * e;  // the residual add after the MLP
  for (std::size_t k = 0; k < L.slots.size(); ++k) L.slots[k].producer = static_cast<std::uint16_t>(k);
  auto const lse = std::find_if(L.slots.begin(), L.slots.end(), [](auto const& x) { return x.name == "softmax_lse"; });
  lse->producer = (lse - 1)->producer;  // attention writes its output and log-sum-exp at once
  return L;
}

}  // namespace detail

//! The stack of `m`: one layer type "dense" and, with experts, one "moe". Slot names are string
//! literals, so the stack does not refer to `m`.
inline stack_spec transformer_stack(transformer_spec const& m) {
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

namespace detail {
inline cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw, training_spec const& t,
                                    bool communication) {
  auto const& lay = t.layout;
  if (communication) check_parallel_layout(m, lay);
  else check_tensor_parallel(m);
  check_link_efficiency(hw);
  cost_table c;
  c.link = hw.link();
  c.storage = hw.storage();
  c.hbm_bytes_per_second = hw.hbm_bytes_per_second;  // host copies take their share of it
  double const T = static_cast<double>(m.tokens());
  double const h = static_cast<double>(m.hidden), e = m.bytes_per_element, tp = m.tensor_parallel;
  // Tensor parallel (sequence parallel): each all-gather or reduce-scatter moves the full-width
  // activations of the tokens, T x hidden.
  auto const dom = job_domain_gpus(lay.gpus, hw);
  auto const in_domain = [&](std::uint64_t group) { return static_cast<std::uint32_t>(std::min<std::uint64_t>(group, dom)); };
  double const tp_us = communication ? all_gather_seconds(T * h * e, m.tensor_parallel, in_domain(m.tensor_parallel), hw) * 1e6 : 0;
  // A group of n GPUs spaced `stride` apart has dom / stride of them in a domain (one when the
  // stride spans a domain).
  auto const spaced = [&](std::uint64_t n, std::uint64_t stride) {
    return static_cast<std::uint32_t>(stride >= dom ? 1 : std::min<std::uint64_t>(n, dom / std::max<std::uint64_t>(stride, 1)));
  };
  std::uint64_t const tpu = m.tensor_parallel, block = std::uint64_t{lay.fsdp} * tpu * lay.pipeline_parallel;
  // Dense weights: FSDP over `fsdp` GPUs (TP apart); replicas a whole FSDP x TP x PP block apart.
  auto const replicas = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, lay.gpus / block));
  // Routed experts: split over expert_parallel GPUs, each expert's state sharded over the
  // `max(fsdp, expert_parallel) / expert_parallel` GPUs that hold it (expert_parallel x TP apart).
  std::uint64_t const expert_shard = std::max<std::uint64_t>(lay.fsdp, lay.expert_parallel);
  auto const expert_group = static_cast<std::uint32_t>(expert_shard / lay.expert_parallel);
  auto const expert_replicas =
      static_cast<std::uint32_t>(std::max<std::uint64_t>(1, lay.gpus / (expert_shard * tpu * lay.pipeline_parallel)));
  layer_cost per_type[2];
  for (int moe = 0; moe < 2; ++moe) {
    auto const desc = detail::describe_layer(m, moe == 1);
    auto& lc = per_type[moe];
    double mat = desc.extra_flops, mem = desc.extra_memory_bytes, attn = 0;
    for (auto const& s : desc.slots) {
      mat += s.flops;
      mem += s.memory_bytes;
      if (s.attention_flops > 0 && s.name == "attn_out") attn += s.attention_flops;  // one kernel
    }
    // Expert parallel: dispatch and combine each send the routed copies of the tokens.
    double const a2a_us =
        communication && moe == 1 ? all_to_all_seconds(T * m.top_k * h * e / tp, lay.expert_parallel, spaced(lay.expert_parallel, tpu), hw) * 1e6
                 : 0;
    double const comm_fwd = 4 * tp_us + 2 * a2a_us;
    double const fwd = hw.matmul_seconds(mat, m.matmul) + hw.matmul_seconds(attn) + hw.memory_seconds(mem);
    lc.forward_us = fwd * 1e6 + comm_fwd;
    lc.backward_us = (hw.matmul_seconds(2 * mat, m.matmul) + hw.matmul_seconds(2.5 * attn) + hw.memory_seconds(2 * mem)) * 1e6 +
                     comm_fwd;
    lc.recompute_us = lc.forward_us;
    lc.memory_bound_share = lc.forward_us > 0 ? hw.memory_seconds(mem) * 1e6 / lc.forward_us : 0;  // of the op's time
    for (auto const& s : desc.slots) {
      double r = (hw.matmul_seconds(s.flops, m.matmul) + hw.matmul_seconds(s.attention_flops) + hw.memory_seconds(s.memory_bytes)) * 1e6;
      r += s.tp_exchanges * tp_us + s.all_to_alls * a2a_us;
      lc.slot_recompute_us.push_back(s.whole_forward ? lc.forward_us : r);
      lc.slot_producer.push_back(s.producer);
    }
    // FSDP: the layer's weights gathered (its tensor-parallel share; of the routed experts, the
    // ones this GPU runs), and its gradients reduce-scattered, each over the group sharding them,
    // then each shard all-reduced over the replicas.
    double const dense = desc.params / tp, experts = desc.expert_params / tp / lay.expert_parallel;
    auto const gather = [&](double bytes_per_param) {
      return all_gather_seconds(dense * bytes_per_param, lay.fsdp, spaced(lay.fsdp, tpu), hw) +
             all_gather_seconds(experts * bytes_per_param, expert_group, spaced(expert_group, lay.expert_parallel * tpu), hw);
    };
    lc.gather_us = gather(t.compute_weight_bytes) * 1e6;
    lc.regather_us = lc.gather_us;
    lc.reduce_us = (gather(t.gradient_bytes) +
                    all_reduce_seconds(dense * t.gradient_bytes / lay.fsdp, replicas, spaced(replicas, block), hw) +
                    all_reduce_seconds(experts * t.gradient_bytes / expert_group, expert_replicas,
                                       spaced(expert_replicas, expert_shard * tpu * lay.pipeline_parallel), hw)) *
                   1e6;
  }
  for (std::uint32_t l = 0; l < m.layer_count; ++l) c.layers.push_back(per_type[m.is_moe(l) ? 1 : 0]);
  return c;
}
}  // namespace detail

//! Per-layer costs of `m` on `hw` for one GPU of a job laid out as `t` says: forward, backward,
//! per-slot recompute (matrix products at `m.matmul`'s rate, attention in BF16), `hw`'s host link
//! (this GPU's share), and the collectives of `training.hpp` (FSDP gathers and reduce-scatters
//! as the layers' collective hooks; tensor-parallel and expert-parallel exchanges on the compute
//! path, paid again by the recomputes that need them).
inline cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw, training_spec const& t) {
  return detail::transformer_costs(m, hw, t, true);
}

//! Per-layer costs of `m` on `hw` without communication: compute and the host link only (the
//! tensor- and expert-parallel exchanges and FSDP's collectives left out).
inline cost_table transformer_costs(transformer_spec const& m, hardware_spec const& hw) {
  return detail::transformer_costs(m, hw, training_spec{}, false);
}

//! A model's parameters: all, and those of the routed experts.
struct parameter_count {
  double total = 0;    //!< every parameter, embedding and output head included
  double experts = 0;  //!< those of the routed experts (part of `total`)
};
//! `m`'s parameters, whole (not split over GPUs), embedding and output head included.
inline parameter_count transformer_parameters(transformer_spec const& m) {
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

//! Model FLOPs of one training step of `m` on one GPU (its tensor-parallel share): three times the
//! forward's matrix products and causal attention, the usual count for FLOP/s per device
//! (recomputation not counted; the embedding and output head, which the stack leaves out, neither).
inline double transformer_step_flops(transformer_spec const& m) {
  double r = 0;
  for (std::uint32_t l = 0; l < m.layer_count; ++l) {
    auto const d = detail::describe_layer(m, m.is_moe(l));
    double f = d.extra_flops;
    for (auto const& s : d.slots) f += s.flops + (s.name == "attn_out" ? s.attention_flops : 0);
    r += 3 * f;
  }
  return r;
}

//! What one GPU of `t`'s job keeps resident for `m` besides activations (`resident_memory`).
inline resident_memory transformer_resident_memory(transformer_spec const& m, hardware_spec const& hw, training_spec const& t) {
  auto const& lay = t.layout;
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

//! The HBM left for activations once `resident` is placed (0 when it does not fit at all).
inline std::size_t activation_budget(hardware_spec const& hw, resident_memory const& resident) noexcept {
  return resident.total() >= hw.hbm_bytes ? 0 : hw.hbm_bytes - resident.total();
}

}  // namespace tide

TIDE_DESIGNATED_INIT_END
