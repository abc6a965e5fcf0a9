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
#include <tide/core/stage_partition.hpp>
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
  // A group of boundary transfers completes at its last op, `last`: what its members' accesses
  // at `k` name (as the latest, or the latest of another micro-batch) becomes `last`.
  constexpr void raise(std::uint8_t space, std::size_t k, std::vector<std::uint32_t> const& members, std::uint32_t last) {
    auto& x = seen[space][k];
    auto const member = [&](std::uint32_t o) { return std::find(members.begin(), members.end(), o) != members.end(); };
    if (member(x.op)) x.op = last;
    if (x.older && member(x.older_op)) x.older_op = last;
  }
};

//! The stage schedule `build_stage_schedule` returns, in a constant expression too.
// Vectors of trivial types are sized with an explicit value: libstdc++ 12 value-initializes
// `vector(n)` with `fill_n` over storage whose lifetime has not begun, which Clang refuses in a
// constant expression.
constexpr schedule build_stage(stack_spec const& stack, strategy const& how, stage_spec const& stage, stage_policies const& policies,
                               stage_chunks const& chunks = {}) {
  check_stage(stage);
  if (!stack.has_carry())
    stage_fail("the stack has no carry: a stage passes its carry (the boundary tensor) to the next stage and its gradient "
               "back; give the stack one (stack_spec::carry)");
  if (how.collectives.before_forward || how.collectives.before_backward || how.collectives.after_backward)
    stage_fail("collective hooks (collective_spec) are not taken in a stage schedule yet: reduce a data-parallel stage's "
               "gradients after the step, and build the stage without them");
  auto const M = stage.micro_batches;
  auto const V = stage.virtual_stages;
  auto const U = stage.units();
  auto const L = stack.layer_count();
  auto const str = [](std::uint64_t x) { return std::to_string(x); };

  // The chunks: v groups of the stage's layers, in turn.
  std::vector<std::uint32_t> first(V + 1, 0);
  if (chunks.layers.empty()) {
    if (L % V != 0)
      stage_fail("the stage's " + str(L) + " layers do not split evenly into its " + str(V) +
                 " chunks: give each chunk's layer count (stage_chunks, or tide::chunks_of a partition)");
    for (std::uint32_t c = 0; c < V; ++c) first[c + 1] = first[c] + L / V;
  } else {
    if (chunks.layers.size() != V)
      stage_fail("stage_chunks::layers has " + str(chunks.layers.size()) + " entries for " + str(V) +
                 " chunks (stage_spec::virtual_stages): give one layer count per chunk");
    for (std::uint32_t c = 0; c < V; ++c) {
      if (chunks.layers[c] == 0) stage_fail("chunk " + str(c) + " of the stage gets no layer (stage_chunks): give every chunk at least one");
      if (chunks.layers[c] > L - first[c])
        stage_fail("stage_chunks gives the chunks more layers than the stage's stack has (" + str(L) + ")");
      first[c + 1] = first[c] + chunks.layers[c];
    }
    if (first[V] != L)
      stage_fail("stage_chunks gives the chunks " + str(first[V]) + " layers, but the stage's stack has " + str(L) +
                 ": the counts must add up to the stack's layers");
  }
  std::vector<policy_spec> const& given = policies.policies;
  auto const P = given.empty() ? std::size_t{1} : given.size();
  auto const per = V > 1 ? " (chunk, micro-batch) units" : " micro-batches";
  if (!policies.of_micro_batch.empty() && policies.of_micro_batch.size() != U)
    stage_fail("stage_policies::of_micro_batch has " + str(policies.of_micro_batch.size()) + " entries for " + str(U) + per +
               ": give one per" + (V > 1 ? " unit (chunk-major: tide::stage_unit)" : " micro-batch") + ", or none");
  if (given.empty() && !policies.of_micro_batch.empty())
    stage_fail("stage_policies::of_micro_batch is given but stage_policies::policies is empty: list the policies it indexes");
  std::vector<std::uint32_t> pol(U, 0);
  for (std::uint32_t u = 0; u < U && !policies.of_micro_batch.empty(); ++u) {
    pol[u] = policies.of_micro_batch[u];
    if (pol[u] >= P)
      stage_fail("stage_policies::of_micro_batch[" + str(u) + "] is " + str(pol[u]) + ", but there are " + str(P) + " policies");
  }
  auto const chunk_of_unit = [&](std::uint32_t u) { return u / M; };
  auto const mb_of_unit = [&](std::uint32_t u) { return u % M; };

  // The builds: one per (policy, chunk) some unit has, with its byte accesses (the checker's,
  // `collect_accesses`): what the waits between units are derived from. A chunk is built as a
  // stack of its own layers, under its policy's rules with their layer bounds moved onto the
  // chunk (a rule's layers are the stage's); chunks of the same layer types under the same rules
  // share a build. The builds are the builder's, not proven one by one here; the stage's program
  // is proven whole by `check_schedule` (the executor runs it unless NDEBUG:
  // executor_options::check_schedule) and, over random stages, by the tests.
  auto const policy_of = [&](std::size_t p) -> policy_spec const& { return given.empty() ? how.policy : given[p]; };
  auto const on_chunk = [&](policy_spec const& p, std::uint32_t c) {
    policy_spec q;
    q.allow_unused_rules = true;  // unused is judged over the whole stage, below
    for (auto r : p.rules) {
      auto const lo = std::max(resolve_layer(r.first_layer, L), first[c]), hi = std::min(resolve_layer(r.last_layer, L), first[c + 1]);
      if (lo >= hi) continue;  // it selects no layer of this chunk: first-match order is the same without it
      r.first_layer = lo - first[c];
      r.last_layer = hi - first[c];
      q.rules.push_back(std::move(r));
    }
    return q;
  };
  auto const same_rules = [](policy_spec const& x, policy_spec const& y) {
    if (x.rules.size() != y.rules.size()) return false;
    for (std::size_t i = 0; i < x.rules.size(); ++i) {
      auto const &r = x.rules[i], &t = y.rules[i];
      if (r.where != t.where || r.slots != t.slots || r.min_bytes != t.min_bytes || r.first_layer.resolve(all_layers) != t.first_layer.resolve(all_layers) ||
          r.last_layer.resolve(all_layers) != t.last_layer.resolve(all_layers))
        return false;
    }
    return true;
  };
  struct build_key {
    std::uint32_t policy = 0, chunk = 0;
    policy_spec rules{};  // interleaved: the policy on the chunk
  };
  std::vector<build_key> keys;
  std::vector<std::uint8_t> has_policy(P, 0);
  for (auto p : pol) has_policy[p] = 1;
  std::vector<std::uint32_t> key_of(P * V, 0);  // per (policy, chunk) some unit has
  for (std::uint32_t p = 0; p < P; ++p) {
    if (!has_policy[p]) continue;
    if (V > 1) {  // the policy's own issues (an unused rule, an empty range) over the stage's stack
      strategy h = how;
      h.policy = policy_of(p);
      try {
        static_cast<void>(build_schedule(stack, h));
      } catch (schedule_error const& e) {
        stage_fail(std::string(given.empty() ? "the strategy" : "policy " + str(p)) + ": " + e.what());
      }
    }
    for (std::uint32_t c = 0; c < V; ++c) {
      auto rules = V > 1 ? on_chunk(policy_of(p), c) : policy_spec{};
      auto const n = first[c + 1] - first[c];
      std::size_t k = 0;
      while (k < keys.size() &&
             !(keys[k].policy == p && first[keys[k].chunk + 1] - first[keys[k].chunk] == n &&
               std::equal(stack.layer_types.begin() + first[c], stack.layer_types.begin() + first[c + 1],
                          stack.layer_types.begin() + first[keys[k].chunk]) &&
               same_rules(keys[k].rules, rules)))
        ++k;
      if (k == keys.size()) keys.push_back({p, c, std::move(rules)});
      key_of[p * V + c] = static_cast<std::uint32_t>(k);
    }
  }
  auto const B = keys.size();
  std::vector<std::uint32_t> bld(U, 0);  // per unit: its build
  for (std::uint32_t u = 0; u < U; ++u) bld[u] = key_of[pol[u] * V + chunk_of_unit(u)];
  auto const part = [&](std::uint32_t c) {  // chunk c's layers as a stack
    stack_spec r;
    r.types = stack.types;
    r.carry = stack.carry;
    r.independent_layers = stack.independent_layers;
    r.layer_types.assign(stack.layer_types.begin() + first[c], stack.layer_types.begin() + first[c + 1]);
    return r;
  };
  std::vector<schedule> base(B);
  std::vector<checked_program> prog(B);
  std::vector<std::uint32_t> split(B, 0);
  std::vector<std::uint32_t> lead(B, 0);  // per build: the prefetches and loads that open its backward
  auto build_all = [&](bool share) {
    for (std::size_t b = 0; b < B; ++b) {
      auto const p = keys[b].policy;
      strategy h = how;
      h.policy = V > 1 ? keys[b].rules : policy_of(p);
      h.buffers.share_phase_regions = share;
      try {
        if (V == 1) base[b] = build_schedule(stack, h);  // (not `?:`: its copy of `stack` is a temporary GCC 12's
        else base[b] = build_schedule(part(keys[b].chunk), h);  // constant evaluator frees twice)
      } catch (schedule_error const& e) {
        stage_fail(std::string(given.empty() ? "the strategy" : "policy " + str(p)) + ": " + e.what());
      }
      for (auto const& x : base[b].slots)
        if (x.where == placement::spill)
          stage_fail(std::string(given.empty() ? "the strategy" : "policy " + str(p)) +
                     " spills slots to storage, which a stage schedule does not take yet (each unit in flight would need a spill "
                     "ring of its own): offload them to pinned host memory instead (placement::offload)");
      auto const v = base[b].view();
      prog[b] = {};  // built again when the phase regions are unshared
      collect_accesses(v, prog[b], access_count(v));
      auto const& ops = base[b].ops;
      auto const n = static_cast<std::uint32_t>(ops.size());
      std::uint32_t k = 0;
      while (k < n && !(ops[k].kind == op_kind::backward || ops[k].kind == op_kind::recompute || ops[k].kind == op_kind::prefetch ||
                        ops[k].kind == op_kind::load || ops[k].kind == op_kind::advance))
        ++k;
      for (std::uint32_t j = k; j < n; ++j)
        if (ops[j].kind == op_kind::forward) stage_fail("internal: a forward after the first backward-phase op");  // the builder's order
      split[b] = k;
      while (k < n && (ops[k].kind == op_kind::prefetch || ops[k].kind == op_kind::load)) ++k;
      lead[b] = k - split[b];
      auto const& a = base[b].arena;
      if (base[b].carry.device_area + a.carry_bytes != a.device_bytes || a.backward_area < a.kept_bytes ||
          base[b].carry.device_area < a.backward_area)
        stage_fail("internal: the arena is not kept, forward, backward, carries in order");  // build_arena.hpp's layout
    }
  };
  // A stage runs one unit's backward beside another's forward: where any of them copies, the
  // staging ring and the offload ring cannot share their bytes (buffer_spec::share_phase_regions);
  // where none does, only the compute stream touches the scratch they share.
  build_all(how.buffers.share_phase_regions);
  auto const copies = [&] {
    for (std::size_t b = 0; b < B; ++b)
      for (auto const& o : base[b].ops)
        if (is_copy(o.kind) || is_storage(o.kind)) return true;
    return false;
  };
  if (how.buffers.share_phase_regions && copies()) build_all(false);
  auto const& b0 = base[0];
  auto const& buf = how.buffers;
  auto const guard = buf.guard_bytes;
  auto const carry = b0.carry.bytes;

  // Instance regions: a unit takes a free one at its forward (one its build used before, else
  // one large enough, else any) and gives it back after its backward; as many as are in flight at
  // once, each as large as the largest unit it holds.
  std::vector<std::uint32_t> inst(U, 0);
  std::vector<std::size_t> need_kept, need_carries, need_host, need_file;
  auto const unit_at = [&](stage_step const& e) { return stage_unit(stage, e.chunk, e.micro_batch); };
  {
    std::vector<std::uint8_t> busy;
    std::vector<std::int64_t> last_build;
    for (std::uint32_t k = 0; k < 2 * U; ++k) {
      auto const e = stage_step_at(stage, k);
      auto const u = unit_at(e);
      if (e.pass == stage_pass::backward) {
        busy[inst[u]] = 0;
        continue;
      }
      auto const b = bld[u];
      auto const& a = base[b].arena;
      std::size_t pick = busy.size();
      for (std::size_t i = 0; i < busy.size() && pick == busy.size(); ++i)
        if (!busy[i] && last_build[i] == b) pick = i;
      for (std::size_t i = 0; i < busy.size() && pick == busy.size(); ++i)
        if (!busy[i] && need_kept[i] >= a.kept_bytes && need_carries[i] >= a.carry_bytes) pick = i;
      for (std::size_t i = 0; i < busy.size() && pick == busy.size(); ++i)
        if (!busy[i]) pick = i;
      if (pick == busy.size()) {
        busy.push_back(0);
        last_build.push_back(-1);
        need_kept.push_back(0);
        need_carries.push_back(0);
        need_host.push_back(0);
        need_file.push_back(0);
      }
      busy[pick] = 1;
      last_build[pick] = b;
      inst[u] = static_cast<std::uint32_t>(pick);
      need_kept[pick] = std::max(need_kept[pick], a.kept_bytes);
      need_carries[pick] = std::max(need_carries[pick], a.carry_bytes);
      need_host[pick] = std::max(need_host[pick], a.host_bytes);
      need_file[pick] = std::max(need_file[pick], a.storage_bytes);
    }
  }
  auto const instances = static_cast<std::uint32_t>(need_kept.size());

  // Layout: the shared area at 0, every build's forward area (offload sources, forward remat
  // scratch) in one region and its backward area (staging ring, recompute scratch) in the next, so
  // that a unit's forward never writes where another's backward reads, whatever their policies;
  // then the instance regions: kept slots, carries, the boundary gradient. Host and storage: a
  // region per instance.
  std::size_t forward_region = 0, backward_region = 0;
  for (std::size_t b = 0; b < B; ++b) {  // every build is some unit's
    forward_region = std::max(forward_region, base[b].arena.backward_area - base[b].arena.kept_bytes);
    backward_region = std::max(backward_region, base[b].carry.device_area - base[b].arena.backward_area);
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
  auto dev = [&](std::size_t b, std::uint32_t i, std::size_t x) {
    auto const& a = base[b];
    if (x < a.arena.kept_bytes) return region[i] + x;
    if (x < a.arena.backward_area) return x - a.arena.kept_bytes;
    if (x < a.carry.device_area) return forward_region + (x - a.arena.backward_area);
    return region[i] + kept_of[i] + (x - a.carry.device_area);
  };
  auto hst = [&](std::uint32_t i, std::size_t x) { return host_at[i] + x; };
  auto fil = [&](std::uint32_t i, std::size_t x) { return file_at[i] + x; };
  auto const last_stage = stage.stage + 1 == stage.stages;
  // Unit u's chunk's layer `l` as a schedule layer.
  auto const layer_at = [&](std::uint32_t u, std::uint32_t l) { return mb_of_unit(u) * L + first[chunk_of_unit(u)] + l; };
  auto const chunk_layers = [&](std::uint32_t u) { return first[chunk_of_unit(u) + 1] - first[chunk_of_unit(u)]; };
  // The unit that ends the model (the last stage's last chunk) turns; the others send on.
  auto const ends_model = [&](std::uint32_t u) { return last_stage && chunk_of_unit(u) + 1 == V; };

  // Layers and slots: per micro-batch, the stage's layers (its chunks' in turn).
  if (std::uint64_t{M} * L >= std::numeric_limits<std::uint32_t>::max()) stage_fail("micro-batches times layers exceed 32-bit layer indices");
  s.layers.reserve(std::size_t{M} * L);
  for (std::uint32_t m = 0; m < M; ++m)
    for (std::uint32_t c = 0; c < V; ++c) {
      auto const u = stage_unit(stage, c, m);
      auto const b = bld[u];
      auto const i = inst[u];
      for (std::uint32_t l = 0; l < first[c + 1] - first[c]; ++l) {
        auto lb = base[b].layers[l];
        auto const f = lb.first_slot;
        lb.first_slot = static_cast<std::uint32_t>(s.slots.size());
        s.layers.push_back(lb);
        for (std::uint32_t k = 0; k < lb.slot_count; ++k) {
          auto x = base[b].slots[f + k];
          x.forward_offset = dev(b, i, x.forward_offset);
          x.backward_offset = dev(b, i, x.backward_offset);
          x.advance_offset = dev(b, i, x.advance_offset);
          if (x.recompute_offset != slot_binding::no_scratch) x.recompute_offset = dev(b, i, x.recompute_offset);
          if (x.where == placement::offload || x.where == placement::spill) x.host_offset = hst(i, x.host_offset);
          if (x.file_offset != slot_binding::not_stored) x.file_offset = fil(i, x.file_offset);
          s.slots.push_back(x);
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
  std::vector<std::vector<std::uint32_t>> at(U);  // per unit: where its base ops went
  // The open group of boundary transfers (posted together on the comm stream, complete at the
  // last), and its members' hazard entries.
  std::vector<std::uint32_t> group;
  std::vector<std::pair<std::uint8_t, std::size_t>> group_entries;
  auto close_group = [&] {
    if (group.empty()) return;
    auto const n = static_cast<std::uint16_t>(group.size());
    for (std::uint16_t k = 0; k < n; ++k) {
      s.ops[group[k]].chunks = n;
      s.ops[group[k]].chunk = k;
    }
    for (auto [sp, k] : group_entries) hz.raise(sp, k, group, group.back());
    group.clear();
    group_entries.clear();
  };
  auto waits_now = [&](op const& o, std::uint32_t u) {
    hz.begin_op();
    for (auto const& a : acc) hz.touch(a.space, a.begin, a.end, a.write, u, o.stream, is_boundary(o.kind) || a.extra);
  };
  // `joins`: a boundary transfer posted with the open group (which it opens if none is).
  auto emit = [&](op o, std::uint32_t u, bool joins = false) {
    waits_now(o, u);
    bool on_member = false;  // a wait on a member of the open group, which completes only at its end
    for (std::size_t t = 0; t < stream_count; ++t)
      if (hz.latest[t] >= 0 && std::find(group.begin(), group.end(), static_cast<std::uint32_t>(hz.latest[t])) != group.end())
        on_member = true;
    // The group ends before an op that waits on a member, and before a comm-stream op that does
    // not join it (a group's ops are consecutive on the comm stream); ops on other streams may come
    // between its members.
    // An interleaved round's group split in two would bring the ring's deadlock back.
    if (on_member && joins && stage.order == stage_order::interleaved)
      stage_fail("internal: a transfer of an interleaved round touches bytes another of its group does");
    if (!group.empty() && (on_member || (!joins && o.stream == stream_role::comm))) {
      close_group();
      if (on_member) waits_now(o, u);
    }
    for (std::size_t t = 0; t < stream_count; ++t)
      if (hz.latest[t] >= 0) ws.push_back(static_cast<std::uint32_t>(hz.latest[t]));
    std::sort(ws.begin(), ws.end());
    ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
    o.wait_begin = static_cast<std::uint32_t>(s.waits.size());
    o.wait_count = static_cast<std::uint32_t>(ws.size());
    s.waits.insert(s.waits.end(), ws.begin(), ws.end());
    o.event = -1;
    auto const idx = static_cast<std::uint32_t>(s.ops.size());
    s.ops.push_back(o);
    for (auto const& a : acc) {
      auto const k = hz.record(a.space, a.begin, a.end, a.write, u, o.stream, idx, is_boundary(o.kind) || a.extra);
      if (joins) group_entries.push_back({a.space, k});
    }
    if (joins) group.push_back(idx);
    acc.clear();
    ws.clear();
    return idx;
  };
  auto boundary = [&](op_kind kind, std::uint16_t slot, std::uint32_t layer, std::size_t device, std::uint32_t u, bool joins) {
    op o{kind, stream_role::comm, slot, layer};
    o.device_offset = device;
    o.bytes = carry;
    acc.push_back({device_space, device, device + carry, kind == op_kind::receive});
    emit(o, u, joins);
  };
  auto run_base = [&](std::uint32_t u, std::uint32_t from, std::uint32_t to) {
    auto const b = bld[u];
    auto const i = inst[u];
    auto const& a = base[b];
    auto const& pr = prog[b];
    auto& where = at[u];
    where.resize(a.ops.size(), 0);
    for (std::uint32_t j = from; j < to; ++j) {
      op o = a.ops[j];
      auto const local_layer = o.layer;
      o.layer = layer_at(u, o.layer);
      if (is_copy(o.kind)) {
        o.device_offset = dev(b, i, o.device_offset);
        o.host_offset = hst(i, o.host_offset);
      } else if (is_storage(o.kind)) {
        o.host_offset = hst(i, o.host_offset);
        o.file_offset = fil(i, o.file_offset);
      }
      if (o.carry_in != no_carry) o.carry_in = dev(b, i, o.carry_in);
      if (o.carry_out != no_carry) o.carry_out = dev(b, i, o.carry_out);
      for (auto k = a.ops[j].wait_begin; k < a.ops[j].wait_begin + a.ops[j].wait_count; ++k) ws.push_back(where[a.waits[k]]);
      for (auto k = pr.first_access[j]; k < pr.first_access[j + 1]; ++k) {
        auto const& x = pr.accesses[k];
        auto const len = x.end - x.begin;
        auto const y = x.host == device_space ? dev(b, i, x.begin) : x.host == host_space ? hst(i, x.begin) : fil(i, x.begin);
        acc.push_back({x.host, y, y + len, x.write});
      }
      // A backward updates its unit's boundary gradient; the model's last layer's forward (the
      // turn, on the last stage) seeds it.
      if (o.kind == op_kind::backward || (ends_model(u) && o.kind == op_kind::forward && local_layer + 1 == chunk_layers(u)))
        acc.push_back({device_space, grad_of[i], grad_of[i] + carry, true, true});
      where[j] = emit(o, u);
    }
  };
  auto const receive_input = [&](std::uint32_t u, bool joins) {
    boundary(op_kind::receive, carry_slot, layer_at(u, 0), dev(bld[u], inst[u], base[bld[u]].carry.input_offset()), u, joins);
  };
  auto const send_output = [&](std::uint32_t u, bool joins) {
    if (!ends_model(u))
      boundary(op_kind::send, carry_slot, layer_at(u, chunk_layers(u) - 1), dev(bld[u], inst[u], base[bld[u]].carry.output_offset()), u, joins);
  };
  auto const receive_gradient = [&](std::uint32_t u, bool joins) {
    if (!ends_model(u)) boundary(op_kind::receive, gradient_slot, layer_at(u, chunk_layers(u) - 1), grad_of[inst[u]], u, joins);
  };
  auto const send_gradient = [&](std::uint32_t u, bool joins) { boundary(op_kind::send, gradient_slot, layer_at(u, 0), grad_of[inst[u]], u, joins); };
  std::vector<std::uint8_t> led(U, 0);  // per unit: its backward's lead-in was emitted early
  // A backward right after a forward gets its first prefetches (and loads) before that forward,
  // so that they overlap it, as PipeOffload reloads in the last free slot before the backward
  // (not its own backward: that one's prefetches wait for this forward's offloads).
  auto const lead_in = [&](std::uint32_t k) {
    auto const e = stage_step_at(stage, k);
    if (e.pass != stage_pass::forward || k + 1 >= 2 * U) return;
    auto const next = stage_step_at(stage, k + 1);
    auto const w = unit_at(next);
    if (next.pass == stage_pass::backward && w != unit_at(e) && lead[bld[w]] > 0) {
      run_base(w, split[bld[w]], split[bld[w]] + lead[bld[w]]);
      led[w] = 1;
    }
  };
  auto const compute = [&](stage_step const& e) {
    auto const u = unit_at(e);
    auto const b = bld[u];
    if (e.pass == stage_pass::forward) {
      run_base(u, 0, split[b]);
    } else {
      run_base(u, split[b] + (led[u] ? lead[b] : 0), static_cast<std::uint32_t>(base[b].ops.size()));
      std::vector<std::uint32_t>().swap(at[u]);
    }
  };
  if (stage.order != stage_order::interleaved) {
    // Each pass between its own transfers; a send and the receive right after it are posted
    // together (Megatron-LM's send_forward_recv_backward and send_backward_recv_forward).
    for (std::uint32_t k = 0; k < 2 * U; ++k) {
      auto const e = stage_step_at(stage, k);
      auto const u = unit_at(e);
      lead_in(k);
      if (e.pass == stage_pass::forward) {
        receive_input(u, !group.empty());
        close_group();
        compute(e);
        send_output(u, true);
      } else {
        receive_gradient(u, !group.empty());
        close_group();
        compute(e);
        send_gradient(u, true);
      }
    }
  } else {
    // Rounds, as Megatron-LM's interleaved schedule runs them: a warm-up forward, a forward and a
    // backward, a cool-down backward; after each, its sends and the next round's receives posted
    // as one group. (Paired only with the next receive, a send that waits for its peer deadlocks
    // the ring: stage 0 and stage 1 each wait for the other to take a gradient it sends, neither
    // having posted the receive.)
    auto const warmup = warmup_length(stage);
    std::vector<std::pair<std::uint32_t, std::uint32_t>> rounds;  // [first, last) entries
    for (std::uint32_t k = 0; k < 2 * U;) {
      auto const n = (k >= warmup && k < warmup + 2 * (U - warmup)) ? 2u : 1u;
      rounds.push_back({k, k + n});
      k += n;
    }
    auto const receive_for = [&](std::pair<std::uint32_t, std::uint32_t> r) {
      for (auto k = r.first; k < r.second; ++k) {
        auto const e = stage_step_at(stage, k);
        if (e.pass == stage_pass::forward) receive_input(unit_at(e), true);
        else receive_gradient(unit_at(e), true);
      }
    };
    receive_for(rounds[0]);
    close_group();
    for (std::size_t r = 0; r < rounds.size(); ++r) {
      for (auto k = rounds[r].first; k < rounds[r].second; ++k) {
        lead_in(k);
        compute(stage_step_at(stage, k));
      }
      for (auto k = rounds[r].first; k < rounds[r].second; ++k) {
        auto const e = stage_step_at(stage, k);
        if (e.pass == stage_pass::forward) send_output(unit_at(e), true);
        else send_gradient(unit_at(e), true);
      }
      if (r + 1 < rounds.size()) receive_for(rounds[r + 1]);
      close_group();
    }
  }
  close_group();
  if (s.ops.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    stage_fail("the stage's program has more ops than 31-bit op indices name");
  // Events: one per op something waits on.
  std::int32_t events = 0;
  for (auto w : s.waits)
    if (s.ops[w].event < 0) s.ops[w].event = events++;
  s.event_count = static_cast<std::uint32_t>(events);

  // Arenas, the carry and the stage.
  std::size_t host_bytes = 0, storage_bytes = 0;
  for (std::uint32_t u = 0; u < U; ++u) {
    auto const& a = base[bld[u]].arena;
    if (a.host_bytes > 0) host_bytes = std::max(host_bytes, hst(inst[u], a.host_bytes));
    if (a.storage_bytes > 0) storage_bytes = std::max(storage_bytes, fil(inst[u], a.storage_bytes));
  }
  s.arena = b0.arena;
  s.arena.device_bytes = device_bytes;
  s.arena.host_bytes = host_bytes;
  s.arena.storage_bytes = storage_bytes;
  s.arena.kept_bytes = b0.arena.kept_bytes;  // instance 0's, at instance_area
  s.arena.forward_area = 0;
  s.arena.backward_area = forward_region;
  s.arena.recompute_carry_offset = no_carry;  // per unit: stage_binding::recompute_carry
  s.carry = b0.carry;
  s.carry.device_area = dev(0, 0, b0.carry.device_area);
  s.stage = {.spec = stage, .layers = L, .instances = instances};
  s.stage_instance_of = inst;
  s.stage_gradient.resize(U, 0);
  for (std::uint32_t u = 0; u < U; ++u) s.stage_gradient[u] = grad_of[inst[u]];
  s.stage_recompute_carry.resize(U, 0);
  for (std::uint32_t u = 0; u < U; ++u) {
    auto const r = base[bld[u]].arena.recompute_carry_offset;
    s.stage_recompute_carry[u] = r == no_carry ? no_carry : dev(bld[u], inst[u], r);
  }
  if (V > 1) s.stage_chunk_first = first;
  return s;
}

}  // namespace tide::detail
