#pragma once
//! \file
//! The two-tier chain model's implementation (plan/checkpointing.hpp declares it): the costs'
//! check, `chain_machine`'s actions and timing, and `evaluate_chain`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>
#include <tide/core/reversal.hpp>
#include <tide/plan/checkpointing.hpp>

namespace tide {

#if TIDE_DEFINITIONS
TIDE_INLINE void chain_costs::check(char const* who, std::int64_t n) const {
  auto fits = [n](std::vector<double> const& v) { return v.size() == 1 || std::ssize(v) == n; };
  if (!fits(forward_us) || !fits(backward_us))
    throw cost_model_error(std::string(who) + ": costs need 1 or n = " + std::to_string(n) + " forward and backward values, got " +
                         std::to_string(forward_us.size()) + " and " + std::to_string(backward_us.size()));
  // The first bad value, by field (and layer): "costs must be finite" named none. At most 1e12 us
  // (a cost table's `max_time_us`), so that no chain of up to 2^23 steps sums past 2^53 us with
  // room left: 1e300 was taken and the chain's time was infinite. The name is built only for the
  // value refused (a million per-layer costs were a million strings).
  auto check = [who](double x, auto const& field) {
    if (!(x >= 0 && x <= 1e12)) {
      char v[32];
      std::snprintf(v, sizeof v, "%.17g", x);
      throw cost_model_error(std::string(who) + ": chain_costs::" + field() + " is " + v + ": give a time from 0 to 1e12 microseconds");
    }
  };
  for (auto const& entry : {std::pair{&forward_us, "forward_us"}, {&backward_us, "backward_us"}}) {
    auto const& [values, field] = entry;  // not captured below: clang before 16 takes no bindings in lambdas
    for (std::size_t l = 0; l < values->size(); ++l)
      check((*values)[l], [&entry, l] {
        return std::string(entry.second) + (entry.first->size() > 1 ? "[" + std::to_string(l) + "]" : "");
      });
  }
  for (auto const& [x, field] : {std::pair{d2h_us, "d2h_us"}, {h2d_us, "h2d_us"}, {disk_write_us, "disk_write_us"}, {disk_read_us, "disk_read_us"}})
    check(x, [f = field] { return std::string(f); });
}
#endif  // TIDE_DEFINITIONS

namespace detail::ckpt {

//! Throws `schedule_error` naming `who` unless `tiers` fit an n-step chain: the chain's
//! arguments, no negative count, and a host snapshot for disk snapshots to pass through.
inline void check_tiers(char const* who, std::int64_t n, chain_tiers const& tiers) {
  check_chain_args(who, n, tiers.device);
  if (tiers.host < 0) throw schedule_error(std::string(who) + ": negative host slot count");
  if (tiers.disk < 0) throw schedule_error(std::string(who) + ": negative disk snapshot count");
  if (tiers.disk > 0 && tiers.host < 1)
    throw schedule_error(std::string(who) + ": " + std::to_string(tiers.disk) +
                         " disk snapshots need at least 1 host snapshot (a disk snapshot is written from and read into one)");
}

//! What machine `m` found over a whole schedule of its n-layer chain (`schedule_error` if the
//! schedule it ran ends before layer 0's backward).
inline chain_evaluation summarize(chain_machine const& m) {
  if (!m.finished())
    throw schedule_error("chain schedule: ends before backward step 0 (next backward: " + std::to_string(m.next_backward()) + ")");
  return {.time_us = m.time(),
          .forward_steps = m.forward_steps(),
          .extra_forwards = m.forward_steps() - m.layers(),
          .copy_us = m.copy_time(),
          .peak_device = m.peak_device(),
          .peak_host = m.peak_host(),
          .peak_disk = m.peak_disk(),
          .disk_writes = m.disk_writes(),
          .disk_reads = m.disk_reads(),
          .storage_us = m.storage_time()};
}

}  // namespace detail::ckpt

#if TIDE_DEFINITIONS
TIDE_INLINE chain_machine::chain_machine(std::int64_t n, chain_tiers tiers, chain_costs costs)
    : n_(static_cast<std::int32_t>(n)), costs_(std::make_shared<chain_costs const>(std::move(costs))) {
  detail::ckpt::check_tiers("chain_machine", n, tiers);
  costs_->check("chain_machine", n);
  device_.resize(static_cast<std::size_t>(std::min<std::int64_t>(tiers.device, n + 1)));
  host_.resize(static_cast<std::size_t>(std::min<std::int64_t>(tiers.host, n + 1)));
  disk_.resize(static_cast<std::size_t>(std::min<std::int64_t>(tiers.disk, n + 1)));
  next_backward_ = n_ - 1;
  if (costs_->forward_us.size() != 1) {
    std::vector<double> prefix(static_cast<std::size_t>(n_) + 1, 0.0);
    for (std::int32_t i = 0; i < n_; ++i) prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + costs_->forward(i);
    forward_prefix_ = std::make_shared<std::vector<double> const>(std::move(prefix));
  }
}

TIDE_INLINE double chain_machine::forward_span(std::int32_t from, std::int32_t to) const noexcept {
  if (!forward_prefix_) return costs_->forward_us[0] * static_cast<double>(to - from);
  return (*forward_prefix_)[static_cast<std::size_t>(to)] - (*forward_prefix_)[static_cast<std::size_t>(from)];
}

TIDE_INLINE void chain_machine::apply(chain_action const& a) {
  switch (a.op) {
    case chain_op::advance: {
      need(work_ == a.carry && a.carry >= 0, a, "the working carry does not hold the state it starts from");
      need(a.to > a.carry && a.to <= n_ - 1, a, "advances go forward and end at a state <= n-1");
      now_ += forward_span(a.carry, a.to);
      forward_steps_ += a.to - a.carry;
      work_ = a.to;
      break;
    }
    case chain_op::turn:
      need(!turned_ && a.carry == n_ - 1 && work_ == n_ - 1, a, "the turn runs step n-1 once, from state n-1");
      now_ += costs_->forward(n_ - 1);
      ++forward_steps_;
      turned_ = true;
      break;
    case chain_op::backward:
      need(turned_, a, "a backward before the turn");
      need(a.carry == next_backward_, a, "backward steps run n-1, ..., 0 in order");
      need(work_ == a.carry, a, "the working carry does not hold the step's input");
      now_ += costs_->backward(a.carry);
      work_ = -1;
      --next_backward_;
      break;
    case chain_op::store: {
      auto& d = dev(a);
      need(work_ >= 0 && work_ == a.carry, a, "the working carry does not hold that state");
      need(d.carry < 0, a, "the device slot is not empty");
      now_ = std::max(now_, d.busy);
      d = {a.carry, now_, now_};
      ++occupied_device_;
      count_stored();
      break;
    }
    case chain_op::restore: {
      auto& d = dev(a);
      need(d.carry >= 0, a, "restore of an empty device slot");
      now_ = std::max(now_, d.ready);
      work_ = d.carry;
      break;
    }
    case chain_op::free: {
      auto& d = dev(a);
      need(d.carry >= 0, a, "free of an empty device slot");
      d.carry = -1;
      --occupied_device_;
      d.busy = std::max(d.busy, d.ready);  // a copy still landing in it
      break;
    }
    case chain_op::offload:
    case chain_op::prefetch: {  // a copy between the action's device and host slots
      bool const out = a.op == chain_op::offload;
      auto& d = dev(a);
      auto& h = hst(a);
      need((out ? d : h).carry >= 0, a, out ? "offload of an empty device slot" : "prefetch of an empty host slot");
      need((out ? h : d).carry < 0, a, out ? "the host slot is not empty" : "the device slot is not empty");
      copy_slot(out ? d : h, out ? h : d, out ? d2h_free_ : h2d_free_, out ? costs_->d2h_us : costs_->h2d_us, copy_time_,
                out ? occupied_host_ : occupied_device_);
      break;
    }
    case chain_op::free_host: {
      auto& h = hst(a);
      need(h.carry >= 0, a, "free of an empty host slot");
      h.carry = -1;
      --occupied_host_;
      h.busy = std::max(h.busy, h.ready);
      break;
    }
    case chain_op::spill:
    case chain_op::load: {  // a copy between the action's host and disk snapshots
      bool const out = a.op == chain_op::spill;
      auto& h = hst(a);
      auto& k = dsk(a);
      need((out ? h : k).carry >= 0, a, out ? "spill of an empty host slot" : "load of an empty disk snapshot");
      need((out ? k : h).carry < 0, a, out ? "the disk snapshot is not empty" : "the host slot is not empty");
      double const us = out ? costs_->disk_write_us : costs_->disk_read_us;
      copy_slot(out ? h : k, out ? k : h, out ? write_free_ : read_free_, us, storage_time_, out ? occupied_disk_ : occupied_host_);
      ++(out ? disk_writes_ : disk_reads_);
      break;
    }
    case chain_op::free_disk: {
      auto& k = dsk(a);
      need(k.carry >= 0, a, "free of an empty disk snapshot");
      k.carry = -1;
      --occupied_disk_;
      k.busy = std::max(k.busy, k.ready);
      break;
    }
  }
}

[[noreturn]] inline void chain_machine::fail(chain_action const& a, char const* why) const {
  throw schedule_error("chain schedule: " + to_string(a) + ": " + why);
}
TIDE_INLINE void chain_machine::need(bool ok, chain_action const& a, char const* why) const {
  if (!ok) fail(a, why);
}
TIDE_INLINE chain_snapshot& chain_machine::dev(chain_action const& a) {
  if (a.snapshot < 0 || a.snapshot >= std::ssize(device_)) fail(a, "no such device slot");
  return device_[static_cast<std::size_t>(a.snapshot)];
}
TIDE_INLINE chain_snapshot& chain_machine::hst(chain_action const& a) {
  if (a.host_snapshot < 0 || a.host_snapshot >= std::ssize(host_)) fail(a, "no such host slot");
  return host_[static_cast<std::size_t>(a.host_snapshot)];
}
TIDE_INLINE chain_snapshot& chain_machine::dsk(chain_action const& a) {
  if (a.disk_snapshot < 0 || a.disk_snapshot >= std::ssize(disk_)) fail(a, "no such disk snapshot");
  return disk_[static_cast<std::size_t>(a.disk_snapshot)];
}
TIDE_INLINE void chain_machine::copy_slot(chain_snapshot& src, chain_snapshot& dst, double& link_free, double us, double& issued,
                                     std::int32_t& occupied) {
  double const start = std::max({now_, costs_->synchronous_copies ? now_ : link_free, src.ready, dst.busy});
  double const end = start + us;
  if (costs_->synchronous_copies) now_ = end;
  else link_free = end;
  src.busy = std::max(src.busy, end);
  dst = {src.carry, end, end};
  issued += us;
  ++occupied;
  count_stored();
}
TIDE_INLINE void chain_machine::count_stored() {
  // Counters, not a scan of the tiers: a scan per copy made a chain with 50,000 host snapshots quadratic.
  peak_device_ = std::max(peak_device_, occupied_device_);
  peak_host_ = std::max(peak_host_, occupied_host_);
  peak_disk_ = std::max(peak_disk_, occupied_disk_);
}

TIDE_INLINE chain_evaluation evaluate_chain(std::int64_t n, chain_tiers tiers, chain_costs const& costs, std::span<chain_action const> actions) {
  chain_machine m(n, tiers, costs);
  for (auto const& a : actions) m.apply(a);
  return detail::ckpt::summarize(m);
}

#endif  // TIDE_DEFINITIONS

}  // namespace tide
