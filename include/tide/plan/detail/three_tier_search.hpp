#pragma once
//! \file
//! `three_tier_plan`'s search (plan/checkpointing.hpp declares it): the disk as the outermost
//! tier. The first sweep writes the starts of k segments to disk (staged through a host
//! snapshot); the backward reverses the segments last to first, each with `two_tier_plan` on
//! the device and host snapshots, and reads the next segment's start back from disk while the
//! current one runs (when a host snapshot is kept for it). Segment lengths are equal, or for
//! short chains of uniform cost chosen by a dynamic program over the segments' own times.
//! docs/checkpointing.md, "Three tiers", says where this is optimal and where it is not.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/reversal.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/plan/detail/chain_model.hpp>
#include <tide/plan/detail/two_tier_search.hpp>

namespace tide {

namespace detail::ckpt {

//! Steps [a, a+l) of `c` as a chain of their own.
inline chain_costs slice_costs(chain_costs const& c, std::int64_t a, std::int64_t l) {
  // The scalars, and of the per-layer vectors only [a, a+l): a copy of the whole vectors per
  // segment made per-layer costs quadratic in the segment count.
  chain_costs s{{}, {}, c.d2h_us, c.h2d_us, c.synchronous_copies, c.disk_write_us, c.disk_read_us};
  auto cut = [&](std::vector<double>& v, std::vector<double> const& from) {
    if (from.size() == 1) v = from;
    else v.assign(from.begin() + a, from.begin() + a + l);
  };
  cut(s.forward_us, c.forward_us);
  cut(s.backward_us, c.backward_us);
  return s;
}

//! A schedule and what the machine that checked it found.
struct timed_schedule {
  std::vector<chain_action> actions;
  chain_evaluation evaluation;
};

//! Builds a disk-segmented schedule on a machine that checks and times each action as it is
//! appended (so the schedule needs no second evaluation).
class disk_segments {
 public:
  disk_segments(std::int64_t n, chain_tiers tiers, chain_costs const& costs, two_tier_options const& inner, std::size_t* dp_states_left)
      : n_(n), tiers_(tiers), costs_(costs), inner_(inner), dp_states_left_(dp_states_left), m_(n, tiers, costs) {}

  //! Segments start at `starts` (starts[0] = 0, increasing, the last one below n): the first
  //! k = starts.size() - 1 starts go to disk snapshots 0..k-1. With `reserve`, the last host
  //! snapshot stages the disk reads (the segments' plans use the others) and each read is issued
  //! a segment ahead; without, the segments use every host snapshot and each read waits for the
  //! segment before to end.
  //! `buffer`: storage for the actions (cleared; its capacity kept: a candidate's schedule at a
  //! million layers is tens of megabytes, and fresh pages for each candidate cost more than
  //! writing the actions).
  timed_schedule build(std::vector<std::int32_t> const& starts, bool reserve, std::vector<chain_action> buffer = {}) && {
    out_ = std::move(buffer);
    out_.clear();
    auto const k = static_cast<std::int32_t>(starts.size()) - 1;
    auto const dev = static_cast<std::int32_t>(m_.device().size()), hst = static_cast<std::int32_t>(m_.host().size());
    std::int32_t const stage = hst - 1;
    std::int64_t const inner_host = reserve ? hst - 1 : hst;
    // The first sweep: each disk start through a device and a host snapshot (round robin, so
    // consecutive writes overlap), then the last segment's plan, which ends with the turn.
    for (std::int32_t j = 0; j < k; ++j) {
      advance_to(starts[static_cast<std::size_t>(j)]);
      std::int32_t const d = j % dev, h = j % hst;
      put(chain_action::store(starts[static_cast<std::size_t>(j)], d));
      put(chain_action::offload(d, h));
      put(chain_action::free(d));
      put(chain_action::spill(h, j));
      put(chain_action::free_host(h));
    }
    advance_to(starts[static_cast<std::size_t>(k)]);
    if (reserve && k > 0) put(chain_action::load(k - 1, stage));
    segment(starts[static_cast<std::size_t>(k)], static_cast<std::int32_t>(n_), inner_host, true, k > 0 ? starts[static_cast<std::size_t>(k) - 1] : -1,
            reserve ? -1 : k - 1);
    for (std::int32_t j = k - 1; j >= 0; --j) {
      std::int32_t const a = starts[static_cast<std::size_t>(j)], b = starts[static_cast<std::size_t>(j) + 1];
      // The segment's start into the working carry: read from disk now (without a reserved
      // snapshot), brought to the device unless the segment before already prefetched it.
      std::int32_t d = held(m_.device(), a);
      if (d < 0) {
        std::int32_t h = held(m_.host(), a);
        if (h < 0) {
          h = empty(m_.host());
          put(chain_action::load(j, h));
        }
        d = empty(m_.device());
        put(chain_action::prefetch(h, d));
        put(chain_action::free_host(h));
      } else {
        free_host_copy(a);
      }
      put(chain_action::free_disk(j));
      put(chain_action::restore(d));
      put(chain_action::free(d));
      if (reserve && j > 0) put(chain_action::load(j - 1, stage));
      segment(a, b, inner_host, false, j > 0 ? starts[static_cast<std::size_t>(j) - 1] : -1, reserve ? -1 : j - 1);
    }
    return {std::move(out_), summarize(m_)};
  }

