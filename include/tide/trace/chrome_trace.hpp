#pragma once
//! \file
//! Timelines as Chrome trace JSON (loads in Perfetto and chrome://tracing): one track per
//! stream, one slice per op named by kind, layer and slot, and counter tracks for device and
//! host bytes live.

#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>

#include <tide/core/config.hpp>
#include <tide/core/schedule.hpp>
#include <tide/trace/json.hpp>
#include <tide/trace/summary.hpp>
#include <tide/trace/timeline.hpp>

namespace tide {

//! Writes timeline `t`, recorded running schedule `s`, to `out` as Chrome trace JSON; `process`
//! names the trace's process.
TIDE_INLINE void write_chrome_trace(std::ostream& out, timeline const& t, schedule_view const& s,
                               std::string_view process = "tide");

#if TIDE_DEFINITIONS
TIDE_INLINE void write_chrome_trace(std::ostream& out, timeline const& t, schedule_view const& s,
                               std::string_view process) {
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"" << json_escaped(process) << "\"}}";
  for (std::size_t st = 0; st < stream_count; ++st)
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << st << ",\"args\":{\"name\":\""
        << to_string(static_cast<stream_role>(st)) << "\"}}";
  for (auto const& sp : t.ops) {
    if (sp.op >= s.ops.size()) continue;
    auto const& o = s.ops[sp.op];
    out << ",\n{\"name\":\"" << json_escaped(op_label(s, o)) << "\",\"cat\":\"" << to_string(o.kind) << "\",\"ph\":\"X\",\"pid\":1,\"tid\":"
        << static_cast<int>(sp.stream) << ",\"ts\":" << sp.begin_us << ",\"dur\":" << (sp.end_us - sp.begin_us)
        << ",\"args\":{\"op\":" << sp.op << ",\"bytes\":" << o.bytes << "}}";
  }
  if (t.turn)  // the head, loss and seed, between the last forward and the first backward
    out << ",\n{\"name\":\"turn\",\"cat\":\"turn\",\"ph\":\"X\",\"pid\":1,\"tid\":" << static_cast<int>(stream_role::compute)
        << ",\"ts\":" << t.turn->begin_us << ",\"dur\":" << (t.turn->end_us - t.turn->begin_us) << "}";
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
#endif  // TIDE_DEFINITIONS

}  // namespace tide
