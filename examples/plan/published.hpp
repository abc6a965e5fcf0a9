// examples/plan --published: NVIDIA's host-offloading study (JAX/XLA/MaxText on 128 GB200 GPUs
// of NVL72 systems) set up from physics: the models' public dimensions, the GB200 datasheet, a
// stated parallel layout and training recipe; nothing fitted to the published results.
//
// Layout (the study's is not public to us; this is why we chose ours):
// - 128 GPUs are two NVL72 racks of 64. FSDP over all 128: with FP32 master weights and Adam
//   (16 bytes a parameter) DeepSeek-V3's state alone is 78 GiB a GPU at 128-way sharding and
//   156 GiB at 64-way (hybrid sharding by rack would not leave room for activations). No tensor
//   parallelism: 1024 / 128 = 8 (and 256 / 128 = 2) sequences per GPU per step, no gradient
//   accumulation. Gathers and reduce-scatters cross the racks hierarchically.
// - DeepSeek-V3, micro-batch 8, global batch 1024: expert parallelism 64, so each expert group is
//   a rack (256 experts / 64 = 4 per GPU) and the all-to-all runs on NVLink. Sequence 4096 (an
//   assumption). Offloaded: the attention's low-rank projections (q_latent, kv_latent) and the
//   MoE up-projections (mlp_up), the study's "attention projections and MoE up-projections".
// - Llama 3.1 405B, batch 2, sequence 8192, FP8 matrix products: the published 2,669 and 2,746
//   TFLOP/s per device are above GB200's dense BF16 peak (2,500), so only FP8 (5,000) reads them
//   physically. Offloaded: the QKV projections.
// DeepSeek-V3 in BF16 (the study's 908.2 TFLOP/s is 36% of the BF16 peak).
// Offload rows rematerialize what they do not offload (the layer input is kept), as full remat
// does (MaxText's `remat_policy: full` saves nothing inside a layer). The rows the study compared:
// full remat; the offload policy with its tensors kept on the device (on-device: "saving
// activations on the device"); offload without latency hiding (copies and collectives on the
// compute stream: XLA's latency-hiding scheduler, off by default, governs both); with it; and
// chunked with a deep prefetch window (7 layers ahead, 8 staging buffers: the study's latency
// hiding held about eight layers of offloaded tensors more than its run without it).
#pragma once

#include "example.hpp"

#include <tide/tide.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace published {

struct setup {
  tide::transformer_spec model;
  tide::training_spec training;
  std::vector<tide::name> offload;  // the study's offloaded tensors
};

inline std::vector<setup> setups(std::uint64_t deepseek_mb = 8, std::uint64_t llama_mb = 2) {
  using namespace tide;
  std::vector<setup> r;
  r.push_back({models::deepseek_v3(4096, deepseek_mb, 1),
               {.layout = {.gpus = 128, .fsdp = 128, .expert_parallel = 64}},
               {"q_latent", "kv_latent", "mlp_up"}});
  auto llama = models::llama3_405b(8192, llama_mb, 1);
  llama.matmul = precision::fp8;
  r.push_back({llama, {.layout = {.gpus = 128, .fsdp = 128}}, {"qkv"}});
  return r;
}

struct row {
  std::string model, hardware, strategy;
  std::uint64_t microbatch = 0;
  double step_ms = 0, tflops_per_device = 0;
  // The step's parts: compute-stream time in forwards, backwards and recomputes, and exposed
  // copies and collectives (on the compute stream, or waited for there).
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0, exposed_copy_ms = 0, exposed_collective_ms = 0;
  double device_peak_gib = 0, activation_peak_gib = 0, host_gib = 0, resident_gib = 0;
  bool fits = false;
  std::uint64_t largest_microbatch = 0;
};

inline double gib(std::size_t b) { return static_cast<double>(b) / double(1ull << 30); }

//! The strategy rows of `s` at its micro-batch on `hw` (`with_plan`: the planner's row too).
inline std::vector<tide::strategy_row> rows_of(setup const& s, tide::hardware_spec const& hw, bool with_plan,
                                               tide::resident_memory* resident_out = nullptr) {
  using namespace tide;
  auto const st = transformer_stack(s.model);
  auto const costs = transformer_costs(s.model, hw, s.training);
  auto const resident = transformer_resident_memory(s.model, hw, s.training);
  if (resident_out) *resident_out = resident;
  strategy_options o;
  o.device_budget = activation_budget(hw, resident);
  o.host_budget = hw.pinnable_host_bytes();
  o.resident_bytes = resident.total();
  o.collectives = training_collectives(s.training);
  o.offload_slots = s.offload;
  o.remat_rest = true;
  o.deep_prefetch_distance = 7;
  o.include_plan = with_plan;
  return compare_strategies(st, costs, o);
}

