// The storage tier: a spill placement laid out and proven by the checker, run on the host backend
// through io_uring and through pread/pwrite bitwise equal to keep-all on the chain workload, and
// the spill file under hostile conditions: a full disk, directories it cannot write, a kernel or
// sandbox without io_uring (this binary run with TIDE_TEST_DENY=io_uring_setup installs a seccomp
// filter before anything else), and a disk that fails mid-step (TIDE_TEST_DENY=pwrite64).
#include <gtest/gtest.h>

#include <tide/tide.hpp>
#include <tide/backends/cuda/detail/ring_redirect.hpp>  // no CUDA in it: checked here

#include "workload.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <stddef.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>
#if __has_include(<linux/seccomp.h>) && __has_include(<linux/filter.h>)
#include <linux/filter.h>
#include <linux/seccomp.h>
#define TIDE_TEST_SECCOMP 1
#endif

using namespace tide;
namespace fs = std::filesystem;

namespace {

std::string denied() {
  auto const* d = std::getenv("TIDE_TEST_DENY");
  return d ? d : "";
}

using workload::temp_dir;

std::string error_of(auto&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "no error";
}

// Three slots per layer: the input (the previous layer's output), h and act.
stack_spec chain_stack(std::uint32_t layers, std::size_t bytes = 100000) {
  return stack_spec{}.append(layer_spec{"blk", {{"input", bytes, true}, {"h", bytes / 2}, {"act", bytes / 3 + 7}}}, layers);
}

strategy spill_strategy(bool hiding = true, std::size_t chunk = 0, std::uint32_t spill_buffers = 2) {
  strategy how{.policy = {rule_spec{.where = placement::spill, .slots = {"input", "h"}},
                          rule_spec{.where = placement::offload, .slots = {"act"}}}};
  how.pipeline.latency_hiding = hiding;
  how.pipeline.chunk_bytes = chunk;
  how.buffers.spill_buffers = spill_buffers;
  return how;
}

host_backend_options storage_in(fs::path const& dir, storage_io io = storage_io::automatic) {
  host_backend_options o;
  o.storage.directory = dir.string();
  o.storage.io = io;
  o.storage.quiet = true;
  return o;
}

}  // namespace

// ---- the schedule ------------------------------------------------------------------------------

// Spilled layer j passes through ring buffer j % R; the last R spilled layers stay there, the
// others get a file region each, padded to the storage alignment.
TEST(SpillSchedule, RingAndFileLayoutByHand) {
  auto const st = chain_stack(5, 10000);  // input 10000, h 5000, act 3340
  auto const s = build_schedule(st, spill_strategy());
  auto const& a = s.arena;
  EXPECT_EQ(a.spill_buffers, 2u);
  // One spilled layer's regions: 12288 (10000 padded) + 8192 (5000 padded).
  EXPECT_EQ(a.spill_ring_bytes, 2u * 20480u);
  EXPECT_EQ(a.spill_area % 4096, 0u);
  EXPECT_EQ(a.host_bytes, a.spill_area + a.spill_ring_bytes);
  EXPECT_EQ(a.storage_bytes, 3u * 20480u);  // layers 0..2 stored, 3 and 4 held in the ring
  for (std::uint32_t l = 0; l < 5; ++l) {
    auto const b = s.view().slots_of(l);
    EXPECT_EQ(b[0].where, placement::spill);
    EXPECT_EQ(b[0].host_offset, a.spill_area + (l % 2) * 20480u);
    EXPECT_EQ(b[1].host_offset, a.spill_area + (l % 2) * 20480u + 12288u);
    EXPECT_EQ(b[0].stored(), l < 3);
    if (l < 3) {
      EXPECT_EQ(b[0].file_offset, l * 20480u);
      EXPECT_EQ(b[1].file_offset, l * 20480u + 12288u);
    } else {
      EXPECT_EQ(b[0].file_offset, slot_binding::not_stored);
    }
    EXPECT_EQ(b[2].where, placement::offload);
  }
  std::size_t stores = 0, loads = 0;
  for (auto const& o : s.ops) {
    stores += o.kind == op_kind::store;
    loads += o.kind == op_kind::load;
    if (is_storage(o.kind)) {
      EXPECT_EQ(o.stream, stream_role::storage);
    }
  }
  EXPECT_EQ(stores, 6u);
  EXPECT_EQ(loads, 6u);
  auto const r = check_schedule(s);
  EXPECT_EQ(r.replayed_storage_bytes, a.storage_bytes);
  EXPECT_EQ(r.replayed_host_bytes, a.host_bytes);
  auto const d = describe(s);
  EXPECT_NE(d.find("spill ring 2 x"), std::string::npos) << d;
  EXPECT_NE(d.find("peak storage 60.00 KiB"), std::string::npos) << d;
  EXPECT_NE(d.find("input=spill[9.77 KiB"), std::string::npos) << d;
  EXPECT_NE(d.find(" held]"), std::string::npos) << d;
  EXPECT_NE(d.find("storage: #"), std::string::npos) << d;
  EXPECT_NE(d.find("store L0 input"), std::string::npos) << d;
}

