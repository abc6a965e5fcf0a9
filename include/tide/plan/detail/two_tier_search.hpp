#pragma once
//! \file
//! `two_tier_plan`'s search (plan/checkpointing.hpp declares it): within its limits a dynamic
//! program over Revolve's nested frames with tiers, memoized on the frames' lags, whose choices an
//! emitter turns into actions on a `chain_machine` (docs/checkpointing.md, "Two tiers"); beyond
//! them the better of device-only Revolve and the segment family (host checkpoints at equal
//! spacing, Revolve inside each segment).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/reversal.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/plan/detail/chain_model.hpp>

namespace tide {

namespace detail::ckpt {

// The DP below is Revolve's recursion with tiers (docs/checkpointing.md, "Two tiers"). A frame
// reverses steps [a, a+l) starting with its base, state a, in the working carry; everything
// about the streams and slots it inherits is a time relative to its start ("lags", >= 0), so
// frames with equal lags share one memo entry. Its structural assumptions: a checkpoint's copies
// are issued where it is stored (offload) or at the start of a frame that precedes its restore
// (prefetch); at most `max_obligations` prefetches for ancestors are pending in one frame.

enum class tt_base : std::uint8_t { device, host, both, carry };  // where a frame's base lives

struct tt_obligation {  // a prefetch of an ancestor's base, to be issued inside this frame
  double ready;         // the ancestor's host copy arrives (lag)
  double slack;         // the ancestor restores it this long after the frame ends
  std::int32_t state;   // which state (for emission only; not part of the memo key)
};

//! A vector with inline storage: the DP copies frames by the million, a heap allocation each
//! would dominate its time.
template <class T, std::size_t N>
struct inline_vec {
  std::array<T, N> items{};
  std::uint8_t count = 0;
  T* begin() noexcept { return items.data(); }
  T* end() noexcept { return items.data() + count; }
  T const* begin() const noexcept { return items.data(); }
  T const* end() const noexcept { return items.data() + count; }
  std::size_t size() const noexcept { return count; }
  bool empty() const noexcept { return count == 0; }
  T& operator[](std::size_t i) noexcept { return items[i]; }
  T const& operator[](std::size_t i) const noexcept { return items[i]; }
  T const& front() const noexcept { return items[0]; }
  void clear() noexcept { count = 0; }
  void push_back(T const& x) {
    if (count == N) throw schedule_error("two_tier_plan: internal error: inline capacity exceeded");
    items[count++] = x;
  }
  void insert(T* at, T const& x) {
    push_back(x);
    std::rotate(at, end() - 1, end());
  }
  void erase(T* from, T* to) noexcept {
    std::move(to, end(), from);
    count = static_cast<std::uint8_t>(count - (to - from));
  }
  void erase(T* at) noexcept { erase(at, at + 1); }
  void assign(std::size_t k, T const& x) {
    clear();
    for (std::size_t i = 0; i < k; ++i) push_back(x);
  }
};

inline constexpr std::size_t tt_max_pool = 16;       // device slots the DP tracks
inline constexpr std::size_t tt_max_obligations = 4;

struct tt_frame {
  std::int32_t a = 0, l = 0, h = 0;  // first step, length, free host slots
  tt_base base = tt_base::device;
  bool fresh = true, last = false, first = false;  // may change tier; holds step n-1; holds step 0
  double host_ready = 0, dev_busy = 0, d2h = 0, h2d = 0;
  inline_vec<double, tt_max_pool> pool;  // free device slots: when each may be written, ascending
  inline_vec<tt_obligation, tt_max_obligations + 2> obs;
  // Free host slots still busy (a disk write of the schedule around a segment reads them): when
  // each may be written, ascending, at most h of them; the others are writable at once. Empty in
  // every frame of a chain planned alone.
  inline_vec<double, tt_max_pool> host_busy;

