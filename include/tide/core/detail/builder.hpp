#pragma once
//! \file
//! The builder's state: what each stage of `try_build_schedule_into` decides and the next reads.
//! The stages, in order, each in its own header:
//! 1. placement (`build_placement.hpp`): each slot kept, offloaded, rematerialized or spilled,
//!    and each layer's region sizes;
//! 2. reversal (`build_reversal.hpp`): the chain actions, and which layers they advance;
//! 3. arena layout (`build_arena.hpp`): kept slots, the offload and staging rings, remat and
//!    advance scratch, every transient slot's offsets, the spill ring and the storage file's
//!    regions, and where the carries live;
//! 4. the reversal walked action by action (`build_reversal.hpp`), emitting the op program;
//!    what it emits for each layer, with its waits, is in `build_program.hpp`;
//! 5. the carry's buffers, after everything else in both arenas (`build_reversal.hpp`).
//! A stage returns the first problem it finds, or an issue whose code is `none`.

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <tide/core/detail/program_writer.hpp>
#include <tide/core/error.hpp>
#include <tide/core/reversal.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/stack.hpp>
#include <tide/core/strategy.hpp>
#include <tide/core/validation.hpp>

namespace tide::detail {

struct builder {
  schedule& s;
  stack_spec const& stack;
  strategy const& how;
  std::uint32_t L = 0;        // layers
  bool hiding = false;        // copies on their own streams
  bool carries = false;       // the stack has a carry
  std::size_t dalign = 1;     // device alignment
  stream_role d2h = stream_role::compute, h2d = stream_role::compute, storage = stream_role::compute;

  // 1. Placement.
  std::size_t kept = 0;           // bytes of kept slots
  std::size_t remat_scratch = 0;  // the largest layer's remat bytes
  std::size_t host = 0;           // bytes of the pinned host arena's slot part
  std::size_t copies = 0;         // offload chunks (each has a prefetch)
  std::size_t n_ops = 0;          // ops at 6 per layer plus the copies
  bool any_offload = false;  // offloaded or spilled slots (both leave the device)
  bool any_spill = false;
  std::size_t transfers = 0;  // spilled slots (each has at most a store and a load)
  std::vector<std::uint32_t> offloaded{};   // layers with offloaded or spilled slots in forward order j (backward order: n_off - 1 - j)
  std::vector<std::uint32_t> ring_index{};  // per layer: its j among the offloaded layers
  std::uint32_t n_off = 0;
  std::vector<std::uint32_t> spilled{};     // layers with spilled slots, in forward order
  std::vector<std::uint32_t> spill_index{}; // per layer: its index among the spilled layers
  std::uint32_t n_sp = 0;
  std::vector<std::size_t> layer_region{};  // per layer: all of its slots' regions (an advance's scratch)

  // 3. Arena layout: ring buffer b of each ring at prefix offset [b], sized for its largest layer.
  std::vector<std::size_t> offload_buf{}, staging_buf{}, spill_buf{};

  // 2. Reversal.
  std::vector<chain_action> actions{};
  std::size_t extra_ops = 0;  // ops beyond n_ops: later advances and the carry's copies
  std::vector<std::uint8_t> advanced{};  // per layer: the reversal re-runs it after the turn (bytes: see place())
  std::size_t advance_scratch = 0;       // the largest advanced layer's slot regions

  // 4. Op program.
  program_writer w;
  // Per (slot binding, chunk 0): the offload op, so the matching prefetch chunk waits on it.
  std::vector<std::uint32_t> first_chunk_op{};
  std::vector<std::int64_t> last_offload_of_layer{}, forward_op{}, backward_op{}, last_prefetch_of_layer{}, gather_op{},
      regather_op{};
  std::int64_t last_offload = -1, last_forward = -1;
  // Per spilled layer: its last store (the next user of its spill buffer waits for it); per
  // stored slot binding: its load (its prefetches wait for it).
  std::vector<std::int64_t> last_store_of_layer{}, load_op{};
  std::vector<std::int64_t> issue_at{};  // per offloaded layer: the layer before whose backward its prefetch issues
  std::uint32_t next_prefetch = 0;       // prefetches issue in backward order: one cursor
  bool first_backward_area_use_h2d = true, first_backward_area_use_compute = true;

