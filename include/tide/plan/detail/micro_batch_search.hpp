#pragma once
//! \file
//! The implementation behind `<tide/plan/micro_batch.hpp>`: the work of a transformer layer that
//! does not grow with the micro-batch, the line fit of calibrated cost tables, and the throughput
//! of one micro-batch's plan.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/error.hpp>
#include <tide/plan/hardware.hpp>
#include <tide/plan/training.hpp>
#include <tide/plan/transformer.hpp>

namespace tide::detail {

//! The fixed work of one layer type, in microseconds: what `add_fixed_work` adds to each op.
struct layer_fixed_work {
  double forward_us = 0;
  double backward_us = 0;
  std::vector<double> slot_us{};  //!< per slot: its producing op's kernels and weight reads
};

//! Kernels a layer's forward launches: two per producing op (the product and its elementwise
//! epilogue, an assumption) for every op that produces a saved slot, the products that produce
//! none, and the residual add.
inline double forward_kernels(transformer_layer const& d, double kernels_per_op) {
  std::set<std::uint16_t> producers;
  for (auto const& s : d.slots) producers.insert(s.producer);
  double const ops = static_cast<double>(producers.size()) + (d.extra_flops > 0 ? 1 : 0) + 1;
  return ops * kernels_per_op;
}

//! `m`'s layer (dense or MoE) as fixed work: launches, and the weights each matrix product reads
//! from HBM once per pass (a slot's share of them is its product's share of the layer's matrix
//! FLOPs, an approximation: exact for dense products, whose FLOPs are 2 x tokens x parameters).
inline layer_fixed_work fixed_work(transformer_spec const& m, hardware_spec const& hw, training_spec const& t, bool moe,
                                   double launch_us, double kernels_per_op, bool weight_reads) {
  auto const d = describe_layer(m, moe);
  layer_fixed_work w;
  double const kernels = forward_kernels(d, kernels_per_op);
  double const tp = m.tensor_parallel;
  // The parameters this GPU's products read: its tensor-parallel share of the dense ones and of
  // the routed experts it runs.
  double const params = d.params / tp + d.expert_params / tp / std::max<std::uint32_t>(t.layout.expert_parallel, 1);
  double const bw = hw.hbm_bytes_per_second;
  double const read_us = weight_reads && bw > 0 ? params * t.compute_weight_bytes / bw * 1e6 : 0;
  // Backward reads the weights for the data gradient and writes the weight gradient.
  double const grad_us = weight_reads && bw > 0 ? params * (t.compute_weight_bytes + t.gradient_bytes) / bw * 1e6 : 0;
  w.forward_us = kernels * launch_us + read_us;
  w.backward_us = 2 * kernels * launch_us + grad_us;  // data- and weight-gradient kernels
  double mat = d.extra_flops;
  for (auto const& s : d.slots) mat += s.flops;
  for (auto const& s : d.slots) {
    double const share = mat > 0 ? s.flops / mat : 0;
    w.slot_us.push_back(s.whole_forward ? w.forward_us : kernels_per_op * launch_us + share * read_us);
  }
  return w;
}

//! Least-squares `fixed + per_sample x b` through (b, y); a negative intercept is refitted
//! through the origin, a negative slope as a constant: times are never negative at any b >= 1.
inline std::pair<double, double> fit_line(std::span<double const> b, std::span<double const> y) {
  auto const n = static_cast<double>(b.size());
  double mb = 0, my = 0;
  for (std::size_t i = 0; i < b.size(); ++i) mb += b[i], my += y[i];
  mb /= n;
  my /= n;
  double sbb = 0, sby = 0;
  for (std::size_t i = 0; i < b.size(); ++i) sbb += (b[i] - mb) * (b[i] - mb), sby += (b[i] - mb) * (y[i] - my);
  double slope = sbb > 0 ? sby / sbb : 0;
  double fixed = my - slope * mb;
  if (slope < 0) slope = 0, fixed = my;
  if (fixed < 0) {
    double sy = 0, sb = 0;
    for (std::size_t i = 0; i < b.size(); ++i) sy += y[i] * b[i], sb += b[i] * b[i];
    fixed = 0, slope = sy / sb;
  }
  return {fixed, slope};
}

//! Tokens per second of `tokens` in `step_us` microseconds: 0 for no step (nothing fits), and
//! infinity for a step of no time.
inline double per_second(double tokens, double step_us) {
  if (!(step_us < std::numeric_limits<double>::infinity())) return 0;
  return step_us > 0 ? tokens / step_us * 1e6 : std::numeric_limits<double>::infinity();
}

}  // namespace tide::detail
