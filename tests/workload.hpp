#pragma once
// Workloads for executor tests. `synthetic`: forward fills each slot with a pattern that depends
// on (layer, slot, step); backward folds each slot's bytes into a per-layer digest. Any byte
// that reaches a backward from the wrong place, or too early, changes the digest. `chain`: layer
// l + 1's input is layer l's output, as in a real network (see below).
#include <tide/tide.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace workload {

//! A fresh directory for spill files (under the system's temporary directory), removed with
//! whatever is left in it at the end.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "tide-spill-test-XXXXXX").string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed in " + t);
    path = t;
  }
  temp_dir(temp_dir const&) = delete;
  temp_dir& operator=(temp_dir const&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  //! True when nothing is in it (spill files are unlinked while open).
  [[nodiscard]] bool empty() const { return std::filesystem::is_empty(path); }
};


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

// ---- a chain workload: data really flows from layer to layer --------------------------------
//
// Like a real network (examples/mlp/mlp.hpp): each layer type has a slot named "input" and
// other ("derived") slots. The forward of layer l copies the working activation (layer 0: a
// batch that depends on the step; layer l: layer l - 1's output) into its input slot, computes
// every derived slot from the input SLOT, and writes its output, computed from the input slot
// and its parameter, into the working buffer. In recompute mode it writes only the slots it must
// produce, from the saved input slot, and touches nothing else. Backward starts from a loss
// gradient of the last output, folds the gradient and every slot byte into the layer's
// "parameter gradient" and passes a gradient to the layer below; after each step the parameters
// move by their gradients, so step 2 depends on step 1. All arithmetic is on 64-bit words:
// bitwise reproducible, and any stale, missing or misplaced byte changes the gradients. Unlike
// the synthetic workload it also sees a slot rebuilt from the wrong layer's data.
//
// Spans are processed as 8-byte words; the last word of a span may be partial (zero padded).

inline std::size_t words(std::size_t bytes) { return (bytes + 7) / 8; }
template <class Byte>
std::uint64_t load_word(std::span<Byte> s, std::size_t i) {
  std::uint64_t w = 0;
  std::memcpy(&w, s.data() + 8 * i, std::min<std::size_t>(8, s.size() - 8 * i));
  return w;
}
inline void store_word(std::span<std::byte> s, std::size_t i, std::uint64_t w) {
  std::memcpy(s.data() + 8 * i, &w, std::min<std::size_t>(8, s.size() - 8 * i));
}
//! FNV-style fold: each step is a bijection of h, so changing any byte changes the result.
template <class Byte>
std::uint64_t fold(std::uint64_t h, std::span<Byte> s) {
  for (std::size_t i = 0, n = words(s.size()); i < n; ++i) h = (h ^ load_word(s, i)) * 1099511628211ull;
  return (h ^ s.size()) * 1099511628211ull;
}
//! dst word i = mix(seed + i) ^ src word (i mod |src|): every word depends on `seed` and on src.
template <class Byte>
void derive(std::span<std::byte> dst, std::uint64_t seed, std::span<Byte> src) {
  auto const sw = words(src.size());
  for (std::size_t i = 0, n = words(dst.size()); i < n; ++i) store_word(dst, i, mix(seed + i) ^ load_word(src, i % sw));
}

//! What both chain workloads keep across steps: the step, each layer's parameter and gradient,
//! and the gradient reaching the batch.
struct chain_params {
  std::uint64_t step = 0;
  std::vector<std::uint64_t> param, grad;  // per layer
  std::uint64_t input_grad = 0;            // fold of the gradient reaching the batch

  explicit chain_params(std::uint32_t layers) : param(layers), grad(layers, 0) {
    for (std::uint32_t l = 0; l < layers; ++l) param[l] = mix(0xC4A1 + l);
  }
  //! Ends a step: appends its gradients (per layer, then the batch's) to `out`, applies them to
  //! the parameters and clears them.
  void update(std::vector<std::uint64_t>& out) {
    for (std::size_t l = 0; l < grad.size(); ++l) {
      out.push_back(grad[l]);
      param[l] = mix(param[l] ^ grad[l]);
      grad[l] = 0;
    }
    out.push_back(input_grad);
    input_grad = 0;
    ++step;
  }
};

struct chain : chain_params {
  static constexpr std::string_view input = "input";
  std::vector<std::size_t> in_bytes, out_bytes;  // per layer; out_bytes[l] == in_bytes[l + 1]
  std::vector<std::byte> work, g, g_next;        // working activation, gradient (out, in)
  std::size_t work_bytes = 0, g_bytes = 0;

