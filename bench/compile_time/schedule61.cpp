// A translation unit that builds a 61-layer schedule (3 dense + 58 MoE layers, 8 slots each,
// offload + remat + chunked latency-hidden copies + collectives) as a constant expression.
// tools/compile_time.sh times it against the same includes without the schedule.
#include <tide/tide.hpp>

#ifndef TIDE_EMPTY
constexpr std::size_t MiB = 1 << 20;
using dense = tide::layer<"dense", tide::input_slot<"layer_input", 28 * MiB>, tide::slot<"attn_norm", 28 * MiB>,
                          tide::slot<"q_latent", 6 * MiB>, tide::slot<"kv_latent", 2 * MiB>, tide::slot<"qkv", 96 * MiB>,
                          tide::slot<"attn_out", 64 * MiB>, tide::slot<"mlp_up", 144 * MiB>, tide::slot<"mlp_act", 72 * MiB>>;
using moe = tide::layer<"moe", tide::input_slot<"layer_input", 28 * MiB>, tide::slot<"attn_norm", 28 * MiB>,
                        tide::slot<"q_latent", 6 * MiB>, tide::slot<"kv_latent", 2 * MiB>, tide::slot<"qkv", 96 * MiB>,
                        tide::slot<"attn_out", 64 * MiB>, tide::slot<"router", 1 * MiB>, tide::slot<"experts", 224 * MiB>>;
using deepseek_like = tide::stack<tide::repeat<dense, 3>, tide::repeat<moe, 58>>;
using policy = tide::policy<tide::offload<tide::slot_names<"qkv", "attn_out", "experts">, tide::layer_range<0, 60>>,
                            tide::remat<tide::slot_names<"attn_norm", "mlp_act">>>;
using strategy = tide::strategy_of<policy, tide::buffers<tide::staging_buffers<3>>,
                                   tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<32 * MiB>>,
                                   tide::collectives<tide::after_backward>>;
constexpr auto schedule = tide::make_schedule<deepseek_like, strategy>();
static_assert(schedule.layer_count() == 61);
static_assert(schedule.peak_device_bytes() < 61 * (28 + 28 + 6 + 2 + 96 + 64 + 224) * MiB);
#endif

int main() {
#ifndef TIDE_EMPTY
  return static_cast<int>(schedule.ops.size() % 7);
#else
  return 0;
#endif
}
