#pragma once
//! \file
//! The reversal of a chain: the adjoint of an n-step chain (a time stepper, or a layer stack
//! whose layer i+1 reads the carry layer i wrote) needs states n-1, ..., 0 in reverse order. A
//! reversal is a list of `chain_action`s; with s snapshot slots `revolve_schedule` is an optimal
//! one (binomial checkpointing, Griewank & Walther's Revolve) and `revolve_extra_forwards` its
//! cost in closed form. The builder expands a reversal into the op program of a stack with a
//! carry; `plan/checkpointing.hpp` times reversals with a host tier and searches for the best.
//! Conventions, derivations, limits: docs/checkpointing.md.
//!
//! Tide's conventions. States 0..n: step i reads state i and writes state i+1; the working
//! carry is the state the next step or backward reads. The first sweep runs all n steps; the
//! output of the last one (step n-1) seeds the adjoint, so its input, state n-1, is still the
//! working carry when the backward starts (`turn`). `backward(i)` needs state i in the working
//! carry and does not re-run step i. A slot count s counts the states stored at once, the
//! initial state included, not the working carry.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <tide/core/error.hpp>
namespace tide {

//! Longest chain the reversal functions take (`revolve_schedule`, `two_tier_plan`,
//! `evaluate_chain`): 8,388,608 steps, as many as `max_ops` allows a schedule built from the
//! reversal, so that a huge n is refused by name instead of failing to allocate its actions.
inline constexpr std::int64_t max_chain_steps = std::int64_t{1} << 23;

namespace detail::ckpt {

__extension__ using u128 = unsigned __int128;  // exact binomial products: no overflow below 2^127
using u64 = std::uint64_t;

//! C(big, k), or `cap + 1` when it exceeds `cap` (cap < 2^63).
constexpr u64 binom_capped(u64 big, u64 k, u64 cap) noexcept {
  if (k > big) return 0;
  k = std::min(k, big - k);
  u128 c = 1;
  for (u64 i = 1; i <= k; ++i) {
    c = c * (big - k + i) / i;  // C(big-k+i, i): exact, and below 2^127 while c <= cap
    if (c > cap) return cap + 1;
  }
  return static_cast<u64>(c);
}

//! The smallest r >= 1 with C(s + r, s) >= l (l >= 1, s >= 1): Revolve's repetition number.
constexpr u64 repetitions(u64 l, u64 s) noexcept {
  if (l <= s + 1) return 1;
  u64 lo = 1, hi = l - 1;  // C(s + l - 1, s) >= l for every s >= 1
  while (lo < hi) {
    u64 mid = lo + (hi - lo) / 2;
    if (binom_capped(s + mid, s, l) >= l) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

//! Griewank & Walther's t(l, s) = r*l - C(s + r, s + 1): forward advances of an optimal reversal
//! of l steps with s snapshots when the first sweep stops at step l-1 (u128: exact for l < 2^63).
constexpr u128 gw_advances(u64 l, u64 s) noexcept {
  if (l <= 1) return 0;
  if (s == 1) return u128(l) * (l - 1) / 2;
  u64 const r = repetitions(l, s);
  // C(s+r, s+1) = C(s+r-1, s) * (s+r) / (s+1), with C(s+r-1, s) < l: the product stays below 2^127.
  u128 const below = binom_capped(s + r - 1, s, l);
  return u128(r) * l - below * (s + r) / (s + 1);
}

//! C(s + k, s) for k >= 0 (k = -1 gives 0), capped as binom_capped.
constexpr u64 beta(u64 s, std::int64_t k, u64 cap) noexcept {
  return k < 0 ? 0 : binom_capped(s + static_cast<u64>(k), s, cap);
}

//! An optimal first split j (1 <= j < l) of Revolve's recurrence for l >= 2 steps and s >= 2
//! slots: j = max(beta(s, r-2), l - beta(s-1, r)). Why it is optimal: docs/checkpointing.md.
constexpr u64 revolve_split(u64 l, u64 s) noexcept {
  u64 const r = repetitions(l, s);
  u64 const a = beta(s, static_cast<std::int64_t>(r) - 2, l);
  u64 const b = beta(s - 1, static_cast<std::int64_t>(r), l);
  u64 j = std::max<u64>(a, b >= l ? 0 : l - b);
  return std::clamp<u64>(j, 1, l - 1);
}

}  // namespace detail::ckpt

//! Extra forward steps, beyond the first sweep, of an optimal reversal of an n-step chain with
//! s snapshot slots in tide's convention: t(n, s) - (n - 1) with Griewank & Walther's t.
//! Throws `schedule_error` for n < 1, s < 1, or a count above INT64_MAX.
constexpr std::int64_t revolve_extra_forwards(std::int64_t n, std::int64_t s) {
  if (n < 1) throw schedule_error("revolve_extra_forwards: the chain needs n >= 1 steps, got " + std::to_string(n));
  if (s < 1) throw schedule_error("revolve_extra_forwards: needs s >= 1 snapshot slots, got " + std::to_string(s));
  if (s >= n - 1) return 0;  // every state 0..n-2 fits: the first sweep stores them all
  auto const t = detail::ckpt::gw_advances(static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(s));
  auto const extra = t - static_cast<detail::ckpt::u128>(n - 1);
  if (extra > static_cast<detail::ckpt::u128>(std::numeric_limits<std::int64_t>::max()))
    throw schedule_error("revolve_extra_forwards: the count for n = " + std::to_string(n) + ", s = " + std::to_string(s) +
                         " overflows a 64-bit integer");
  return static_cast<std::int64_t>(extra);
}

//! What one action of a chain schedule does. Carry i is layer i's input (carry 0 the stack's);
//! a snapshot holds one carry, on the device, on the host or on disk (a storage file; a disk
//! snapshot is written from and read into a host snapshot, as the storage tier stages slots).
enum class chain_op : std::uint8_t {
  advance,    //!< layers `carry` .. `to`-1 forward: the working carry goes from carry `carry` to `to`
  turn,       //!< layer n-1 forward (end of the first sweep); the working carry keeps carry n-1
  store,      //!< the working carry (carry `carry`) into device snapshot `snapshot`
  restore,    //!< device snapshot `snapshot` into the working carry
  free,       //!< device snapshot `snapshot` becomes empty
  backward,   //!< the backward of layer `carry`: needs carry `carry` in the working carry, consumes it
  offload,    //!< copy device snapshot `snapshot` to host snapshot `host_snapshot` (d2h stream)
  prefetch,   //!< copy host snapshot `host_snapshot` to device snapshot `snapshot` (h2d stream)
  free_host,  //!< host snapshot `host_snapshot` becomes empty
  spill,      //!< copy host snapshot `host_snapshot` to disk snapshot `disk_snapshot` (storage write)
  load,       //!< copy disk snapshot `disk_snapshot` to host snapshot `host_snapshot` (storage read)
  free_disk,  //!< disk snapshot `disk_snapshot` becomes empty
};

//! One action; fields an action does not use are -1. (0.3 renamed the fields: `state` is
//! `carry`, `slot` is `snapshot`, `host` is `host_snapshot`.)
struct chain_action {
  chain_op op{};                    //!< what the action does; it says which fields below are used
  std::int32_t carry = -1;          //!< advance: from; store: the carry stored; turn, backward: the layer
  std::int32_t to = -1;             //!< advance: the carry reached
  std::int32_t snapshot = -1;       //!< device snapshot
  std::int32_t host_snapshot = -1;  //!< host snapshot
  std::int32_t disk_snapshot = -1;  //!< disk snapshot (spill, load, free_disk)

  //! Layers `from` .. `to`-1 forward.
  static constexpr chain_action advance(std::int32_t from, std::int32_t to) { return {chain_op::advance, from, to, -1, -1}; }
  //! Layer `layer` (the chain's last) forward, ending the first sweep.
  static constexpr chain_action turn(std::int32_t layer) { return {chain_op::turn, layer, -1, -1, -1}; }
  //! Stores the working carry, carry `carry`, into device snapshot `snapshot`.
  static constexpr chain_action store(std::int32_t carry, std::int32_t snapshot) { return {chain_op::store, carry, -1, snapshot, -1}; }
  //! Loads device snapshot `snapshot` into the working carry.
  static constexpr chain_action restore(std::int32_t snapshot) { return {chain_op::restore, -1, -1, snapshot, -1}; }
  //! Empties device snapshot `snapshot`.
  static constexpr chain_action free(std::int32_t snapshot) { return {chain_op::free, -1, -1, snapshot, -1}; }
  //! The backward of layer `layer`.
  static constexpr chain_action backward(std::int32_t layer) { return {chain_op::backward, layer, -1, -1, -1}; }
  //! Copies device snapshot `snapshot` to host snapshot `host`.
  static constexpr chain_action offload(std::int32_t snapshot, std::int32_t host) { return {chain_op::offload, -1, -1, snapshot, host}; }
  //! Copies host snapshot `host` to device snapshot `snapshot`.
  static constexpr chain_action prefetch(std::int32_t host, std::int32_t snapshot) { return {chain_op::prefetch, -1, -1, snapshot, host}; }
  //! Empties host snapshot `host`.
  static constexpr chain_action free_host(std::int32_t host) { return {chain_op::free_host, -1, -1, -1, host}; }
  //! Copies host snapshot `host` to disk snapshot `disk`.
  static constexpr chain_action spill(std::int32_t host, std::int32_t disk) { return {chain_op::spill, -1, -1, -1, host, disk}; }
  //! Copies disk snapshot `disk` to host snapshot `host`.
  static constexpr chain_action load(std::int32_t disk, std::int32_t host) { return {chain_op::load, -1, -1, -1, host, disk}; }
  //! Empties disk snapshot `disk`.
  static constexpr chain_action free_disk(std::int32_t disk) { return {chain_op::free_disk, -1, -1, -1, -1, disk}; }
  //! Field-wise equality.
  friend constexpr bool operator==(chain_action const&, chain_action const&) = default;
};

//! A readable form of one action, e.g. "advance(3 -> 7)", "offload(d1 -> h0)", "spill(h0 -> s2)".
inline std::string to_string(chain_action const& a) {
  auto s = [](std::int32_t v) { return std::to_string(v); };
  switch (a.op) {
    case chain_op::advance: return "advance(" + s(a.carry) + " -> " + s(a.to) + ")";
    case chain_op::turn: return "turn(" + s(a.carry) + ")";
    case chain_op::store: return "store(" + s(a.carry) + " -> d" + s(a.snapshot) + ")";
    case chain_op::restore: return "restore(d" + s(a.snapshot) + ")";
    case chain_op::free: return "free(d" + s(a.snapshot) + ")";
    case chain_op::backward: return "backward(" + s(a.carry) + ")";
    case chain_op::offload: return "offload(d" + s(a.snapshot) + " -> h" + s(a.host_snapshot) + ")";
    case chain_op::prefetch: return "prefetch(h" + s(a.host_snapshot) + " -> d" + s(a.snapshot) + ")";
    case chain_op::free_host: return "free_host(h" + s(a.host_snapshot) + ")";
    case chain_op::spill: return "spill(h" + s(a.host_snapshot) + " -> s" + s(a.disk_snapshot) + ")";
    case chain_op::load: return "load(s" + s(a.disk_snapshot) + " -> h" + s(a.host_snapshot) + ")";
    case chain_op::free_disk: return "free_disk(s" + s(a.disk_snapshot) + ")";
  }
  return "?";
}

namespace detail::ckpt {

constexpr void check_chain_args(char const* who, std::int64_t n, std::int64_t slots) {
  if (n < 1) throw schedule_error(std::string(who) + ": the chain needs n >= 1 steps, got " + std::to_string(n));
  if (n > max_chain_steps)
    throw schedule_error(std::string(who) + ": n = " + std::to_string(n) + " steps is more than the supported " +
                         std::to_string(max_chain_steps) + " (a schedule lists about 5 actions a step, and the op "
                         "program built from it at least one op a step, past tide::max_ops): reverse the chain in "
                         "segments, or make each layer several steps");
  if (slots < 1) throw schedule_error(std::string(who) + ": needs at least 1 device snapshot slot, got " + std::to_string(slots));
}

//! Slot ids: a free list, new ids only when it is empty (so ids stay below min(s, n)).
struct slot_pool {
  std::vector<std::int32_t> free_ids;
  std::int32_t next = 0;
  constexpr std::int32_t take() {
    if (free_ids.empty()) return next++;
    auto id = free_ids.back();
    free_ids.pop_back();
    return id;
  }
  constexpr void give(std::int32_t id) { free_ids.push_back(id); }
};

//! Appends an optimal one-tier reversal of steps [a, a+l) to `out`: state a is in device slot
//! `slot` (which it frees at the end), `s` slots are available counting that one, and the
//! working carry holds state a when `at_a`. `last` is the chain's last step (its `turn` is
//! emitted before its backward). Iterative (an explicit stack): the right part of a split is
//! pushed, the frame itself keeps the left part, as in Revolve's recursion.
constexpr void append_revolve(std::vector<chain_action>& out, slot_pool& pool, std::int32_t a, std::int32_t l, std::int64_t s,
                           std::int32_t slot, bool at_a, std::int32_t last) {
  struct frame {
    std::int32_t a, l;
    std::int64_t s;
    std::int32_t slot;
    bool at_a;
  };
  std::vector<frame> stack;
  stack.push_back({a, l, s, slot, at_a});
  auto backward = [&](std::int32_t i) {
    if (i == last) out.push_back(chain_action::turn(i));
    out.push_back(chain_action::backward(i));
  };
  while (!stack.empty()) {
    frame& f = stack.back();
    if (!f.at_a) out.push_back(chain_action::restore(f.slot));
    f.at_a = true;
    if (f.l == 1) {
      backward(f.a);
      out.push_back(chain_action::free(f.slot));
      pool.give(f.slot);
      stack.pop_back();
      continue;
    }
    // The split: advance j steps; the right part [a+j, a+l) is reversed first, then the left.
    std::int32_t j = f.s == 1 ? f.l - 1 : static_cast<std::int32_t>(revolve_split(static_cast<u64>(f.l), static_cast<u64>(f.s)));
    out.push_back(chain_action::advance(f.a, f.a + j));
    if (f.l - j == 1) {  // a right part of one step needs no slot: its state is the working carry
      backward(f.a + j);
      f.l = j;
      f.at_a = false;
      continue;
    }
    auto const child_slot = pool.take();
    out.push_back(chain_action::store(f.a + j, child_slot));
    frame child{f.a + j, f.l - j, f.s - 1, child_slot, true};
    f.l = j;
    f.at_a = false;
    stack.push_back(child);  // invalidates f
  }
}

}  // namespace detail::ckpt

//! An optimal one-tier reversal of an n-step chain with `slots` device snapshot slots (the
//! initial state's included): `store(0 -> d0)`, the first sweep with its stores, `turn(n-1)`,
//! then backward steps n-1..0 with the restores and advances between them. Its forward steps
//! beyond the first sweep are `revolve_extra_forwards(n, slots)`. O(n) actions, O(n log n) time.
constexpr std::vector<chain_action> revolve_schedule(std::int64_t n, std::int64_t slots) {
  detail::ckpt::check_chain_args("revolve_schedule", n, slots);
  std::vector<chain_action> out;
  out.reserve(static_cast<std::size_t>(5 * n + 8));  // about 4.5 actions per step (bench/plan/checkpointing_bench)
  detail::ckpt::slot_pool pool;
  auto const n32 = static_cast<std::int32_t>(n);
  if (n == 1) {  // the working carry is the initial state: nothing to store
    out.push_back(chain_action::turn(0));
    out.push_back(chain_action::backward(0));
    return out;
  }
  auto const first = pool.take();
  out.push_back(chain_action::store(0, first));
  detail::ckpt::append_revolve(out, pool, 0, n32, slots, first, true, n32 - 1);
  return out;
}

}  // namespace tide