  //! Every layer of `s` must have a slot named "input".
  explicit chain(tide::schedule_view s) : chain_params(s.layer_count()) {
    for (std::uint32_t l = 0; l < s.layer_count(); ++l) {
      std::size_t n = 0;
      for (auto const& b : s.slots_of(l))
        if (b.name == input) n = b.bytes;
      if (n == 0) throw std::logic_error("chain: every layer needs a slot named 'input'");
      in_bytes.push_back(n);
    }
    for (std::uint32_t l = 0; l < s.layer_count(); ++l)
      out_bytes.push_back(l + 1 < s.layer_count() ? in_bytes[l + 1] : in_bytes[l]);
    std::size_t most = 0;
    for (auto n : in_bytes) most = std::max(most, n);
    work.resize(most);
    g.resize(most);
    g_next.resize(most);
  }

  template <class Ctx>
  void forward(Ctx const& c) {
    auto const l = c.layer;
    auto const ki = c.slot_index(input);
    std::span<std::byte const> x;
    if (c.mode == tide::forward_mode::forward) {  // the input slot is saved data: recompute mode must not rebuild it
      if (l == 0) {  // a fresh batch each step
        work_bytes = in_bytes[0];
        for (std::size_t i = 0, n = words(work_bytes); i < n; ++i)
          store_word(std::span(work.data(), work_bytes), i, mix((step << 32) + i));
      }
      auto const in = c.slot(ki);
      if (work_bytes != in.size()) throw std::logic_error("chain: activation size mismatch");
      std::memcpy(in.data(), work.data(), in.size());
      x = in;
    } else {
      x = c.saved(ki);  // a recompute reads the saved input (slot() would be scratch)
    }
    auto const hx = fold(param[l], x);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (k != ki && c.produces(k)) derive(c.slot(k), hx + 0x9E3779B97F4A7C15ull * (k + 1), x);
    if (c.mode == tide::forward_mode::forward) {
      work_bytes = out_bytes[l];
      derive(std::span(work.data(), work_bytes), hx, x);
    }
  }

  template <class Ctx>
  void backward(Ctx const& c) {
    auto const l = c.layer;
    if (l + 1 == param.size()) {  // the loss gradient of the last output against a target
      g_bytes = work_bytes;
      for (std::size_t i = 0, n = words(g_bytes); i < n; ++i)
        store_word(std::span(g.data(), g_bytes), i, load_word(std::span(work.data(), work_bytes), i) - mix(0x7A67 + i));
    }
    if (g_bytes != out_bytes[l]) throw std::logic_error("chain: gradient size mismatch");
    std::span<std::byte const> go(g.data(), g_bytes);
    auto h = fold(param[l], go);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) h = fold(h ^ k, c.slot(k));
    grad[l] = mix(grad[l] + h);
    auto x = c.slot(c.slot_index(input));
    std::span<std::byte> gi(g_next.data(), x.size());
    auto const gw = words(go.size());
    for (std::size_t i = 0, n = words(gi.size()); i < n; ++i)
      store_word(gi, i, mix(h + i) ^ load_word(x, i) ^ load_word(go, i % gw));
    std::swap(g, g_next);
    g_bytes = gi.size();
    if (l == 0) input_grad = fold(input_grad, std::span<std::byte const>(g.data(), g_bytes));
  }
};

// ---- the chain through a carry: layer l reads carry l and writes carry l + 1 ----------------
//
// As `chain`, but the activation flowing between layers is the stack's carry, which tide stores,
// offloads or recomputes by the schedule's checkpoints: the forward reads `carry_in()` (layer 0:
// the batch the step wrote into the executor's input buffer), derives every slot it must produce
// and writes all of `carry_out()` when it must (forward and advance; a recompute writes slots). Backward folds its carry in, its slots and the
// gradient from above; the last layer's loss gradient comes from the stack's output. A carry
// recomputed from the wrong state, or read after it was overwritten, changes the gradients.
struct carry_chain : chain_params {
  std::vector<std::byte> g, g_next;
  std::size_t bytes = 0;
  std::uint64_t forwards = 0;  // forward-lambda calls that wrote a carry (advances included)

  explicit carry_chain(tide::schedule_view s)
      : chain_params(s.layer_count()), g(s.carry.bytes), g_next(s.carry.bytes), bytes(s.carry.bytes) {
    if (bytes == 0) throw std::logic_error("carry_chain: the stack has no carry");
  }

  //! Writes this step's batch into the input buffer.
  void write_input(std::span<std::byte> in) const {
    for (std::size_t i = 0, n = words(in.size()); i < n; ++i) store_word(in, i, mix((step << 32) + i));
  }

