// The schedule of a small transformer-like stack under three policies, built at compile time:
// keep everything, offload the large attention and MLP activations, or recompute them. Prints
// what each keeps where, the op order on each stream, and the predicted peaks.
#include <tide/tide.hpp>

#include <cstdio>

namespace {

constexpr std::size_t KiB = 1024;
//! [stack]
// 2 dense layers, then 4 mixture-of-experts layers: the slots each saves for backward.
using dense = tide::layer<"dense", tide::input_slot<"layer_input", 64 * KiB>, tide::slot<"q_proj", 64 * KiB>,
                          tide::slot<"kv_proj", 16 * KiB>, tide::slot<"attn_out", 64 * KiB>,
                          tide::slot<"mlp_up", 256 * KiB>>;
using moe = tide::layer<"moe", tide::input_slot<"layer_input", 64 * KiB>, tide::slot<"q_proj", 64 * KiB>,
                        tide::slot<"kv_proj", 16 * KiB>, tide::slot<"attn_out", 64 * KiB>,
                        tide::slot<"experts", 512 * KiB>>;
using model = tide::stack<tide::repeat<dense, 2>, tide::repeat<moe, 4>>;
//! [stack]

//! [strategies]
using keep_all = tide::keep_all;
// Offload what is large and produced early; keep the small kv projections on device.
using offload_selected = tide::policy<tide::offload<tide::slot_names<"q_proj", "attn_out", "mlp_up", "experts">>>;
// Recompute the MLP and expert activations from the saved layer input.
using remat_selected = tide::policy<tide::remat<tide::slot_names<"mlp_up", "experts">>>;

// Latency hiding (the default), each layer prefetched two layers ahead, copies in 128 KiB chunks.
using pipelined = tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<128 * KiB>>;
using ring3 = tide::buffers<tide::staging_buffers<3>>;

constexpr auto keep = tide::make_schedule<model, tide::strategy_of<keep_all>>();
constexpr auto offload = tide::make_schedule<model, tide::strategy_of<offload_selected, ring3, pipelined>>();
constexpr auto remat = tide::make_schedule<model, tide::strategy_of<remat_selected>>();

// Schedules are constant expressions: a budget can be enforced at compile time.
constexpr std::size_t budget = 2560 * KiB;
static_assert(offload.peak_device_bytes() <= budget, "the offload schedule must fit 2.5 MiB");
static_assert(remat.peak_device_bytes() <= budget, "the remat schedule must fit 2.5 MiB");
static_assert(keep.peak_device_bytes() > budget, "keep-all is what does not fit");
//! [strategies]

void show(char const* title, tide::schedule_view s) {
  auto const r = tide::check_schedule(s);  // the checker proves the program before it is shown
  std::printf("=== %s\n%s  checker: ok (%zu ordering checks of overlapping accesses; replayed peaks %s device, %s host)\n\n",
              title, tide::describe(s).c_str(), r.conflicting_pairs,
              tide::format_bytes(static_cast<double>(r.replayed_device_bytes)).c_str(),
              tide::format_bytes(static_cast<double>(r.replayed_host_bytes)).c_str());
}

}  // namespace

int main() {
  show("keep all", keep);
  show("offload q_proj, attn_out, mlp_up, experts (latency hiding, prefetch distance 2, 128 KiB chunks)", offload);
  show("remat mlp_up and experts", remat);
  std::printf("%-10s %14s %14s\n", "policy", "peak device", "peak host");
  for (auto [name, s] : {std::pair<char const*, tide::schedule_view>{"keep", keep}, {"offload", offload}, {"remat", remat}})
    std::printf("%-10s %14s %14s\n", name, tide::format_bytes(static_cast<double>(s.peak_device_bytes())).c_str(),
                tide::format_bytes(static_cast<double>(s.peak_host_bytes())).c_str());
}
