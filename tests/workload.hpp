#pragma once
// A synthetic workload for executor tests: forward fills each slot with a pattern that depends
// on (layer, slot, step); backward folds each slot's bytes into a per-layer digest. Any byte
// that reaches a backward from the wrong place, or too early, changes the digest.
#include <tide/tide.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

namespace workload {

inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct synthetic {
  std::uint64_t step = 0;
  std::vector<std::uint64_t> digest;  // per layer
  explicit synthetic(std::uint32_t layers) : digest(layers, 0) {}

  template <class Ctx>
  void forward(Ctx const& c) const {
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) {
      if (!c.produces(k)) continue;
      auto s = c.slot(k);
      std::uint64_t v = mix((std::uint64_t{c.layer} << 40) ^ (std::uint64_t{k} << 20) ^ step);
      std::size_t i = 0;
      for (; i + 8 <= s.size(); i += 8, v = v * 6364136223846793005ull + 1442695040888963407ull)
        std::memcpy(s.data() + i, &v, 8);
      for (; i < s.size(); ++i) s[i] = static_cast<std::byte>(v >> (8 * (i % 8)));
    }
  }
  template <class Ctx>
  void backward(Ctx const& c) {
    std::uint64_t h = digest[c.layer];
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) {
      auto s = c.slot(k);
      std::size_t i = 0;
      for (; i + 8 <= s.size(); i += 8) {
        std::uint64_t w;
        std::memcpy(&w, s.data() + i, 8);
        h = (h ^ w) * 1099511628211ull;
      }
      for (; i < s.size(); ++i) h = (h ^ static_cast<std::uint64_t>(s[i])) * 1099511628211ull;
    }
    digest[c.layer] = h;
  }
};

//! Runs `steps` steps of the synthetic workload on `s`; returns the per-layer digests.
template <class Backend>
std::vector<std::uint64_t> run(Backend& b, tide::schedule_view s, int steps = 2, tide::executor_options o = {}) {
  tide::executor exec(b, s, o);
  synthetic w(s.layer_count());
  for (int i = 0; i < steps; ++i, ++w.step)
    exec.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
  return w.digest;
}

}  // namespace workload
