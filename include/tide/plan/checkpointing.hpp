#pragma once
//! \file
//! Checkpointing of a chain: the adjoint of an n-layer chain (a time stepper, or a layer
//! stack whose layer i+1 reads the carry layer i wrote) needs carries n-1, ..., 0 in reverse
//! order. With s snapshots, `revolve_schedule` is an optimal reversal (binomial checkpointing,
//! Griewank & Walther's Revolve) and `revolve_extra_forwards` its cost in closed form. With
//! device and host snapshots and copies that overlap compute, `two_tier_plan` searches for the
//! schedule of least time in a stated model (a dynamic program, optimal on the small chains the
//! tests compare with an exhaustive search, not on every chain), and `evaluate_chain` checks and
//! times any action list in that model. Conventions, derivations, limits: docs/checkpointing.md.
//!
//! Tide's conventions. Carries 0..n: layer i reads carry i and writes carry i+1; the working
//! carry is the carry the next layer or backward reads. The first sweep runs all n layers; the
//! output of the last one (layer n-1) seeds the adjoint, so its input, carry n-1, is still the
//! working carry when the backward starts (`turn`). `backward(i)` needs carry i in the working
//! carry and does not re-run layer i. A snapshot count s counts the carries stored at once,
//! carry 0 included, not the working carry.
//!
//! This header is the API. The model's implementation is in `plan/detail/chain_model.hpp`, the
//! two-tier search's (the dynamic program, the segment family) in
//! `plan/detail/two_tier_search.hpp`; both are included at the end of this header.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/core/error.hpp>

#include <tide/core/reversal.hpp>

namespace tide {

// ---- the two-tier model --------------------------------------------------------------------

//! Costs of the two-tier model, in microseconds. Forward and backward costs are per layer
//! (`forward_us[i]`), or one value for every layer when the vector has one element.
struct chain_costs {
  std::vector<double> forward_us{1.0};   //!< layer i's forward (or every layer's, one element)
  std::vector<double> backward_us{2.0};  //!< layer i's backward (or every layer's, one element)
  double d2h_us = 1.0;  //!< one carry, device to host (its own stream)
  double h2d_us = 1.0;  //!< one carry, host to device (its own stream)
  //! Copies run on the compute stream and add to its time (the synchronous model of H-Revolve).
  bool synchronous_copies = false;
  double disk_write_us = 1.0;  //!< one carry, host snapshot to disk snapshot (the storage write lane)
  double disk_read_us = 1.0;   //!< one carry, disk snapshot to host snapshot (the storage read lane)

  //! Step `i`'s forward time.
  double forward(std::int64_t i) const { return forward_us.size() == 1 ? forward_us[0] : forward_us[static_cast<std::size_t>(i)]; }
  //! Step `i`'s backward time.
  double backward(std::int64_t i) const { return backward_us.size() == 1 ? backward_us[0] : backward_us[static_cast<std::size_t>(i)]; }
  //! True when every layer costs the same (one forward and one backward value).
  bool uniform() const { return forward_us.size() == 1 && backward_us.size() == 1; }

  //! Every layer at forward `f` and backward `b`, copies at `d2h` and `h2d`.
  static chain_costs constant(double f, double b, double d2h, double h2d, bool synchronous = false) {
    return chain_costs{{f}, {b}, d2h, h2d, synchronous};
  }

  //! Throws `cost_model_error` unless the costs fit an n-layer chain: one value or n per vector,
  //! every time finite and non-negative.
  void check(char const* who, std::int64_t n) const;
};

//! How many snapshots each tier holds (carry 0's included in `device`). A disk snapshot is
//! written from a host snapshot and read back into one, so disk snapshots need `host` >= 1.
struct chain_tiers {
  std::int64_t device = 1;  //!< device snapshots
  std::int64_t host = 0;    //!< host snapshots
  std::int64_t disk = 0;    //!< disk snapshots (regions of a storage file)
};

//! A device, host or disk snapshot as the evaluator tracks it.
struct chain_snapshot {
  std::int32_t carry = -1;  //!< the carry held, -1: empty
  double ready = 0;         //!< when the carry is there (a copy's arrival)
  double busy = 0;          //!< when the snapshot may be overwritten (the end of copies reading or writing it)
};
//! Deprecated (0.3): a snapshot is `chain_snapshot`, its `state` is `carry`.
using chain_slot [[deprecated("use tide::chain_snapshot (its field state is now carry)")]] = chain_snapshot;

//! The evaluator of the chain model: applies actions one at a time in list order, checks each
//! (a `schedule_error` names the action and what was wrong) and keeps the time of the compute,
//! d2h, h2d, storage-write and storage-read streams. Every copy starts at or after the compute
//! stream's time at its place in the list (it is issued there), after its stream's previous
//! copy, after its source's arrival and after its target's last reader; a `store` into a
//! snapshot waits for the snapshot's copies; a `restore` waits for the carry's arrival. Stores,
//! restores and frees take no time. Shared by `two_tier_plan`, `three_tier_plan` and by any
//! search that needs the model's time.
class chain_machine {
 public:
  //! An `n`-layer chain with carry 0 in the working carry and every snapshot empty (snapshot
  //! counts above n + 1 are capped). Throws `schedule_error` or `cost_model_error` on bad arguments.
  chain_machine(std::int64_t n, chain_tiers tiers, chain_costs costs);
  //! Device and host snapshots only (no disk tier).
  chain_machine(std::int64_t n, std::int64_t device_snapshots, std::int64_t host_snapshots, chain_costs costs)
      : chain_machine(n, chain_tiers{.device = device_snapshots, .host = host_snapshots}, std::move(costs)) {}

