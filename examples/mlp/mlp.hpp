#pragma once
// A real CPU network for the host backend: each layer is y = rmsnorm(silu(x W + b)), with its
// backward written out. Each layer saves four slots for backward: its input, the
// pre-activation, the activation and the per-row inverse RMS. Running activations and
// gradients live in the user's own buffers; tide manages only what is saved for backward.
//
// The forward lambda in recompute mode rebuilds the remat slots from the saved input with the
// very same code, so gradients are bitwise equal under every policy.

#include <tide/tide.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace mlp {

struct config {
  std::uint32_t layers = 16;
  std::uint32_t width = 192;
  std::uint32_t batch = 32;
  float learning_rate = 0.05f;
  std::uint64_t seed = 42;  //!< the data; weights always start from the same values
};

//! The layer type: its slots, sized at run time from the config (`make_stack`).
using layer = tide::layer<"mlp", tide::input_slot<"input">, tide::slot<"pre_act">, tide::slot<"act">, tide::slot<"inv_rms">>;

//! The slots as typed handles, resolved at compile time (a misspelled name does not compile).
inline constexpr auto input_slot = tide::slot_handle_of<layer, "input", float>;
inline constexpr auto pre_act_slot = tide::slot_handle_of<layer, "pre_act", float>;
inline constexpr auto act_slot = tide::slot_handle_of<layer, "act", float>;
inline constexpr auto inv_rms_slot = tide::slot_handle_of<layer, "inv_rms", float>;

//! `c.layers` layers of type `layer`, each slot sized for `c.batch` rows of `c.width` floats
//! (`inv_rms`: one float per row).
inline tide::stack_spec make_stack(config const& c) {
  std::size_t const act = std::size_t{c.batch} * c.width * sizeof(float);
  tide::stack_spec s;
  s.append(layer::spec(), c.layers);
  return tide::bind_sizes(s, {{"input", act}, {"pre_act", act}, {"act", act}, {"inv_rms", c.batch * sizeof(float)}});
}

//! Deterministic pseudo-random numbers (SplitMix64), so every run sees the same data.
struct rng {
  std::uint64_t s;
  float uniform() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
};

