#pragma once
//! \file
//! The planner's grouped search for deep stacks (planner.hpp, `plan_options::group_above_decisions`):
//! runs of identical layers (one layer type, equal costs), and runs of a repeating block of layers
//! (dense and MoE alternating: a block of 2; `plan_options::group_max_period`), are planned as
//! groups. Each run longer than `2 * edge + representatives` blocks keeps its first and last
//! `edge` layers, in whole blocks (the prefetch window's ends: a deeper window than the
//! candidates' never reaches past them), and stands its middle in for by `representatives`
//! blocks, each the stand-in for a contiguous share of the middle's blocks. The searches
//! (plan_search.hpp) plan that compressed stack; its plan is expanded (each
//! stand-in's decisions copied onto its block) and built and simulated whole, so the step, peaks
//! and fit reported are the full stack's, never an estimate.
//!
//! The compressed stack's device budget is found by bisection: a stand-in's kept bytes count once
//! in the compressed stack and once per layer of its block in the full one, so the compressed
//! plan is made under a smaller budget, the largest whose expansion fits (the host budget the
//! same way, scaled by the bytes the compressed stack holds, shrunk while the expansion's pinned
//! bytes do not fit). Work: a few compressed plans (a few hundred decisions each) and one full
//! build and simulation per bisection step, linear in the layers.
//!
//! What it loses against planning every layer: a block's layers all take its stand-in's
//! placement, so a trade finer than a block (e.g. keeping a slot in 37% of a run's layers) is
//! only as fine as the edges and blocks allow. Nothing hides that: `make_plan` reports the gap to
//! the lower bound of the full stack, computed as for any plan.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/build.hpp>
#include <tide/plan/detail/plan_search.hpp>
#include <tide/plan/plan.hpp>
#include <tide/plan/policy_codegen.hpp>
#include <tide/plan/simulate.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide::detail {

//! True when layers `a` and `b` have one type and equal costs (what makes them one group).
inline bool same_layer(stack_spec const& stack, cost_table const& costs, std::uint32_t a, std::uint32_t b) {
  if (stack.layer_types[a] != stack.layer_types[b]) return false;
  auto const& x = costs.layers[a];
  auto const& y = costs.layers[b];
  return x.forward_us == y.forward_us && x.backward_us == y.backward_us && x.recompute_us == y.recompute_us &&
         x.slot_recompute_us == y.slot_recompute_us && x.gather_us == y.gather_us && x.reduce_us == y.reduce_us &&
         x.regather_us == y.regather_us && x.slot_producer == y.slot_producer &&
         x.memory_bound_share == y.memory_bound_share;
}

//! A stack with runs compressed: compressed layer `c` stands for `weight[c]` layers of the full
//! stack, the first `begin[c]`, the others `period[c]` layers apart (a run of a repeating block of
//! `period[c]` layers: its stand-in is the block's `period[c]` consecutive compressed layers, each
//! of one weight). Layers outside a compressed run have weight 1 and period 1.
struct grouped_stack {
  stack_spec stack;
  cost_table costs;
  std::vector<std::uint32_t> begin;
  std::vector<std::uint32_t> weight;
  std::vector<std::uint32_t> period;
  std::uint32_t stand_ins = 0;  //!< compressed layers with a weight above one
};

//! The longest periodic run at layer `l` of a block of at most `max_period` layers: where layer
//! `i + k` equals layer `i` (one type, equal costs) for every `i` from `l`, the period `k` whose
//! whole blocks cover the most layers (the shortest on a tie), and how many blocks. A run of one
//! repeated layer has period 1; dense and MoE layers alternating have period 2.
struct periodic_run {
  std::uint32_t period = 1;
  std::uint32_t blocks = 1;
  std::uint32_t identical_end = 0;  //!< one past the run of layers identical to layer `l` (period 1)
};
inline periodic_run longest_periodic_run(stack_spec const& stack, cost_table const& costs, std::uint32_t l, std::uint32_t max_period) {
  auto const L = stack.layer_count();
  periodic_run best;
  std::uint64_t covered = 1;
  for (std::uint32_t k = 1; k <= max_period && std::uint64_t{l} + k <= L; ++k) {
    auto e = l + k;  // [l, e) has period k
    while (e < L && same_layer(stack, costs, e - k, e)) ++e;
    auto const blocks = (e - l) / k;
    if (k == 1) best.identical_end = e;
    if (std::uint64_t{blocks} * k > covered) {
      covered = std::uint64_t{blocks} * k;
      best.period = k, best.blocks = blocks;
    }
  }
  return best;
}

