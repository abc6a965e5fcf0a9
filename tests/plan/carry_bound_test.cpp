// The lower bound of a stack with a carry uses its budgets (issue 42, item 4): on small random
// stacks with a carry it is never above the fastest schedule that fits, over every placement,
// candidate pipeline and checkpoint choice the planner tries (one-tier Revolve counts and two-tier
// reversals), and where the budgets bind it is above the keep-all step it used to be.
#include <gtest/gtest.h>

#include <tide/tide.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <limits>
#include <random>
#include <vector>

using namespace tide;

namespace {
// Under a sanitizer (TIDE_SANITIZE, from tests/meson.build) fewer random cases: the same code paths
// at a size the -O0 ASan build runs within the test's timeout; the statistics are the main build's.
bool sanitized() {
  char const* e = std::getenv("TIDE_SANITIZE");
  return e && *e && std::string_view(e) != "none";
}
}  // namespace

TEST(CarryBound, NeverAboveAFeasibleScheduleAndTighterWhereTheBudgetsBind) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  int checked = 0, tighter = 0;
  int const cases = sanitized() ? 4 : 32;
  for (int it = 0; it < cases; ++it) {
    stack_spec st;
    st.carry = {.name = "h", .bytes = static_cast<std::size_t>(1024 * (1 + rng() % 8))};
    auto const L = static_cast<std::uint32_t>(3 + rng() % 2);
    static constexpr std::string_view names[] = {"s0", "s1"};
    layer_spec t{"blk", {}};
    for (std::uint32_t k = 0; k < (L == 4 ? 1u : 2u); ++k)  // at most 6 decisions: the search below is exhaustive
      t.slots.push_back({names[k], static_cast<std::size_t>(1024 * (1 + rng() % 16))});
    st.append(t, L);
    cost_table c;
    for (std::uint32_t l = 0; l < L; ++l) {
      layer_cost x{.forward_us = 50 + 100 * u(rng), .backward_us = 100 + 200 * u(rng)};
      for (std::size_t k = 0; k < t.slots.size(); ++k) x.slot_recompute_us.push_back(5 + 60 * u(rng));
      c.layers.push_back(x);
    }
    c.link = host_link::symmetric(1024 * (50 + 400 * u(rng)) * 1e3, 5 * u(rng), u(rng) < 0.7);
    // A device budget between all-remat with one snapshot and keep-all; a host cap half the time.
    auto const lo = build_schedule(st, {.policy = {rule_spec{.where = placement::remat}}, .checkpoints = {.device_snapshots = 1}})
                        .peak_device_bytes();
    auto const hi = build_schedule(st, strategy{}).peak_device_bytes();
    auto const device = lo + static_cast<std::size_t>(static_cast<double>(hi - lo) * u(rng));
    auto const host = u(rng) < 0.5 ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(static_cast<double>(hi) * u(rng) / 2);
    std::vector<checkpoint_spec> checkpoints;
    auto const chain = carry_chain_costs(st, c);
    for (auto s : snapshot_candidates(L)) {
      checkpoints.push_back({.device_snapshots = s});
      if (s != every_carry) checkpoints.push_back({.device_snapshots = s, .host_snapshots = 1, .reversal = two_tier_plan(L, s, 1, chain).actions});
    }
    auto const candidates = default_candidates(st);
    std::size_t const n = std::size_t{L} * t.slots.size();
    std::size_t total = 1;
    for (std::size_t i = 0; i < n; ++i) total *= 3;
    std::vector<placement> d(n);
    double best = std::numeric_limits<double>::infinity();
    schedule s;
    for (std::size_t code = 0; code < total; ++code) {
      auto cc = code;
      for (std::size_t i = 0; i < n; ++i, cc /= 3) d[i] = static_cast<placement>(cc % 3);
      auto const pol = policy_from_decisions(st, d);
      for (auto const& ck : checkpoints)
        for (auto how : candidates) {
          how.policy = pol;
          how.checkpoints = ck;
          if (try_build_schedule_into(s, st, how)) continue;
          if (s.peak_device_bytes() > device || s.peak_host_bytes() > host) continue;
          best = std::min(best, simulate_step_us(s, c));
        }
    }
    if (!(best < std::numeric_limits<double>::infinity())) continue;
    auto const b = step_lower_bound(st, c, {.device_budget = device, .host_budget = host, .strategies = candidates});
    SCOPED_TRACE("case " + std::to_string(it));
    EXPECT_LE(b.step_us, best * (1 + 1e-9));
    EXPECT_GE(b.step_us, b.keep_all_us);
    ++checked;
    tighter += b.step_us > b.keep_all_us * (1 + 1e-9);
    // The plan, with its checkpoints chosen, is never faster than the bound either.
    auto const p = make_plan(st, c, {.device_budget = device, .host_budget = host});
    if (p.fits) {
      EXPECT_LE(p.lower_bound_us, p.step_us * (1 + 1e-9));
    }
  }
  if (!sanitized()) {
    EXPECT_GE(checked, 16);
    EXPECT_GT(tighter, 0);
  }  // the budgets bind somewhere: the bound is more than the keep-all step
}
