#pragma once
//! \file
//! Checkpoints: where the carries of a stack live (see `carry_spec`). Storing a carry is a
//! checkpoint; a carry not stored is recomputed, in the backward pass, by re-running the layers
//! from the nearest stored carry before it (segment recomputation). The builder expands the
//! chosen reversal into the op program.

#include <cstdint>
#include <limits>
#include <vector>

#include <tide/core/reversal.hpp>
#include <tide/core/vocabulary.hpp>

namespace tide {

//! `checkpoint_spec::device_snapshots` that stores every carry: nothing is recomputed.
inline constexpr std::uint32_t every_carry = std::numeric_limits<std::uint32_t>::max();

//! How many carries are stored, and where: `{.device_snapshots = 4}` reverses the stack with the
//! optimal one-tier schedule (Revolve) and 4 device snapshots; with a host tier, give the
//! reversal (`tide::plan::two_tier_plan(...).actions`, whose time it minimizes in a stated model).
struct checkpoint_spec {
  //! Carries stored on the device at once, the input's included (not the working carry the
  //! current layer reads and writes); `every_carry` stores all of them.
  std::uint32_t device_snapshots = every_carry;
  //! Host snapshot slots the reversal may use (copies on the d2h and h2d streams).
  std::uint32_t host_snapshots = 0;
  //! An explicit reversal of the stack (chain actions over its layers); empty: Revolve with
  //! `device_snapshots`. Required when `host_snapshots > 0` or `disk_snapshots > 0`.
  std::vector<chain_action> reversal{};
  //! Disk snapshot slots the reversal may use: regions of the storage file, written from and
  //! read into a host snapshot on the storage stream (the backend needs a storage directory).
  std::uint32_t disk_snapshots = 0;

  //! True when every carry is stored: nothing to recompute, no reversal to follow.
  constexpr bool stores_every_carry() const noexcept {
    return device_snapshots == every_carry && host_snapshots == 0 && disk_snapshots == 0 && reversal.empty();
  }
  friend constexpr bool operator==(checkpoint_spec const&, checkpoint_spec const&) = default;
};

// ---------------------------------------------------------------------------------------------
// Checkpoint knobs (one tier: a host tier needs a reversal, made at run time by two_tier_plan)

//! `checkpoint_spec::device_snapshots`.
template <std::uint32_t N>
struct device_snapshots : detail::field_knob<checkpoint_spec, &checkpoint_spec::device_snapshots, N, "device_snapshots"> {
  static_assert(N >= 1, "tide::device_snapshots<N>: N must be at least 1 (the input's snapshot)");
};

//! The checkpoints as a part of `tide::strategy_of`: `tide::checkpoints<tide::device_snapshots<4>>`.
template <class... Knobs>
struct checkpoints {
  static_assert((detail::knob_for<Knobs, checkpoint_spec> && ...),
                "tide::checkpoints<...>: each argument must be a checkpoint knob: tide::device_snapshots<N>");
  static_assert(detail::distinct_knobs<Knobs...>(), "tide::checkpoints<...>: a knob is given twice: give each once");
  using tide_checkpoints_tag = void;  //!< Marks this type as the checkpoints part of `tide::strategy_of`.
  //! The `checkpoint_spec` the knobs spell.
  static constexpr checkpoint_spec spec() { return detail::apply_knobs<checkpoint_spec, Knobs...>(); }
};

}  // namespace tide