 private:
  void put(chain_action const& a) {
    m_.apply(a);
    out_.push_back(a);
  }
  void advance_to(std::int32_t to) {
    if (to > m_.work()) put(chain_action::advance(m_.work(), to));
  }
  static std::int32_t empty(std::span<chain_snapshot const> tier) {
    for (std::size_t i = 0; i < tier.size(); ++i)
      if (tier[i].carry < 0) return static_cast<std::int32_t>(i);
    throw schedule_error("three_tier_plan: internal error: no empty snapshot at a segment boundary");
  }
  //! The snapshot of `tier` that holds `carry`, or -1.
  static std::int32_t held(std::span<chain_snapshot const> tier, std::int32_t carry) {
    for (std::size_t i = 0; i < tier.size(); ++i)
      if (tier[i].carry == carry) return static_cast<std::int32_t>(i);
    return -1;
  }
  void free_host_copy(std::int32_t carry) {
    if (auto const h = held(m_.host(), carry); h >= 0) put(chain_action::free_host(h));
  }
  //! Snapshots holding carries no backward reads any more.
  void drop_dead() {
    for (std::size_t i = 0; i < m_.device().size(); ++i)
      if (m_.device()[i].carry > m_.next_backward()) put(chain_action::free(static_cast<std::int32_t>(i)));
    for (std::size_t i = 0; i < m_.host().size(); ++i)
      if (m_.host()[i].carry > m_.next_backward()) put(chain_action::free_host(static_cast<std::int32_t>(i)));
  }
  //! Segment [a, b) reversed by `two_tier_plan` with `host` host snapshots, its actions shifted
  //! to the chain's carries (its turn kept only for the chain's last segment). The next segment
  //! starts at carry `next_carry` (-1: none). When it is still on disk snapshot `next_disk` (-1:
  //! already being read), its read is issued once a host snapshot is free for the rest of this
  //! segment; once read, its prefetch is issued before this segment's last backward when a
  //! device snapshot is free.
  void segment(std::int32_t a, std::int32_t b, std::int64_t host, bool last, std::int32_t next_carry, std::int32_t next_disk) {
    auto const l = b - a;
    // The plan's offloads wait for the host snapshots they write while disk writes still read
    // them (the first sweep's): the plan is searched knowing how long each stays busy.
    detail::ckpt::tt_start start{.d2h = std::max(0.0, m_.d2h_free() - m_.now()), .dp_states_left = dp_states_left_};
    for (std::size_t i = 0; i < static_cast<std::size_t>(host); ++i) start.host_busy.push_back(std::max(0.0, m_.host()[i].busy - m_.now()));
    auto const plan = relabel(hold_prefetched(two_tier_search(l, tiers_.device, host, slice_costs(costs_, a, l), inner_, start).actions), host);
    std::size_t last_backward = plan.size();
    for (std::size_t i = plan.size(); i-- > 0;)
      if (plan[i].op == chain_op::backward) {
        last_backward = i;
        break;
      }
    // The host snapshot whose last copy the plan issues first: the read goes there right after
    // (the plan's own later free of it is dropped; nothing of the plan reads it again).
    std::vector<std::ptrdiff_t> last_use(m_.host().size(), -1);
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (plan[i].host_snapshot >= 0 && plan[i].op != chain_op::free_host)
        last_use[static_cast<std::size_t>(plan[i].host_snapshot)] = static_cast<std::ptrdiff_t>(i);
    auto const h = static_cast<std::int32_t>(std::min_element(last_use.begin(), last_use.end()) - last_use.begin());
    bool taken = false;  // h was taken for the read: the plan's free of it is dropped
    auto read = [&](std::ptrdiff_t after) {
      if (next_disk < 0 || after < last_use[static_cast<std::size_t>(h)]) return;
      if (m_.host()[static_cast<std::size_t>(h)].carry >= 0) put(chain_action::free_host(h)), taken = true;
      put(chain_action::load(next_disk, h));
      next_disk = -1;
    };
    read(-1);
    for (std::size_t i = 0; i < plan.size(); ++i) {
      auto x = plan[i];
      if (i == last_backward && next_carry >= 0) prefetch_early(next_carry);
      switch (x.op) {
        case chain_op::advance: x.carry += a, x.to += a; break;
        case chain_op::turn:
          if (!last) continue;
          x.carry += a;
          break;
        case chain_op::store:
        case chain_op::backward: x.carry += a; break;
        case chain_op::free_host:
          if (taken && x.host_snapshot == h) {
            taken = false;
            continue;
          }
          break;
        default: break;
      }
      put(x);
      read(static_cast<std::ptrdiff_t>(i));
    }
    drop_dead();
  }
  //! `plan` without the prefetches of a carry into a device snapshot that held it when it was
  //! freed and was not written since: the carry stays there (the free and the prefetch are
  //! dropped). Alone, a plan loses nothing by prefetching again; in a segment, the host snapshot
  //! is then done sooner and the next segment's disk read can start.
  static std::vector<chain_action> hold_prefetched(std::vector<chain_action> plan) {
    std::vector<std::int32_t> dev, hst;
    std::vector<std::ptrdiff_t> freed_at;  // per device snapshot: the free that emptied it, unwritten since (-1: none)
    std::vector<std::int32_t> freed_carry;
    auto grow = [](auto& v, std::int32_t i, auto fill) {
      if (static_cast<std::size_t>(i) >= v.size()) v.resize(static_cast<std::size_t>(i) + 1, fill);
    };
    std::vector<char> drop(plan.size(), 0);
    for (std::size_t i = 0; i < plan.size(); ++i) {
      auto const& x = plan[i];
      if (x.snapshot >= 0) grow(dev, x.snapshot, -1), grow(freed_at, x.snapshot, std::ptrdiff_t{-1}), grow(freed_carry, x.snapshot, -1);
      if (x.host_snapshot >= 0) grow(hst, x.host_snapshot, -1);
      auto const d = static_cast<std::size_t>(x.snapshot), h = static_cast<std::size_t>(x.host_snapshot);
      switch (x.op) {
        case chain_op::store: dev[d] = x.carry, freed_at[d] = -1; break;
        case chain_op::offload: hst[h] = dev[d]; break;
        case chain_op::free: freed_at[d] = static_cast<std::ptrdiff_t>(i), freed_carry[d] = dev[d], dev[d] = -1; break;
        case chain_op::free_host: hst[h] = -1; break;
        case chain_op::prefetch:
          if (freed_at[d] >= 0 && freed_carry[d] == hst[h]) {
            drop[static_cast<std::size_t>(freed_at[d])] = 1, drop[i] = 1;
          }
          dev[d] = hst[h], freed_at[d] = -1;
          break;
        default: break;
      }
    }
    std::vector<chain_action> out;
    out.reserve(plan.size());
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (!drop[i]) out.push_back(plan[i]);
    return out;
  }
  //! `plan` (a segment's, planned as if its snapshots were idle) on the snapshots the machine
  //! has: its device snapshots, and its host snapshots (the first `host`), in the order it first
  //! writes them, go to the snapshots that are free soonest (the disk writes of the first sweep
  //! keep some busy), so that the plan's first copies do not queue behind them.
  std::vector<chain_action> relabel(std::vector<chain_action> plan, std::int64_t host) const {
    auto order = [](std::span<chain_snapshot const> tier, std::size_t count) {
      std::vector<std::int32_t> idx(count);
      for (std::size_t i = 0; i < count; ++i) idx[i] = static_cast<std::int32_t>(i);
      std::stable_sort(idx.begin(), idx.end(), [&](auto x, auto y) { return tier[static_cast<std::size_t>(x)].busy < tier[static_cast<std::size_t>(y)].busy; });
      return idx;
    };
    auto const dev_free = order(m_.device(), m_.device().size()), host_free = order(m_.host(), static_cast<std::size_t>(host));
    std::vector<std::int32_t> dmap(m_.device().size(), -1), hmap(static_cast<std::size_t>(host), -1);
    std::size_t dn = 0, hn = 0;
    for (auto const& x : plan) {
      if (x.snapshot >= 0 && dmap[static_cast<std::size_t>(x.snapshot)] < 0) dmap[static_cast<std::size_t>(x.snapshot)] = dev_free[dn++];
      if (x.host_snapshot >= 0 && hmap[static_cast<std::size_t>(x.host_snapshot)] < 0) hmap[static_cast<std::size_t>(x.host_snapshot)] = host_free[hn++];
    }
    for (auto& x : plan) {
      if (x.snapshot >= 0) x.snapshot = dmap[static_cast<std::size_t>(x.snapshot)];
      if (x.host_snapshot >= 0) x.host_snapshot = hmap[static_cast<std::size_t>(x.host_snapshot)];
    }
    return plan;
  }
  //! The next segment's start (carry `carry`), when a host snapshot holds it, to a free device
  //! snapshot, if one is free.
  void prefetch_early(std::int32_t carry) {
    auto const h = held(m_.host(), carry);
    if (h < 0) return;
    for (std::size_t i = 0; i < m_.device().size(); ++i)
      if (m_.device()[i].carry < 0) {
        put(chain_action::prefetch(h, static_cast<std::int32_t>(i)));
        return;
      }
  }

