#pragma once
//! \file
//! The schedule: an op program with a static buffer assignment and predicted peaks, as built
//! from a stack and a strategy (build.hpp, constexpr) or frozen into a literal type
//! (static_schedule.hpp). Executors and checkers take a `schedule_view` of either.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <tide/core/buffers.hpp>
#include <tide/core/name.hpp>
#include <tide/core/op.hpp>
#include <tide/core/pipeline.hpp>
#include <tide/core/stage_order.hpp>
#include <tide/core/vocabulary.hpp>

namespace tide {

//! Where one slot of one layer lives.
struct slot_binding {
  tide::name name{};                  //!< the slot's name in its layer type
  placement where = placement::keep;  //!< keep, offload, remat or spill, as the policy decided
  std::size_t bytes = 0;              //!< the slot's size (unaligned)
  std::size_t forward_offset = 0;     //!< device offset the forward lambda writes
  std::size_t backward_offset = 0;    //!< device offset recompute/backward read
  std::size_t host_offset = 0;        //!< pinned host offset (offload; spill: in the spill ring)
  //! Device offset an advance (a segment recomputation) gives the forward lambda for the slot:
  //! scratch in the backward area that nothing reads; set in the layers the reversal advances.
  std::size_t advance_offset = 0;
  //! Spill: the slot's region in the storage file, or `not_stored` when its layer is among the
  //! spill ring's last uses (its bytes stay in the ring from forward to backward).
  std::size_t file_offset = not_stored;
  static constexpr std::size_t not_stored = static_cast<std::size_t>(-1);  //!< see `file_offset`
  //! Device offset a recompute lends the forward lambda for the slot when it does not rebuild it
  //! (kept, offloaded or spilled, in a layer with a recompute): scratch after the layer's remat
  //! slots that nothing reads, so a layer's unchanged forward can run as its recompute without
  //! touching the saved bytes; `no_scratch` elsewhere, and in a schedule written without it (the
  //! context then refuses the access by name).
  std::size_t recompute_offset = no_scratch;
  static constexpr std::size_t no_scratch = static_cast<std::size_t>(-1);  //!< see `recompute_offset`
  //! The slot is its layer's input (`slot_spec::input`): never rematerialized. Kept so that what
  //! a schedule's view says about its stack is whole (the out-of-memory hint builds alternatives).
  bool input = false;
  //! True when the slot's bytes go to the storage file (a spilled slot outside the ring's last uses).
  [[nodiscard]] constexpr bool stored() const noexcept { return where == placement::spill && file_offset != not_stored; }
  //! Field-wise equality.
  friend constexpr bool operator==(slot_binding const&, slot_binding const&) = default;
};

//! One layer of the schedule: its type and the range of its slots in the slot bindings.
struct layer_binding {
  tide::name type_name{};           //!< name of the layer's type (`layer_spec::name`)
  std::uint32_t first_slot = 0;     //!< index into the schedule's slot bindings
  std::uint32_t slot_count = 0;     //!< number of slot bindings the layer has, from `first_slot`
  std::size_t offloaded_bytes = 0;  //!< device region bytes of its offloaded and spilled slots
  std::size_t remat_bytes = 0;      //!< region bytes of its remat slots
  std::uint32_t type_index = 0;     //!< the layer's type: an index into `stack_spec::types`
  //! Host bytes of its spilled slots in a spill ring buffer (each region aligned to the storage
  //! alignment, so that direct I/O can move it)
  std::size_t spilled_bytes = 0;
  //! Field-wise equality.
  friend constexpr bool operator==(layer_binding const&, layer_binding const&) = default;
};

//! Where the carries live (a stack without a carry: `bytes == 0`, nothing else set). Device
//! buffers are `region_bytes` apart from `device_area`; buffer 0 holds the input (carry 0, which
//! the user writes before a step) and buffer 1 the output (the last layer's carry out); the
//! others hold snapshots and working carries as the reversal assigns them, reused without copies.
struct carry_binding {
  tide::name name{};                   //!< the carry's name (`carry_spec::name`)
  std::size_t bytes = 0;               //!< bytes of one carry; 0: the stack has none
  std::size_t region_bytes = 0;        //!< bytes, aligned to the device alignment
  std::size_t device_area = 0;         //!< device offset of buffer 0
  std::uint32_t device_buffers = 0;    //!< buffers the reversal uses at once (input and output included)
  std::size_t host_area = 0;           //!< host offset of host snapshot 0
  std::size_t host_region_bytes = 0;   //!< bytes, aligned to the host alignment
  std::uint32_t host_snapshots = 0;    //!< host snapshot slots the reversal uses
  std::uint32_t device_snapshots = 0;  //!< device snapshot slots the reversal uses (the input's included)
  std::uint64_t advances = 0;          //!< layer forwards beyond the first sweep (advance ops)
  //! Storage file offset of disk snapshot 0 (after the stored slots' regions)
  std::size_t file_area = 0;
  //! Bytes of a disk snapshot's file region, aligned to the storage alignment; 0 when the
  //! checkpoints allow no disk snapshot. When not 0, host snapshots are aligned and padded to the
  //! storage alignment too (direct I/O moves them whole).
  std::size_t file_region_bytes = 0;
  std::uint32_t disk_snapshots = 0;    //!< disk snapshot slots the reversal uses