  void shift(double t) {
    auto c = [t](double& x) { x = std::max(0.0, x - t); };
    c(host_ready), c(dev_busy), c(d2h), c(h2d);
    for (auto& x : pool) c(x);
    for (auto& o : obs) c(o.ready);
    for (auto& x : host_busy) c(x);
    while (!host_busy.empty() && host_busy.front() == 0) host_busy.erase(host_busy.begin());
  }
  //! Takes a free host slot (one writable at once if there is one) for an offload; returns when
  //! the copy may start given that the d2h stream is free at `d2h`.
  double take_host(double from) {
    if (static_cast<std::int32_t>(host_busy.size()) < h) return from;
    double const lag = host_busy.front();
    host_busy.erase(host_busy.begin());
    return std::max(from, lag);
  }
  void add_slot(double lag) { pool.insert(std::upper_bound(pool.begin(), pool.end(), lag), lag); }
  double take_slot() {  // the earliest writable free slot
    double lag = pool.front();
    pool.erase(pool.begin());
    return lag;
  }
};

enum class tt_kind : std::uint8_t { none, leaf, to_host, to_both, drop_device, issue, split };

struct tt_choice {
  tt_kind kind = tt_kind::none;
  std::uint8_t x_host = 0, keep = 0, use_base_slot = 0, which = 0, mask = 0;
  std::int32_t j = 0;
};

class two_tier_dp {
 public:
  static constexpr double inf = std::numeric_limits<double>::infinity();
  struct entry {
    double value;       // the frame's time, waits for its obligations' arrivals included
    double exit_h2d;    // h2d still busy after it (lag)
    double exit_d2h;    // d2h still busy after it (lag)
    tt_choice choice;
  };

  struct dp_budget_exceeded {};

  two_tier_dp(std::int32_t n, chain_costs const& costs, int max_obligations,
              std::size_t max_states = std::numeric_limits<std::size_t>::max())
      : n_(n), c_(costs), uniform_(costs.uniform()), sync_(costs.synchronous_copies), max_obs_(max_obligations),
        max_states_(max_states) {
    prefix_.assign(static_cast<std::size_t>(n) + 1, 0.0);
    back_.assign(static_cast<std::size_t>(n) + 1, 0.0);
    min_forward_ = n > 0 ? c_.forward(0) : 0.0;
    for (std::int32_t i = 0; i < n; ++i) {
      prefix_[static_cast<std::size_t>(i) + 1] = prefix_[static_cast<std::size_t>(i)] + c_.forward(i);
      back_[static_cast<std::size_t>(i) + 1] = back_[static_cast<std::size_t>(i)] + c_.backward(i);
      min_forward_ = std::min(min_forward_, c_.forward(i));
    }
  }

  entry const& solve(tt_frame const& f) {
    scratch_.clear();
    key_of(f, scratch_);
    if (auto it = memo_.find(std::string_view(scratch_)); it != memo_.end()) return it->second;
    if (memo_.size() >= max_states_) throw dp_budget_exceeded{};
    std::string key = scratch_;  // compute() reuses the scratch key
    entry e = compute(f);
    return memo_.emplace(std::move(key), e).first->second;
  }

  //! A lower bound of a frame's time: every backward, the turn, and Griewank & Walther's fewest
  //! advances with as many snapshots as the frame could hold at once (copies free).
  double lower_bound(std::int32_t a, std::int32_t l, bool last, std::int64_t slots) const {
    auto const i = static_cast<std::size_t>(a), e = static_cast<std::size_t>(a + l);
    double const back = back_[e] - back_[i] + (last ? c_.forward(n_ - 1) : 0.0);
    if (l <= 1) return back;
    double const sweep = prefix_[e - 1] - prefix_[i];  // the first sweep to state a+l-1, at least
    double const advances = static_cast<double>(gw_advances(static_cast<u64>(l), static_cast<u64>(std::max<std::int64_t>(slots, 1))));
    return back + std::max(sweep, advances * min_forward_);
  }

