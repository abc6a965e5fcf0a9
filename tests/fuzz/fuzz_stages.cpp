// The stage-order fuzzer (libFuzzer, clang only): bytes become a pipeline (order, stages, stage,
// micro-batches, per-stage forward, backward and transfer times, hostile values included), and
// stage_steps, peak_in_flight and time_stages must either refuse it with a tide::error or give
// orders and timelines that keep their invariants: each micro-batch once forward and once
// backward, forward first, backwards in micro-batch order, the peak in flight in closed form, and
// every pass after what it waits on. A finding prints what broke and aborts (libFuzzer keeps the
// input). Input format (read front to back; missing bytes read as 0):
//   byte 0: order (low bit: 0 gpipe, 1 1f1b; bit 1: interleaved, with bits 2-4 its virtual
//   stages, 0 and 1 refused; 0xFF: an invalid enumerator); bytes 1-2: stages;
//   bytes 3-4: stage; bytes 5-7: micro-batches; then per stage (at most 8 read) three times, each
//   one byte: 0xFF NaN, 0xFE -1, 0xFD 1e13, 0xFC infinity, else the byte / 4 microseconds.
// The bytes left over are a partition's input (plan/partition.hpp): two times for the first and
// last stage's ends, then one per layer (at most 48), as above; the partition over the pipeline's
// stages (at most 64 read) must be refused with a tide::error or cover the layers, no stage empty,
// and be no slower than the even partition; check_partition must refuse the counts read as a
// partition (each byte a stage's layers) unless they add up.
#include <tide/core/stage_order.hpp>
#include <tide/plan/partition.hpp>
#include <tide/plan/stage_timeline.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <vector>

