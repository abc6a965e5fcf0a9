#pragma once
// The original trainer, before tide: every layer's activations in one struct, a forward loop, the
// loss, a backward loop, SGD. This is the shape docs/porting.md starts from.

#include <cstdint>
#include <vector>

#include "model.hpp"

namespace porting {

//! Every layer's saved activations at once: what tide takes over.
struct activations {
  std::vector<float> residual;                     // (L+1)*B*C: [0] the input, [l+1] layer l's output
  std::vector<float> ln, ln_mean, ln_rstd, fc, fc_gelu;  // L*B*C, L*B, L*B, L*B*4C, L*B*4C
  config c;
  explicit activations(config const& cfg) : c(cfg) {
    std::size_t const L = c.layers, B = c.batch, C = c.channels;
    residual.resize((L + 1) * B * C), ln.resize(L * B * C), ln_mean.resize(L * B), ln_rstd.resize(L * B);
    fc.resize(L * B * 4 * C), fc_gelu.resize(L * B * 4 * C);
  }
  [[nodiscard]] block_acts layer(int l) {
    std::size_t const B = c.batch, BC = B * c.channels;
    return {&ln[l * BC], &ln_mean[l * B], &ln_rstd[l * B], &fc[l * 4 * BC], &fc_gelu[l * 4 * BC]};
  }
  [[nodiscard]] float* res(int l) { return &residual[l * std::size_t(c.batch) * c.channels]; }
};

struct step_result {
  float loss = 0;
  std::uint64_t grad_checksum = 0;
  friend bool operator==(step_result const&, step_result const&) = default;
};

//! Trains `c.steps` steps from the initial weights; returns each step's loss and gradient checksum.
[[nodiscard]] inline std::vector<step_result> train_original(config const& c) {
  parameters p(c), g(c, true);
  activations acts(c);
  backward_scratch scratch(c);
  std::vector<float> dres(std::size_t(c.batch) * c.channels);  // the gradient of the residual stream
  std::vector<step_result> out;
  for (int step = 0; step < c.steps; ++step) {
    batch const b(c, step);
    std::copy(b.x.begin(), b.x.end(), acts.res(0));
    for (int l = 0; l < c.layers; ++l) block_forward(c, p, l, acts.res(l), acts.layer(l), acts.res(l + 1));
    float const loss = head_loss(c, p, g, acts.res(c.layers), b.targets.data(), dres.data());
    for (int l = c.layers - 1; l >= 0; --l) {
      block_acts const a = acts.layer(l);
      block_backward(c, p, g, l, acts.res(l), {a.ln, a.ln_mean, a.ln_rstd, a.fc, a.fc_gelu}, dres.data(), scratch);
    }
    out.push_back({loss, checksum_and_update(c, p, g)});
  }
  return out;
}

}  // namespace porting