// Without latency hiding one ring buffer serves, on the compute stream: every spilled layer but
// the last is stored, and the program is one stream.
// GPUDirect Storage keeps the ring in device memory (cuda_backend): every offload into the ring,
// store, load and prefetch out of it must land at the same offset of the device ring, and
// nothing else may move. Checked on a built schedule's ops, with the host arena's addresses.
TEST(SpillSchedule, TheDeviceRingRedirectMapsEveryRingTransfer) {
  auto const s = build_schedule(chain_stack(5, 10000), spill_strategy());
  auto const& a = s.arena;
  std::vector<std::byte> host(a.host_bytes), device(a.spill_ring_bytes);
  detail::ring_redirect const r{host.data() + a.spill_area, device.data(), a.spill_ring_bytes};
  ASSERT_TRUE(r.active());
  std::size_t mapped = 0;
  for (auto const& o : s.view().ops) {
    bool const ring_copy = (o.kind == op_kind::offload || o.kind == op_kind::prefetch) && o.host_offset >= a.spill_area;
    if (!ring_copy && !is_storage(o.kind)) continue;
    auto const n = is_storage(o.kind) ? align_up(o.bytes, s.buffers.storage_alignment) : o.bytes;
    auto* const p = host.data() + o.host_offset;
    ASSERT_EQ(r(p, n), device.data() + (o.host_offset - a.spill_area)) << to_string(o.kind);
    ++mapped;
  }
  EXPECT_GT(mapped, 0u);
  // Outside the ring: unchanged; the ring's end is outside; a transfer past the end is an error.
  EXPECT_EQ(r(host.data(), 16), host.data());
  EXPECT_EQ(r.offset_of(host.data() + a.spill_area + a.spill_ring_bytes), -1);
  EXPECT_THROW((void)r(host.data() + a.spill_area + a.spill_ring_bytes - 8, 16), schedule_error);
  EXPECT_FALSE(detail::ring_redirect{}.active());
  EXPECT_EQ(detail::ring_redirect{}.offset_of(host.data()), -1);
}

TEST(SpillSchedule, WithoutLatencyHidingOneBufferOnTheComputeStream) {
  auto const s = build_schedule(chain_stack(4, 4096), spill_strategy(false));
  EXPECT_EQ(s.arena.spill_buffers, 1u);
  for (auto const& o : s.ops) EXPECT_EQ(o.stream, stream_role::compute);
  EXPECT_EQ(s.event_count, 0u);
  std::size_t stored = 0;
  for (auto const& b : s.slots) stored += b.stored();
  EXPECT_EQ(stored, 6u);  // layers 0..2, two spilled slots each
  check_schedule(s);
}

// The spill ring's every buffer count, chunking and prefetch distance pass the checker.
TEST(SpillSchedule, EveryVariantPassesTheChecker) {
  for (std::uint32_t layers : {1u, 2u, 3u, 7u})
    for (std::uint32_t ring : {1u, 2u, 3u, 9u})
      for (std::size_t chunk : {std::size_t{0}, std::size_t{3000}})
        for (std::uint32_t dist : {0u, 1u, 3u})
          for (bool share : {true, false}) {
            auto how = spill_strategy(true, chunk, ring);
            how.pipeline.prefetch_distance = dist;
            how.buffers.share_phase_regions = share;
            how.buffers.storage_alignment = 512;
            auto const s = build_schedule(chain_stack(layers, 5000), how);
            EXPECT_NO_THROW(check_schedule(s)) << layers << " layers, ring " << ring << ", chunk " << chunk << "\n" << describe(s);
            EXPECT_EQ(s.arena.spill_buffers, std::min(layers, ring));
          }
}

TEST(SpillSchedule, ZeroSpillBuffersAndBadStorageAlignmentAreErrors) {
  auto how = spill_strategy();
  how.buffers.spill_buffers = 0;
  auto const m = error_of([&] { (void)build_schedule(chain_stack(3), how); });
  EXPECT_NE(m.find("zero spill buffers"), std::string::npos) << m;
  EXPECT_NE(m.find("tide::spill_buffers<N>"), std::string::npos) << m;
  how = spill_strategy();
  how.buffers.storage_alignment = 3000;
  auto const a = error_of([&] { (void)build_schedule(chain_stack(3), how); });
  EXPECT_NE(a.find("storage alignment 3000 is not a power of two"), std::string::npos) << a;
}

TEST(SpillSchedule, TypeLevelSpellingGivesTheValueForm) {
  using how = strategy_of<policy<tide::spill<slot_names<"input", "h">>, offload<slot_names<"act">>>,
                          buffers<spill_buffers<3>, storage_alignment<512>>>;
  auto const v = how::spec();
  ASSERT_EQ(v.policy.rules.size(), 2u);
  EXPECT_EQ(v.policy.rules[0].where, placement::spill);
  EXPECT_EQ(v.buffers.spill_buffers, 3u);
  EXPECT_EQ(v.buffers.storage_alignment, 512u);
  auto const code = to_cpp_types(v);
  EXPECT_NE(code.find("tide::spill<tide::slot_names<\"input\", \"h\">>"), std::string::npos) << code;
  EXPECT_NE(code.find("tide::spill_buffers<3>, tide::storage_alignment<512>"), std::string::npos) << code;
  // Decisions with spills come back as spill rules.
  auto const st = chain_stack(4);
  std::vector<placement> d(12, placement::keep);
  d[1] = d[4] = d[7] = placement::spill;
  auto const p = policy_from_decisions(st, d);
  ASSERT_EQ(p.rules.size(), 1u);
  EXPECT_EQ(p.rules[0].where, placement::spill);
  EXPECT_EQ(p.rules[0].last_layer, 3u);
}