  std::int64_t n_;
  chain_tiers tiers_;
  chain_costs const& costs_;
  two_tier_options const& inner_;
  std::size_t* dp_states_left_;
  chain_machine m_;
  std::vector<chain_action> out_;
};

//! Forwards and backwards every schedule of the chain runs: sum of forwards, sum of backwards,
//! and the cheapest forward (what an extra forward costs at least).
struct chain_work {
  double forwards = 0, backwards = 0, cheapest_forward = 0;
};
inline chain_work work_of(std::int64_t n, chain_costs const& c) {
  chain_work w;
  if (c.uniform()) return {c.forward(0) * static_cast<double>(n), c.backward(0) * static_cast<double>(n), c.forward(0)};
  w.cheapest_forward = std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < n; ++i) {
    w.forwards += c.forward(i), w.backwards += c.backward(i);
    w.cheapest_forward = std::min(w.cheapest_forward, c.forward(i));
  }
  return w;
}

//! The least extra forwards of the disk-segment schedule with segment starts `starts`, whose
//! segments are reversed with at most `snapshots` carries held: each middle segment (all but
//! the last) runs its l - 1 forwards again from its start, read back from disk, and every
//! segment's reversal at least Revolve's extra forwards for its length (a schedule holding at
//! most s carries at once recomputes at least `revolve_extra_forwards(l, s)`). Lengths repeat
//! (equal segments have two): each length's count is computed once.
inline std::int64_t segments_extra_forwards_bound(std::int64_t n, std::vector<std::int32_t> const& starts, std::int64_t snapshots) {
  std::int64_t extra = 0;
  std::int64_t memo_len = -1, memo_val = 0;
  for (std::size_t j = 0; j < starts.size(); ++j) {
    std::int64_t const l = (j + 1 < starts.size() ? starts[j + 1] : n) - starts[j];
    if (j + 1 < starts.size()) extra += l - 1;
    if (l != memo_len) memo_len = l, memo_val = revolve_extra_forwards(l, std::max<std::int64_t>(snapshots, 1));
    extra += memo_val;
  }
  return extra;
}

//! Equal segments: k disk starts and the last segment's start, k + 1 segments of n / (k + 1).
inline std::vector<std::int32_t> equal_starts(std::int64_t n, std::int64_t k) {
  std::vector<std::int32_t> q;
  for (std::int64_t j = 0; j <= k; ++j) q.push_back(static_cast<std::int32_t>(j * n / (k + 1)));
  return q;
}

//! The disk-start counts the search builds: every k up to `every_up_to`, then doublings and
//! `kmax` itself. Each candidate is a whole O(n) schedule, so the count must not grow with the
//! disk tier (k from 1 to 1,000 at n = 100,000 took 42 s).
inline std::vector<std::int64_t> segment_counts(std::int64_t kmax, std::int64_t every_up_to) {
  std::vector<std::int64_t> ks;
  for (std::int64_t k = 1; k <= kmax; k = k < every_up_to ? k + 1 : 2 * k) ks.push_back(k);
  if (ks.back() != kmax) ks.push_back(kmax);
  return ks;
}

//! The tiers a disk-segment schedule needs: device and host snapshots beyond a segment's
//! length plus the staging ones are never written, and every segment boundary scans the tiers,
//! so huge tiers (up to n + 1 each) would make a schedule of many segments quadratic.
inline chain_tiers segment_tiers(chain_tiers tiers, std::int64_t longest_segment) {
  std::int64_t const enough = std::max<std::int64_t>(64, longest_segment + 3);
  tiers.device = std::min(tiers.device, enough);
  tiers.host = std::min(tiers.host, enough);
  return tiers;
}

}  // namespace detail::ckpt