//! `stack` with each periodic run (`longest_periodic_run`, blocks of up to `max_period` layers)
//! compressed where it is longer than `2 * edge + representatives` layers' worth of blocks: its
//! first blocks covering `edge` layers, `representatives` stand-in blocks for equal shares of its
//! middle blocks (the first shares one block longer where it does not divide), and its last blocks
//! covering `edge` layers. Work: linear in the layers for a fixed `max_period` (a run too short to
//! compress is at most `(2 * edge + representatives + 1) * max_period` layers long).
inline grouped_stack compress_runs(stack_spec const& stack, cost_table const& costs, std::uint32_t edge,
                                   std::uint32_t representatives, std::uint32_t max_period = 1) {
  grouped_stack g;
  g.stack.types = stack.types;
  g.costs = costs;
  g.costs.layers.clear();
  auto const L = stack.layer_count();
  auto add = [&](std::uint32_t layer, std::uint32_t weight, std::uint32_t period) {
    g.stack.layer_types.push_back(stack.layer_types[layer]);
    g.costs.layers.push_back(costs.layers[layer]);
    g.begin.push_back(layer);
    g.weight.push_back(weight);
    g.period.push_back(period);
    g.stand_ins += weight > 1;
  };
  max_period = std::max<std::uint32_t>(max_period, 1);
  // A compressed run has more than 2 * edge + representatives layers: none fits, none is searched
  // (with group_blocks 0, or an edge of half the stack, every layer searched the rest of its run).
  if (representatives == 0 || std::uint64_t{L} <= 2 * std::uint64_t{edge} + representatives) {
    for (std::uint32_t l = 0; l < L; ++l) add(l, 1, 1);
    return g;
  }
  for (std::uint32_t l = 0; l < L;) {
    auto const run = longest_periodic_run(stack, costs, l, max_period);
    auto const k = run.period;
    // The ends in whole blocks; in 64 bits: an edge or a representative count near 2^31 wrapped,
    // and the run was then "compressed" into layers past the stack's end.
    auto const edge_blocks = (std::uint64_t{edge} + k - 1) / k;
    if (run.blocks <= 2 * edge_blocks + representatives) {
      // Too short: its first layers as they are, and the search goes on where a periodic run may
      // begin. A start within the layers identical to layer l, at least max_period before their
      // end, finds every period's run ending where l's does, with fewer blocks: too short too.
      // (Searching from each of them made a long run of identical layers quadratic.)
      auto next = l + 1;
      if (std::uint64_t{run.identical_end} >= std::uint64_t{l} + max_period) next = run.identical_end - max_period + 1;
      for (; l < next; ++l) add(l, 1, 1);
      continue;
    }
    auto const eb = static_cast<std::uint32_t>(edge_blocks);
    for (std::uint32_t i = 0; i < eb * k; ++i) add(l + i, 1, 1);
    auto const middle = run.blocks - 2 * eb;
    auto at = l + eb * k;
    for (std::uint32_t r = 0; r < representatives; ++r) {
      auto const w = middle / representatives + (r < middle % representatives ? 1 : 0);
      for (std::uint32_t i = 0; i < k; ++i) add(at + i, w, k);
      at += w * k;
    }
    for (std::uint32_t i = 0; i < eb * k; ++i) add(at + i, 1, 1);
    l = at + eb * k;
  }
  return g;
}