// ---- the checker on spill programs -------------------------------------------------------------

namespace {
std::string rejected(schedule const& s) {
  try {
    check_schedule(s);
  } catch (schedule_error const& e) {
    return e.what();
  }
  return "accepted";
}
std::uint32_t find(schedule const& s, op_kind k, std::uint32_t layer, std::uint16_t slot = 0) {
  for (std::uint32_t i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].kind == k && s.ops[i].layer == layer && s.ops[i].slot == slot) return i;
  ADD_FAILURE() << "no " << to_string(k) << " L" << layer;
  return 0;
}
}  // namespace

TEST(SpillChecker, HostileEditsAreRejectedNamingTheProblem) {
  auto const good = build_schedule(chain_stack(5, 10000), spill_strategy());
  ASSERT_EQ(rejected(good), "accepted");
  {  // a load that reads another slot's file region
    auto s = good;
    s.ops[find(s, op_kind::load, 1)].file_offset += 4096;
    EXPECT_NE(rejected(s).find("storage geometry: op #"), std::string::npos) << rejected(s);
  }
  {  // two stored slots sharing a file region: the second store overwrites the first
    auto s = good;
    for (auto& b : s.slots)
      if (b.stored()) b.file_offset = 0;
    for (auto& o : s.ops)
      if (is_storage(o.kind)) o.file_offset = 0;
    s.arena.storage_bytes = 12288;  // the peak agrees: only the data flow can tell
    auto const m = rejected(s);
    EXPECT_TRUE(m.find("data flow") != std::string::npos || m.find("race") != std::string::npos) << m;
    EXPECT_NE(m.find("storage file bytes"), std::string::npos) << m;
  }
  {  // a prefetch that no longer waits for its load: it races the load into the ring
    auto s = good;
    auto const l = find(s, op_kind::load, 2);
    for (auto& o : s.ops) {
      if (o.kind != op_kind::prefetch || o.layer != 2) continue;
      for (std::uint32_t w = o.wait_begin; w < o.wait_begin + o.wait_count; ++w)
        if (s.waits[w] == l) s.waits[w] = find(s, op_kind::forward, 0, no_slot);
    }
    auto const m = rejected(s);
    EXPECT_NE(m.find("host bytes"), std::string::npos) << m;
  }
  {  // a store of a slot the ring holds (not stored)
    auto s = good;
    auto& o = s.ops[find(s, op_kind::store, 0)];
    o.layer = 4;  // layer 4 is held in the ring
    auto const m = rejected(s);
    EXPECT_NE(m.find("moves a slot that is not stored (spill, held in the spill ring)"), std::string::npos) << m;
  }
  {  // a stored slot without its load
    auto s = good;
    auto const l = find(s, op_kind::load, 0, 1);
    // Drop it by turning it into a second store: completeness names the missing load.
    s.ops[l].kind = op_kind::store;
    auto const m = rejected(s);
    EXPECT_NE(m.find("has two store ops"), std::string::npos) << m;
  }
  {  // a spilled slot off the storage alignment
    auto s = good;
    s.slots[0].host_offset += 64;
    auto const m = rejected(s);
    EXPECT_NE(m.find("not on the storage alignment 4096 direct I/O needs"), std::string::npos) << m;
  }
  {  // a kept slot claiming a file region
    auto s = build_schedule(chain_stack(2), strategy{});
    s.slots[0].file_offset = 0;
    EXPECT_NE(rejected(s).find("is keep but has a storage file offset"), std::string::npos) << rejected(s);
  }
  {  // a store on another stream than the loads': two transfers of one file at once
    auto s = good;
    s.ops[find(s, op_kind::store, 1)].stream = stream_role::d2h;
    EXPECT_NE(rejected(s).find("is a storage transfer on the d2h stream: stores and loads run on the storage stream"),
              std::string::npos)
        << rejected(s);
  }
  {  // a spilled slot outside the ring, with the peaks made to agree: a load would write past the arena
    auto s = good;
    s.arena.spill_ring_bytes = 0;
    EXPECT_NE(rejected(s).find("outside the spill ring"), std::string::npos) << rejected(s);
  }
  {  // a wrong storage peak
    auto s = good;
    s.arena.storage_bytes += 4096;
    EXPECT_NE(rejected(s).find("storage file bytes but the predicted peak is"), std::string::npos) << rejected(s);
  }
}

// ---- on the host backend: bitwise equal to keep-all --------------------------------------------