  //! True when the stack has a carry.
  [[nodiscard]] constexpr bool present() const noexcept { return bytes != 0; }
  //! Device offset of buffer 0, where the user writes the stack's input before a step.
  [[nodiscard]] constexpr std::size_t input_offset() const noexcept { return device_area; }
  //! Device offset of buffer 1, where the last layer writes the stack's output.
  [[nodiscard]] constexpr std::size_t output_offset() const noexcept { return device_area + region_bytes; }
  //! Field-wise equality.
  friend constexpr bool operator==(carry_binding const&, carry_binding const&) = default;
};

//! The static buffer assignment.
struct arena_layout {
  std::size_t device_bytes = 0;      //!< the whole device arena: the predicted device peak
  std::size_t host_bytes = 0;        //!< the whole pinned host arena: the predicted host peak
  std::size_t kept_bytes = 0;        //!< kept slots, at offset 0
  std::size_t forward_area = 0;      //!< offset of offload sources then forward remat scratch
  std::size_t backward_area = 0;     //!< offset of the staging ring then recompute scratch
  std::size_t offload_ring_bytes = 0; //!< all offload source buffers (each sized for its layers)
  std::size_t staging_ring_bytes = 0; //!< all staging buffers (each sized for its layers)
  std::uint32_t offload_buffers = 0;  //!< offload source buffers in the ring
  std::uint32_t staging_buffers = 0;  //!< staging buffers in the ring
  std::size_t remat_scratch_bytes = 0; //!< remat scratch, sized for the layer with the most remat bytes
  //! An advance's slots, sized for the largest layer advanced; it shares the backward area's
  //! remat scratch (which is the larger of the two)
  std::size_t advance_scratch_bytes = 0;
  //! What a recompute is lent beside the remat slots it rebuilds: its layer's other slots
  //! (`slot_binding::recompute_offset`, after the remat slots) and, in a stack with a carry, its
  //! carry out; sized for the largest layer that recomputes, in the backward area's scratch
  //! (shared with remat and advance scratch: one of them runs at a time, on the compute stream)
  std::size_t recompute_scratch_bytes = 0;
  //! Device offset of the carry out a recompute is lent (a stack with a carry and a recompute),
  //! else `no_carry`
  std::size_t recompute_carry_offset = no_carry;
  std::size_t carry_bytes = 0;        //!< device carry buffers, at `carry.device_area`
  std::size_t host_carry_bytes = 0;   //!< host carry snapshots, at `carry.host_area`
  std::size_t spill_area = 0;         //!< host offset of the spill ring (aligned to the storage alignment)
  std::size_t spill_ring_bytes = 0;   //!< all spill ring buffers (each sized for its layers)
  std::uint32_t spill_buffers = 0;    //!< host buffers in the spill ring
  //! The storage file: every stored slot's region and every disk snapshot's, each aligned: the
  //! predicted storage peak
  std::size_t storage_bytes = 0;
  //! Field-wise equality.
  friend constexpr bool operator==(arena_layout const&, arena_layout const&) = default;
};

//! What makes a schedule a pipeline stage's step (core/stage_schedule.hpp): its layers are the
//! stage's `layers` for each micro-batch in turn (schedule layer `v` is layer `v % layers` of
//! micro-batch `v / layers`), run in the order of `spec`, with boundary sends and receives.
//! Interleaved, the stage's layers are its chunks' in turn (`chunk_first`), and what the tables
//! hold per micro-batch they hold per (chunk, micro-batch) unit (`stage_unit`). Each unit in
//! flight holds an instance region (its kept slots, carries and boundary gradient; pinned host
//! and storage regions too); the copy rings and scratch are shared. `layers == 0`: not a stage
//! schedule.
struct stage_binding {
  stage_spec spec{};                //!< the stage, its pipeline's stages and micro-batches, and the order
  std::uint32_t layers = 0;         //!< the stage's layers (per micro-batch); 0: not a stage schedule
  std::uint32_t instances = 0;      //!< instance regions: the most units in flight at once
  //! Per unit: the device offset of the carry scratch its recomputes are lent, or `no_carry`
  //! (`arena_layout::recompute_carry_offset` of its policy's layout)
  std::span<std::size_t const> recompute_carry{};
  //! Per unit: its instance region
  std::span<std::uint32_t const> instance_of{};
  //! Per unit: the device offset of its boundary gradient (the carry's size)
  std::span<std::size_t const> gradient{};
  //! Interleaved: the first of the stage's layers of each chunk, then `layers` (virtual stages + 1
  //! entries); empty: one chunk of every layer
  std::span<std::uint32_t const> chunk_first{};
  //! True for a stage schedule.
  [[nodiscard]] constexpr bool present() const noexcept { return layers != 0; }
  //! Which micro-batch schedule layer `v` belongs to (0 outside a stage schedule).
  [[nodiscard]] constexpr std::uint32_t micro_batch_of(std::uint32_t v) const noexcept { return layers ? v / layers : 0; }
  //! Which of the stage's layers schedule layer `v` is (`v` outside a stage schedule).
  [[nodiscard]] constexpr std::uint32_t layer_of(std::uint32_t v) const noexcept { return layers ? v % layers : v; }
  //! Which of the stage's chunks schedule layer `v` is in (0 but interleaved).
  [[nodiscard]] constexpr std::uint32_t chunk_of(std::uint32_t v) const noexcept {
    std::uint32_t c = 0;
    if (chunk_first.size() > 2)
      for (auto const l = layer_of(v); c + 2 < chunk_first.size() && chunk_first[c + 1] <= l;) ++c;
    return c;
  }
  //! The first of the stage's layers in chunk `c`.
  [[nodiscard]] constexpr std::uint32_t chunk_begin(std::uint32_t c) const noexcept { return chunk_first.empty() ? 0 : chunk_first[c]; }
  //! One past the last of the stage's layers in chunk `c`.
  [[nodiscard]] constexpr std::uint32_t chunk_end(std::uint32_t c) const noexcept { return chunk_first.empty() ? layers : chunk_first[c + 1]; }
  //! The (chunk, micro-batch) unit schedule layer `v` belongs to: its index in the per-unit tables.
  [[nodiscard]] constexpr std::uint32_t unit_of(std::uint32_t v) const noexcept {
    return stage_unit(spec, chunk_of(v), micro_batch_of(v));
  }
  //! True when schedule layer `v` is the model's last layer: the last stage's, of its last chunk.
  [[nodiscard]] constexpr bool ends_model(std::uint32_t v) const noexcept {
    return present() && spec.stage + 1 == spec.stages && layer_of(v) + 1 == layers;
  }
  //! Device offset of unit `u`'s boundary gradient (the carry's size).
  [[nodiscard]] constexpr std::size_t gradient_at(std::uint32_t u) const noexcept { return gradient[u]; }
};

//! A non-owning view of any schedule (run-time or static); what executors and checkers take.
struct schedule_view {
  std::span<layer_binding const> layers{};  //!< one per layer, in forward order
  std::span<slot_binding const> slots{};    //!< every layer's slots, each layer's contiguous
  std::span<op const> ops{};                //!< the op program, in host issue order
  std::span<std::uint32_t const> waits{};   //!< indices of the ops each op waits for (`op::wait_begin`)
  std::uint32_t event_count = 0;            //!< events the program records (`op::event` < this)
  arena_layout arena{};                     //!< the static buffer assignment and peaks
  buffer_spec buffers{};                    //!< the buffers the schedule was built with
  pipeline_spec pipeline{};                 //!< the pipeline the schedule was built with
  collective_spec collectives{};            //!< the collective hooks it makes room for
  carry_binding carry{};                    //!< where the carries live
  stage_binding stage{};                    //!< a pipeline stage's step: micro-batches and boundaries