  //! The pieces of a split; nullopt-like (value inf) when it is not feasible.
  struct split_parts {
    double value = inf;
    tt_frame child, left;
  };
  split_parts split(tt_frame const& f, std::int32_t j, bool x_host, int keep, unsigned mask, double bound = inf) {
    split_parts out;
    double const J = prefix_[static_cast<std::size_t>(f.a + j)] - prefix_[static_cast<std::size_t>(f.a)];
    if (J >= bound) return out;
    tt_frame g = f;
    g.shift(J);
    bool const store = j < f.l - 1;  // a right part of one step needs no slot
    double stall = 0;
    if (store) {
      if (g.pool.empty()) return out;
      stall = g.take_slot();
      g.shift(stall);
    }
    if (x_host && (!store || f.h < 1)) return out;
    inline_vec<tt_obligation, tt_max_obligations + 2> to_child, to_left;
    for (std::size_t k = 0; k < f.obs.size(); ++k) ((mask >> k) & 1u ? to_child : to_left).push_back(g.obs[k]);
    // The left part's pool: the frame's, the right part's base slot back, minus one slot per
    // obligation issued in the child (held until the ancestor restores) and a kept base copy.
    int pool = static_cast<int>(g.pool.size()) + (store ? 1 : 0) - static_cast<int>(to_child.size());
    tt_frame left;
    left.a = f.a, left.l = j, left.h = f.h, left.base = f.base, left.fresh = true, left.last = false, left.first = f.first;
    left.host_busy.clear();
    left.obs = to_left;
    if (f.base == tt_base::host && keep > 0) {
      --pool;
      left.base = keep == 1 ? tt_base::device : tt_base::both;
      if (keep == 1) ++left.h;
    }
    if (pool < 0) return out;
    // Obligations passed to the child may arrive as late as the left part's end: its time with a
    // lag-free pool is a lower bound of the actual one, so the slack never overstates.
    double left_estimate = 0;
    if (!to_child.empty()) {
      tt_frame proto = left;
      proto.pool.assign(static_cast<std::size_t>(pool), 0.0);
      left_estimate = solve(proto).value;
      if (left_estimate == inf) return out;
    }
    tt_frame child = g;
    child.a = f.a + j, child.l = f.l - j, child.fresh = true, child.last = f.last, child.first = false;
    child.base = store ? tt_base::device : tt_base::carry;
    child.host_ready = 0, child.dev_busy = 0;
    child.obs.clear();
    if (f.base == tt_base::host) child.obs.push_back({g.host_ready, 0.0, f.a});
    for (auto o : to_child) {
      o.slack += left_estimate;
      child.obs.push_back(o);
    }
    double copy = 0;
    if (x_host) {
      double const start = child.take_host(child.d2h);
      child.h = f.h - 1;
      child.base = tt_base::host;
      if (sync_) {
        copy = c_.d2h_us;
        child.shift(copy);
        child.add_slot(0);
      } else {
        double const end = start + c_.d2h_us;
        child.add_slot(end);
        child.d2h = end, child.host_ready = end;
      }
    }
    double const before = J + stall + copy;
    double const left_bound = lower_bound(f.a, j, false, pool + left.h + 1);
    if (before + lower_bound(child.a, child.l, child.last, static_cast<std::int64_t>(child.pool.size()) + child.h + 1) + left_bound >= bound)
      return out;
    entry const ce = solve(child);
    if (ce.value == inf || before + ce.value + left_bound >= bound) return out;
    double const tc = copy + ce.value;
    // The left part, with what the child left behind: untouched slots keep their (shifted) lag,
    // slots the child used are free by its end; taking the shifted lag for all is conservative.
    auto rest = g.pool;
    if (store) rest.insert(rest.begin(), 0.0);
    left.pool.clear();
    for (double x : rest) left.add_slot(std::max(0.0, x - tc));
    left.pool.erase(left.pool.begin(), left.pool.begin() + (static_cast<std::ptrdiff_t>(rest.size()) - pool));
    left.d2h = std::max({0.0, g.d2h - tc, ce.exit_d2h});
    left.h2d = std::max({0.0, g.h2d - tc, ce.exit_h2d});
    left.host_ready = (left.base == tt_base::host || left.base == tt_base::both) ? std::max(0.0, g.host_ready - tc) : 0;
    left.dev_busy = left.base == tt_base::both ? std::max(0.0, g.dev_busy - tc) : 0;
    for (auto& o : left.obs) o.ready = std::max(0.0, o.ready - tc);
    // The host slots the frame had, as busy as before the child took one (g is untouched: the
    // child took it from its copy; the child's own are free by the time the left part writes
    // them again, the DP's assumption for every freed slot).
    for (double x : g.host_busy)
      if (x > tc) left.host_busy.push_back(x - tc);
    entry const le = solve(left);
    if (le.value == inf) return out;
    out.value = before + ce.value + le.value;
    out.child = std::move(child);
    out.left = std::move(left);
    return out;
  }

  std::int32_t steps() const noexcept { return n_; }
  chain_costs const& costs() const noexcept { return c_; }
  bool synchronous() const noexcept { return sync_; }
  std::size_t memo_size() const noexcept { return memo_.size(); }

 private:
  void key_of(tt_frame const& f, std::string& k) const {
    k.reserve(64 + 8 * (f.pool.size() + 2 * f.obs.size()));
    auto put = [&k](auto v) { k.append(reinterpret_cast<char const*>(&v), sizeof v); };
    put(uniform_ ? std::int32_t{0} : f.a), put(f.l), put(f.h), put(f.base);
    put(static_cast<std::uint8_t>(f.fresh | f.last << 1 | f.first << 2));
    put(f.host_ready), put(f.dev_busy), put(f.d2h), put(f.h2d);
    put(static_cast<std::uint32_t>(f.pool.size()));
    for (double x : f.pool) put(x);
    put(static_cast<std::uint32_t>(f.host_busy.size()));
    for (double x : f.host_busy) put(x);
    for (auto const& o : f.obs) put(o.ready), put(o.slack);
  }