  // The carry's device buffers: 0 holds the input (the user writes it), 1 the output; the others
  // are handed out and taken back as the reversal stores, restores and frees carries. A buffer
  // is reused in place (no copies): its next writer waits for its last writer and readers.
  struct carry_buffer {
    std::int64_t writer = -1;
    std::array<std::int64_t, stream_count> readers{-1, -1, -1, -1, -1};
    std::uint32_t refs = 0;  // device snapshot slots holding it
  };
  static constexpr std::int32_t none = -1;
  std::vector<carry_buffer> cbuf{};
  std::vector<std::uint32_t> free_bufs{};
  std::int32_t working = none;  // buffer of the working carry
  std::int32_t working_state = 0;
  bool have_working = true;  // the working carry holds a state (a backward consumes it)
  struct device_snapshot {
    std::int32_t buffer = -1, state = -1;
  };
  struct host_snapshot {
    std::int32_t state = -1;
    std::int64_t writer = -1, reader = -1;  // reader: its last prefetch (the h2d stream orders the others)
    std::int64_t storer = -1;               // its last store to a disk snapshot (the storage stream orders the others)
  };
  struct disk_snapshot {
    std::int32_t state = -1;
    std::int64_t writer = -1, reader = -1;  // its store, its last load
  };
  std::vector<device_snapshot> dslots{};
  std::vector<host_snapshot> hslots{};
  std::vector<disk_snapshot> kslots{};
  std::uint32_t held = 0;          // device snapshots holding a carry now
  std::uint32_t forwarded = 0;     // layers the first sweep has run
  bool turned = false;
  std::int64_t next_backward = 0;  // the next layer whose backward runs

  constexpr builder(schedule& out, stack_spec const& st, strategy const& h)
      : s(out), stack(st), how(h), L(st.layer_count()), hiding(h.pipeline.latency_hiding), carries(st.has_carry()),
        dalign(h.buffers.device_alignment), w(out) {
    d2h = hiding ? stream_role::d2h : stream_role::compute;
    h2d = hiding ? stream_role::h2d : stream_role::compute;
    storage = hiding ? stream_role::storage : stream_role::compute;
  }

  // The stages.
  constexpr schedule_issue place();
  constexpr schedule_issue choose_reversal();
  constexpr schedule_issue lay_out_arena();
  constexpr schedule_issue write_program();
  constexpr schedule_issue place_carries();

  // Stage 3's walk: one action each.
  constexpr schedule_issue walk(std::size_t at, chain_action const& x);
  constexpr schedule_issue bad(std::size_t at, std::string_view why) const {
    return issue(schedule_issue_code::bad_reversal, {}, {}, at, 0, why);
  }

  // Stage 4's emitters.
  [[nodiscard]] constexpr std::uint32_t chunk_count(std::size_t bytes) const;
  [[nodiscard]] constexpr op chunk_op(op_kind kind, stream_role stream, slot_binding const& b, std::size_t device, std::uint32_t k,
                                      std::uint32_t l, std::uint32_t c, std::uint32_t n) const;
  template <class F>
  constexpr void for_each_offloaded_chunk(std::uint32_t l, F&& f) const;
  [[nodiscard]] constexpr std::size_t carry_at(std::int32_t b) const {
    return s.carry.device_area + s.carry.region_bytes * static_cast<std::size_t>(b);
  }
  constexpr std::int32_t take_buffer();
  constexpr void release_if_unused(std::int32_t b);
  constexpr void wait_to_read(std::int32_t b);
  constexpr void wait_to_write(std::int32_t b);
  constexpr void note(std::uint32_t idx, std::int32_t read, std::int32_t wrote);
  constexpr std::uint32_t emit_layer_op(op o, std::int32_t in, std::int32_t out);
  [[nodiscard]] constexpr stream_role collective_stream() const;
  constexpr void emit_gather(std::uint32_t l);
  constexpr void emit_forward(std::uint32_t l, std::int32_t in, std::int32_t out);
  [[nodiscard]] constexpr op transfer_op(op_kind kind, slot_binding const& b, std::uint32_t k, std::uint32_t l) const;
  constexpr void emit_stores_of(std::uint32_t l);
  constexpr void emit_loads_of(std::uint32_t l);
  constexpr void emit_prefetches_of(std::uint32_t l);
  constexpr void emit_prefetches_at(std::uint32_t t);
  constexpr void emit_regather(std::uint32_t l, std::int64_t after);
  constexpr void emit_backward(std::uint32_t l, std::int32_t in);
};

}  // namespace tide::detail