#if TIDE_DEFINITIONS
TIDE_INLINE double three_tier_lower_bound(std::int64_t n, chain_tiers tiers, chain_costs const& costs) {
  detail::ckpt::check_tiers("three_tier_lower_bound", n, tiers);
  costs.check("three_tier_lower_bound", n);
  auto const w = detail::ckpt::work_of(n, costs);
  auto const cap = [n](std::int64_t x) { return std::min(x, n); };  // the tiers are not bounded above: no sum past n
  auto const held = std::min(n, cap(tiers.device) + cap(tiers.host) + cap(tiers.disk));
  return w.forwards + w.backwards + w.cheapest_forward * static_cast<double>(revolve_extra_forwards(n, std::max<std::int64_t>(held, 1)));
}

TIDE_INLINE three_tier_result three_tier_plan(std::int64_t n, chain_tiers tiers, chain_costs const& costs, three_tier_options const& options) {
  detail::ckpt::check_tiers("three_tier_plan", n, tiers);
  if (n > max_three_tier_layers)
    throw schedule_error("three_tier_plan: n = " + std::to_string(n) + " layers is more than the " + std::to_string(max_three_tier_layers) +
                         " it plans in seconds (tide::max_three_tier_layers; each candidate is a whole schedule of about 5 actions a "
                         "layer): plan a coarser chain (several layers a step), or use two_tier_plan or revolve_schedule, which take "
                         "up to tide::max_chain_steps");
  if (options.every_count_max_disk < 1)
    throw schedule_error("three_tier_plan: three_tier_options::every_count_max_disk must be at least 1, got " +
                         std::to_string(options.every_count_max_disk));
  costs.check("three_tier_plan", n);
  std::size_t dp_states_left = options.max_dp_states;
  detail::ckpt::tt_start const budget{.dp_states_left = &dp_states_left};
  auto result = [](detail::ckpt::timed_schedule t, three_tier_method how, std::int32_t segments, bool reserve) {
    auto const& e = t.evaluation;
    return three_tier_result{.actions = std::move(t.actions),
                             .predicted_us = e.time_us,
                             .extra_forwards = e.extra_forwards,
                             .disk_writes = e.disk_writes,
                             .disk_reads = e.disk_reads,
                             .segments = segments,
                             .staging_reserved = reserve,
                             .method = how};
  };
  auto two = detail::ckpt::two_tier_search(n, tiers.device, tiers.host, costs, options.inner, budget).actions;
  auto const two_eval = evaluate_chain(n, tiers, costs, two);  // the disk counts, zero
  auto best = result({std::move(two), two_eval}, three_tier_method::two_tier, 1, false);
  auto const kmax = std::min<std::int64_t>(tiers.disk, n - 1);
  if (kmax < 1) return best;

  auto consider = [&](std::vector<std::int32_t> const& starts, bool reserve) {
    std::int64_t longest = n - starts.back();
    for (std::size_t j = 0; j + 1 < starts.size(); ++j) longest = std::max<std::int64_t>(longest, starts[j + 1] - starts[j]);
    auto const seg_tiers = detail::ckpt::segment_tiers(tiers, longest);
    auto r = result(detail::ckpt::disk_segments(n, seg_tiers, costs, options.inner, &dp_states_left).build(starts, reserve),
                    three_tier_method::disk_segments, static_cast<std::int32_t>(starts.size()), reserve);
    if (r.predicted_us < best.predicted_us) best = std::move(r);
  };
  // Segment lengths by a dynamic program (uniform costs, short chains): a segment's time is its
  // two-tier plan's (less the turn, for all but the last) and a prefetch at its start; the first
  // sweep's forward to the last segment's start is added once. Estimates that rank splits; the
  // evaluator times the schedules built from them.
  std::vector<std::vector<std::int32_t>> dp_starts(static_cast<std::size_t>(kmax) + 1);
  if (costs.uniform() && n <= options.dp_max_layers) {
    auto const f = costs.forward(0);
    std::vector<double> mid(static_cast<std::size_t>(n) + 1), last(static_cast<std::size_t>(n) + 1);
    std::int64_t const inner_host = std::max<std::int64_t>(tiers.host - 1, 0);
    for (std::int64_t l = 1; l <= n; ++l) {
      auto const t = detail::ckpt::two_tier_search(l, tiers.device, inner_host, costs, options.inner, budget).predicted_us;
      last[static_cast<std::size_t>(l)] = t;
      mid[static_cast<std::size_t>(l)] = t - f + costs.h2d_us;
    }
    constexpr double inf = std::numeric_limits<double>::infinity();
    // g[j][p]: the least time of j middle segments covering steps [0, p); choice[j][p] the last one's length.
    std::vector<std::vector<double>> g(static_cast<std::size_t>(kmax) + 1, std::vector<double>(static_cast<std::size_t>(n), inf));
    std::vector<std::vector<std::int32_t>> choice(g.size(), std::vector<std::int32_t>(static_cast<std::size_t>(n), 0));
    g[0][0] = 0;
    for (std::size_t j = 1; j < g.size(); ++j)
      for (std::int64_t p = static_cast<std::int64_t>(j); p < n; ++p)
        for (std::int64_t l = 1; l <= p; ++l)
          if (double const v = g[j - 1][static_cast<std::size_t>(p - l)] + mid[static_cast<std::size_t>(l)]; v < g[j][static_cast<std::size_t>(p)])
            g[j][static_cast<std::size_t>(p)] = v, choice[j][static_cast<std::size_t>(p)] = static_cast<std::int32_t>(l);
    for (std::size_t j = 1; j < g.size(); ++j) {
      double best_v = inf;
      std::int64_t best_p = -1;
      for (std::int64_t p = static_cast<std::int64_t>(j); p < n; ++p)
        if (double const v = f * static_cast<double>(p) + g[j][static_cast<std::size_t>(p)] + last[static_cast<std::size_t>(n - p)]; v < best_v)
          best_v = v, best_p = p;
      if (best_p < 0) continue;
      std::vector<std::int32_t> q{static_cast<std::int32_t>(best_p)};
      for (std::size_t i = j, p = static_cast<std::size_t>(best_p); i > 0; --i) {
        p -= static_cast<std::size_t>(choice[i][p]);
        q.push_back(static_cast<std::int32_t>(p));
      }
      std::reverse(q.begin(), q.end());
      dp_starts[j] = std::move(q);
    }
  }
  // The candidates, in the order building every one would take them (so that ties go where
  // they went): one disk start at every carry on a short chain, then each count's equal and DP
  // segments, with and without a reserved staging snapshot.
  struct candidate {
    std::vector<std::int32_t> starts;
    bool reserve;
  };
  std::vector<candidate> cands;
  if (n <= options.every_split_max_layers)
    for (std::int32_t q = 1; q < n; ++q)
      for (bool const reserve : {true, false}) cands.push_back({{0, q}, reserve});
  for (std::int64_t const k : detail::ckpt::segment_counts(kmax, options.every_count_max_disk)) {
    auto equal = detail::ckpt::equal_starts(n, k);
    auto const& dp = dp_starts[static_cast<std::size_t>(k)];
    for (bool const reserve : {true, false}) {
      cands.push_back({equal, reserve});
      if (!dp.empty() && dp != equal) cands.push_back({dp, reserve});
    }
  }
  if (!options.skip_by_bound) {
    for (auto const& c : cands) consider(c.starts, c.reserve);
    return best;
  }
  // Best first: each candidate's time is at least its work plus its least extra forwards
  // (segments_extra_forwards_bound, at the cheapest forward); candidates are built in the order of
  // that bound and the search stops at the first whose bound is above the best time found. A
  // tie with an earlier candidate goes to the earlier one, as building every one in order gives.
  auto const w = detail::ckpt::work_of(n, costs);
  auto const held = std::min(tiers.device, n) + std::min(tiers.host, n);  // a segment holds at most these
  std::vector<std::pair<double, std::size_t>> order;
  order.reserve(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i)
    order.push_back({w.forwards + w.backwards +
                         w.cheapest_forward * static_cast<double>(detail::ckpt::segments_extra_forwards_bound(n, cands[i].starts, held)),
                     i});
  std::stable_sort(order.begin(), order.end(), [](auto const& x, auto const& y) { return x.first < y.first; });
  std::size_t best_index = 0;  // 0: the two-tier plan, before every candidate
  std::vector<chain_action> spare;  // the last loser's actions: the next candidate builds into them
  for (auto const& entry : order) {
    auto const bound = entry.first;
    auto const i = entry.second;  // not a structured binding: the lambda below captures it (clang before 16)
    // A relative margin: the bound and the machine's time add the same terms in other orders. At
    // the best time, a candidate can only tie, and a tie goes to the earlier candidate.
    if (bound > best.predicted_us * (1 + 1e-9)) break;
    if (bound >= best.predicted_us * (1 - 1e-9) && i + 1 > best_index) continue;
    auto const before = best.predicted_us;
    auto r = [&] {
      auto const& c = cands[i];
      std::int64_t longest = n - c.starts.back();
      for (std::size_t j = 0; j + 1 < c.starts.size(); ++j) longest = std::max<std::int64_t>(longest, c.starts[j + 1] - c.starts[j]);
      return result(detail::ckpt::disk_segments(n, detail::ckpt::segment_tiers(tiers, longest), costs, options.inner, &dp_states_left)
                        .build(c.starts, c.reserve, std::move(spare)),
                    three_tier_method::disk_segments, static_cast<std::int32_t>(c.starts.size()), c.reserve);
    }();
    if (r.predicted_us < before || (r.predicted_us == before && best_index > 0 && i + 1 < best_index)) {
      spare = std::move(best.actions);
      best = std::move(r);
      best_index = i + 1;
    } else {
      spare = std::move(r.actions);
    }
  }
  return best;
}
#endif

}  // namespace tide