  entry compute(tt_frame const& f) {
    entry best{inf, 0, 0, {}};
    auto consider = [&best](double v, double xh, double xd, tt_choice ch) {
      // ties: the smaller lag left behind (a later frame may have to wait for it)
      if (v < best.value - 1e-9 || (v < best.value + 1e-9 && std::max(xh, xd) < std::max(best.exit_h2d, best.exit_d2h) - 1e-9))
        best = {v, xh, xd, ch};
    };
    if (static_cast<int>(f.obs.size()) > max_obs_) return best;
    double const w = c_.d2h_us, r = c_.h2d_us;
    auto after = [](double v, double t0, entry const& e) {  // lags behind a sub-frame started at t0
      return std::pair{std::max(0.0, t0 + e.value + e.exit_h2d - v), std::max(0.0, t0 + e.value + e.exit_d2h - v)};
    };
    // Tier changes of the base, once per frame, before anything else.
    if (f.fresh && f.base == tt_base::device && f.h >= 1 && f.l >= 2) {
      for (int both = 0; both < 2; ++both) {
        tt_frame g = f;
        g.fresh = false, g.base = both ? tt_base::both : tt_base::host;
        double const start = g.take_host(g.d2h);  // before the slot leaves the count
        --g.h;
        double t0 = 0;
        if (sync_) {
          t0 = w;
          g.shift(w);
          if (!both) g.add_slot(0);
        } else {
          double const end = start + w;
          g.d2h = end, g.host_ready = end;
          if (both) g.dev_busy = end;
          else g.add_slot(end);
        }
        auto const& e = solve(g);
        if (e.value == inf) continue;
        double const v = t0 + e.value;
        auto [xh, xd] = after(v, t0, e);
        consider(v, xh, xd, {both ? tt_kind::to_both : tt_kind::to_host});
      }
    }
    if (f.fresh && f.base == tt_base::both) {  // drop the device copy
      tt_frame g = f;
      g.fresh = false, g.base = tt_base::host;
      g.add_slot(g.dev_busy);
      g.dev_busy = 0;
      auto const& e = solve(g);
      if (e.value < inf) consider(e.value, e.exit_h2d, e.exit_d2h, {tt_kind::drop_device});
    }
    // Issue a pending obligation now, into the earliest free slot or, at a last backward, into
    // the base's own slot (the base is in the working carry and needed no more). With copies on
    // the compute stream an early prefetch only holds a slot longer: they wait for the last step.
    for (std::size_t k = 0; k < f.obs.size() && (!sync_ || f.l == 1); ++k) {
      for (int use_base = 0; use_base < 2; ++use_base) {
        tt_frame g = f;
        tt_obligation const o = g.obs[k];
        g.obs.erase(g.obs.begin() + static_cast<std::ptrdiff_t>(k));
        double slot_lag;
        if (!use_base) {
          if (g.pool.empty()) continue;
          slot_lag = g.take_slot();
        } else {
          if (f.l != 1 || (f.base != tt_base::device && f.base != tt_base::both)) continue;
          slot_lag = f.base == tt_base::both ? f.dev_busy : 0;
          g.base = tt_base::carry, g.dev_busy = 0;
        }
        double t0 = 0, arrival;
        if (sync_) {
          t0 = arrival = r;
          g.shift(r);
        } else {
          arrival = std::max({g.h2d, slot_lag, o.ready}) + r;
          g.h2d = arrival;
        }
        auto const& e = solve(g);
        if (e.value == inf) continue;
        double const v = std::max(t0 + e.value, arrival - o.slack);
        auto [xh, xd] = after(v, t0, e);
        consider(v, xh, xd, {tt_kind::issue, 0, 0, static_cast<std::uint8_t>(use_base), static_cast<std::uint8_t>(k)});
      }
    }
    if (f.l == 1 && f.obs.empty()) {
      double v = c_.backward(f.a) + (f.last ? c_.forward(n_ - 1) : 0);
      if (f.first) v = std::max({v, f.d2h, f.h2d});  // the chain ends when its last copy does
      consider(v, std::max(0.0, f.h2d - v), std::max(0.0, f.d2h - v), {tt_kind::leaf});
    }
    if (f.l >= 2 && f.base != tt_base::carry) {
      unsigned const masks = sync_ ? 1u : 1u << f.obs.size();  // (synchronous: obligations stay with the left part)
      // Splits near Revolve's (for all the slots the frame has) first: a good bound early prunes the rest.
      auto const slots = static_cast<u64>(f.pool.size()) + static_cast<u64>(f.h) + 1;
      auto const j0 = static_cast<std::int32_t>(slots >= 2 ? revolve_split(static_cast<u64>(f.l), slots) : static_cast<u64>(f.l - 1));
      for (std::int32_t step = 0; step < 2 * f.l; ++step) {
        std::int32_t const j = j0 + (step % 2 ? -(step + 1) / 2 : step / 2);
        if (j < 1 || j >= f.l) continue;
        for (int xh = 0; xh < (j < f.l - 1 ? 2 : 1); ++xh)
          for (int keep = 0; keep < (f.base == tt_base::host ? 3 : 1); ++keep)
            for (unsigned mask = 0; mask < masks; ++mask) {
              auto const p = split(f, j, xh != 0, keep, mask, best.value + 1e-9);
              if (p.value == inf) continue;
              auto const& le = solve(p.left);
              consider(p.value, le.exit_h2d, le.exit_d2h,
                       {tt_kind::split, static_cast<std::uint8_t>(xh), static_cast<std::uint8_t>(keep), 0, 0,
                        static_cast<std::uint8_t>(mask), j});
            }
      }
    }
    return best;
  }

