#pragma once
//! \file
//! `build_stage_schedule` (core/stage_schedule.hpp) and `make_stage_schedule`
//! (core/static_stage_schedule.hpp): one build per policy, laid side by side per micro-batch, with
//! waits wherever two micro-batches touch the same bytes. A constant expression, as
//! `build_schedule` is.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <tide/core/build.hpp>
#include <tide/core/check.hpp>
#include <tide/core/detail/check_structure.hpp>
#include <tide/core/error.hpp>
#include <tide/core/stage_order.hpp>
#include <tide/core/stage_policies.hpp>

namespace tide::detail {

[[noreturn]] inline void stage_fail(std::string const& m) { throw schedule_error("tide::build_stage_schedule: " + m); }

constexpr std::size_t stage_align(std::size_t x, std::size_t a) {
  std::size_t r = 0;
  if (!checked_align_up(x, a, r)) stage_fail("a region size overflows size_t when aligned");
  return r;
}
constexpr std::size_t stage_add(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  if (!checked_add(a, b, r)) stage_fail("the arena overflows size_t");
  return r;
}

//! The waits two micro-batches' conflicting accesses need: a new access waits, on each other
//! stream, for the latest op of another micro-batch that wrote bytes it touches, or read bytes it
//! writes. Per arena, the accesses so far are kept by what they touch (the byte range, the stream,
//! read or write, boundary or not), each with its latest op and the latest op of any other
//! micro-batch: what a query can want of them. Their count is that of the distinct regions, not of
//! the accesses, so a step of many micro-batches costs accesses times regions, not accesses squared.
struct stage_hazards {
  struct key {
    std::size_t begin, end;
    std::uint8_t stream;
    bool write, boundary;
    std::uint32_t op = 0, micro_batch = 0;  // the latest access
    bool older = false;                     // and, when there is one, the latest of another micro-batch
    std::uint32_t older_op = 0;
  };
  std::array<std::vector<key>, space_count> seen{};
  std::array<std::int64_t, stream_count> latest{};
  constexpr void begin_op() { latest.fill(-1); }
  // One micro-batch's own build is ordered already, but not against its boundary transfers.
  constexpr void touch(std::uint8_t space, std::size_t b, std::size_t e, bool write, std::uint32_t m, stream_role st, bool boundary) {
    for (auto const& x : seen[space]) {
      if (x.stream == static_cast<std::uint8_t>(st) || !(x.begin < e && b < x.end) || !(write || x.write)) continue;
      std::int64_t op = -1;  // none of another micro-batch
      if (x.micro_batch != m || x.boundary || boundary) op = x.op;
      else if (x.older) op = x.older_op;
      latest[x.stream] = std::max(latest[x.stream], op);
    }
  }
  // Ops are recorded in increasing order; returns the access's place, for `raise`.
  constexpr std::size_t record(std::uint8_t space, std::size_t b, std::size_t e, bool write, std::uint32_t m, stream_role st,
                               std::uint32_t op, bool boundary) {
    auto& v = seen[space];
    auto const s = static_cast<std::uint8_t>(st);
    std::size_t k = 0;
    while (k < v.size() && !(v[k].begin == b && v[k].end == e && v[k].stream == s && v[k].write == write && v[k].boundary == boundary)) ++k;
    if (k == v.size()) {
      v.push_back({b, e, s, write, boundary, op, m});
      return k;
    }
    auto& x = v[k];
    if (x.micro_batch != m) {
      x.older = true;
      x.older_op = x.op;
    }
    x.op = op;
    x.micro_batch = m;
    return k;
  }
  // The latest access at `k` is now op `op` (a send completed by the receive after it, which no
  // other op on its stream comes between).
  constexpr void raise(std::uint8_t space, std::size_t k, std::uint32_t op) { seen[space][k].op = op; }
};

//! The stage schedule `build_stage_schedule` returns, in a constant expression too.
// Vectors of trivial types are sized with an explicit value: libstdc++ 12 value-initializes
// `vector(n)` with `fill_n` over storage whose lifetime has not begun, which Clang refuses in a
// constant expression.
constexpr schedule build_stage(stack_spec const& stack, strategy const& how, stage_spec const& stage, stage_policies const& policies) {
  check_stage(stage);
  if (!stack.has_carry())
    stage_fail("the stack has no carry: a stage passes its carry (the boundary tensor) to the next stage and its gradient "
               "back; give the stack one (stack_spec::carry)");
  if (how.collectives.before_forward || how.collectives.before_backward || how.collectives.after_backward)
    stage_fail("collective hooks (collective_spec) are not taken in a stage schedule yet: reduce a data-parallel stage's "
               "gradients after the step, and build the stage without them");
  auto const M = stage.micro_batches;
  std::vector<policy_spec> const& given = policies.policies;
  auto const P = given.empty() ? std::size_t{1} : given.size();
  if (!policies.of_micro_batch.empty() && policies.of_micro_batch.size() != M)
    stage_fail("stage_policies::of_micro_batch has " + std::to_string(policies.of_micro_batch.size()) +
               " entries for " + std::to_string(M) + " micro-batches: give one per micro-batch, or none");
  if (given.empty() && !policies.of_micro_batch.empty())
    stage_fail("stage_policies::of_micro_batch is given but stage_policies::policies is empty: list the policies it indexes");
  std::vector<std::uint32_t> pol(M, 0);
  for (std::uint32_t m = 0; m < M && !policies.of_micro_batch.empty(); ++m) {
    pol[m] = policies.of_micro_batch[m];
    if (pol[m] >= P)
      stage_fail("stage_policies::of_micro_batch[" + std::to_string(m) + "] is " + std::to_string(pol[m]) + ", but there are " +
                 std::to_string(P) + " policies");
  }

  // One build per policy, with its byte accesses (the checker's, `collect_accesses`): what the
  // waits between micro-batches are derived from. The builds are the builder's, not proven one by
  // one here; the stage's program is proven whole by `check_schedule` (the executor runs it
  // unless NDEBUG: executor_options::check_schedule) and, over random stages, by the tests.
  std::vector<schedule> base(P);
  std::vector<checked_program> prog(P);
  std::vector<std::uint32_t> split(P, 0);
  std::vector<std::uint32_t> lead(P, 0);  // per build: the prefetches and loads that open its backward
  std::vector<std::uint8_t> used(P, 0);
  for (auto p : pol) used[p] = 1;
  auto build_all = [&](bool share) {
    for (std::size_t p = 0; p < P; ++p) {
      strategy h = how;
      if (!given.empty()) h.policy = given[p];
      h.buffers.share_phase_regions = share;
      try {
        base[p] = build_schedule(stack, h);
      } catch (schedule_error const& e) {
        stage_fail(std::string(given.empty() ? "the strategy" : "policy " + std::to_string(p)) + ": " + e.what());
      }
      auto const v = base[p].view();
      prog[p] = {};  // built again when the phase regions are unshared
      collect_accesses(v, prog[p], access_count(v));
      auto const& ops = base[p].ops;
      auto const n = static_cast<std::uint32_t>(ops.size());
      std::uint32_t k = 0;
      while (k < n && !(ops[k].kind == op_kind::backward || ops[k].kind == op_kind::recompute || ops[k].kind == op_kind::prefetch ||
                        ops[k].kind == op_kind::load || ops[k].kind == op_kind::advance))
        ++k;
      for (std::uint32_t j = k; j < n; ++j)
        if (ops[j].kind == op_kind::forward) stage_fail("internal: a forward after the first backward-phase op");  // the builder's order
      split[p] = k;
      while (k < n && (ops[k].kind == op_kind::prefetch || ops[k].kind == op_kind::load)) ++k;
      lead[p] = k - split[p];
      auto const& a = base[p].arena;
      if (base[p].carry.device_area + a.carry_bytes != a.device_bytes || a.backward_area < a.kept_bytes ||
          base[p].carry.device_area < a.backward_area)
        stage_fail("internal: the arena is not kept, forward, backward, carries in order");  // build_arena.hpp's layout
    }
  };
  // A stage runs one micro-batch's backward beside another's forward: where any of them copies,
  // the staging ring and the offload ring cannot share their bytes (buffer_spec::
  // share_phase_regions); where none does, only the compute stream touches the scratch they share.
  build_all(how.buffers.share_phase_regions);
  auto const copies = [&] {
    for (std::size_t p = 0; p < P; ++p)
      if (used[p])
        for (auto const& o : base[p].ops)
          if (is_copy(o.kind) || is_storage(o.kind)) return true;
    return false;
  };
  if (how.buffers.share_phase_regions && copies()) build_all(false);
  auto const L = stack.layer_count();
  auto const& b0 = base[0];
  auto const& buf = how.buffers;
  auto const guard = buf.guard_bytes;
  auto const carry = b0.carry.bytes;

  // Instance regions: a micro-batch takes a free one at its forward (one its policy used before,
  // else one large enough, else any) and gives it back after its backward; as many as are in
  // flight at once, each as large as the largest micro-batch it holds.
  std::vector<std::uint32_t> inst(M, 0);
  std::vector<std::size_t> need_kept, need_carries, need_host, need_file;
  {
    std::vector<std::uint8_t> busy;
    std::vector<std::int64_t> last_policy;
    for (std::uint32_t k = 0; k < 2 * M; ++k) {
      auto const e = stage_step_at(stage, k);
      auto const m = e.micro_batch;
      if (e.pass == stage_pass::backward) {
        busy[inst[m]] = 0;
        continue;
      }
      auto const p = pol[m];
      auto const& a = base[p].arena;
      std::size_t pick = busy.size();
      for (std::size_t i = 0; i < busy.size() && pick == busy.size(); ++i)
        if (!busy[i] && last_policy[i] == p) pick = i;
      for (std::size_t i = 0; i < busy.size() && pick == busy.size(); ++i)
        if (!busy[i] && need_kept[i] >= a.kept_bytes && need_carries[i] >= a.carry_bytes) pick = i;
      for (std::size_t i = 0; i < busy.size() && pick == busy.size(); ++i)
        if (!busy[i]) pick = i;
      if (pick == busy.size()) {
        busy.push_back(0);
        last_policy.push_back(-1);
        need_kept.push_back(0);
        need_carries.push_back(0);
        need_host.push_back(0);
        need_file.push_back(0);
      }
      busy[pick] = 1;
      last_policy[pick] = p;
      inst[m] = static_cast<std::uint32_t>(pick);
      need_kept[pick] = std::max(need_kept[pick], a.kept_bytes);
      need_carries[pick] = std::max(need_carries[pick], a.carry_bytes);
      need_host[pick] = std::max(need_host[pick], a.host_bytes);
      need_file[pick] = std::max(need_file[pick], a.storage_bytes);
    }
  }
  auto const instances = static_cast<std::uint32_t>(need_kept.size());

  // Layout: the shared area at 0, every build's forward area (offload sources, forward remat
  // scratch) in one region and its backward area (staging ring, recompute scratch) in the next, so
  // that a micro-batch's forward never writes where another's backward reads, whatever their
  // policies; then the instance regions: kept slots, carries, the boundary gradient. Host and
  // storage: a region per instance.
  std::size_t forward_region = 0, backward_region = 0;
  for (std::size_t p = 0; p < P; ++p) {
    if (!used[p]) continue;  // a policy no micro-batch has takes no room
    forward_region = std::max(forward_region, base[p].arena.backward_area - base[p].arena.kept_bytes);
    backward_region = std::max(backward_region, base[p].carry.device_area - base[p].arena.backward_area);
  }
  auto const dalign = buf.device_alignment;
  auto const halign = std::max(buf.host_alignment, buf.storage_alignment);
  forward_region = stage_align(forward_region, dalign);
  auto const area = stage_add(forward_region, stage_align(backward_region, dalign));
  auto const grad_region = stage_align(stage_add(carry, guard), dalign);
  std::vector<std::size_t> region(instances, 0), kept_of(instances, 0), host_at(instances, 0), file_at(instances, 0),
      grad_of(instances, 0);
  std::size_t device_bytes = area, host_end = 0, file_end = 0;
  for (std::uint32_t i = 0; i < instances; ++i) {
    region[i] = device_bytes;
    kept_of[i] = stage_align(need_kept[i], dalign);
    grad_of[i] = stage_add(stage_add(region[i], kept_of[i]), stage_align(need_carries[i], dalign));
    device_bytes = stage_add(grad_of[i], grad_region);
    host_at[i] = host_end;
    host_end = stage_add(host_end, stage_align(need_host[i], halign));
    file_at[i] = file_end;
    file_end = stage_add(file_end, stage_align(need_file[i], buf.storage_alignment));
  }

  schedule s;
  s.buffers = how.buffers;
  s.pipeline = how.pipeline;
  s.collectives = how.collectives;
  auto dev = [&](std::size_t p, std::uint32_t i, std::size_t x) {
    auto const& b = base[p];
    if (x < b.arena.kept_bytes) return region[i] + x;
    if (x < b.arena.backward_area) return x - b.arena.kept_bytes;
    if (x < b.carry.device_area) return forward_region + (x - b.arena.backward_area);
    return region[i] + kept_of[i] + (x - b.carry.device_area);
  };
  auto hst = [&](std::uint32_t i, std::size_t x) { return host_at[i] + x; };
  auto fil = [&](std::uint32_t i, std::size_t x) { return file_at[i] + x; };
  auto const last_stage = stage.stage + 1 == stage.stages;

  // Layers and slots, per micro-batch.
  if (std::uint64_t{M} * L >= std::numeric_limits<std::uint32_t>::max()) stage_fail("micro-batches times layers exceed 32-bit layer indices");
  s.layers.reserve(std::size_t{M} * L);
  for (std::uint32_t m = 0; m < M; ++m) {
    auto const p = pol[m];
    auto const i = inst[m];
    for (std::uint32_t l = 0; l < L; ++l) {
      auto lb = base[p].layers[l];
      auto const first = lb.first_slot;
      lb.first_slot = static_cast<std::uint32_t>(s.slots.size());
      s.layers.push_back(lb);
      for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
        auto b = base[p].slots[first + k];
        b.forward_offset = dev(p, i, b.forward_offset);
        b.backward_offset = dev(p, i, b.backward_offset);
        b.advance_offset = dev(p, i, b.advance_offset);
        if (b.recompute_offset != slot_binding::no_scratch) b.recompute_offset = dev(p, i, b.recompute_offset);
        if (b.where == placement::offload || b.where == placement::spill) b.host_offset = hst(i, b.host_offset);
        if (b.file_offset != slot_binding::not_stored) b.file_offset = fil(i, b.file_offset);
        s.slots.push_back(b);
      }
    }
  }