namespace {

struct reader {
  std::uint8_t const* data;
  std::size_t size, at = 0;
  std::uint32_t byte() { return at < size ? data[at++] : 0; }
};

[[noreturn]] void finding(char const* what, tide::stage_spec const& s) {
  std::fprintf(stderr, "fuzz_stages: %s (stage %u of %u, %u micro-batches, %s)\n", what, s.stage, s.stages, s.micro_batches,
               s.order == tide::stage_order::gpipe ? "gpipe" : s.order == tide::stage_order::interleaved ? "interleaved" : "1f1b or invalid");
  std::abort();
}

double time_of(std::uint32_t b) {
  switch (b) {
    case 0xFF: return std::numeric_limits<double>::quiet_NaN();
    case 0xFE: return -1;
    case 0xFD: return 1e13;
    case 0xFC: return std::numeric_limits<double>::infinity();
    default: return b / 4.0;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  reader r{data, size};
  auto const o = r.byte();
  tide::stage_spec s;
  s.order = o == 0xFF ? static_cast<tide::stage_order>(7) : (o & 1) ? tide::stage_order::one_f_one_b : tide::stage_order::gpipe;
  if (o != 0xFF && (o & 2)) {
    s.order = tide::stage_order::interleaved;
    s.virtual_stages = (o >> 2) & 7;
  }
  s.stages = r.byte() | r.byte() << 8;
  s.stage = r.byte() | r.byte() << 8;
  s.micro_batches = r.byte() | r.byte() << 8 | r.byte() << 16;
  // Keep one input's work small: the order is 2 x micro_batches entries, the timeline stages x
  // micro_batches passes (the limits themselves are the unit test's).
  if (std::uint64_t{s.micro_batches} * std::max<std::uint32_t>(s.stages, 1) * std::max<std::uint32_t>(s.virtual_stages, 1) > (1u << 16))
    return 0;
  std::vector<tide::stage_costs> costs;
  for (std::uint32_t k = 0; k < std::min<std::uint32_t>(s.stages, 8); ++k)
    costs.push_back({.forward_us = time_of(r.byte()), .backward_us = time_of(r.byte()), .transfer_us = time_of(r.byte())});
  try {
    auto const v = tide::stage_steps(s);
    auto const V = s.virtual_stages, M = s.micro_batches, U = M * V;
    if (v.size() != 2 * std::size_t{U}) finding("an order of the wrong length", s);
    std::vector<char> fwd(U, 0);
    std::vector<std::uint32_t> next_f(V, 0), next_b(V, 0);
    std::uint32_t live = 0, peak = 0;
    for (auto const& x : v) {
      if (x.micro_batch >= M || x.chunk >= V) finding("a unit out of range", s);
      auto const u = tide::stage_unit(s, x.chunk, x.micro_batch);
      if (x.pass == tide::stage_pass::forward) {
        if (x.micro_batch != next_f[x.chunk]++) finding("a chunk's forwards out of order", s);
        if (x.chunk > 0 && !fwd[u - M]) finding("a chunk's forward before the chunk before it", s);
        fwd[u] = 1;
        peak = std::max(peak, ++live);
      } else {
        if (x.micro_batch != next_b[x.chunk]++) finding("backwards out of micro-batch order", s);
        if (!fwd[u]) finding("a backward before its forward", s);
        --live;
      }
    }
    if (live != 0) finding("micro-batches left in flight", s);
    auto const S = s.stages, st = s.stage;
    auto const w = std::min((S - st - 1) * 2 + (V - 1) * S, U);
    auto const expect = s.order == tide::stage_order::gpipe        ? M
                        : s.order == tide::stage_order::one_f_one_b ? S - st
                        : M == S                                   ? U
                                                                   : std::min(w + 1, U);
    if (peak != expect || tide::peak_in_flight(s) != peak) finding("the peak in flight is not the closed form", s);
  } catch (tide::error const&) {
    // a refused stage: fine
  }
  if (costs.size() == std::min<std::uint32_t>(s.stages, 8) && !costs.empty() && s.stages > 8) costs.resize(1);  // one for every stage
  try {
    auto const t = tide::time_stages(s.order, s.stages, s.micro_batches, costs);
    for (std::uint32_t st = 0; st < t.stages; ++st)
      for (std::uint32_t m = 0; m < t.micro_batches; ++m) {
        auto const i = t.index(st, m);
        if (!(t.forward_end_us[i] >= t.forward_begin_us[i]) || !(t.backward_begin_us[i] >= t.forward_end_us[i]) ||
            !(t.backward_end_us[i] >= t.backward_begin_us[i]) || !(t.backward_end_us[i] <= t.step_us))
          finding("a pass out of order in the timeline", s);
        if (st > 0 && t.forward_begin_us[i] < t.forward_end_us[t.index(st - 1, m)]) finding("a forward before the previous stage's", s);
        if (st + 1 < t.stages && t.backward_begin_us[i] < t.backward_end_us[t.index(st + 1, m)])
          finding("a backward before the next stage's", s);
      }
    for (std::uint32_t st = 0; st < t.stages; ++st)
      if (!(t.bubble_us(st) >= -1e-6 * t.step_us)) finding("a negative bubble", s);
  } catch (tide::error const&) {
    // refused: fine
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fuzz_stages: an undocumented exception: %s\n", e.what());
    std::abort();
  }

  // Partitions, from the bytes left.
  tide::partition_ends const ends{time_of(r.byte()), time_of(r.byte())};
  std::vector<double> layer_us;
  std::vector<std::uint32_t> counts;
  while (r.at < r.size && layer_us.size() < 48) {
    auto const b = r.byte();
    layer_us.push_back(time_of(b));
    counts.push_back(b % 8);
  }
  auto const stages = std::min<std::uint32_t>(s.stages, 64);
  auto const slowest = [&](tide::stage_partition const& p) {
    double worst = 0;
    for (std::uint32_t st = 0, at = 0; st < stages; at += p.layers[st++]) {
      double t = (st == 0 ? ends.first_stage_us : 0) + (st + 1 == stages ? ends.last_stage_us : 0);
      for (std::uint32_t l = at; l < at + p.layers[st]; ++l) t += layer_us[l];
      worst = std::max(worst, t);
    }
    return worst;
  };
  try {
    auto const p = tide::partition_by_cost(layer_us, stages, ends);
    tide::check_partition(p, stages, static_cast<std::uint32_t>(layer_us.size()));
    auto const even = tide::even_partition(static_cast<std::uint32_t>(layer_us.size()), stages);
    if (slowest(p) > slowest(even) * (1 + 1e-12)) finding("the cost-based partition is slower than the even one", s);
  } catch (tide::error const&) {
    // refused: fine
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fuzz_stages: an undocumented exception from a partition: %s\n", e.what());
    std::abort();
  }
  std::uint64_t sum = 0;
  for (auto c : counts) sum += c;
  bool refused = false;
  try {
    tide::check_partition({counts}, static_cast<std::uint32_t>(counts.size()), static_cast<std::uint32_t>(sum));
  } catch (tide::error const&) {
    refused = true;
  }
  if (refused != std::any_of(counts.begin(), counts.end(), [](auto c) { return c == 0; }))
    finding("check_partition refused a partition with no empty stage, or took one with an empty stage", s);
  return 0;
}