  std::int32_t n_;
  chain_costs c_;
  bool uniform_, sync_;
  int max_obs_;
  std::size_t max_states_;
  double min_forward_ = 0;
  std::string scratch_;
  std::vector<double> prefix_, back_;  // prefix sums of forward and backward costs
  struct key_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view k) const noexcept { return std::hash<std::string_view>{}(k); }
  };
  std::unordered_map<std::string, entry, key_hash, std::equal_to<>> memo_;
};

//! Turns the DP's choices into actions, on a `chain_machine` that picks concrete slots (the
//! free device slot writable earliest, as the DP assumes) and checks every action.
class two_tier_emitter {
 public:
  two_tier_emitter(two_tier_dp& dp, std::int64_t device_slots, std::int64_t host_slots)
      : dp_(dp), m_(dp.steps(), device_slots, host_slots, dp.costs()) {}

  void put(chain_action const& a) {
    m_.apply(a);
    out_.push_back(a);
  }

  void emit(tt_frame f, std::int32_t dev, std::int32_t host) {
    for (;;) {  // the left part is the frame's tail: a loop, so depth grows with right parts only
      auto const ch = dp_.solve(f).choice;
      double const w = dp_.costs().d2h_us, r = dp_.costs().h2d_us;
      bool const sync = dp_.synchronous();
      switch (ch.kind) {
        case tt_kind::none: throw schedule_error("two_tier_plan: internal error: infeasible frame emitted");
        case tt_kind::to_host:
        case tt_kind::to_both: {
          bool const both = ch.kind == tt_kind::to_both;
          auto const h = free_host();
          put(chain_action::offload(dev, h));
          if (!both) put(chain_action::free(dev)), dev = -1;
          host = h;
          f.fresh = false, f.base = both ? tt_base::both : tt_base::host;
          double const start = f.take_host(f.d2h);  // before the slot leaves the count
          --f.h;
          if (sync) {
            f.shift(w);
            if (!both) f.add_slot(0);
          } else {
            double const end = start + w;
            f.d2h = end, f.host_ready = end;
            if (both) f.dev_busy = end;
            else f.add_slot(end);
          }
          continue;
        }
        case tt_kind::drop_device:
          put(chain_action::free(dev));
          dev = -1;
          f.fresh = false, f.base = tt_base::host;
          f.add_slot(f.dev_busy);
          f.dev_busy = 0;
          continue;
        case tt_kind::issue: {
          tt_obligation const o = f.obs[ch.which];
          f.obs.erase(f.obs.begin() + ch.which);
          std::int32_t slot;
          double slot_lag;
          if (!ch.use_base_slot) {
            slot = free_device();
            slot_lag = f.take_slot();
          } else {
            slot = dev;
            put(chain_action::free(dev));
            if (f.base == tt_base::both) put(chain_action::free_host(host)), host = -1;
            slot_lag = f.base == tt_base::both ? f.dev_busy : 0;
            f.base = tt_base::carry, f.dev_busy = 0, dev = -1;
          }
          put(chain_action::prefetch(host_of(o.state), slot));
          landed_[o.state] = slot;
          if (sync) f.shift(r);
          else f.h2d = std::max({f.h2d, slot_lag, o.ready}) + r;
          continue;
        }
        case tt_kind::leaf:
          if (f.last) put(chain_action::turn(f.a));
          put(chain_action::backward(f.a));
          if (dev >= 0) put(chain_action::free(dev));
          if (host >= 0) put(chain_action::free_host(host));
          return;
        case tt_kind::split: {
          auto p = dp_.split(f, ch.j, ch.x_host != 0, ch.keep, ch.mask);
          if (p.value == two_tier_dp::inf) throw schedule_error("two_tier_plan: internal error: infeasible split emitted");
          put(chain_action::advance(f.a, f.a + ch.j));
          std::int32_t cdev = -1, chost = -1;
          if (ch.j < f.l - 1) {
            cdev = free_device();
            put(chain_action::store(f.a + ch.j, cdev));
            if (ch.x_host) {
              chost = free_host();
              put(chain_action::offload(cdev, chost));
              put(chain_action::free(cdev));
              cdev = -1;
            }
          }
          emit(p.child, cdev, chost);
          if (f.base == tt_base::device || f.base == tt_base::both) {
            put(chain_action::restore(dev));
          } else {  // host: the child prefetched the base
            auto const slot = landed_.at(f.a);
            put(chain_action::restore(slot));
            if (ch.keep == 1) put(chain_action::free_host(host)), host = -1, dev = slot;
            else if (ch.keep == 2) dev = slot;
            else put(chain_action::free(slot));
          }
          f = std::move(p.left);
          continue;
        }
      }
    }
  }

