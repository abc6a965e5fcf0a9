#pragma once
// The transformer cost model's implementation (<tide/plan/transformer.hpp>'s transformer_costs).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/plan/detail/transformer_layers.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/transformer_spec.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {
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
}  // namespace tide

TIDE_DESIGNATED_INIT_END
