// The stage-schedule fuzzer (libFuzzer, clang only): bytes become a stage of a pipeline (order,
// stages, stage, micro-batches, a stack with a carry, a policy per micro-batch, the copy pipeline
// and buffers), which build_stage_schedule must either refuse with a tide::error or build into a
// program the checker proves; then the rest of the bytes edit that program as a hostile user
// would (an op's kind, stream, layer, slot, offsets, bytes, pair place, event or waits; a stage
// table's entry), and the checker must either prove the edited program or refuse it with a
// tide::schedule_error: never crash, hang or read out of bounds. A finding prints what broke and
// aborts (libFuzzer keeps the input). Input format (read front to back; missing bytes read as 0):
//   byte 0: low bit order (0 gpipe, 1 1f1b), bit 1 latency hiding off, bit 2 chunks of 128 bytes,
//   bit 3 guard bytes, bit 4 interleaved (bit 5: 3 chunks, else 2); byte 1: stages (mod 5, 0
//   allowed: refused); byte 2: stage; byte 3: micro-batches (mod 9); byte 4: layers (1 to 3;
//   interleaved, per chunk, and a chunk count of 0 when the byte is 0xFF: refused); byte 5: the
//   carry's size / 8; then per layer two slot sizes / 8 (0: refused); then per micro-batch
//   (interleaved: per unit) a policy (mod 5: keep, offload, remat, spill-free mix, offload one
//   slot); then edits, 6 bytes each: target, op index (2 bytes), field, value (2 bytes).
#include <tide/core/stage_schedule.hpp>
#include <tide/host.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

struct reader {
  std::uint8_t const* data;
  std::size_t size, at = 0;
  std::uint32_t byte() { return at < size ? data[at++] : 0; }
  std::uint32_t u16() { return byte() | byte() << 8; }
  bool done() const { return at >= size; }
};

[[noreturn]] void finding(std::string const& what) {
  std::fprintf(stderr, "fuzz_stage_schedule: %s\n", what.c_str());
  std::abort();
}

tide::policy_spec policy(std::uint32_t k) {
  using tide::placement;
  tide::policy_spec p;
  switch (k % 5) {
    case 0: break;
    case 1: p = {tide::rule_spec{.where = placement::offload}}; break;
    case 2: p = {tide::rule_spec{.where = placement::remat}}; break;
    case 3: p = {tide::rule_spec{.where = placement::offload, .slots = {"a"}}, tide::rule_spec{.where = placement::remat}}; break;
    default: p = {tide::rule_spec{.where = placement::offload, .slots = {"b"}}}; break;
  }
  return p;
}

void edit(tide::schedule& s, reader& r) {
  auto const target = r.byte() % 4;
  auto const at = r.u16();
  auto const field = r.byte();
  auto const v = r.u16();
  auto const big = v == 0xFFFF ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(v) * 8;
  if (target == 3) {  // a stage table's entry
    auto const m = s.stage_instance_of.empty() ? 0 : at % s.stage_instance_of.size();
    switch (field % 7) {
      case 0: if (!s.stage_instance_of.empty()) s.stage_instance_of[m] = v; break;
      case 1: if (!s.stage_gradient.empty()) s.stage_gradient[m] = big; break;
      case 2: if (!s.stage_recompute_carry.empty()) s.stage_recompute_carry[m] = big; break;
      case 3: s.stage.spec.micro_batches = v; break;
      case 4: if (!s.stage_chunk_first.empty()) s.stage_chunk_first[at % s.stage_chunk_first.size()] = v; break;
      case 5: s.stage.spec.virtual_stages = v % 5; break;
      default: s.stage.spec.order = static_cast<tide::stage_order>(v % 4); break;
    }
    return;
  }
  if (target == 2 && !s.waits.empty()) {
    s.waits[at % s.waits.size()] = v;
    return;
  }
  if (s.ops.empty()) return;
  auto& o = s.ops[at % s.ops.size()];
  switch (field % 12) {
    case 0: o.kind = static_cast<tide::op_kind>(v % (tide::op_kind_count + 1)); break;
    case 1: o.stream = static_cast<tide::stream_role>(v % 6); break;
    case 2: o.layer = v; break;
    case 3: o.slot = static_cast<std::uint16_t>(v % 3 == 0 ? tide::gradient_slot : v % 3 == 1 ? tide::carry_slot : v); break;
    case 4: o.device_offset = big; break;
    case 5: o.host_offset = big; break;
    case 6: o.bytes = big; break;
    case 7: o.chunk = v % 5; o.chunks = v / 5 % 6; break;
    case 8: o.event = static_cast<std::int32_t>(v) - 1; break;
    case 9: o.wait_count = v % 4; break;
    case 10: o.carry_in = big; break;
    default: o.carry_out = big; break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  reader r{data, size};
  auto const flags = r.byte();
  tide::stage_spec spec{.stage = r.byte(), .stages = r.byte() % 5, .micro_batches = r.byte() % 9,
                        .order = flags & 1 ? tide::stage_order::one_f_one_b : tide::stage_order::gpipe};
  if (flags & 16) {
    spec.order = tide::stage_order::interleaved;
    spec.virtual_stages = flags & 32 ? 3 : 2;
  }
  auto const per = r.byte();
  tide::stage_chunks chunks;
  std::uint32_t layers = 1 + per % 3;
  if (spec.virtual_stages > 1) {
    for (std::uint32_t c = 0; c < spec.virtual_stages; ++c) chunks.layers.push_back(per == 0xFF && c == 1 ? 0 : 1 + (per + c) % 2);
    layers = 0;
    for (auto n : chunks.layers) layers += n;
  }
  tide::stack_spec st;
  st.carry = {"x", 8 * (r.byte() % 64)};
  // A type per layer (the first three's names as before; a name reused with other sizes is refused
  // by append, outside what is fuzzed here).
  char const* const names[] = {"t0", "t1", "t2", "t3", "t4", "t5"};
  for (std::uint32_t l = 0; l < layers; ++l)
    st.append(tide::layer_spec{names[l], {{"a", 8 * (r.byte() % 64)}, {"b", 8 * (r.byte() % 64)}}});
  tide::stage_policies pols;
  for (std::uint32_t k = 0; k < 5; ++k) {
    pols.policies.push_back(policy(k));
    pols.policies.back().allow_unused_rules = true;
  }
  for (std::uint32_t u = 0; u < spec.micro_batches * spec.virtual_stages; ++u) pols.of_micro_batch.push_back(r.byte() % 5);
  tide::strategy how;
  how.pipeline.latency_hiding = !(flags & 2);
  how.pipeline.chunk_bytes = flags & 4 ? 128 : 0;
  how.buffers.guard_bytes = flags & 8 ? 16 : 0;
  tide::schedule s;
  try {
    s = tide::build_stage_schedule(st, how, spec, pols, chunks);
  } catch (tide::error const&) {
    return 0;  // refused by name
  }
  try {
    (void)tide::check_schedule(s);
  } catch (std::exception const& e) {
    finding(std::string("a built stage schedule fails the checker: ") + e.what());
  }
  if (s.stage.instances != tide::peak_in_flight(spec)) finding("instance regions are not the peak in flight");
  for (int k = 0; k < 8 && !r.done(); ++k) edit(s, r);
  try {
    (void)tide::check_schedule(s);
  } catch (tide::schedule_error const&) {
  } catch (std::exception const& e) {
    finding(std::string("the checker threw something other than schedule_error: ") + e.what());
  }
  return 0;
}