class network {
 public:
  explicit network(config c) : c_(c), w_(c.layers), b_(c.layers), dw_(c.layers), db_(c.layers) {
    rng r{42};
    rng data{c.seed};
    float const scale = 1.5f / std::sqrt(static_cast<float>(c.width));
    for (std::uint32_t l = 0; l < c.layers; ++l) {
      w_[l].resize(std::size_t{c.width} * c.width);
      b_[l].assign(c.width, 0.0f);
      dw_[l].assign(w_[l].size(), 0.0f);
      db_[l].assign(c.width, 0.0f);
      for (auto& x : w_[l]) x = r.uniform() * scale;
    }
    std::size_t const n = std::size_t{c.batch} * c.width;
    input_.resize(n);
    target_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      input_[i] = data.uniform();
      target_[i] = 0.5f * std::sin(3.0f * input_[i]);
    }
    h_.resize(n);
    g_.resize(n);
  }

  config const& cfg() const { return c_; }
  float loss() const { return loss_; }

  //! The forward lambda: layer 0 starts from the batch; recompute mode writes only remat slots.
  template <class Ctx>
  void forward(Ctx const& ctx) {
    auto const l = ctx.layer;
    auto z = ctx.slot(pre_act_slot);
    auto a = ctx.slot(act_slot);
    auto r = ctx.slot(inv_rms_slot);
    // The input: written in a forward; in a recompute, its saved data (slot() would be scratch).
    std::span<float const> x;
    if (ctx.mode == tide::forward_mode::forward) {
      auto const in = ctx.slot(input_slot);
      std::memcpy(in.data(), l == 0 ? input_.data() : h_.data(), in.size_bytes());
      x = in;
    } else {
      x = ctx.saved(input_slot);
    }
    bool const want_z = ctx.produces(pre_act_slot), want_a = ctx.produces(act_slot), want_r = ctx.produces(inv_rms_slot);
    if (!(want_z || want_a || want_r)) return;
    auto const B = c_.batch, H = c_.width;
    std::vector<float>& zs = scratch_z_;
    zs.resize(std::size_t{B} * H);
    for (std::uint32_t i = 0; i < B; ++i) {
      float* zr = zs.data() + std::size_t{i} * H;
      for (std::uint32_t j = 0; j < H; ++j) zr[j] = b_[l][j];
      for (std::uint32_t k = 0; k < H; ++k) {
        float const xv = x[std::size_t{i} * H + k];
        float const* wr = w_[l].data() + std::size_t{k} * H;
        for (std::uint32_t j = 0; j < H; ++j) zr[j] += xv * wr[j];
      }
      float ss = 0;
      for (std::uint32_t j = 0; j < H; ++j) {
        float const av = silu(zr[j]);
        if (want_a) a[std::size_t{i} * H + j] = av;
        ss += av * av;
      }
      float const inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + 1e-5f);
      if (want_r) r[i] = inv;
      if (ctx.mode == tide::forward_mode::forward)
        for (std::uint32_t j = 0; j < H; ++j) h_[std::size_t{i} * H + j] = silu(zr[j]) * inv;
    }
    if (want_z) std::memcpy(z.data(), zs.data(), z.size_bytes());
  }

  //! The backward lambda: the last layer starts from the loss gradient.
  template <class Ctx>
  void backward(Ctx const& ctx) {
    auto const l = ctx.layer;
    auto const B = c_.batch, H = c_.width;
    auto x = ctx.slot(input_slot);  // read-only: the backward context's spans are const
    auto z = ctx.slot(pre_act_slot);
    auto a = ctx.slot(act_slot);
    auto r = ctx.slot(inv_rms_slot);
    if (l + 1 == c_.layers) {
      float sum = 0;
      auto const n = static_cast<float>(h_.size());
      for (std::size_t i = 0; i < h_.size(); ++i) {
        float const d = h_[i] - target_[i];
        sum += d * d;
        g_[i] = d / n;
      }
      loss_ = 0.5f * sum / n;
    }
    std::vector<float>& dz = scratch_z_;
    dz.resize(std::size_t{B} * H);
    for (std::uint32_t i = 0; i < B; ++i) {
      float const* gr = g_.data() + std::size_t{i} * H;
      float const* ar = a.data() + std::size_t{i} * H;
      float dot = 0;
      for (std::uint32_t j = 0; j < H; ++j) dot += gr[j] * ar[j];
      float const inv = r[i], mean = dot / static_cast<float>(H);
      for (std::uint32_t j = 0; j < H; ++j) {
        float const da = inv * (gr[j] - ar[j] * inv * inv * mean);
        dz[std::size_t{i} * H + j] = da * silu_grad(z[std::size_t{i} * H + j]);
      }
    }
    for (std::uint32_t i = 0; i < B; ++i)
      for (std::uint32_t k = 0; k < H; ++k) {
        float const xv = x[std::size_t{i} * H + k];
        float* dwr = dw_[l].data() + std::size_t{k} * H;
        float const* dzr = dz.data() + std::size_t{i} * H;
        for (std::uint32_t j = 0; j < H; ++j) dwr[j] += xv * dzr[j];
      }
    for (std::uint32_t i = 0; i < B; ++i)
      for (std::uint32_t j = 0; j < H; ++j) db_[l][j] += dz[std::size_t{i} * H + j];
    for (std::uint32_t i = 0; i < B; ++i)  // dx = dz W^T, into the running gradient
      for (std::uint32_t k = 0; k < H; ++k) {
        float const* wr = w_[l].data() + std::size_t{k} * H;
        float const* dzr = dz.data() + std::size_t{i} * H;
        float s = 0;
        for (std::uint32_t j = 0; j < H; ++j) s += dzr[j] * wr[j];
        g_[std::size_t{i} * H + k] = s;
      }
  }

  //! A layer's weight and bias gradients as one span each (for collectives).
  std::span<float> weight_grad(std::uint32_t l) { return dw_[l]; }
  std::span<float> bias_grad(std::uint32_t l) { return db_[l]; }
  //! FNV-1a of the weights' bits: equal on every rank of a data-parallel run.
  std::uint64_t weight_checksum() const {
    std::uint64_t h = 1469598103934665603ull;
    for (auto const& w : w_)
      for (float f : w) {
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        h = (h ^ u) * 1099511628211ull;
      }
    return h;
  }

  //! Drops the gradients of a failed step.
  void discard_gradients() {
    for (std::uint32_t l = 0; l < c_.layers; ++l) {
      std::fill(dw_[l].begin(), dw_[l].end(), 0.0f);
      std::fill(db_[l].begin(), db_[l].end(), 0.0f);
    }
  }

  //! Applies SGD and clears the gradients; returns the gradients' checksum (FNV-1a of the bits).
  std::uint64_t update() {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::vector<float> const& v) {
      for (float f : v) {
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        h = (h ^ u) * 1099511628211ull;
      }
    };
    for (std::uint32_t l = 0; l < c_.layers; ++l) {
      mix(dw_[l]);
      mix(db_[l]);
      for (std::size_t i = 0; i < w_[l].size(); ++i) w_[l][i] -= c_.learning_rate * dw_[l][i];
      for (std::size_t i = 0; i < b_[l].size(); ++i) b_[l][i] -= c_.learning_rate * db_[l][i];
      std::fill(dw_[l].begin(), dw_[l].end(), 0.0f);
      std::fill(db_[l].begin(), db_[l].end(), 0.0f);
    }
    return h;
  }

 private:
  static float silu(float z) { return z / (1.0f + std::exp(-z)); }
  static float silu_grad(float z) {
    float const s = 1.0f / (1.0f + std::exp(-z));
    return s + z * s * (1.0f - s);
  }

  config c_;
  std::vector<std::vector<float>> w_, b_, dw_, db_;
  std::vector<float> input_, target_, h_, g_, scratch_z_;
  float loss_ = 0;
};

}  // namespace mlp