  //! Number of layers.
  [[nodiscard]] constexpr std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(layers.size()); }
  //! Predicted device peak: the whole device arena.
  [[nodiscard]] constexpr std::size_t peak_device_bytes() const noexcept { return arena.device_bytes; }
  //! Predicted pinned host peak: the whole host arena.
  [[nodiscard]] constexpr std::size_t peak_host_bytes() const noexcept { return arena.host_bytes; }
  //! Predicted storage peak: the whole storage file (0: nothing is stored).
  [[nodiscard]] constexpr std::size_t peak_storage_bytes() const noexcept { return arena.storage_bytes; }
  //! The slot bindings of layer `layer`.
  [[nodiscard]] constexpr std::span<slot_binding const> slots_of(std::uint32_t layer) const {
    return slots.subspan(layers[layer].first_slot, layers[layer].slot_count);
  }
  //! The ops `o` waits for.
  [[nodiscard]] constexpr std::span<std::uint32_t const> waits_of(op const& o) const {
    return waits.subspan(o.wait_begin, o.wait_count);
  }
  //! The carry scratch a recompute of layer `layer` is lent, or `no_carry`.
  [[nodiscard]] constexpr std::size_t recompute_carry_offset(std::uint32_t layer) const {
    return stage.present() ? stage.recompute_carry[stage.unit_of(layer)] : arena.recompute_carry_offset;
  }
  //! True when layer `layer` is the last of its stack (of its unit's chunk, in a stage schedule).
  [[nodiscard]] constexpr bool last_layer(std::uint32_t layer) const noexcept {
    return stage.present() ? stage.layer_of(layer) + 1 == stage.chunk_end(stage.chunk_of(layer)) : layer + 1 == layers.size();
  }
  //! True when layer `layer` is the first of its stack (of its unit's chunk, in a stage schedule).
  [[nodiscard]] constexpr bool first_layer(std::uint32_t layer) const noexcept {
    return stage.present() ? stage.layer_of(layer) == stage.chunk_begin(stage.chunk_of(layer)) : layer == 0;
  }
};