TEST(SpillRun, ChainWorkloadBitwiseEqualToKeepAllOnEveryPath) {
  temp_dir dir;
  auto const st = chain_stack(7);
  auto const keep = build_schedule(st, strategy{});
  host_backend plain;
  auto const want = workload::run_chain(plain, keep, 3);
  for (auto io : {storage_io::io_uring, storage_io::posix})
    for (bool hiding : {true, false})
      for (std::size_t chunk : {std::size_t{0}, std::size_t{40000}})
        for (std::uint32_t ring : {1u, 2u, 5u}) {
          auto const s = build_schedule(st, spill_strategy(hiding, chunk, ring));
          host_backend b(storage_in(dir.path, io));
          auto const got = workload::run_chain(b, s, 3, {.debug_checks = true, .check_schedule = true});
          EXPECT_EQ(got, want) << to_string(io) << (hiding ? " hiding" : " serial") << ", chunk " << chunk << ", ring " << ring;
          ASSERT_NE(b.storage(), nullptr);
          EXPECT_EQ(b.storage()->io(), io);
          EXPECT_TRUE(dir.empty()) << "the spill file must be unlinked while open";
        }
  EXPECT_TRUE(dir.empty());
}

// A paced link makes the copies slow enough that a missing wait would show; the storage stream
// runs beside them. Recorded timelines show the storage lane.
TEST(SpillRun, PacedLinkAndTimelineShowTheStorageLane) {
  temp_dir dir;
  auto const st = chain_stack(6, 200000);
  host_backend plain;
  auto const keep = build_schedule(st, strategy{});
  auto const want = workload::run_chain(plain, keep, 2);
  auto o = storage_in(dir.path);
  o.d2h = o.h2d = {.bytes_per_second = 2e9, .latency_us = 10};
  host_backend b(o);
  auto const s = build_schedule(st, spill_strategy());
  timeline t;
  auto const got = workload::run_chain(b, s, 2, {.debug_checks = true, .timeline = &t});
  EXPECT_EQ(got, want);
  auto const sum = summarize(t, s);
  EXPECT_GT(sum.storage_us, 0);
  EXPECT_EQ(sum.predicted_storage_bytes, s.arena.storage_bytes);
  EXPECT_LE(sum.measured_host_bytes, s.arena.host_bytes);
  std::size_t storage_spans = 0;
  for (auto const& sp : t.ops) storage_spans += sp.stream == stream_role::storage;
  EXPECT_EQ(storage_spans, 2u * 4u * 2u);  // 4 stored layers, 2 slots, a store and a load each
  std::ostringstream json;
  write_chrome_trace(json, t, s);
  EXPECT_NE(json.str().find("\"storage\""), std::string::npos);
}

// One backend, one file, schedules of different storage alignments (the file was opened for the
// first): each pads its transfers to its own regions, so no transfer spills into a neighbour's.
TEST(SpillRun, OneBackendServesSchedulesOfEveryAlignment) {
  temp_dir dir;
  auto const st = chain_stack(6, 3000);  // regions far smaller than 4096: padding matters
  host_backend plain;
  auto const keep = build_schedule(st, strategy{});
  auto const want = workload::run_chain(plain, keep, 2);
  host_backend b(storage_in(dir.path));
  for (std::size_t align : {4096u, 512u, 1024u, 8192u, 512u}) {
    auto how = spill_strategy();
    how.buffers.storage_alignment = align;
    auto const s = build_schedule(st, how);
    EXPECT_EQ(workload::run_chain(b, s, 2, {.debug_checks = true}), want) << "alignment " << align;
  }
  auto how = spill_strategy();
  how.buffers.storage_alignment = 256;  // a valid schedule, but below what direct I/O moves
  auto const s = build_schedule(st, how);
  auto const m = error_of([&] { executor e(b, s); });
  EXPECT_NE(m.find("storage alignment (256) is below the 512 bytes"), std::string::npos) << m;
}

// The debug checks poison the ring's copy once stored: a program whose prefetch reads the ring
// without the load would hand the backward poison, and the gradients would differ.
TEST(SpillRun, ThePoisonedRingExposesAMissingLoad) {
  temp_dir dir;
  auto const st = chain_stack(5, 8192);
  host_backend plain;
  auto const keep = build_schedule(st, strategy{});
  auto const want = workload::run_chain(plain, keep, 2);
  auto s = build_schedule(st, spill_strategy(false));  // one stream: ordering holds without the loads
  std::erase_if(s.ops, [](op const& o) { return o.kind == op_kind::load; });
  host_backend b(storage_in(dir.path));
  EXPECT_NE(workload::run_chain(b, s, 2, {.debug_checks = true, .check_schedule = false}), want);
}

// ---- refusals: no storage tier, a bad directory, a full disk ------------------------------------

TEST(SpillFailures, ABackendWithoutADirectoryRefusesAStoringSchedule) {
  auto const s = build_schedule(chain_stack(5), spill_strategy());
  host_backend b;
  auto const m = error_of([&] { executor e(b, s); });
  EXPECT_NE(m.find("host_backend_options::storage.directory"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(s.arena.storage_bytes) + " bytes of spilled slots"), std::string::npos) << m;
  EXPECT_EQ(b.device_held_bytes(), 0u);  // refused before any arena was taken
  // The backend still runs what stores nothing.
  auto const keep = build_schedule(chain_stack(5), strategy{});
  EXPECT_NO_THROW(workload::run_chain(b, keep, 1));
}

