#pragma once
// The slots of a transformer layer (<tide/plan/transformer.hpp>'s stack and costs read them).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/core/name.hpp>
#include <tide/plan/transformer_spec.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {
namespace detail {

//! One slot of a transformer layer and the op that produces it.
struct transformer_slot {
  tide::name name{};        //!< the slot's name
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
  // tokens() is their product: past 2^40 it is no step a GPU runs, and past 2^64 it wrapped to a
  // small count (or 0) that the check below took as given. Divided, so nothing overflows.
  if (m.seq_len != 0 && m.micro_batch != 0 && m.seq_len > (std::uint64_t{1} << 40) / m.micro_batch)
    throw cost_model_error("tide: transformer '" + std::string(m.name) + "' has seq_len " + std::to_string(m.seq_len) + " x micro_batch " +
                           std::to_string(m.micro_batch) + ": give at most 2^40 tokens a step");
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
}  // namespace tide

TIDE_DESIGNATED_INIT_END