//! A schedule built at run time (or transiently inside a constant expression).
struct schedule {
  std::vector<layer_binding> layers{};  //!< one per layer, in forward order
  std::vector<slot_binding> slots{};    //!< every layer's slots, each layer's contiguous
  std::vector<op> ops{};                //!< the op program, in host issue order
  std::vector<std::uint32_t> waits{};   //!< indices of the ops each op waits for (`op::wait_begin`)
  std::uint32_t event_count = 0;        //!< events the program records (`op::event` < this)
  arena_layout arena{};                 //!< the static buffer assignment and peaks
  buffer_spec buffers{};                //!< the buffers the schedule was built with
  pipeline_spec pipeline{};             //!< the pipeline the schedule was built with
  collective_spec collectives{};        //!< the collective hooks it makes room for
  carry_binding carry{};                //!< where the carries live
  stage_binding stage{};                //!< a pipeline stage's step (core/stage_schedule.hpp)
  std::vector<std::size_t> stage_recompute_carry{};  //!< storage of `stage.recompute_carry`
  std::vector<std::uint32_t> stage_instance_of{};    //!< storage of `stage.instance_of`
  std::vector<std::size_t> stage_gradient{};         //!< storage of `stage.gradient`
  std::vector<std::uint32_t> stage_chunk_first{};    //!< storage of `stage.chunk_first`