  // A layer's forward as it would be written without tide's modes: every slot and the carry out,
  // in every mode. Passed as the recompute (and the advance) too, it must give keep-all's
  // gradients: what a recompute does not rebuild, and its carry out, land in lent scratch.
  template <class Ctx>
  void unchanged_forward(Ctx const& c) {
    auto const x = c.carry_in();
    auto const hx = fold(param[c.layer], x);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) derive(c.slot(k), hx + 0x9E3779B97F4A7C15ull * (k + 1), x);
    auto const out = c.carry_out();
    if (out.size() != bytes) throw std::logic_error("carry_chain: carry_out() is not the carry's size in this mode");
    derive(out, hx, x);
    if (c.produces_carry()) ++forwards;
  }

  // An advance may write its slots (a forward run unchanged would); it writes junk, so that
  // scratch overlapping anything live would change the gradients.
  template <class Ctx>
  void forward(Ctx const& c) {
    auto const x = c.carry_in();
    auto const hx = fold(param[c.layer], x);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k)
      if (c.produces(k)) derive(c.slot(k), hx + 0x9E3779B97F4A7C15ull * (k + 1), x);
      else if (c.mode == tide::forward_mode::advance) derive(c.slot(k), ~hx, x);  // junk: see below
    if (c.produces_carry()) {
      derive(c.carry_out(), hx, x);
      ++forwards;
    }
  }

  //! The loss gradient of the stack's output `y` against a target, into the gradient.
  void seed(std::span<std::byte const> y) {
    for (std::size_t i = 0, n = words(bytes); i < n; ++i) store_word(std::span(g), i, load_word(y, i) - mix(0x7A67 + i));
  }
  bool seed_in_backward = true;  // false: the turn seeds it (tide::turn)

  template <class Ctx>
  void backward(Ctx const& c) {
    auto const l = c.layer;
    if (l + 1 == param.size() && seed_in_backward) seed(c.output());
    std::span<std::byte const> go(g.data(), bytes);
    auto const x = c.carry_in();
    auto h = fold(param[l], go);
    h = fold(h, x);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) h = fold(h ^ k, c.slot(k));
    grad[l] = mix(grad[l] + h);
    for (std::size_t i = 0, n = words(bytes); i < n; ++i)
      store_word(std::span(g_next), i, mix(h + i) ^ load_word(x, i) ^ load_word(go, i));
    std::swap(g, g_next);
    if (l == 0) input_grad = fold(input_grad, std::span<std::byte const>(g.data(), bytes));
  }
};

//! A collective hook that moves no data (the workloads have no replicas).
struct empty_hook {
  template <class Ctx>
  void operator()(Ctx const&) const noexcept {}
};
//! One step of `exec` with an `empty_hook` as each hook its schedule makes room for (the executor
//! refuses a step without them).
template <class Executor, class F, class B>
void step(Executor& exec, F&& forward, B&& backward) {
  tide::detail::with_hooks_for(exec.schedule().collectives, empty_hook{},
                               [&](auto& h) { exec.step(forward, backward, h); });
}

//! Runs `steps` steps of the carry chain on `s` (which must have a carry); returns every step's
//! gradients. `forwards`, when given, receives the forward-lambda calls of the last step.
template <class Backend>
std::vector<std::uint64_t> run_carry_chain(Backend& b, tide::schedule_view s, int steps = 2, tide::executor_options o = {},
                                           std::uint64_t* forwards = nullptr) {
  tide::executor exec(b, s, o);
  carry_chain w(s);
  std::vector<std::uint64_t> out;
  for (int i = 0; i < steps; ++i) {
    w.write_input(exec.carry_input());
    w.forwards = 0;
    step(exec, [&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
    w.update(out);
  }
  if (forwards) *forwards = w.forwards;
  return out;
}

//! Runs `steps` steps of the chain workload on `s`; returns every step's gradients.
template <class Backend>
std::vector<std::uint64_t> run_chain(Backend& b, tide::schedule_view s, int steps = 2, tide::executor_options o = {}) {
  tide::executor exec(b, s, o);
  chain w(s);
  std::vector<std::uint64_t> out;
  for (int i = 0; i < steps; ++i) {
    step(exec, [&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
    w.update(out);
  }
  return out;
}

//! Runs `steps` steps of the synthetic workload on `s`; returns the per-layer digests.
template <class Backend>
std::vector<std::uint64_t> run(Backend& b, tide::schedule_view s, int steps = 2, tide::executor_options o = {}) {
  tide::executor exec(b, s, o);
  synthetic w(s.layer_count());
  for (int i = 0; i < steps; ++i, ++w.step)
    step(exec, [&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
  return w.digest;
}

}  // namespace workload