//! Where compressed layer `c`'s copies' decisions lie in the full stack's: the first copy's first
//! decision, and the distance between copies (the decisions of its block).
struct copy_layout {
  std::vector<std::size_t> first;
  std::vector<std::size_t> stride;
};
inline copy_layout copy_positions(grouped_stack const& g) {
  copy_layout r;
  auto const C = g.stack.layer_count();
  r.first.resize(C);
  r.stride.resize(C);
  std::size_t d = 0;
  for (std::uint32_t c = 0; c < C;) {
    auto const k = g.period[c];  // c starts a block: its k compressed layers share one weight
    std::size_t block = 0;
    for (std::uint32_t i = 0; i < k; ++i) {
      r.first[c + i] = d + block;
      block += g.stack.layer(c + i).slots.size();
    }
    for (std::uint32_t i = 0; i < k; ++i) r.stride[c + i] = block;
    d += block * g.weight[c];
    c += k;
  }
  return r;
}

//! The full stack's decisions for the compressed stack's `d`: each stand-in block's copied onto
//! its share of the run, block by block.
inline std::vector<placement> expand_decisions(stack_spec const& full, grouped_stack const& g, std::vector<placement> const& d) {
  std::vector<placement> r;
  std::size_t decisions = 0;
  for (std::uint32_t l = 0; l < full.layer_count(); ++l) decisions += full.layer(l).slots.size();
  r.reserve(decisions);
  auto const stride = copy_positions(g).stride;  // a block's decisions
  std::size_t at = 0;
  for (std::uint32_t c = 0; c < g.stack.layer_count();) {
    auto const k = g.period[c];
    auto const block = stride[c];
    auto const from = d.begin() + static_cast<std::ptrdiff_t>(at);
    for (std::uint32_t w = 0; w < g.weight[c]; ++w) r.insert(r.end(), from, from + static_cast<std::ptrdiff_t>(block));
    at += block;
    c += k;
  }
  return r;
}