TEST(SpillFailures, UnwritableOrMissingDirectoriesNameThePath) {
  temp_dir dir;
  auto const file = dir.path / "a-file";
  { std::FILE* f = std::fopen(file.c_str(), "w"); std::fclose(f); }
  struct bad {
    std::string path, says;
  };
  // As root, permissions are not enforced: /proc is a directory no one can create files in.
  for (auto const& [path, says] : {bad{"/nonexistent/tide", "No such file or directory"}, bad{file.string(), "Not a directory"},
                                   bad{"/proc", "cannot create it"}}) {
    storage_options o{.directory = path, .quiet = true};
    auto const m = error_of([&] { spill_file f(o, 1 << 20, 4096); });
    EXPECT_NE(m.find("spill file in '" + path + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(says), std::string::npos) << m;
    auto const s = build_schedule(chain_stack(5), spill_strategy());
    host_backend_options ho;
    ho.storage = o;
    host_backend b(ho);
    auto const e = error_of([&] { executor x(b, s); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
  }
  storage_options none{.quiet = true};
  EXPECT_NE(error_of([&] { spill_file f(none, 4096, 4096); }).find("needs a directory"), std::string::npos);
}

// Preallocation finds a full disk when the executor is built: the error names the directory, the
// bytes asked and the bytes free, and the backend stays usable.
TEST(SpillFailures, AFullDiskIsFoundAtSetupNamingTheBytes) {
  temp_dir dir;
  storage_options o{.directory = dir.path.string(), .quiet = true};
  std::size_t const huge = std::size_t{1} << 52;  // 4 PiB
  auto const m = error_of([&] { spill_file f(o, huge, 4096); });
  EXPECT_NE(m.find("cannot reserve " + std::to_string(huge) + " bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("bytes free"), std::string::npos) << m;
  EXPECT_TRUE(m.find("No space left on device") != std::string::npos || m.find("File too large") != std::string::npos) << m;
  EXPECT_TRUE(dir.empty());
  // More than is free, by a little: refused before fallocate takes any of it, with the real free
  // space in the message (fallocate had filled the disk, then reported "0 bytes free").
  struct statvfs before {};
  ASSERT_EQ(::statvfs(dir.path.c_str(), &before), 0);
  auto const free_before = static_cast<std::size_t>(before.f_bavail) * before.f_frsize;
  auto const over = free_before + (std::size_t{64} << 20);
  auto const m_over = error_of([&] { spill_file f(o, over, 4096); });
  EXPECT_NE(m_over.find("No space left on device"), std::string::npos) << m_over;
  auto const at = m_over.find(" bytes free)");
  ASSERT_NE(at, std::string::npos) << m_over;
  auto const reported = std::stoull(m_over.substr(m_over.rfind('(', at) + 1));
  EXPECT_GT(reported, free_before / 2) << m_over;  // what was free, not what fallocate left
  EXPECT_TRUE(dir.empty());
  // Through a schedule: a slot too big for the disk.
  auto const big = stack_spec{}.append(layer_spec{"blk", {{"input", std::size_t{1} << 50, true}}}, 3);
  auto const s = build_schedule(big, strategy{.policy = {rule_spec{.where = placement::spill}},
                                              .buffers = {.spill_buffers = 1}});
  host_backend b(storage_in(dir.path));
  auto const e = error_of([&] { executor x(b, s); });
  EXPECT_NE(e.find("cannot reserve"), std::string::npos) << e;
  EXPECT_EQ(b.device_held_bytes(), 0u);
  EXPECT_EQ(b.host_held_bytes(), 0u);
  auto const small = build_schedule(chain_stack(4, 4096), spill_strategy());
  host_backend plain;
  auto const keep = build_schedule(chain_stack(4, 4096), strategy{});
  EXPECT_EQ(workload::run_chain(b, small, 2), workload::run_chain(plain, keep, 2));
}

TEST(SpillFile, RoundTripsOnEveryPathWithSmallRequestsAndAShallowQueue) {
  temp_dir dir;
  std::size_t const bytes = (3 << 20) + 4096 * 3;
  auto* buf = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  auto* back = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  for (std::size_t i = 0; i < bytes; ++i) buf[i] = static_cast<std::byte>((i * 131) ^ (i >> 12));
  for (auto io : {storage_io::io_uring, storage_io::posix})
    for (bool reg : {true, false})
      for (bool direct : {true, false}) {
        storage_options o{.directory = dir.path.string(), .io = io, .direct = direct, .request_bytes = 64 << 10, .queue_depth = 3, .quiet = true};
        spill_file f(o, 2 * bytes, 4096);
        if (reg) f.register_memory({buf, bytes});
        EXPECT_EQ(f.registered(), reg && io == storage_io::io_uring);
        EXPECT_EQ(f.direct(), direct);
        f.write(buf, 4096 * 7, bytes - 4096);
        std::memset(back, 0, bytes);
        f.read(std::span<std::byte>(back, bytes - 4096), 4096 * 7);
        EXPECT_EQ(std::memcmp(buf, back, bytes - 4096), 0) << f.description();
        EXPECT_NE(f.description().find(io == storage_io::io_uring ? "io_uring" : "pread/pwrite"), std::string::npos);
        // Off the alignment, or past the end: an error, nothing moved.
        EXPECT_NE(error_of([&] { f.write(buf, 100, 4096); }).find("does not lie on the alignment 4096"), std::string::npos);
        EXPECT_NE(error_of([&] { f.read(back, f.size(), 4096); }).find("within the file's"), std::string::npos);
      }
  std::free(buf);
  std::free(back);
  EXPECT_TRUE(dir.empty());
}

// Issue 40, item 7: queue_depth = 2^20 read "io_uring is not available: Invalid argument" (the
// kernel blamed for the option), and `automatic` then fell back to pread/pwrite without a word.
// Out of range on any path is an error naming the option and its range; in range works on all.
TEST(SpillFile, AQueueDepthOutOfRangeIsRefusedNamingTheOption) {
  temp_dir dir;
  for (auto io : {storage_io::automatic, storage_io::io_uring, storage_io::posix})
    for (std::uint32_t depth : {0u, spill_file::max_queue_depth + 1, 1u << 20, 0xffffffffu}) {
      storage_options o{.directory = dir.path.string(), .io = io, .queue_depth = depth, .quiet = true};
      auto const m = error_of([&] { spill_file f(o, 1 << 20, 4096); });
      EXPECT_NE(m.find("storage_options::queue_depth (" + std::to_string(depth) + ")"), std::string::npos) << to_string(io) << ": " << m;
      EXPECT_NE(m.find("between 1 and " + std::to_string(spill_file::max_queue_depth)), std::string::npos) << m;
      EXPECT_EQ(m.find("not available"), std::string::npos) << m;
      // Through a backend: the executor's setup says the same.
      auto ho = storage_in(dir.path, io);
      ho.storage.queue_depth = depth;
      host_backend bad(ho);
      auto const s = build_schedule(chain_stack(4, 4096), spill_strategy());
      auto const e = error_of([&] { executor x(bad, s); });
      EXPECT_NE(e.find("storage_options::queue_depth"), std::string::npos) << e;
    }
  for (std::uint32_t depth : {1u, spill_file::max_queue_depth}) {
    storage_options o{.directory = dir.path.string(), .queue_depth = depth, .quiet = true};
    EXPECT_EQ(error_of([&] { spill_file f(o, 1 << 20, 4096); }), "no error") << depth;
  }
  EXPECT_TRUE(dir.empty());
}

// Issue 40, item 1: a length off the alignment used to be rounded up, so that read(dst, 0, 100)
// wrote a whole block into a 100-byte buffer and write read one from it. Now the file moves only
// the caller's bytes: such a transfer is refused by name and the bytes around the buffer stay as
// they were; a buffer off the alignment is refused by name, not with O_DIRECT's "Invalid argument".
TEST(SpillFile, TransfersNeverTouchBytesOutsideTheCallersBuffer) {
  temp_dir dir;
  constexpr std::size_t block = 8192;
  auto* mem = static_cast<std::byte*>(std::aligned_alloc(4096, block));
  for (auto io : {storage_io::io_uring, storage_io::posix})
    for (bool direct : {true, false}) {
      storage_options o{.directory = dir.path.string(), .io = io, .direct = direct, .quiet = true};
      spill_file f(o, 1 << 20, 512);
      EXPECT_EQ(f.alignment(), 512u);
      std::memset(mem, 0x5a, block);
      f.write(mem, 0, 4096);  // the file's first block: 0x5a
      std::memset(mem, 0xab, block);  // the canary around a 100-byte buffer at mem
      auto const r = error_of([&] { f.read(mem, 0, 100); });
      EXPECT_NE(r.find("reading 100 bytes at offset 0: the length is not a multiple of the alignment 512"), std::string::npos) << r;
      EXPECT_NE(r.find("pad the buffer and the length to 512 bytes"), std::string::npos) << r;
      for (std::size_t i = 0; i < block; ++i) ASSERT_EQ(mem[i], std::byte{0xab}) << "byte " << i << " was overwritten: " << f.description();
      auto const w = error_of([&] { f.write(std::span<std::byte const>(mem, 100), 0); });
      EXPECT_NE(w.find("writing 100 bytes at offset 0: the length is not a multiple"), std::string::npos) << w;
      // Nothing was written: the file's block is still 0x5a.
      f.read(std::span<std::byte>(mem, 4096), 0);
      for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(mem[i], std::byte{0x5a}) << "byte " << i << ": " << f.description();
      // A buffer off the alignment: named, whether or not the file is open with O_DIRECT.
      auto const m = error_of([&] { f.read(mem + 8, 0, 512); });
      EXPECT_NE(m.find("the buffer's address is not a multiple of the alignment 512"), std::string::npos) << m;
      EXPECT_NE(m.find("std::align_val_t{512}"), std::string::npos) << m;
      EXPECT_EQ(m.find("Invalid argument"), std::string::npos) << m;
      EXPECT_NE(error_of([&] { f.write(mem + 8, 512, 512); }).find("not a multiple of the alignment 512"), std::string::npos);
      // Aligned exact lengths still move, from the span overloads too.
      std::memset(mem, 0x11, 512);
      f.write(std::span<std::byte const>(mem, 512), 512);
      std::memset(mem, 0, 512);
      f.read(mem, 512, 512);
      EXPECT_EQ(mem[0], std::byte{0x11});
      EXPECT_EQ(mem[511], std::byte{0x11});
    }
  std::free(mem);
}

// Issue 40, item 3: a drive with 4096-byte sectors took storage_alignment 512 at setup and failed
// the first store with "Invalid argument". The file's direct-I/O alignment is probed when it is
// opened (statx STATX_DIOALIGN, else the device's logical block size) and a smaller alignment is
// refused at setup, naming both numbers. No 4Kn device here: storage_options::direct_io_alignment
// says what such a device would, and the sysfs reader runs on a sysfs tree made in a directory.
TEST(SpillFile, ASmallerAlignmentThanTheDevicesDirectIoIsRefusedAtSetup) {
  temp_dir dir;
  storage_options o{.directory = dir.path.string(), .quiet = true};
  for (std::size_t bad : {std::size_t{0}, std::size_t{6000}, std::size_t{3}, std::size_t{1} << 31}) {
    o.direct_io_alignment = bad;
    auto const m = error_of([&] { spill_file f(o, 1 << 20, 4096); });
    EXPECT_NE(m.find("storage_options::direct_io_alignment (" + std::to_string(bad) + ") must be a power of two of at most 1 GiB"),
              std::string::npos) << m;
  }
  o.direct_io_alignment.reset();
  EXPECT_TRUE(dir.empty());
  {
    spill_file f(o, 1 << 20, 4096);
    if (f.direct() && f.direct_io_alignment()) {  // this machine's device, as the kernel reports it
      EXPECT_GE(*f.direct_io_alignment(), 1u);
      EXPECT_LE(*f.direct_io_alignment(), 4096u) << f.description();
      EXPECT_NE(f.description().find("direct I/O in blocks of " + std::to_string(*f.direct_io_alignment()) + " bytes"), std::string::npos)
          << f.description();
    }
  }
  o.direct_io_alignment = 4096;  // what a 4Kn drive reports
  auto const m = error_of([&] { spill_file f(o, 1 << 20, 512); });
  bool const direct_here = [&] {
    storage_options p = o;
    p.direct_io_alignment.reset();
    return spill_file(p, 4096, 4096).direct();
  }();
  if (direct_here) {
    EXPECT_NE(m.find("direct I/O on this file moves blocks of 4096 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("the storage alignment is 512"), std::string::npos) << m;
    EXPECT_NE(m.find("storage_alignment of 4096 or more"), std::string::npos) << m;
  } else {
    EXPECT_EQ(m, "no error");  // buffered I/O has no alignment to keep
  }
  EXPECT_TRUE(dir.empty());
  // Through a backend: refused when the executor is built, naming both numbers; the backend then
  // runs a schedule at the device's alignment, bitwise equal to keep-all.
  auto aligned = [](std::size_t a) {
    auto how = spill_strategy();
    how.buffers.storage_alignment = a;
    return build_schedule(chain_stack(5), how);
  };
  auto ho = storage_in(dir.path);
  ho.storage.direct_io_alignment = 4096;
  host_backend b(ho);
  host_backend plain;
  auto const keep = build_schedule(chain_stack(5), strategy{});
  auto const want = workload::run_chain(plain, keep, 2);
  auto const a512 = aligned(512), a1024 = aligned(1024), a4096 = aligned(4096), a8192 = aligned(8192);
  if (direct_here) {
    auto const e = error_of([&] { executor x(b, a512); });
    EXPECT_NE(e.find("moves blocks of 4096 bytes"), std::string::npos) << e;
    EXPECT_NE(e.find("the storage alignment is 512"), std::string::npos) << e;
    EXPECT_EQ(b.device_held_bytes(), 0u);
  }
  EXPECT_EQ(workload::run_chain(b, a4096, 2), want);
  EXPECT_EQ(workload::run_chain(b, a8192, 2), want);
  if (direct_here) {  // the open file takes no smaller alignment either
    auto const e = error_of([&] { workload::run_chain(b, a1024, 1); });
    EXPECT_NE(e.find("the storage alignment is 1024"), std::string::npos) << e;
  }
  EXPECT_EQ(workload::run_chain(b, a4096, 2), want);
}

// The fallback where statx does not report it: the logical block size of the file's device, from
// sysfs (a partition's from its disk's); a value that is no block size is not trusted.
TEST(SpillFile, TheDevicesLogicalBlockSizeIsReadFromSysfs) {
  temp_dir dir;
  auto const file = dir.path / "f";
  { std::FILE* f = std::fopen(file.c_str(), "w"); std::fclose(f); }
  int const fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  auto const id = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  auto write = [](fs::path const& p, std::string const& text) {
    fs::create_directories(p.parent_path());
    std::FILE* f = std::fopen(p.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  temp_dir sys;
  EXPECT_FALSE(detail::direct_io_alignment_from_sysfs(fd, sys.path.string()));  // nothing there
  // A whole disk.
  write(sys.path / "dev/block" / id / "queue/logical_block_size", "4096\n");
  auto a = detail::direct_io_alignment_from_sysfs(fd, sys.path.string());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->offset, 4096u);
  EXPECT_EQ(a->required(), 4096u);
  EXPECT_NE(a->source.find("logical block size in " + (sys.path / "dev/block" / id).string()), std::string::npos) << a->source;
  for (auto const* bad : {"0\n", "513\n", "abc\n", "256\n", "4096abc\n", "4096 8192\n"}) {
    write(sys.path / "dev/block" / id / "queue/logical_block_size", bad);
    EXPECT_FALSE(detail::direct_io_alignment_from_sysfs(fd, sys.path.string())) << bad;
  }
  // A partition: its link leads into its disk's directory, which has the queue.
  fs::remove_all(sys.path / "dev");
  write(sys.path / "devices/vdx/queue/logical_block_size", "4096\n");
  fs::create_directories(sys.path / "devices/vdx/vdx1");
  fs::create_directories(sys.path / "dev/block");
  fs::create_directory_symlink("../../devices/vdx/vdx1", sys.path / "dev/block" / id);
  a = detail::direct_io_alignment_from_sysfs(fd, sys.path.string());
  ASSERT_TRUE(a);
  EXPECT_EQ(a->offset, 4096u);
  ::close(fd);
  // The real probe on this machine's temp directory: statx's answer, or the device's, or nothing
  // (tmpfs), never below 1 or off a power of two.
  int const d = ::open(dir.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (auto const r = detail::probe_direct_io_alignment(d)) {
    EXPECT_EQ(r->offset & (r->offset - 1), 0u) << r->source;
  }
  ::close(d);
}

// ---- run by the seccomp variants of this binary (see main) ---------------------------------------

// A kernel or sandbox without io_uring: automatic falls back to pread/pwrite and says so; asking
// for io_uring is an error naming the reason.
TEST(NoIoUring, AutomaticFallsBackAndSaysSoIoUringIsAnError) {
  if (denied() != "io_uring_setup") GTEST_SKIP() << "run with TIDE_TEST_DENY=io_uring_setup";
  temp_dir dir;
  storage_options o{.directory = dir.path.string(), .quiet = true};
  spill_file f(o, 1 << 20, 4096);
  EXPECT_EQ(f.io(), storage_io::posix);
  EXPECT_NE(f.description().find("pread/pwrite"), std::string::npos) << f.description();
  o.io = storage_io::io_uring;
  auto const m = error_of([&] { spill_file g(o, 1 << 20, 4096); });
  EXPECT_NE(m.find("not available at run time"), std::string::npos) << m;  // not "not compiled in"
  EXPECT_NE(m.find("forbids io_uring"), std::string::npos) << m;
  // The fallback runs the chain workload bitwise equal to keep-all.
  auto const st = chain_stack(5);
  host_backend plain;
  auto const keep = build_schedule(st, strategy{});
  auto const want = workload::run_chain(plain, keep, 2);
  host_backend b(storage_in(dir.path));
  auto const spilled = build_schedule(st, spill_strategy());
  EXPECT_EQ(workload::run_chain(b, spilled, 2, {.debug_checks = true}), want);
  EXPECT_EQ(b.storage()->io(), storage_io::posix);
}

// A disk that fails mid-step: the step throws a storage_error naming the directory, the offset and
// the bytes; nothing hangs, the next step reports it again, and what stores nothing still runs.
TEST(FailingDisk, AFailedWriteFailsTheStepNamingPathAndBytes) {
  if (denied() != "pwrite64") GTEST_SKIP() << "run with TIDE_TEST_DENY=pwrite64";
  temp_dir dir;
  auto const st = chain_stack(5);
  auto const s = build_schedule(st, spill_strategy());
  host_backend b(storage_in(dir.path, storage_io::posix));
  executor e(b, s);
  workload::chain w(s);
  for (int step = 0; step < 2; ++step) {
    try {
      e.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); });
      ADD_FAILURE() << "the step succeeded though every write fails";
    } catch (storage_error const& x) {
      std::string const m = x.what();
      EXPECT_NE(m.find("spill file in '" + dir.path.string() + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("writing 102400 bytes at offset 0 failed: Input/output error"), std::string::npos) << m;
      EXPECT_EQ(x.code, EIO);
    }
  }
  EXPECT_EQ(e.steps(), 2u);
  host_backend plain;
  auto const keep = build_schedule(st, strategy{});
  EXPECT_EQ(workload::run_chain(b, keep, 2), workload::run_chain(plain, keep, 2));
}

int main(int argc, char** argv) {
  // Before anything starts a thread: the filter applies to the threads created after it.
  if (auto const d = denied(); !d.empty()) {
#ifdef TIDE_TEST_SECCOMP
    long const nr = d == "io_uring_setup" ? SYS_io_uring_setup : d == "pwrite64" ? SYS_pwrite64 : -1;
    if (nr < 0) return std::fprintf(stderr, "TIDE_TEST_DENY: unknown syscall %s\n", d.c_str()), 2;
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(nr), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((d == "pwrite64" ? EIO : ENOSYS) & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      std::perror("seccomp");
      return 77;  // a sandbox that forbids seccomp filters itself: skip
    }
#else
    return 77;
#endif
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
