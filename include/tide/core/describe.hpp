#pragma once
//! \file `tide::describe(schedule)`: a readable account of what is kept, offloaded or recomputed
//! per layer, the arena layout and peaks, and the op order on each stream.

#include <cstdio>
#include <string>

#include <tide/core/schedule.hpp>

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

struct describe_options {
  bool layers = true;
  bool ops = true;
};

inline std::string describe(schedule_view const& s, describe_options opt = {}) {
  std::string r;
  auto const& a = s.arena;
  r += "schedule: " + std::to_string(s.layer_count()) + " layers, " + std::to_string(s.ops.size()) + " ops, " +
       std::to_string(s.event_count) + " events\n";
  r += "  pipeline: latency hiding " + std::string(s.pipeline.latency_hiding ? "on" : "off") + ", prefetch distance " +
       std::to_string(s.pipeline.prefetch_distance) + ", chunk " +
       (s.pipeline.chunk_bytes ? format_bytes(static_cast<double>(s.pipeline.chunk_bytes)) : std::string("whole slot")) +
       ", offloads in flight " + std::to_string(s.pipeline.max_offloads_in_flight) + "\n";
  r += "  peak device " + format_bytes(static_cast<double>(a.device_bytes)) + " (kept " +
       format_bytes(static_cast<double>(a.kept_bytes)) + ", offload sources " + std::to_string(a.offload_buffers) + " x = " +
       format_bytes(static_cast<double>(a.offload_ring_bytes)) + ", staging " + std::to_string(a.staging_buffers) +
       " x = " + format_bytes(static_cast<double>(a.staging_ring_bytes)) + ", remat scratch " +
       format_bytes(static_cast<double>(a.remat_scratch_bytes)) + (s.buffers.share_phase_regions ? ", phases share" : "") +
       "), peak host " + format_bytes(static_cast<double>(a.host_bytes)) + "\n";
  if (opt.layers) {
    for (std::uint32_t l = 0; l < s.layer_count(); ++l) {
      r += "  layer " + std::to_string(l) + " (" + std::string(s.layers[l].type_name) + "):";
      for (auto const& b : s.slots_of(l)) {
        // Appended piecewise: " " + std::string(...) trips GCC 12's -Wrestrict (PR 105651).
        r.append(" ").append(b.name).append("=").append(to_string(b.where)).append("[");
        r.append(format_bytes(static_cast<double>(b.bytes))).append(" @").append(std::to_string(b.forward_offset));
        if (b.backward_offset != b.forward_offset) r += "->" + std::to_string(b.backward_offset);
        if (b.where == placement::offload) r += " host@" + std::to_string(b.host_offset);
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
        line += " #" + std::to_string(i) + ":" + std::string(to_string(o.kind)) + "(L" + std::to_string(o.layer);
        if (o.slot != no_slot) {
          line += "." + std::string(s.slots_of(o.layer)[o.slot].name);
          if (o.chunks > 1) line += "[" + std::to_string(o.chunk) + "/" + std::to_string(o.chunks) + "]";
        }
        line += ")";
        if (o.wait_count) {
          line += "<-";
          bool first = true;
          for (auto w : s.waits_of(o)) line += (first ? "#" : ",#") + std::to_string(w), first = false;
        }
      }
      if (!line.empty()) r += "  " + std::string(to_string(static_cast<stream_role>(st))) + ":" + line + "\n";
    }
  }
  return r;
}

}  // namespace tide