  //! Predicted device peak: the whole device arena.
  [[nodiscard]] constexpr std::size_t peak_device_bytes() const noexcept { return arena.device_bytes; }
  //! Predicted pinned host peak: the whole host arena.
  [[nodiscard]] constexpr std::size_t peak_host_bytes() const noexcept { return arena.host_bytes; }
  //! Predicted storage peak: the whole storage file (0: nothing is stored).
  [[nodiscard]] constexpr std::size_t peak_storage_bytes() const noexcept { return arena.storage_bytes; }
  //! Number of layers.
  [[nodiscard]] constexpr std::uint32_t layer_count() const noexcept { return static_cast<std::uint32_t>(layers.size()); }
  //! A view of this schedule, valid while it lives.
  [[nodiscard]] constexpr schedule_view view() const& noexcept {
    auto st = stage;
    st.recompute_carry = stage_recompute_carry;
    st.instance_of = stage_instance_of;
    st.gradient = stage_gradient;
    st.chunk_first = stage_chunk_first;
    return {layers, slots, ops, waits, event_count, arena, buffers, pipeline, collectives, carry, st};
  }
  //! Same as `view()`, so a schedule passes where a `schedule_view` is taken.
  constexpr operator schedule_view() const& noexcept { return view(); }
  // A view of a temporary would dangle (`executor ex(b, build_schedule(...))`): keep the
  // schedule in a variable.
  schedule_view view() const&& = delete;
  operator schedule_view() const&& = delete;
};

//! `write_op_label` with the slot's name from the schedule: "prefetch L3 q_proj 2/4"; in a stage
//! schedule the stage's layer and the micro-batch: "prefetch L1 q_proj mb5" (interleaved, with the
//! chunk: "prefetch L3 q_proj mb5 chunk1").
inline std::string op_label(schedule_view const& s, op const& o) {
  if (s.stage.present() && o.layer < s.layers.size()) {
    auto local = o;
    local.layer = s.stage.layer_of(o.layer);
    std::string name = s.carry.name.empty() ? "carry" : std::string(s.carry.name.view());
    if (o.slot != carry_slot && o.slot != gradient_slot && o.slot != no_slot && o.slot < s.layers[o.layer].slot_count)
      name = std::string(s.slots_of(o.layer)[o.slot].name.view());
    char buf[160];
    write_op_label(buf, local, o.slot == gradient_slot ? std::string_view{} : std::string_view(name));
    return std::string(buf) + " mb" + std::to_string(s.stage.micro_batch_of(o.layer)) +
           (s.stage.chunk_first.empty() ? std::string() : " chunk" + std::to_string(s.stage.chunk_of(o.layer)));
  }
  char buf[160];
  std::string_view name;
  if (o.slot == carry_slot) name = s.carry.name.empty() ? std::string_view("carry") : s.carry.name.view();
  else if (o.slot != no_slot && o.layer < s.layers.size() && o.slot < s.layers[o.layer].slot_count)
    name = s.slots_of(o.layer)[o.slot].name;
  write_op_label(buf, o, name);
  return buf;
}

}  // namespace tide