  std::vector<chain_action> take() { return std::move(out_); }
  chain_machine const& machine() const noexcept { return m_; }

 private:
  std::int32_t free_device() const {
    std::int32_t best = -1;
    auto const d = m_.device();
    for (std::int32_t i = 0; i < static_cast<std::int32_t>(d.size()); ++i)
      if (d[static_cast<std::size_t>(i)].carry < 0 && (best < 0 || d[static_cast<std::size_t>(i)].busy < d[static_cast<std::size_t>(best)].busy))
        best = i;
    if (best < 0) throw schedule_error("two_tier_plan: internal error: no free device slot");
    return best;
  }
  std::int32_t free_host() const {
    auto const h = m_.host();
    for (std::int32_t i = 0; i < static_cast<std::int32_t>(h.size()); ++i)
      if (h[static_cast<std::size_t>(i)].carry < 0) return i;
    throw schedule_error("two_tier_plan: internal error: no free host slot");
  }
  std::int32_t host_of(std::int32_t state) const {
    auto const h = m_.host();
    for (std::int32_t i = 0; i < static_cast<std::int32_t>(h.size()); ++i)
      if (h[static_cast<std::size_t>(i)].carry == state) return i;
    throw schedule_error("two_tier_plan: internal error: state " + std::to_string(state) + " is not on the host");
  }

  two_tier_dp& dp_;
  chain_machine m_;
  std::vector<chain_action> out_;
  std::unordered_map<std::int32_t, std::int32_t> landed_;  // state -> device slot its prefetch wrote
};

