#pragma once
//! \file
//! `tide::describe`: a strategy's rules and parts; and a schedule's readable account of what is kept, offloaded or recomputed
//! per layer, the arena layout and peaks, and the op order on each stream.

#include <cstdio>
#include <string>

#include <tide/core/schedule.hpp>
#include <tide/core/strategy.hpp>

namespace tide {

//! Bytes with a binary unit, e.g. "1.50 MiB".
inline std::string format_bytes(double b) {
  char buf[32];
  char const* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

namespace detail {
inline std::string describe_pipeline(pipeline_spec const& p) {
  return "latency hiding " + std::string(p.latency_hiding ? "on" : "off") + ", prefetch distance " +
         std::to_string(p.prefetch_distance) + ", chunk " +
         (p.chunk_bytes ? format_bytes(static_cast<double>(p.chunk_bytes)) : std::string("whole slot")) +
         ", offloads in flight " + std::to_string(p.max_offloads_in_flight);
}
inline std::string describe_buffers(buffer_spec const& b) {
  return std::to_string(b.staging_buffers) + " staging buffers, device alignment " + std::to_string(b.device_alignment) +
         ", host alignment " + std::to_string(b.host_alignment) + ", guard bytes " + std::to_string(b.guard_bytes) +
         (b.share_phase_regions ? ", phases share regions" : ", phases apart") +
         (b.spill_buffers != buffer_spec{}.spill_buffers || b.storage_alignment != buffer_spec{}.storage_alignment
              ? ", " + std::to_string(b.spill_buffers) + " spill buffers, storage alignment " + std::to_string(b.storage_alignment)
              : std::string());
}
inline std::string describe_collectives(collective_spec const& c) {
  std::string r;
  auto add = [&](bool on, char const* what) {
    if (!on) return;
    if (!r.empty()) r += ", ";
    r += what;
  };
  add(c.before_forward, "gather before forward");
  add(c.before_backward, "regather before backward");
  add(c.after_backward, "reduce after backward");
  if (r.empty()) return "none";
  return c.overlap ? r : r + " (on the compute stream, not overlapped)";
}
}  // namespace detail

//! A strategy as text: its rules in order (first match wins, the default is keep), then its
//! buffers, pipeline and collectives.
inline std::string describe(strategy const& st) {
  std::string r = "strategy:\n  policy:";
  if (st.policy.rules.empty()) r += " keep everything";
  for (auto const& rule : st.policy.rules) {
    r.append("\n    ").append(to_string(rule.where)).append(" ");
    if (rule.slots.empty()) r += "any slot";
    for (std::size_t i = 0; i < rule.slots.size(); ++i) r.append(i ? ", " : "").append(rule.slots[i]);
    if (rule.first_layer != 0 || rule.last_layer != all_layers) {
      auto bound = [](layer_bound l) {
        return l == all_layers        ? std::string("end")
               : counts_from_end(l) ? "end - " + std::to_string(from_end_count(l))
                                      : std::to_string(l.value);
      };
      r += " of layers [" + bound(rule.first_layer) + ", " + bound(rule.last_layer) + ")";
    }
    if (rule.min_bytes) r += " of at least " + format_bytes(static_cast<double>(rule.min_bytes));
  }
  if (st.policy.allow_unused_rules) r += "\n    (unused rules allowed)";
  r += "\n  buffers: " + detail::describe_buffers(st.buffers) + "\n  pipeline: " + detail::describe_pipeline(st.pipeline) +
       "\n  collectives: " + detail::describe_collectives(st.collectives) + "\n";
  auto const& k = st.checkpoints;
  if (!k.stores_every_carry()) {
    r += "  checkpoints: " +
         (k.device_snapshots == every_carry ? std::string("every carry") : std::to_string(k.device_snapshots)) +
         " on the device, " + std::to_string(k.host_snapshots) + " on the host" +
         (k.reversal.empty() ? std::string(", Revolve") : ", a reversal of " + std::to_string(k.reversal.size()) + " actions") +
         "\n";
  }
  return r;
}

//! What `describe(schedule_view, ...)` prints after its summary lines.
struct describe_options {
  bool layers = true;  //!< each layer's slots: placement, size and offsets
  bool ops = true;     //!< each stream's ops in issue order, with the ops they wait for
};

//! A schedule as text: layer, op and event counts, pipeline and collectives, the arena layout and
//! peaks, the carry, then (as `opt` asks) each layer's slots and each stream's op order.
inline std::string describe(schedule_view const& s, describe_options opt = {}) {
  std::string r;
  auto const& a = s.arena;
  r += "schedule: " + std::to_string(s.layer_count()) + " layers, " + std::to_string(s.ops.size()) + " ops, " +
       std::to_string(s.event_count) + " events\n";
  r += "  pipeline: " + detail::describe_pipeline(s.pipeline) + "\n  collectives: " +
       detail::describe_collectives(s.collectives) + "\n";
  r += "  peak device " + format_bytes(static_cast<double>(a.device_bytes)) + " (kept " +
       format_bytes(static_cast<double>(a.kept_bytes)) + ", offload sources " + std::to_string(a.offload_buffers) + " x = " +
       format_bytes(static_cast<double>(a.offload_ring_bytes)) + ", staging " + std::to_string(a.staging_buffers) +
       " x = " + format_bytes(static_cast<double>(a.staging_ring_bytes)) + ", remat scratch " +
       format_bytes(static_cast<double>(a.remat_scratch_bytes)) +
       (a.advance_scratch_bytes > 0 ? ", advance scratch " + format_bytes(static_cast<double>(a.advance_scratch_bytes)) : "") +
       // What a recompute is lent beyond its remat slots: the slots it does not rebuild, its carry out.
       (a.recompute_scratch_bytes > a.remat_scratch_bytes
            ? ", recompute scratch " + format_bytes(static_cast<double>(a.recompute_scratch_bytes))
            : "") +
       (s.buffers.share_phase_regions ? ", phases share" : "") +
       "), peak host " + format_bytes(static_cast<double>(a.host_bytes)) +
       (a.spill_buffers > 0 ? " (spill ring " + std::to_string(a.spill_buffers) + " x = " +
                                  format_bytes(static_cast<double>(a.spill_ring_bytes)) + "), peak storage " +
                                  format_bytes(static_cast<double>(a.storage_bytes))
                            : std::string()) +
       "\n";
  if (s.carry.present())
    r += "  carry '" + std::string(s.carry.name) + "' " + format_bytes(static_cast<double>(s.carry.bytes)) + ": " +
         std::to_string(s.carry.device_buffers) + " device buffers (" + format_bytes(static_cast<double>(a.carry_bytes)) +
         ", " + std::to_string(s.carry.device_snapshots) + " snapshots), " + std::to_string(s.carry.host_snapshots) +
         " host snapshots (" + format_bytes(static_cast<double>(a.host_carry_bytes)) + "), " +
         (s.carry.disk_snapshots > 0 ? std::to_string(s.carry.disk_snapshots) + " disk snapshots (" +
                                           format_bytes(static_cast<double>(s.carry.file_region_bytes * s.carry.disk_snapshots)) +
                                           " of the storage file at " + std::to_string(s.carry.file_area) + "), "
                                     : std::string()) +
         std::to_string(s.carry.advances) + " advances\n";
  if (opt.layers) {
    for (std::uint32_t l = 0; l < s.layer_count(); ++l) {
      r += "  layer " + std::to_string(l) + " (" + std::string(s.layers[l].type_name) + "):";
      for (auto const& b : s.slots_of(l)) {
        // Appended piecewise: " " + std::string(...) trips GCC 12's -Wrestrict (PR 105651).
        r.append(" ").append(b.name).append("=").append(to_string(b.where)).append("[");
        r.append(format_bytes(static_cast<double>(b.bytes))).append(" @").append(std::to_string(b.forward_offset));
        if (b.backward_offset != b.forward_offset) r += "->" + std::to_string(b.backward_offset);
        if (b.where == placement::offload) r += " host@" + std::to_string(b.host_offset);
        if (b.where == placement::spill)
          r += " ring@" + std::to_string(b.host_offset) + (b.stored() ? " file@" + std::to_string(b.file_offset) : std::string(" held"));
        r += "]";
      }
      r += "\n";
    }
  }
  if (opt.ops) {
    for (std::size_t st = 0; st < stream_count; ++st) {
      std::string line;
      for (std::uint32_t i = 0; i < s.ops.size(); ++i) {
        auto const& o = s.ops[i];
        if (static_cast<std::size_t>(o.stream) != st) continue;
        line.append(" #").append(std::to_string(i)).append(" ").append(op_label(s, o));
        bool first = true;
        for (auto w : s.waits_of(o)) line.append(first ? " (after #" : ",#").append(std::to_string(w)), first = false;
        line += first ? ";" : ");";
      }
      if (!line.empty()) r += "  " + std::string(to_string(static_cast<stream_role>(st))) + ":" + line + "\n";
    }
  }
  return r;
}

}  // namespace tide