  //! Applies `a` and advances the streams' times; throws `schedule_error` naming `a` when it is
  //! invalid where the chain stands.
  void apply(chain_action const& a);

  //! Every backward has run.
  bool finished() const noexcept { return next_backward_ < 0; }
  //! The end of the last operation on any stream.
  double time() const noexcept { return std::max({now_, d2h_free_, h2d_free_, write_free_, read_free_}); }

  //! The chain's layer count n.
  [[nodiscard]] std::int32_t layers() const noexcept { return n_; }
  //! Deprecated (0.3).
  [[deprecated("use layers()")]] std::int32_t steps() const noexcept { return n_; }
  //! The compute stream's time.
  double now() const noexcept { return now_; }
  //! When the d2h stream is free for the next offload.
  double d2h_free() const noexcept { return d2h_free_; }
  //! When the h2d stream is free for the next prefetch.
  double h2d_free() const noexcept { return h2d_free_; }
  //! When the storage write stream is free for the next spill.
  double write_free() const noexcept { return write_free_; }
  //! When the storage read stream is free for the next load.
  double read_free() const noexcept { return read_free_; }
  //! The carry in the working carry (-1: consumed by a backward).
  std::int32_t work() const noexcept { return work_; }
  //! The layer whose backward runs next (-1 once finished).
  std::int32_t next_backward() const noexcept { return next_backward_; }
  //! True once the turn has run.
  bool turned() const noexcept { return turned_; }
  //! The device snapshots.
  std::span<chain_snapshot const> device() const noexcept { return device_; }
  //! The host snapshots.
  std::span<chain_snapshot const> host() const noexcept { return host_; }
  //! The disk snapshots.
  std::span<chain_snapshot const> disk() const noexcept { return disk_; }
  //! Forwards run so far: advances and the turn.
  std::int64_t forward_steps() const noexcept { return forward_steps_; }
  //! Copy time issued so far, on either copy stream.
  double copy_time() const noexcept { return copy_time_; }
  //! The most device snapshots occupied at once so far.
  std::int32_t peak_device() const noexcept { return peak_device_; }
  //! The most host snapshots occupied at once so far.
  std::int32_t peak_host() const noexcept { return peak_host_; }
  //! The most disk snapshots occupied at once so far.
  std::int32_t peak_disk() const noexcept { return peak_disk_; }
  //! Spills (carries written to disk) issued so far.
  std::int64_t disk_writes() const noexcept { return disk_writes_; }
  //! Loads issued so far.
  std::int64_t disk_reads() const noexcept { return disk_reads_; }
  //! Storage time issued so far, on either storage stream.
  double storage_time() const noexcept { return storage_time_; }
  //! The costs the machine times actions with.
  chain_costs const& costs() const noexcept { return *costs_; }

 private:
  [[noreturn]] void fail(chain_action const& a, char const* why) const;
  void need(bool ok, chain_action const& a, char const* why) const;
  chain_snapshot& dev(chain_action const& a);
  chain_snapshot& hst(chain_action const& a);
  chain_snapshot& dsk(chain_action const& a);
  //! A copy of `src` into the empty snapshot `dst` on a link direction free from `link_free`: it
  //! starts once the data is ready, the destination's last reader is done and the link is free
  //! (at once, on the compute timeline, when copies are synchronous); `us` is added to `issued`.
  void copy_slot(chain_snapshot& src, chain_snapshot& dst, double& link_free, double us, double& issued, std::int32_t& occupied);
  void count_stored();
  //! Layers `from` .. `to`-1's forward time: O(1), so that timing a schedule costs its action
  //! count, not its forward count (a one-snapshot reversal re-runs O(n^2) layers).
  [[nodiscard]] double forward_span(std::int32_t from, std::int32_t to) const noexcept;