//! The segment family: host checkpoints at q_0 = 0 < ... < q_{k-1}, the last segment's base q_k
//! on the device; each segment reversed by Revolve with device_slots - 1 slots, the remaining
//! slot receiving the prefetch of the next segment's base while the segment runs backward.
inline std::vector<chain_action> segment_schedule(std::int32_t n, std::int64_t device_slots, std::int32_t k) {
  std::vector<chain_action> out;
  out.reserve(static_cast<std::size_t>(5) * static_cast<std::size_t>(n) + 8);
  // A segment's Revolve never uses more slots than it has steps, and every segment lists the
  // free slots: more than a segment, its base and the prefetch's slot can use made huge tiers
  // quadratic (16,384 device and host snapshots: 0.2 s; 65,536: 2.9 s).
  std::int64_t const longest = (n + k) / (k + 1) + 1;
  auto const sd = static_cast<std::int32_t>(std::min<std::int64_t>({device_slots, n + 1, std::max<std::int64_t>(64, longest + 2)}));
  std::vector<std::int32_t> q(static_cast<std::size_t>(k) + 2);
  for (std::int32_t i = 0; i <= k + 1; ++i)
    q[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(static_cast<std::int64_t>(n) * i / (k + 1));
  bool const overlap = sd >= 2;
  std::int64_t const seg_slots = overlap ? sd - 1 : 1;
  // First sweep: offload the bases q_0..q_{k-1}, rotating the staging slot so copies overlap.
  for (std::int32_t i = 0; i < k; ++i) {
    if (i > 0) out.push_back(chain_action::advance(q[static_cast<std::size_t>(i) - 1], q[static_cast<std::size_t>(i)]));
    std::int32_t const s = i % sd;
    out.push_back(chain_action::store(q[static_cast<std::size_t>(i)], s));
    out.push_back(chain_action::offload(s, i));
    out.push_back(chain_action::free(s));
  }
  std::int32_t base = k % sd, reserve = overlap ? (base + 1) % sd : -1;
  if (k > 0) out.push_back(chain_action::advance(q[static_cast<std::size_t>(k) - 1], q[static_cast<std::size_t>(k)]));
  out.push_back(chain_action::store(q[static_cast<std::size_t>(k)], base));
  for (std::int32_t i = k; i >= 0; --i) {
    auto const a = q[static_cast<std::size_t>(i)], l = q[static_cast<std::size_t>(i) + 1] - a;
    if (i < k) {  // the base arrives from the host
      if (!overlap) out.push_back(chain_action::prefetch(i, base));
      out.push_back(chain_action::restore(base));
      out.push_back(chain_action::free_host(i));
    }
    if (overlap && i > 0) out.push_back(chain_action::prefetch(i - 1, reserve));
    slot_pool pool;
    for (std::int32_t s = sd - 1; s >= 0; --s)
      if (s != base && s != reserve) pool.free_ids.push_back(s);
    pool.next = std::numeric_limits<std::int32_t>::max();  // never more than seg_slots - 1 ids
    append_revolve(out, pool, a, l, seg_slots, base, true, n - 1);
    if (overlap) std::swap(base, reserve);
  }
  return out;
}

//! The segment family's time, estimated in closed form for uniform costs (the planner then
//! evaluates the chosen schedule exactly). O(1) in k: the k + 1 segments have only two lengths
//! (n / (k + 1) and one more), and only the first and the last segment differ in their terms, so
//! the sum is a few terms with counts (a loop over the segments made the search over k quadratic:
//! minutes for 50,000 host snapshots).
inline double segment_estimate(std::int32_t n, std::int64_t device_slots, std::int32_t k, chain_costs const& c, double f, double b) {
  std::int64_t const seg_slots = device_slots >= 2 ? device_slots - 1 : 1;
  // Segment i's contribution to the step (forwards and backwards) and to the stalls.
  auto segment = [&](std::int64_t len, bool first, bool last) {
    double const extra = static_cast<double>(revolve_extra_forwards(len, seg_slots)) + (!last ? static_cast<double>(len - 1) : 0.0);
    double t = extra * f;
    double const seg_time = (extra + static_cast<double>(len)) * f + static_cast<double>(len) * b;
    if (c.synchronous_copies) t += !last ? c.d2h_us + c.h2d_us : 0;
    else {
      if (!last) t += std::max(0.0, c.d2h_us - static_cast<double>(len) * f);  // the next offload waits for this one
      if (!first) t += device_slots >= 2 ? std::max(0.0, c.h2d_us - seg_time) : c.h2d_us;
    }
    return t;
  };
  auto len_of = [&](std::int64_t i) {
    return static_cast<std::int64_t>(n) * (i + 1) / (k + 1) - static_cast<std::int64_t>(n) * i / (k + 1);
  };
  double t = n * (f + b);
  if (k == 0) return t + segment(n, true, true);
  t += segment(len_of(0), true, false) + segment(len_of(k), false, true);
  // The k - 1 middle segments: `longer` of them have length q + 1, the rest q.
  std::int64_t const q = n / (k + 1), longer_all = n % (k + 1);
  std::int64_t const longer = longer_all - (len_of(0) == q + 1) - (len_of(k) == q + 1);
  std::int64_t const middle = k - 1;
  if (longer > 0) t += static_cast<double>(longer) * segment(q + 1, false, false);
  if (middle - longer > 0) t += static_cast<double>(middle - longer) * segment(q, false, false);
  return t;
}

//! What a chain inherits when it starts inside a longer schedule (`three_tier_plan`'s segments):
//! the d2h stream is busy for `d2h` more (or the host snapshot the first offload writes is:
//! a disk write still reads it). Only the dynamic program takes it into account.
struct tt_start {
  double d2h = 0;
  std::vector<double> host_busy{};  //!< free host snapshots still busy this long (a disk write reads them)
  //! DP states the caller's searches may still create together (null: only `dp_max_states`
  //! bounds this one); the search takes what its DP memoized off it, and skips the DP at 0.
  //! `three_tier_plan` runs one search per segment per candidate: each alone is bounded, their
  //! sum was not (tiers (4, 5, 16) at n = 300 took 71 s).
  std::size_t* dp_states_left = nullptr;
};

inline two_tier_result two_tier_search(std::int64_t n, std::int64_t device_slots, std::int64_t host_slots, chain_costs const& costs,
                                       two_tier_options const& options, tt_start const& start);

}  // namespace detail::ckpt

