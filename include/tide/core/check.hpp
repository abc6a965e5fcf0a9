#pragma once
//! \file
//! The checker: proves any op program (built, edited, hand-written or hostile) against the
//! properties tide promises, in O(n log n) for n ops and byte accesses.
//!
//! - bindings: every layer's slot range lies inside the slot table and belongs to that layer
//!   alone; every slot has bytes, a placement, offsets whose ends fit in `size_t`, and the slots
//!   of one layer do not overlap;
//! - structure: every op names a layer, stream and (copies) slot in range; a copy's byte range
//!   lies inside its slot and its arena ranges do not wrap; waits name earlier ops that record
//!   an event; events are in range and recorded once;
//! - completeness: exactly one forward and one backward per layer, forwards in layer order and
//!   backwards in reverse; a recompute exactly for the layers with a remat slot, after the
//!   forward and before the backward; every offloaded slot offloaded and prefetched, each chunk
//!   exactly once; gathers, regathers and reduces exactly where `collective_spec` asks, gathers
//!   before their forward, regathers before their recompute and backward, reduces after their
//!   backward;
//! - copy geometry: copies are exactly where the bindings say. Chunk c of slot b covers bytes
//!   [c * chunk_bytes, c * chunk_bytes + n) of the slot, n = min(chunk_bytes, b.bytes - c *
//!   chunk_bytes) (all of it when the slot goes in one chunk), between device b.forward_offset
//!   (an offload's source) or b.backward_offset (a prefetch's target) and host b.host_offset,
//!   each plus c * chunk_bytes: the chunks tile the slot. The executor's debug checks poison each
//!   offload chunk's source once copied, which only a tiling makes harmless;
//! - guards: with `buffers.guard_bytes` > 0 the executor's debug checks write guard bytes after
//!   every slot before a forward (at forward_offset + bytes) and after every remat slot before a
//!   recompute (at backward_offset + bytes), and check them after the op. Within one layer, the
//!   regions [offset, offset + bytes + guard) a forward writes do not overlap, nor do those a
//!   recompute or backward touches at backward offsets (the guard for remat slots only); and the
//!   guard writes are byte accesses of their op (writes with an identity of their own, never read
//!   as slot data) in the race and data-flow sweep;
//! - peaks: replaying the ops' byte ranges reproduces the predicted device and host peaks;
//! - no race: two ops that touch overlapping bytes (one of them writing) are ordered by stream
//!   order or an event chain, so no region is reused while an op that reads or writes it may run;
//! - data flow: every read (a backward, a recompute, a copy) sees the bytes written for that very
//!   (layer, slot), ordered before it, and not overwritten in between: prefetches complete before
//!   their consumer, offloads complete before their source region is reused.
//!
//! Race and data flow are one sweep in issue order (happens-before implies issue order) over the
//! elementary byte intervals of each arena, kept in a segment tree. For a byte, ordering each
//! access after the last write, and each write after the reads since the last write, orders every
//! conflicting pair by transitivity; per stream only the latest such op matters (stream order),
//! which is what the tree's range maximum yields. Once accesses are race free, a read sees its
//! own data exactly when the last write before it to each of its bytes wrote that data.
//!
//! The passes are in core/detail/: `check_bindings.hpp`, `check_structure.hpp` (structure, clocks,
//! completeness, byte accesses) with `check_carry.hpp`, `check_layout.hpp` (copy geometry and
//! guards), `check_peaks.hpp` and `check_races.hpp` (race and data flow, on `byte_state_tree.hpp`),
//! sharing `check_common.hpp`; the report is `check_report` (core/check_report.hpp).

#include <tide/core/check_report.hpp>
#include <tide/core/config.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#if TIDE_DEFINITIONS
#include <tide/core/detail/check_bindings.hpp>
#include <tide/core/detail/check_common.hpp>
#include <tide/core/detail/check_layout.hpp>
#include <tide/core/detail/check_peaks.hpp>
#include <tide/core/detail/check_races.hpp>
#include <tide/core/detail/check_structure.hpp>
#endif

namespace tide {

//! Verifies `s`; throws `schedule_error` naming the invariant that fails and the layer, slot or
//! ops involved. Takes any program, including malformed or hostile ones: nothing is indexed or
//! summed before it is proven in range.
TIDE_INLINE check_report check_schedule(schedule_view const& s);

#if TIDE_DEFINITIONS
TIDE_INLINE check_report check_schedule(schedule_view const& s) {
  auto const p = detail::check_program(s);
  detail::check_layout(s);
  check_report report;
  detail::replay_peaks(s, p, report);
  detail::check_races_and_data_flow(s, p, report);
  return report;
}
#endif

}  // namespace tide