  std::int32_t n_;
  std::shared_ptr<chain_costs const> costs_;  // shared: searches copy machines by the million
  //! Prefix sums of the forward costs (empty when every layer costs the same), shared as costs_ is.
  std::shared_ptr<std::vector<double> const> forward_prefix_;
  std::int32_t occupied_device_ = 0, occupied_host_ = 0, occupied_disk_ = 0;  // snapshots holding a carry now
  std::vector<chain_snapshot> device_, host_, disk_;
  double now_ = 0, d2h_free_ = 0, h2d_free_ = 0, write_free_ = 0, read_free_ = 0, copy_time_ = 0, storage_time_ = 0;
  std::int64_t disk_writes_ = 0, disk_reads_ = 0;
  std::int32_t work_ = 0;  // the chain starts with carry 0 in the working carry
  std::int32_t next_backward_ = 0;
  bool turned_ = false;
  std::int64_t forward_steps_ = 0;
  std::int32_t peak_device_ = 0, peak_host_ = 0, peak_disk_ = 0;
};

//! What `evaluate_chain` found.
struct chain_evaluation {
  double time_us = 0;               //!< the end of the last operation on any stream
  std::int64_t forward_steps = 0;   //!< advances and the turn
  std::int64_t extra_forwards = 0;  //!< forwards beyond the first sweep's n
  double copy_us = 0;               //!< copy time issued (on either copy stream)
  //! `peak_device`: the most device snapshots occupied at once.
  std::int32_t peak_device = 0, peak_host = 0;  //!< `peak_host`: the most host snapshots occupied at once
  std::int32_t peak_disk = 0;                   //!< the most disk snapshots occupied at once
  std::int64_t disk_writes = 0;                 //!< carries written to disk (spills)
  std::int64_t disk_reads = 0;                  //!< carries read back from disk (loads)
  double storage_us = 0;                        //!< storage time issued (on either storage stream)
};

//! Runs `actions` through the model; throws `schedule_error` if an action is invalid or the
//! list ends before layer 0's backward.
TIDE_INLINE chain_evaluation evaluate_chain(std::int64_t n, chain_tiers tiers, chain_costs const& costs, std::span<chain_action const> actions);
//! Device and host snapshots only.
inline chain_evaluation evaluate_chain(std::int64_t n, std::int64_t device_snapshots, std::int64_t host_snapshots, chain_costs const& costs,
                                       std::span<chain_action const> actions) {
  return evaluate_chain(n, chain_tiers{.device = device_snapshots, .host = host_snapshots}, costs, actions);
}

// ---- the two-tier planner -------------------------------------------------------------------

//! How `two_tier_plan` found its schedule.
enum class two_tier_method : std::uint8_t {
  dp,        //!< the dynamic program (Revolve's nested frames with tiers; see docs/checkpointing.md for where it is optimal)
  segments,  //!< host checkpoints at equal spacing, Revolve inside each segment (large chains)
  revolve,   //!< device-only Revolve: the host tier does not pay for its copies
};

//! Limits of `two_tier_plan`'s dynamic program; beyond them it uses the segment family.
struct two_tier_options {
  std::int64_t dp_max_layers = 64;     //!< longer chains skip the DP (its work grows as n^3 times its snapshot states)
  std::int64_t dp_max_snapshots = 8;   //!< device plus host snapshots it takes on (each capped at n; at most 16 device)
  std::size_t dp_max_states = 50000;  //!< memo entries; a DP that needs more is abandoned for the segment family
  int max_obligations = 2;             //!< prefetches for ancestors pending in one DP frame (1 to 4)
};

//! A two-tier schedule, its predicted time (`evaluate_chain` of its actions) and how it was found.
struct two_tier_result {
  std::vector<chain_action> actions{};           //!< the schedule, e.g. as a `checkpoint_spec::reversal`
  double predicted_us = 0;                       //!< the model's time of `actions` (`evaluate_chain`)
  double dp_estimate_us = -1;                    //!< the DP's own value (method dp; equal to `predicted_us` in every test)
  std::int64_t extra_forwards = 0;               //!< forwards beyond the first sweep's n
  two_tier_method method = two_tier_method::dp;  //!< which search produced `actions`
};

//! A schedule of least predicted time for an n-layer chain with `device_snapshots` device
//! snapshots (carry 0's included) and `host_snapshots` host snapshots, in the model of
//! `chain_machine`. Within `options`, a dynamic program over Revolve's nested frames with tiers:
//! optimal in the model on every chain the tests compare with an exhaustive search (all of
//! n <= 8 with up to 3 + 3 slots), but not in general: when a prefetch takes longer than a
//! backward step, interleaving a re-sweep with the running backward can be faster (a few
//! percent; docs/checkpointing.md). Beyond `options`, the better of device-only Revolve and the
//! segment family. `predicted_us` is `evaluate_chain` of the actions.
TIDE_INLINE two_tier_result two_tier_plan(std::int64_t n, std::int64_t device_snapshots, std::int64_t host_snapshots, chain_costs const& costs,
                                          two_tier_options const& options = {});

// ---- the three-tier planner -----------------------------------------------------------------

//! How `three_tier_plan` found its schedule.
enum class three_tier_method : std::uint8_t {
  two_tier,       //!< `two_tier_plan` on the device and host snapshots: the disk does not pay
  disk_segments,  //!< segment starts on disk, each segment reversed by `two_tier_plan`
};

//! Longest chain `three_tier_plan` takes: 2^20 (1,048,576) layers, where the tier sets measured
//! plan in under 10 s of CPU on a 2-core VM (docs/performance.md). Longer chains: a coarser chain
//! (several layers a step), or `two_tier_plan` / `revolve_schedule`, which take up to
//! `max_chain_steps`.
inline constexpr std::int64_t max_three_tier_layers = std::int64_t{1} << 20;

//! Limits of `three_tier_plan`.
struct three_tier_options {
  two_tier_options inner{};          //!< the two-tier search of the whole chain and of each segment
  std::int64_t dp_max_layers = 64;   //!< uniform chains up to this long get their segment lengths from a DP
  std::int64_t every_split_max_layers = 16;  //!< chains up to this long also try one disk start at every carry
  //! Disk-start counts tried: every k up to this, then doublings up to the disk snapshot count
  //! (each candidate is a whole schedule; at least 1).
  std::int64_t every_count_max_disk = 16;
  //! DP states all the two-tier searches of one call create together (each segment of each
  //! candidate runs one); once spent, segments get the segment family instead of the DP.
  std::size_t max_dp_states = 100000;
  //! Candidates are built in the order of a lower bound on their time (every step's work and the
  //! least extra forwards of their segments) and those whose bound is above the best time found
  //! are skipped: the same plan as building
  //! every candidate (ties go to the earlier candidate, as there), in far fewer builds. false:
  //! every candidate, in order (the reference the tests compare with).
  bool skip_by_bound = true;
};

//! A three-tier schedule, its predicted time (`evaluate_chain` of its actions) and its counts.
struct three_tier_result {
  std::vector<chain_action> actions{};  //!< the schedule
  double predicted_us = 0;              //!< the model's time of `actions`
  std::int64_t extra_forwards = 0;      //!< forwards beyond the first sweep's n
  std::int64_t disk_writes = 0;         //!< carries written to disk
  std::int64_t disk_reads = 0;          //!< carries read back from disk
  std::int32_t segments = 1;            //!< segments reversed one after another (1: no disk)
  bool staging_reserved = false;        //!< a host snapshot kept for disk reads, each issued a segment ahead
  three_tier_method method = three_tier_method::two_tier;  //!< which family `actions` come from
};

//! A lower bound on the time of any schedule of an n-layer chain in the three-tier model: every
//! layer's forward and backward once, and the least extra forwards of any reversal that holds at
//! most `device + host + disk` carries at once (`revolve_extra_forwards`), each at the cheapest
//! forward. Copies are taken as hidden. Loose where the tiers are many but slow, or where the disk
//! holds carries a reversal must read more than once; `three_tier_plan`'s gap to it is in
//! docs/performance.md.
[[nodiscard]] TIDE_INLINE double three_tier_lower_bound(std::int64_t n, chain_tiers tiers, chain_costs const& costs);

//! A schedule for an n-layer chain with device, host and disk snapshots, in the model of
//! `chain_machine` (disk snapshots staged through a host snapshot, on their own read and write
//! streams). The better of `two_tier_plan` without the disk and the disk-segment family: the
//! first sweep writes k segment starts to disk, the backward reverses the segments last to
//! first with `two_tier_plan`'s search (told how long the disk writes keep host snapshots
//! busy), reading each start back ahead of its segment. Optimal on every small chain of the
//! tests' proven set (n <= 7, tiers up to one extra snapshot in one tier); not in general:
//! docs/checkpointing.md, "Three tiers", gives its gap to an exhaustive search elsewhere.
TIDE_INLINE three_tier_result three_tier_plan(std::int64_t n, chain_tiers tiers, chain_costs const& costs,
                                              three_tier_options const& options = {});

}  // namespace tide

// The definitions, after every declaration above: each of these headers includes this one first,
// so that it compiles on its own too. In separate compilation they are the library's.
#if TIDE_DEFINITIONS
#include <tide/plan/detail/chain_model.hpp>
#include <tide/plan/detail/two_tier_search.hpp>
#include <tide/plan/detail/three_tier_search.hpp>
#endif