#if TIDE_DEFINITIONS
TIDE_INLINE two_tier_result two_tier_plan(std::int64_t n, std::int64_t device_slots, std::int64_t host_slots, chain_costs const& costs,
                                     two_tier_options const& options) {
  return detail::ckpt::two_tier_search(n, device_slots, host_slots, costs, options, {});
}
#endif

inline two_tier_result detail::ckpt::two_tier_search(std::int64_t n, std::int64_t device_slots, std::int64_t host_slots, chain_costs const& costs,
                                                     two_tier_options const& options, tt_start const& start) {
  detail::ckpt::check_chain_args("two_tier_plan", n, device_slots);
  if (host_slots < 0) throw schedule_error("two_tier_plan: negative host slot count");
  costs.check("two_tier_plan", n);
  if (options.max_obligations < 1 || options.max_obligations > static_cast<int>(detail::ckpt::tt_max_obligations))
    throw schedule_error("two_tier_plan: max_obligations must be between 1 and " + std::to_string(detail::ckpt::tt_max_obligations));
  auto const n32 = static_cast<std::int32_t>(n);
  auto const sd = std::min<std::int64_t>(device_slots, n), sh = std::min<std::int64_t>(host_slots, n);
  auto finish = [&](std::vector<chain_action> acts, two_tier_method m) {
    auto const e = evaluate_chain(n, device_slots, host_slots, costs, acts);
    return two_tier_result{std::move(acts), e.time_us, -1, e.extra_forwards, m};
  };
  std::size_t const dp_states = start.dp_states_left ? std::min(options.dp_max_states, *start.dp_states_left) : options.dp_max_states;
  if (dp_states > 0 && n <= options.dp_max_layers && sd + sh <= options.dp_max_snapshots &&
      sd <= static_cast<std::int64_t>(detail::ckpt::tt_max_pool)) {
    detail::ckpt::two_tier_dp dp(n32, costs, options.max_obligations, dp_states);
    auto charge = [&] {
      if (start.dp_states_left) *start.dp_states_left -= std::min(*start.dp_states_left, dp.memo_size());
    };
    detail::ckpt::tt_frame root;
    root.a = 0, root.l = n32, root.h = static_cast<std::int32_t>(sh), root.last = true, root.first = true;
    root.pool.assign(static_cast<std::size_t>(sd - 1), 0.0);
    root.d2h = start.d2h;
    {
      auto busy = start.host_busy;
      std::sort(busy.begin(), busy.end());
      for (double x : busy)
        if (x > 0 && static_cast<std::int64_t>(root.host_busy.size()) < sh) root.host_busy.push_back(x);
    }
    try {
      if (dp.solve(root).value == detail::ckpt::two_tier_dp::inf) throw schedule_error("two_tier_plan: internal error: no schedule");
      detail::ckpt::two_tier_emitter em(dp, device_slots, host_slots);
      em.put(chain_action::store(0, 0));
      em.emit(root, 0, -1);
      auto r = finish(em.take(), two_tier_method::dp);
      r.dp_estimate_us = dp.solve(root).value;
      charge();
      return r;
    } catch (detail::ckpt::two_tier_dp::dp_budget_exceeded const&) {
      charge();  // too many states for the budget: the segment family below
    }
  }
  auto best = finish(revolve_schedule(n, device_slots), two_tier_method::revolve);
  if (sh >= 1) {
    double f = 0, b = 0;  // averages: the estimate only ranks k
    for (std::int64_t i = 0; i < n; ++i) f += costs.forward(i), b += costs.backward(i);
    f /= static_cast<double>(n), b /= static_cast<double>(n);
    std::int32_t best_k = 0;
    double best_est = std::numeric_limits<double>::infinity();
    for (std::int32_t k = 1; k <= std::min<std::int64_t>(sh, n - 1); ++k) {
      double const e = detail::ckpt::segment_estimate(n32, sd, k, costs, f, b);
      if (e < best_est) best_est = e, best_k = k;
    }
    if (best_k > 0) {
      auto seg = finish(detail::ckpt::segment_schedule(n32, device_slots, best_k), two_tier_method::segments);
      if (seg.predicted_us < best.predicted_us) best = std::move(seg);
    }
  }
  return best;
}

}  // namespace tide