//! The ceiling of full remat over the latency-hidden run, and a what-if (docs/planning.md): if
//! full remat recomputes each layer's forward once and the latency-hidden run is compute-bound,
//! remat / latency-hidden <= (2F + B) / (F + B) = 1 + F / (F + B) for forward F and backward B.
struct ceiling {
  double forward_ms = 0, backward_ms = 0;
  double bound = 0;                   //!< 1 + F / (F + B), on the sim's F and B
  double ratio = 0;                   //!< the model's full remat over offload-lhs
  double remat_without_overlap_ms = 0;  //!< what-if: full remat with its collectives on the compute stream
  double exposed_needed_ms = 0;       //!< what-if: exposure the remat run alone would need for `published_ratio`
};
inline ceiling ceiling_of(setup const& s, tide::hardware_spec const& hw, std::vector<row> const& rows, double published_ratio) {
  using namespace tide;
  ceiling c;
  row const* lhs = nullptr;
  row const* remat = nullptr;
  for (auto const& r : rows) {
    if (r.strategy == "offload-lhs") lhs = &r;
    if (r.strategy == "full-remat") remat = &r;
  }
  if (!lhs || !remat) return c;
  c.forward_ms = lhs->forward_ms;
  c.backward_ms = lhs->backward_ms;
  c.bound = 1 + c.forward_ms / (c.forward_ms + c.backward_ms);
  c.ratio = remat->step_ms / lhs->step_ms;
  c.exposed_needed_ms = published_ratio * lhs->step_ms - remat->step_ms;
  // The table's own full-remat strategy, its collectives turned serial.
  for (auto const& r : rows_of(s, hw, false))
    if (r.key == "full-remat") {
      auto serial = r.strategy;
      serial.collectives.overlap = false;
      strategy_options o;
      o.collectives = training_collectives(s.training);
      auto const what_if = evaluate_strategy(transformer_stack(s.model), transformer_costs(s.model, hw, s.training), serial, o,
                                             "full-remat", "full remat, collectives not overlapped");
      c.remat_without_overlap_ms = what_if.step_us / 1e3;
    }
  return c;
}

//! Every strategy of `s` on `hw`, with the largest micro-batch at which each fits (searched
//! upward from 1 to `max_mb`).
inline std::vector<row> run(setup const& s, tide::hardware_spec const& hw, std::uint64_t max_mb = 16) {
  using namespace tide;
  std::vector<row> out;
  auto const flops = transformer_step_flops(s.model);
  for (auto const& r : rows_of(s, hw, true)) {
    row x{std::string(s.model.name), std::string(hw.name), r.key, s.model.micro_batch};
    x.step_ms = r.step_us / 1e3;
    x.tflops_per_device = flops / (r.step_us * 1e-6) / 1e12;
    x.forward_ms = r.forward_us / 1e3;
    x.backward_ms = r.backward_us / 1e3;
    x.recompute_ms = r.recompute_us / 1e3;
    x.exposed_copy_ms = r.exposed_transfer_us / 1e3;
    x.exposed_collective_ms = r.exposed_collective_us / 1e3;
    x.device_peak_gib = gib(r.whole_device_bytes);
    x.activation_peak_gib = gib(r.activation_bytes);
    x.host_gib = gib(r.host_bytes);
    x.resident_gib = gib(r.whole_device_bytes - r.activation_bytes);
    x.fits = r.fits;
    out.push_back(x);
  }
  // Largest micro-batch per strategy: the table's rows (cheap) at micro-batch 1, 2, ... until none
  // fits. The planner is never worse than a row that fits (the rows are its seeds), so its search
  // starts above the rows' largest micro-batch: it plans only where it could add one.
  std::uint64_t rows_largest = 0;
  for (std::uint64_t mb = 1; mb <= max_mb; ++mb) {
    auto m = s;
    m.model.micro_batch = mb;
    bool any = false;
    for (auto const& r : rows_of(m, hw, false))
      if (r.fits) {
        any = true;
        rows_largest = mb;
        for (auto& x : out)
          if (x.strategy == r.key) x.largest_microbatch = mb;
      }
    if (!any) break;
  }
  // The planner: a bisection above the rows' largest micro-batch (fitting is monotone in the
  // micro-batch: a plan that fits at mb + 1 fits at mb, where every slot is smaller).
  auto planner_fits = [&](std::uint64_t mb) {
    auto m = s;
    m.model.micro_batch = mb;
    auto const rows = rows_of(m, hw, true);
    return std::any_of(rows.begin(), rows.end(), [](auto const& r) { return r.key == "planner" && r.fits; });
  };
  std::uint64_t lo = rows_largest, hi = max_mb + 1;  // fits at lo (or lo = 0), not known to fit at hi
  while (hi - lo > 1) {
    auto const mid = lo + (hi - lo) / 2;
    (planner_fits(mid) ? lo : hi) = mid;
  }
  for (auto& x : out)
    if (x.strategy == "planner") x.largest_microbatch = lo;
  return out;
}

}  // namespace published