//! The grouped planner (see the file comment): `plan_slots`'s answer for `stack`, planned on the
//! compressed stack and evaluated whole. `fits == false` when no expansion fits (the caller may
//! then plan ungrouped). `grouped_layers` in the result: the layers planned as copies.
inline plan plan_grouped(stack_spec const& stack, cost_table const& costs, plan_options const& opt, std::uint32_t edge,
                         std::uint32_t representatives) {
  auto const g = compress_runs(stack, costs, edge, representatives, opt.group_max_period);
  plan best;
  best.smallest_activation_bytes = std::numeric_limits<std::size_t>::max();
  best.step_us = std::numeric_limits<double>::infinity();
  std::size_t evaluations = 0;
  // One full evaluation: build, and when it fits, simulate; the fastest that fits is kept.
  struct outcome {
    bool planned = false;  // the compressed stack's plan fit its budgets
    bool built = false;
    std::size_t device = 0, host = 0;
  };
  schedule s;
  auto evaluate_full = [&](std::vector<placement> const& d, strategy how) {
    outcome o{.planned = true};
    how.policy = policy_from_decisions(stack, d);
    ++evaluations;
    if (try_build_schedule_into(s, stack, how)) return o;
    o.built = true;
    o.device = s.peak_device_bytes();
    o.host = s.peak_host_bytes();
    best.smallest_activation_bytes = std::min(best.smallest_activation_bytes, o.device);
    if (o.device > opt.device_budget || o.host > opt.host_budget) return o;
    auto const t = simulate_step_us(s, costs);
    if (t < best.step_us) {
      best.fits = true;
      best.step_us = t;
      best.decisions = d;
      best.strategy = std::move(how);
      best.activation_bytes = o.device;
      best.host_bytes = o.host;
    }
    return o;
  };
  auto sum_bytes = [](stack_spec const& st) {
    double t = 0;
    for (std::uint32_t l = 0; l < st.layer_count(); ++l)
      for (auto const& x : st.layer(l).slots) t += static_cast<double>(x.bytes);
    return t;
  };
  double const share = sum_bytes(g.stack) / std::max(sum_bytes(stack), 1.0);  // of the bytes, in the compressed stack
  constexpr auto unlimited = std::numeric_limits<std::size_t>::max();
  auto o = opt;
  o.seeds.clear();  // the seeds are full-stack strategies: evaluated whole below
  o.storage_budget = 0;
  o.max_decisions = unlimited;
  if (o.candidates.empty()) o.candidates = default_candidates(stack);
  auto host_c = opt.host_budget == unlimited ? unlimited : static_cast<std::size_t>(static_cast<double>(opt.host_budget) * share);
  // Plans the compressed stack under (device, host_c) and evaluates its expansion.
  auto try_budget = [&](std::size_t device) {
    o.device_budget = device;
    o.host_budget = host_c;
    auto p = plan_slots(g.stack, g.costs, o);
    evaluations += p.evaluations;
    if (!p.fits) return outcome{};
    return evaluate_full(expand_decisions(stack, g, p.decisions), p.strategy);
  };
  // No compressed budget above the compressed stack's keep-all peaks changes its plan.
  auto top = opt.device_budget;
  {
    std::size_t keep_all = 0;
    schedule k;
    for (auto const& c : o.candidates)
      if (!try_build_schedule_into(k, g.stack, {.buffers = c.buffers, .pipeline = c.pipeline, .collectives = c.collectives}))
        keep_all = std::max(keep_all, k.peak_device_bytes());
    if (keep_all > 0) top = std::min(top, keep_all);
  }
  for (int round = 0; round < 3; ++round) {
    std::size_t host_over = 0;
    auto const first = try_budget(top);
    if (first.built && first.host > opt.host_budget) host_over = first.host;
    if (opt.device_budget != unlimited && first.built && first.device > opt.device_budget) {
      // Bisection: the largest compressed budget whose expansion fits (most kept bytes).
      std::size_t lo = 0, hi = top;  // hi's expansion does not fit
      for (int step = 0; step < 14 && hi - lo > top / 512; ++step) {  // finer: the fill below
        auto const mid = lo + (hi - lo) / 2;
        auto const r = try_budget(mid);
        if (r.built && r.host > opt.host_budget) host_over = std::max(host_over, r.host);
        if (!r.planned || (r.built && r.device <= opt.device_budget)) lo = mid;  // fits, or more room needed
        else hi = mid;
      }
    }
    if (best.fits || host_over == 0 || host_c == 0) break;
    // The expansion pinned more than the host budget: the compressed stack's share of it shrinks.
    host_c = static_cast<std::size_t>(static_cast<double>(host_c) * 0.95 * static_cast<double>(opt.host_budget) /
                                      static_cast<double>(host_over));
  }
  // The fill: a block's layers share a placement, so the bisection leaves device (and host) room
  // smaller than a block's worth of a slot. Rematerialized slots of the blocks' layers are
  // offloaded (into the host room, while offloads pay) or kept (into the device room) layer by
  // layer, dearest to recompute per byte first, each try built and simulated whole and kept only
  // when it fits and is faster. Offloads first: they leave the device room to the keeps.
  if (best.fits) {
    struct slot_class {
      std::uint32_t c;  // compressed layer (a stand-in)
      std::uint32_t k;  // slot
      double value;     // recompute time per byte
    };
    std::vector<slot_class> classes;
    auto const copies = copy_positions(g);  // each stand-in's copies in the full stack's decisions
    for (std::uint32_t c = 0; c < g.stack.layer_count(); ++c) {
      auto const& slots = g.stack.layer(c).slots;
      if (g.weight[c] > 1)
        for (std::uint32_t k = 0; k < slots.size(); ++k) {
          auto const& lc = g.costs.layers[c];
          double const r = lc.slot_recompute_us.size() == slots.size() ? lc.slot_recompute_us[k] : lc.full_recompute_us();
          classes.push_back({c, k, r / static_cast<double>(std::max<std::size_t>(slots[k].bytes, 1))});
        }
    }
    std::stable_sort(classes.begin(), classes.end(), [](auto const& a, auto const& b) { return a.value > b.value; });
    std::size_t tries = 0;
    bool offload_pays = true;  // false once an offload that fit was no faster (the link is busy)
    for (auto const& cl : classes) {
      if (tries >= opt.group_fill_tries) break;
      auto const bytes = std::max<std::size_t>(g.stack.layer(cl.c).slots[cl.k].bytes, 1);
      for (auto to : {placement::offload, placement::keep}) {
        if (to == placement::offload && !offload_pays) break;
        std::vector<std::size_t> members;  // this class's rematerialized decisions in the full plan
        for (std::uint32_t w = 0; w < g.weight[cl.c]; ++w)
          if (auto const i = copies.first[cl.c] + w * copies.stride[cl.c] + cl.k; best.decisions[i] == placement::remat) members.push_back(i);
        if (members.empty()) break;
        auto const room = to == placement::keep ? opt.device_budget - std::min(opt.device_budget, best.activation_bytes)
                                                : opt.host_budget - std::min(opt.host_budget, best.host_bytes);
        auto m = std::min(members.size(), room / bytes);
        for (int half = 0; half < 3 && m > 0 && tries < opt.group_fill_tries; ++half, m /= 2) {
          ++tries;
          auto d = best.decisions;
          for (std::size_t j = 0; j < m; ++j) d[members[j]] = to;
          auto const before = best.step_us;
          auto const r = evaluate_full(d, best.strategy);
          if (best.step_us < before) break;  // taken
          // An offload that does not pay (the link is busy, or its ring does not fit) is not
          // tried smaller: offloads stop being tried at all.
          if (to == placement::offload) {
            offload_pays = false;
            break;
          }
          if (r.built && r.device <= opt.device_budget && r.host <= opt.host_budget) break;  // fits but no faster
        }
      }
    }
  }
  // The seeds (e.g. the strategy table's rows) with their own pipelines: never slower than one that fits.
  for (auto const& seed : opt.seeds) {
    auto& t = s;  // reused: a deep stack's schedule is large
    ++evaluations;
    if (try_build_schedule_into(t, stack, seed)) continue;
    if (t.peak_device_bytes() > opt.device_budget || t.peak_host_bytes() > opt.host_budget) continue;
    auto const step = simulate_step_us(t, costs);
    if (step < best.step_us) {
      best.fits = true;
      best.step_us = step;
      best.decisions.assign(t.slots.size(), placement::keep);
      for (std::size_t i = 0; i < t.slots.size(); ++i) best.decisions[i] = t.slots[i].where;
      best.strategy = seed;
      best.activation_bytes = t.peak_device_bytes();
      best.host_bytes = t.peak_host_bytes();
    }
  }
  best.evaluations = evaluations;
  best.grouped_layers = 0;
  for (std::uint32_t c = 0; c < g.stack.layer_count(); ++c)
    if (g.weight[c] > 1) best.grouped_layers += g.weight[c];
  if (!best.fits) {
    // Nothing fit: the smallest peaks of the extremes within the host budget (everything
    // rematerialized but the inputs, kept; everything offloaded, per pipeline), so the answer says
    // how far off the device budget is.
    std::vector<placement> all;
    for (std::uint32_t l = 0; l < stack.layer_count(); ++l)
      for (auto const& x : stack.layer(l).slots) all.push_back(x.input ? placement::keep : placement::remat);
    auto peak = [&](strategy how) {
      how.policy = policy_from_decisions(stack, all);
      ++evaluations;
      if (!try_build_schedule_into(s, stack, how) && s.peak_host_bytes() <= opt.host_budget)
        best.smallest_activation_bytes = std::min(best.smallest_activation_bytes, s.peak_device_bytes());
    };
    peak(o.candidates.front());
    std::fill(all.begin(), all.end(), placement::offload);
    for (auto const& c : o.candidates) peak(c);
    best.evaluations = evaluations;
    best.step_us = 0;
    best.decisions.clear();
  }
  return best;
}

//! The edge of `compress_runs` for `opt`'s candidates and seeds: their deepest prefetch distance
//! plus two (the layers whose copies overlap a run's ends), and 2 at least.
inline std::uint32_t group_edge(stack_spec const& stack, plan_options const& opt) {
  auto const cands = opt.candidates.empty() ? default_candidates(stack) : opt.candidates;
  std::uint32_t d = 0;
  for (auto const& c : cands) d = std::max(d, c.pipeline.prefetch_distance);
  for (auto const& c : opt.seeds) d = std::max(d, c.pipeline.prefetch_distance);
  // A distance past the stack reaches no further than its last layer (and d + 2 must not wrap).
  return std::min(d, stack.layer_count()) + 2;
}

}  // namespace tide::detail

TIDE_DESIGNATED_INIT_END
