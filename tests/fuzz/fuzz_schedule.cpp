// libFuzzer target: bytes -> (stack, strategy: policy, buffers, pipeline, collectives) -> build_schedule.
//
// A composition the builder rejects with tide::schedule_error is fine. Anything else is a
// finding: another exception, a crash or sanitizer report in the builder, a built schedule that
// tide::check_schedule rejects, and (for small schedules) a step on the sim backend that fails
// or a step on the host backend, debug checks on, whose synthetic digests (or chain-workload
// gradients, when every layer has an "input" slot kept or offloaded) differ from keep-all's.
// Bytes left after the composition edit the built program (see `mutate`): an edited program the
// checker accepts must still run correctly, so a hole in the checker is a finding too.
//
// Run: fuzz_schedule [libFuzzer flags] CORPUS_DIR...   or   fuzz_schedule FILE... (replay).
// The input format is a plain byte stream read front to back (see `decode`); bytes past the end
// read as zero. tests/fuzz/make_corpus.py writes the seed corpus in this format.
#include <tide/tide.hpp>

#include "../workload.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string_view>
#include <vector>

// Allocations the allocator cannot serve return null (or throw std::bad_alloc), as they do
// without ASan, instead of aborting: tide's own reporting of them is under test.
extern "C" char const* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace {

constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
constexpr std::uint32_t u32_max = std::numeric_limits<std::uint32_t>::max();

struct reader {
  std::uint8_t const* p;
  std::size_t n;
  std::uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::uint8_t peek() const { return n == 0 ? 0 : *p; }
  std::uint64_t bytes(int k) {
    std::uint64_t v = 0;
    for (int i = 0; i < k; ++i) v |= std::uint64_t{u8()} << (8 * i);
    return v;
  }
  //! A size: mostly small, sometimes an extreme (0, 1, SIZE_MAX - k, 2^63 +- k, powers of two).
  std::size_t size() {
    auto const t = u8();
    if (t < 0x80) return ((std::size_t{t} << 8) | u8()) + 1;             // 1 .. 32 Ki
    if (t < 0xA0) return (std::size_t{t - 0x80u} << 16 | bytes(2)) + 1;  // up to 2 Mi
    switch (t) {
      case 0xA0: return 0;
      case 0xA1: return 1;
      case 0xA2: return size_max - u8();
      case 0xA3: return (std::size_t{1} << 63) + u8() - 128;
      case 0xA4: return (std::size_t{1} << 32) + u8() - 128;
      case 0xA5: return size_max / (std::size_t{u8()} + 1);
      case 0xA6: return std::size_t{1} << (u8() % 64);
      case 0xA7: return (std::size_t{1} << (u8() % 64)) - 1;
      case 0xA8: return (std::size_t{1} << (u8() % 64)) + 1;
      case 0xA9: return bytes(8);
      default: return t - 0xA9u;  // 1 .. 86
    }
  }
  //! A layer index, a count or a distance: mostly small, sometimes huge.
  std::uint32_t index() {
    auto const t = u8();
    if (t < 0xF0) return t % 16;
    switch (t) {
      case 0xF0: return tide::all_layers;
      case 0xF1: return u32_max - 1;
      case 0xF2: return std::uint32_t{1} << 31;
      case 0xF3: return 16 + u8();
      case 0xF4: return tide::all_layers - u8() % 20;  // what from_end(k) once was: an index now (issue 40)
      default: return static_cast<std::uint32_t>(bytes(4));
    }
  }
  //! A rule's layer bound: 0xF5 then k is `tide::from_end(k % 20)`, a count from the end; anything
  //! else an index as `index()` reads it.
  tide::layer_bound layer() {
    if (peek() == 0xF5) {
      (void)u8();
      return tide::from_end(u8() % 20);
    }
    return index();
  }
  //! An alignment: usual powers of two, odd values, zero, huge ones.
  std::size_t alignment() {
    static constexpr std::size_t table[] = {256,     64, 1,       2, 3, 8, 24, 4096, 0, std::size_t{1} << 63,
                                            size_max, std::size_t{1} << 32, 1 << 20, 6, std::size_t{1} << 62, 128};
    auto const t = u8();
    return t < 16 ? table[t] : t < 0x80 ? std::size_t{1} << (t % 13) : size();
  }
};

// Names must outlive the specs (they hold string_views): static pools.
constexpr std::string_view slot_pool[] = {"a", "b", "c", "d", "e", "f", "input", "zz_unknown"};
constexpr std::string_view type_pool[] = {"t0", "t1", "t2", "t3"};

struct composition {
  tide::stack_spec stack;
  tide::strategy how;  //!< policy, buffers, pipeline, collectives
};

//! The byte stream, front to back:
//!   types-1 (%4); per type: slots-1 (%6), per slot: name (%7; duplicates allowed), size();
//!   layers (%13; 0 means the empty stack), per layer: its type (%types);
//!   rules (bit 7: allow unused rules; the rest %7); per rule: where (%4), names (%4) each (%8, incl. an unknown one), first index(),
//!     last: one byte (even: all_layers, else index()), min_bytes (one byte: even: 0, else size());
//!   staging index(), device alignment(), host alignment(), guard size(), share (&1);
//!   latency hiding (bit 0 clear: on; set: the naive pipeline), prefetch index(),
//!     chunk (one byte: even: 0, else size()), offloads in flight index();
//!   collectives (bit 0: before forward, bit 1: after backward, bit 2: before backward, bit 3: not
//!   overlapped).
composition decode(reader& r) {
  composition c;
  std::vector<tide::layer_spec> types(r.u8() % 4 + 1);
  for (std::size_t t = 0; t < types.size(); ++t) {
    types[t].name = type_pool[t];
    auto const n = r.u8() % 6 + 1;
    for (int k = 0; k < n; ++k) {
      auto const name = slot_pool[r.u8() % 7];
      types[t].slots.push_back({name, r.size()});
    }
  }
  auto const layers = r.u8() % 13;
  // The synthetic workload's contract: no layer reads another's output (the chain workload runs
  // only where every layer's "input" slot is kept or offloaded: chain_applies).
  c.stack.independent_layers = true;
  for (int l = 0; l < layers; ++l) c.stack.append(types[r.u8() % types.size()]);
  auto const rules_byte = r.u8();
  auto& policy = c.how.policy;
  policy.allow_unused_rules = (rules_byte & 0x80) != 0;
  auto const rules = (rules_byte & 0x7F) % 7;
  for (int i = 0; i < rules; ++i) {
    tide::rule_spec rs;
    rs.where = static_cast<tide::placement>(r.u8() % 4);  // keep, offload, remat, spill
    auto const names = r.u8() % 4;
    for (int k = 0; k < names; ++k) rs.slots.push_back(slot_pool[r.u8() % 8]);
    rs.first_layer = r.layer();
    rs.last_layer = r.u8() % 2 == 0 ? tide::layer_bound{tide::all_layers} : r.layer();
    rs.min_bytes = r.u8() % 2 == 0 ? 0 : r.size();
    policy.rules.push_back(rs);
  }
  auto& buffers = c.how.buffers;
  buffers.staging_buffers = r.index();
  buffers.device_alignment = r.alignment();
  buffers.host_alignment = r.alignment();
  buffers.guard_bytes = r.u8() % 2 == 0 ? 0 : r.size();
  buffers.share_phase_regions = r.u8() & 1;
  auto& pipeline = c.how.pipeline;
  pipeline.latency_hiding = !(r.u8() & 1);
  pipeline.prefetch_distance = r.index();
  pipeline.chunk_bytes = r.u8() % 2 == 0 ? 0 : r.size();
  pipeline.max_offloads_in_flight = r.index();
  auto const coll = r.u8();
  c.how.collectives = {.before_forward = (coll & 1) != 0,
                       .before_backward = (coll & 4) != 0,
                       .after_backward = (coll & 2) != 0,
                       .overlap = (coll & 8) == 0};
  return c;
}

[[noreturn]] void finding(char const* what, tide::schedule const& s) {
  std::fprintf(stderr, "fuzz_schedule: %s\n%s\n", what, tide::describe(s).c_str());
  __builtin_trap();
}

//! One host backend for every input: starting its five stream threads per input would dominate.
tide::host_backend& host() {
  // Spilled slots go to a file in a directory of the fuzzer's own (the file is unlinked at once).
  static workload::temp_dir dir;
  static tide::host_backend b([] {
    tide::host_backend_options o;
    o.storage = {.directory = dir.path.string(), .quiet = true};
    return o;
  }());
  return b;
}

//! Small enough to run on the host backend for every input. It allocates each arena at the
//! schedule's alignment, which reserves alignment-sized address space (ASan shadows it: a 2^33
//! alignment costs 1 GiB of RSS per input), so alignments above 1 MiB are left to build and check.
bool small(tide::schedule const& s) {
  constexpr std::size_t limit = 4u << 20;
  return s.arena.device_bytes < limit && s.arena.host_bytes < limit && s.arena.device_bytes + s.arena.host_bytes < limit &&
         s.ops.size() < 5000 && s.buffers.device_alignment <= (1u << 20) && s.buffers.host_alignment <= (1u << 20);
}

//! True when every layer has an "input" slot that is not rematerialized (the chain workload's
//! contract: recompute mode cannot rebuild a layer's input).
bool chain_applies(tide::schedule const& s) {
  for (std::uint32_t l = 0; l < s.layer_count(); ++l) {
    bool ok = false;
    for (auto const& b : s.view().slots_of(l))
      if (b.name == workload::chain::input) ok = b.where != tide::placement::remat;
    if (!ok) return false;
  }
  return true;
}

//! True when the program could have more than `limit` copy ops (every slot offloaded). The
//! builder accepts up to 2^24 chunks per slot, so a tiny chunk size yields valid programs of
//! millions of ops that take longer to build and check than a fuzz input may: skipped, not
//! reported as timeouts.
bool too_many_copies(composition const& c, std::size_t limit) {
  std::size_t n = 0;
  for (auto t : c.stack.layer_types)
    for (auto const& sl : c.stack.types[t].slots) {
      n += c.how.pipeline.chunk_bytes == 0 ? 1 : std::min(sl.bytes / c.how.pipeline.chunk_bytes, limit) + 1;
      if (n > limit) return true;
    }
  return false;
}

//! Edits the program as decoded from the bytes left: drops a wait, moves a copy, resizes a
//! copy, moves a slot's forward or backward region, or puts a copy on another stream. False
//! when there was nothing to edit.
bool mutate(tide::schedule& m, reader& r, bool verbose) {
  auto const what = r.u8() % 5;
  auto const pick = static_cast<std::size_t>(r.bytes(2));
  auto const delta = static_cast<std::int64_t>(static_cast<std::int8_t>(r.u8()));
  auto const scale = std::size_t{1} << (r.u8() % 13);
  auto shift = [&](std::size_t& v) { v += static_cast<std::size_t>(delta * static_cast<std::int64_t>(scale)); };
  auto nth = [&](auto&& want) -> tide::op* {  // the pick-th op (cyclically) that `want` accepts
    std::vector<tide::op*> c;
    for (auto& o : m.ops)
      if (want(o)) c.push_back(&o);
    return c.empty() ? nullptr : c[pick % c.size()];
  };
  switch (what) {
    case 0: {  // drop one wait (moved to the end of the op's range, then cut)
      auto* o = nth([](tide::op const& x) { return x.wait_count > 0; });
      if (!o) return false;
      auto const k = o->wait_begin + (pick >> 8) % o->wait_count;
      if (verbose) std::fprintf(stderr, "edit: op #%zu drops its wait on op #%u\n", std::size_t(o - m.ops.data()), m.waits[k]);
      std::swap(m.waits[k], m.waits[o->wait_begin + o->wait_count - 1]);
      --o->wait_count;
      return true;
    }
    case 1:
    case 2: {
      auto* o = nth([](tide::op const& x) { return tide::is_copy(x.kind); });
      if (!o) return false;
      auto& v = what == 2 ? o->bytes : r.u8() & 1 ? o->device_offset : o->host_offset;
      auto const was = v;
      shift(v);
      if (verbose)
        std::fprintf(stderr, "edit: op #%zu's %s %zu -> %zu\n", std::size_t(o - m.ops.data()),
                     what == 2 ? "bytes" : &v == &o->device_offset ? "device offset" : "host offset", was, v);
      return true;
    }
    case 3: {
      if (m.slots.empty()) return false;
      auto& b = m.slots[pick % m.slots.size()];
      auto& v = r.u8() & 1 ? b.forward_offset : b.backward_offset;
      auto const was = v;
      shift(v);
      if (verbose)
        std::fprintf(stderr, "edit: slot binding %zu's %s offset %zu -> %zu\n", pick % m.slots.size(),
                     &v == &b.forward_offset ? "forward" : "backward", was, v);
      return true;
    }
    default: {
      auto* o = nth([](tide::op const& x) { return tide::is_copy(x.kind); });
      if (!o) return false;
      o->stream = static_cast<tide::stream_role>(r.u8() % tide::stream_count);
      if (verbose) std::fprintf(stderr, "edit: op #%zu to stream %d\n", std::size_t(o - m.ops.data()), int(o->stream));
      return true;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  static bool const verbose = std::getenv("TIDE_FUZZ_VERBOSE") != nullptr;  // says what each input became
  reader r{data, size};
  auto const c = decode(r);
  if (too_many_copies(c, 20'000)) return 0;
  tide::schedule s;
  try {
    s = tide::build_schedule(c.stack, c.how);
  } catch (tide::schedule_error const& e) {
    if (verbose) std::fprintf(stderr, "rejected: %s\n", e.what());
    return 0;  // a rejected composition: fine
  }
  if (verbose) std::fprintf(stderr, "%s\n", tide::describe(s).c_str());
  try {
    tide::check_schedule(s);
  } catch (tide::schedule_error const& e) {
    std::fprintf(stderr, "fuzz_schedule: check_schedule rejects a built schedule: %s\n", e.what());
    finding("built schedule fails the checker", s);
  }
  (void)tide::describe(s);
  if (!small(s)) return 0;

  // The sim backend: one step in virtual time, peaks as predicted.
  auto const costs = tide::uniform_costs(s.layer_count(), tide::layer_cost{.forward_us = 10, .backward_us = 20},
                                         tide::host_link::symmetric(1e9, 1, (size & 1) != 0));
  auto const sim = tide::simulate(s, costs);
  if (sim.summary.predicted_device_bytes != s.peak_device_bytes()) finding("sim summary peak differs", s);

  // The host backend with real data, debug checks and the checker on: bitwise keep-all's digests.
  tide::schedule const keep = tide::build_schedule(c.stack, tide::strategy{});
  if (!small(keep)) return 0;
  tide::executor_options const checked{.debug_checks = true, .check_schedule = true};
  auto const want = workload::run(host(), keep, 2, checked);
  try {
    if (workload::run(host(), s, 2, checked) != want) finding("host digests differ from keep-all", s);
    if (chain_applies(s) && workload::run_chain(host(), s, 2, checked) != workload::run_chain(host(), keep, 2, checked))
      finding("chain gradients differ from keep-all", s);
  } catch (std::exception const& e) {  // e.g. tide::out_of_memory for a schedule of a few MiB
    std::fprintf(stderr, "fuzz_schedule: %s\n", e.what());
    finding("the host backend fails to run a small built schedule", s);
  }

  // The checker's completeness: bytes left over edit the program; a program the checker accepts
  // must still compute keep-all's digests, pass the debug checks and stay in its arenas.
  if (r.n == 0) return 0;
  tide::schedule m = s;
  if (!mutate(m, r, verbose)) return 0;
  try {
    tide::check_schedule(m);
  } catch (tide::schedule_error const& e) {
    if (verbose) std::fprintf(stderr, "edited program rejected: %s\n", e.what());
    return 0;
  }
  if (verbose) std::fprintf(stderr, "edited program accepted:\n%s\n", tide::describe(m).c_str());
  // First without debug checks (the program alone), then with them (guards, poisoning of dead
  // regions, prefetch checks must agree with what the checker proved).
  if (workload::run(host(), m, 2, {.debug_checks = false, .check_schedule = false}) != want)
    finding("the checker accepts an edited program whose digests differ", m);
  try {
    if (workload::run(host(), m, 2, checked) != want)
      finding("the checker accepts an edited program whose digests differ only with debug checks on (the "
              "executor poisons bytes the program still reads)", m);
  } catch (tide::debug_check_error const& e) {
    std::fprintf(stderr, "fuzz_schedule: %s\n", e.what());
    finding("the checker accepts an edited program that fails a debug check", m);
  }
  return 0;
}