  // The program, in stage order.
  struct touched {
    std::uint8_t space;
    std::size_t begin, end;
    bool write;
    bool extra = false;  // not the base build's: the boundary gradient
  };
  std::vector<touched> acc;       // the op being emitted: its byte accesses
  std::vector<std::uint32_t> ws;  // ... and its waits
  stage_hazards hz;
  std::vector<std::vector<std::uint32_t>> at(M);  // per micro-batch: where its base ops went
  std::int64_t last_comm = -1;                     // the last op on the comm stream
  std::vector<std::pair<std::uint8_t, std::size_t>> send_entries;  // the hazard entries of the last op if a send
  auto emit = [&](op o, std::uint32_t m) {
    hz.begin_op();
    for (auto const& a : acc) hz.touch(a.space, a.begin, a.end, a.write, m, o.stream, is_boundary(o.kind) || a.extra);
    for (std::size_t t = 0; t < stream_count; ++t)
      if (hz.latest[t] >= 0) ws.push_back(static_cast<std::uint32_t>(hz.latest[t]));
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    o.wait_begin = static_cast<std::uint32_t>(s.waits.size());
    o.wait_count = static_cast<std::uint32_t>(ws.size());
    s.waits.insert(s.waits.end(), ws.begin(), ws.end());
    o.event = -1;
    auto const idx = static_cast<std::uint32_t>(s.ops.size());
    bool const pairs = o.kind == op_kind::receive && last_comm >= 0 && s.ops[static_cast<std::size_t>(last_comm)].kind == op_kind::send;
    if (pairs) {
      // Posted with the send before it: the pair completes here, so what waits for the send's
      // bytes waits for this op (nothing can have waited on the send yet: it was the last op).
      auto& snd = s.ops[static_cast<std::size_t>(last_comm)];
      snd.chunks = o.chunks = 2;
      snd.chunk = 0;
      o.chunk = 1;
      for (auto [sp, k] : send_entries) hz.raise(sp, k, idx);
    }
    s.ops.push_back(o);
    if (o.stream == stream_role::comm) send_entries.clear();  // ops on other streams may come between a pair's two
    for (auto const& a : acc) {
      auto const k = hz.record(a.space, a.begin, a.end, a.write, m, o.stream, idx, is_boundary(o.kind) || a.extra);
      if (o.kind == op_kind::send) send_entries.push_back({a.space, k});
    }
    if (o.stream == stream_role::comm) last_comm = idx;
    acc.clear();
    ws.clear();
    return idx;
  };
  auto boundary = [&](op_kind kind, std::uint16_t slot, std::uint32_t layer, std::size_t device, std::uint32_t m) {
    op o{kind, stream_role::comm, slot, layer};
    o.device_offset = device;
    o.bytes = carry;
    acc.push_back({device_space, device, device + carry, kind == op_kind::receive});
    emit(o, m);
  };
  auto run_base = [&](std::uint32_t m, std::uint32_t from, std::uint32_t to) {
    auto const p = pol[m];
    auto const i = inst[m];
    auto const& b = base[p];
    auto const& pr = prog[p];
    auto& where = at[m];
    where.resize(b.ops.size(), 0);
    for (std::uint32_t j = from; j < to; ++j) {
      op o = b.ops[j];
      auto const local_layer = o.layer;
      o.layer += m * L;
      if (is_copy(o.kind)) {
        o.device_offset = dev(p, i, o.device_offset);
        o.host_offset = hst(i, o.host_offset);
      } else if (is_storage(o.kind)) {
        o.host_offset = hst(i, o.host_offset);
        o.file_offset = fil(i, o.file_offset);
      }
      if (o.carry_in != no_carry) o.carry_in = dev(p, i, o.carry_in);
      if (o.carry_out != no_carry) o.carry_out = dev(p, i, o.carry_out);
      for (auto k = b.ops[j].wait_begin; k < b.ops[j].wait_begin + b.ops[j].wait_count; ++k) ws.push_back(where[b.waits[k]]);
      for (auto k = pr.first_access[j]; k < pr.first_access[j + 1]; ++k) {
        auto const& a = pr.accesses[k];
        auto const len = a.end - a.begin;
        auto const x = a.host == device_space ? dev(p, i, a.begin) : a.host == host_space ? hst(i, a.begin) : fil(i, a.begin);
        acc.push_back({a.host, x, x + len, a.write});
      }
      // A backward updates its micro-batch's boundary gradient; the last stage's turn (in its
      // last layer's forward) seeds it.
      if (o.kind == op_kind::backward || (last_stage && o.kind == op_kind::forward && local_layer + 1 == L))
        acc.push_back({device_space, grad_of[i], grad_of[i] + carry, true, true});
      where[j] = emit(o, m);
    }
  };
  std::vector<std::uint8_t> led(M, 0);  // per micro-batch: its backward's lead-in was emitted early
  for (std::uint32_t k = 0; k < 2 * M; ++k) {
    auto const e = stage_step_at(stage, k);
    auto const m = e.micro_batch;
    auto const p = pol[m];
    auto const i = inst[m];
    auto const& b = base[p];
    // A backward right after a forward gets its first prefetches (and loads) before that forward,
    // so that they overlap it, as PipeOffload reloads in the last free slot before the backward.
    if (e.pass == stage_pass::forward && k + 1 < 2 * M) {
      auto const next = stage_step_at(stage, k + 1);
      // (Not its own backward: that one's prefetches wait for this forward's offloads.)
      if (next.pass == stage_pass::backward && next.micro_batch != m && lead[pol[next.micro_batch]] > 0) {
        auto const q = pol[next.micro_batch];
        run_base(next.micro_batch, split[q], split[q] + lead[q]);
        led[next.micro_batch] = 1;
      }
    }
    if (e.pass == stage_pass::forward) {
      boundary(op_kind::receive, carry_slot, m * L, dev(p, i, b.carry.input_offset()), m);
      run_base(m, 0, split[p]);
      if (!last_stage) boundary(op_kind::send, carry_slot, m * L + L - 1, dev(p, i, b.carry.output_offset()), m);
    } else {
      if (!last_stage) boundary(op_kind::receive, gradient_slot, m * L + L - 1, grad_of[i], m);
      run_base(m, split[p] + (led[m] ? lead[p] : 0), static_cast<std::uint32_t>(b.ops.size()));
      boundary(op_kind::send, gradient_slot, m * L, grad_of[i], m);
      std::vector<std::uint32_t>().swap(at[m]);
    }
  }
  if (s.ops.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    stage_fail("the stage's program has more ops than 31-bit op indices name");
  // Events: one per op something waits on.
  std::int32_t events = 0;
  for (auto w : s.waits)
    if (s.ops[w].event < 0) s.ops[w].event = events++;
  s.event_count = static_cast<std::uint32_t>(events);

  // Arenas, the carry and the stage.
  std::size_t host_bytes = 0, storage_bytes = 0;
  for (std::uint32_t m = 0; m < M; ++m) {
    auto const& a = base[pol[m]].arena;
    if (a.host_bytes > 0) host_bytes = std::max(host_bytes, hst(inst[m], a.host_bytes));
    if (a.storage_bytes > 0) storage_bytes = std::max(storage_bytes, fil(inst[m], a.storage_bytes));
  }
  s.arena = b0.arena;
  s.arena.device_bytes = device_bytes;
  s.arena.host_bytes = host_bytes;
  s.arena.storage_bytes = storage_bytes;
  s.arena.kept_bytes = b0.arena.kept_bytes;  // instance 0's, at instance_area
  s.arena.forward_area = 0;
  s.arena.backward_area = forward_region;
  s.arena.recompute_carry_offset = no_carry;  // per micro-batch: stage_binding::recompute_carry
  s.carry = b0.carry;
  s.carry.device_area = dev(0, 0, b0.carry.device_area);
  s.stage = {.spec = stage, .layers = L, .instances = instances};
  s.stage_instance_of = inst;
  s.stage_gradient.resize(M, 0);
  for (std::uint32_t m = 0; m < M; ++m) s.stage_gradient[m] = grad_of[inst[m]];
  s.stage_recompute_carry.resize(M, 0);
  for (std::uint32_t m = 0; m < M; ++m) {
    auto const r = base[pol[m]].arena.recompute_carry_offset;
    s.stage_recompute_carry[m] = r == no_carry ? no_carry : dev(pol[m], inst[m], r);
  }
  return s;
}

}  // namespace tide::detail
