#pragma once
//! \file
//! The builder's stage 1, placement: the policy's deciding rule for each slot (keep, offload,
//! remat or spill), each slot's region size and each layer's region totals, with overflow checks.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <tide/core/detail/builder.hpp>

namespace tide::detail {

constexpr schedule_issue builder::place() {
  using c = schedule_issue_code;
  auto const& policy = how.policy;
  auto const& buffers = how.buffers;
  auto const& pipeline = how.pipeline;
  // Bytes, not std::vector<bool>: Clang 14 cannot evaluate libstdc++ 12's vector<bool> in a constant expression.
  std::vector<std::uint8_t> rule_used(policy.rules.size(), 0);
  auto const deciding = policy.deciding_rules(stack);
  std::size_t pair = 0;
  for (std::uint32_t l = 0; l < L; ++l) {
    auto const& type = stack.layer(l);
    layer_binding lb{.type_name = type.name,
                     .first_slot = static_cast<std::uint32_t>(s.slots.size()),
                     .slot_count = static_cast<std::uint32_t>(type.slots.size()),
                     .type_index = stack.layer_types[l]};
    std::size_t all = 0;  // every slot's region: what an advance of this layer writes
    for (auto const& sl : type.slots) {
      auto const rule = deciding[pair++];
      if (rule != policy_spec::no_rule) rule_used[rule] = 1;
      slot_binding b{sl.name, rule == policy_spec::no_rule ? placement::keep : policy.rules[rule].where, sl.bytes};
      b.input = sl.input;
      if (sl.input && b.where == placement::remat) return issue(c::remat_of_input, type.name, sl.name, l);
      std::size_t region = 0;
      if (!checked_add(sl.bytes, buffers.guard_bytes, region)) return overflow("size plus guard bytes", type.name, sl.name);
      if (!checked_align_up(region, dalign, region))
        return overflow("size plus guard bytes, aligned to the device alignment,", type.name, sl.name);
      if (!checked_add(all, region, all)) return overflow("total of one layer's slots", type.name, sl.name);
      switch (b.where) {
        case placement::keep:
          b.forward_offset = b.backward_offset = kept;
          if (!checked_add(kept, region, kept)) return overflow("total of kept slots", type.name, sl.name);
          break;
        case placement::offload:
        case placement::spill: {
          // A spilled slot leaves the device as an offloaded one does; on the host it lands in
          // the spill ring rather than in a region of its own.
          any_offload = true;
          b.forward_offset = b.backward_offset = lb.offloaded_bytes;  // layer-local until the arena is laid out
          if (!checked_add(lb.offloaded_bytes, region, lb.offloaded_bytes))
            return overflow("total of one layer's offloaded slots", type.name, sl.name);
          std::size_t host_region = 0;
          if (b.where == placement::spill) {
            any_spill = true;
            b.host_offset = lb.spilled_bytes;  // layer-local until the ring is laid out
            if (!checked_align_up(sl.bytes, buffers.storage_alignment, host_region) ||
                !checked_add(lb.spilled_bytes, host_region, lb.spilled_bytes))
              return overflow("total of one layer's spilled slots, aligned to the storage alignment,", type.name, sl.name);
            ++transfers;
          } else {
            b.host_offset = host;
            if (!checked_align_up(sl.bytes, buffers.host_alignment, host_region) || !checked_add(host, host_region, host))
              return overflow("pinned host arena", type.name, sl.name);
          }
          auto const chunks = pipeline.chunk_bytes == 0 ? 1 : ceil_div(sl.bytes, pipeline.chunk_bytes);
          // Chunk and op indices are 32-bit: refuse chunk sizes that split a slot absurdly fine.
          if (chunks > max_chunks_per_slot) return issue(c::too_many_chunks, type.name, sl.name, chunks, max_chunks_per_slot);
          copies += chunks;
          if (copies > max_ops) return issue(c::too_many_ops, {}, {}, copies, max_ops);
          break;
        }
        case placement::remat:
          b.forward_offset = b.backward_offset = lb.remat_bytes;
          if (!checked_add(lb.remat_bytes, region, lb.remat_bytes))
            return overflow("total of one layer's remat slots", type.name, sl.name);
          break;
      }
      s.slots.push_back(b);
    }
    remat_scratch = std::max(remat_scratch, lb.remat_bytes);
    layer_region.push_back(all);
    s.layers.push_back(lb);
  }
  // forward, recompute, backward, gather, regather, reduce; a store and a load per spilled slot
  n_ops = 6 * std::size_t{L} + 2 * copies + 2 * transfers;
  if (n_ops > max_ops) return issue(c::too_many_ops, {}, {}, n_ops, max_ops);
  if (!policy.allow_unused_rules)
    for (std::size_t i = 0; i < rule_used.size(); ++i)
      if (!rule_used[i]) {
        auto const& r = policy.rules[i];
        // type_name "+" marks a rule naming more slots than the one quoted.
        return issue(c::unused_rule, r.slots.size() > 1 ? "+" : "", r.slots.empty() ? std::string_view{} : r.slots[0].view(), i, L,
                     to_string(r.where));
      }
  // Staging and in-flight parameters only matter once something is offloaded with latency
  // hiding (without it copies are serialized on the compute stream).
  if (hiding && any_offload) {
    if (buffers.staging_buffers == 0) return issue(c::zero_staging_buffers);
    if (pipeline.max_offloads_in_flight == 0) return issue(c::zero_offloads_in_flight);
  }
  if (any_spill && buffers.spill_buffers == 0) return issue(c::zero_spill_buffers);

  ring_index.assign(L, 0);
  for (std::uint32_t l = 0; l < L; ++l)
    if (s.layers[l].offloaded_bytes > 0) {
      ring_index[l] = static_cast<std::uint32_t>(offloaded.size());
      offloaded.push_back(l);
    }
  n_off = static_cast<std::uint32_t>(offloaded.size());
  spill_index.assign(L, 0);
  for (std::uint32_t l = 0; l < L; ++l)
    if (s.layers[l].spilled_bytes > 0) {
      spill_index[l] = static_cast<std::uint32_t>(spilled.size());
      spilled.push_back(l);
    }
  n_sp = static_cast<std::uint32_t>(spilled.size());
  return {};
}

}  // namespace tide::detail
