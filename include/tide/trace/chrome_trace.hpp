#pragma once
//! \file Timelines as Chrome trace JSON (loads in Perfetto and chrome://tracing): one track per
//! stream, one slice per op named by kind, layer and slot, and counter tracks for device and
//! host bytes live.

#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>

#include <tide/core/schedule.hpp>
#include <tide/trace/summary.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

namespace detail {
//! `s` as the inside of a JSON string.
inline std::string json_escaped(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') r.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      r += buf;
    } else {
      r.push_back(c);
    }
  }
  return r;
}
}  // namespace detail

//! "forward L3", "offload L3 q_proj [1/4]": the name an op has in traces and NVTX ranges.
inline std::string op_label(schedule_view const& s, op const& o) {
  std::string r = std::string(to_string(o.kind)) + " L" + std::to_string(o.layer);
  if (o.slot != no_slot) {
    r += " " + std::string(s.slots_of(o.layer)[o.slot].name);
    if (o.chunks > 1) r += " [" + std::to_string(o.chunk + 1) + "/" + std::to_string(o.chunks) + "]";
  }
  return r;
}

inline void write_chrome_trace(std::ostream& out, timeline const& t, schedule_view const& s,
                               std::string_view process = "tide") {
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"" << detail::json_escaped(process) << "\"}}";
  for (std::size_t st = 0; st < stream_count; ++st)
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << st << ",\"args\":{\"name\":\""
        << to_string(static_cast<stream_role>(st)) << "\"}}";
  for (auto const& sp : t.ops) {
    if (sp.op >= s.ops.size()) continue;
    auto const& o = s.ops[sp.op];
    out << ",\n{\"name\":\"" << detail::json_escaped(op_label(s, o)) << "\",\"cat\":\"" << to_string(o.kind) << "\",\"ph\":\"X\",\"pid\":1,\"tid\":"
        << static_cast<int>(sp.stream) << ",\"ts\":" << sp.begin_us << ",\"dur\":" << (sp.end_us - sp.begin_us)
        << ",\"args\":{\"op\":" << sp.op << ",\"bytes\":" << o.bytes << "}}";
  }
  for (auto const& w : t.waits)
    out << ",\n{\"name\":\"wait\",\"cat\":\"wait\",\"ph\":\"X\",\"pid\":1,\"tid\":" << static_cast<int>(w.stream)
        << ",\"ts\":" << w.begin_us << ",\"dur\":" << (w.end_us - w.begin_us) << ",\"args\":{\"event\":" << w.event << "}}";
  auto occ = measure_occupancy(t, s);
  for (auto const& p : occ.device)
    out << ",\n{\"name\":\"device bytes\",\"ph\":\"C\",\"pid\":1,\"ts\":" << p.t_us << ",\"args\":{\"live\":" << p.bytes
        << "}}";
  for (auto const& p : occ.host)
    out << ",\n{\"name\":\"host bytes\",\"ph\":\"C\",\"pid\":1,\"ts\":" << p.t_us << ",\"args\":{\"live\":" << p.bytes
        << "}}";
  out << "\n],\"otherData\":{\"predicted_device_bytes\":" << s.arena.device_bytes
      << ",\"predicted_host_bytes\":" << s.arena.host_bytes << "}}\n";
}

}  // namespace tide
