// Stage schedules (core/stage_schedule.hpp): every stage of random pipelines is proven by the
// checker, broken stage programs are refused by name, hostile inputs get clear errors, and a
// pipeline of stages on threads (a transport of queues) trains bitwise like one process under
// every placement.
#include <gtest/gtest.h>
#include <tide/core/stage_schedule.hpp>
#include <tide/core/static_stage_schedule.hpp>
#include <tide/host.hpp>
#include <tide/plan/stage_timeline.hpp>

#include "workload.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using workload::derive;
using workload::fold;
using workload::load_word;
using workload::mix;
using workload::store_word;
using workload::words;

std::string what(auto&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "(no error)";
}

tide::stack_spec random_stack(std::mt19937_64& r, std::uint32_t layers) {
  tide::stack_spec st;
  st.carry = {"x", 64 + 8 * (r() % 24)};
  std::vector<tide::layer_spec> types{{"a", {{"q", 256}, {"k", 40 + 8 * (r() % 40)}, {"h", 64}}},
                                      {"b", {{"h", 512 + 8 * (r() % 64)}, {"q", 128}, {"k", 72}}}};
  for (std::uint32_t l = 0; l < layers; ++l) st.append(types[r() % 2]);
  return st;
}

tide::policy_spec random_policy(std::mt19937_64& r) {
  using tide::placement;
  tide::policy_spec p;
  switch (r() % 5) {
    case 0: break;
    case 1: p = {tide::rule_spec{.where = placement::offload}}; break;
    case 2: p = {tide::rule_spec{.where = placement::remat}}; break;
    case 3: p = {tide::rule_spec{.where = placement::offload, .slots = {"q"}}, tide::rule_spec{.where = placement::remat, .slots = {"k"}}}; break;
    default: p = {tide::rule_spec{.where = placement::offload, .slots = {"h"}}}; break;
  }
  p.allow_unused_rules = true;  // a random stack may lack a type the rules name
  return p;
}

struct random_stage {
  tide::stack_spec stack;
  tide::strategy how;
  tide::stage_spec spec;
  tide::stage_policies policies;
  tide::stage_chunks chunks;
};

// A random stage of a random pipeline: GPipe, 1F1B, or interleaved with 2 or 3 chunks of 1 to 3
// layers each (uneven, as Meta's first and last stages are lighter).
random_stage draw(std::mt19937_64& r) {
  random_stage x;
  auto const kind = r() % 3;
  auto const order = kind == 0 ? tide::stage_order::gpipe : kind == 1 ? tide::stage_order::one_f_one_b : tide::stage_order::interleaved;
  if (order == tide::stage_order::interleaved) {
    auto const S = 2 + static_cast<std::uint32_t>(r() % 4), V = 2 + static_cast<std::uint32_t>(r() % 2);
    x.spec = {.stage = static_cast<std::uint32_t>(r() % S), .stages = S, .micro_batches = S * (1 + static_cast<std::uint32_t>(r() % 3)),
              .order = order, .virtual_stages = V};
    std::uint32_t L = 0;
    for (std::uint32_t c = 0; c < V; ++c) L += x.chunks.layers.emplace_back(1 + static_cast<std::uint32_t>(r() % 3));
    x.stack = random_stack(r, L);
  } else {
    x.stack = random_stack(r, 1 + static_cast<std::uint32_t>(r() % 4));
    auto const S = 1 + static_cast<std::uint32_t>(r() % 5);
    auto const M = (order == tide::stage_order::one_f_one_b ? S : 1) + static_cast<std::uint32_t>(r() % 6);
    x.spec = {.stage = static_cast<std::uint32_t>(r() % S), .stages = S, .micro_batches = M, .order = order};
  }
  x.how.pipeline.latency_hiding = r() % 4 != 0;
  x.how.pipeline.prefetch_distance = static_cast<std::uint32_t>(r() % 3);
  x.how.pipeline.chunk_bytes = r() % 3 == 0 ? 128 : 0;
  x.how.buffers.staging_buffers = 1 + static_cast<std::uint32_t>(r() % 2);
  x.how.buffers.guard_bytes = r() % 2 ? 16 : 0;
  auto const P = 1 + r() % 3;
  for (std::size_t p = 0; p < P; ++p) x.policies.policies.push_back(random_policy(r));
  for (std::uint32_t u = 0; u < x.spec.units(); ++u) x.policies.of_micro_batch.push_back(static_cast<std::uint32_t>(r() % P));
  return x;
}

TEST(StageSchedule, EveryStageOfRandomPipelinesIsProven) {
  std::mt19937_64 r(55);
  int interleaved = 0, grouped = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    auto const x = draw(r);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": stage " + std::to_string(x.spec.stage) + " of " +
                 std::to_string(x.spec.stages) + ", " + std::to_string(x.spec.micro_batches) + " micro-batches, " +
                 std::string(to_string(x.spec.order)) + ", " + std::to_string(x.spec.virtual_stages) + " chunks");
    auto const s = tide::build_stage_schedule(x.stack, x.how, x.spec, x.policies, x.chunks);
    auto const report = tide::check_schedule(s);
    EXPECT_EQ(report.replayed_device_bytes, s.peak_device_bytes());
    auto const v = s.view();
    EXPECT_EQ(v.stage.instances, tide::peak_in_flight(x.spec));
    EXPECT_EQ(v.layer_count(), x.spec.micro_batches * x.stack.layer_count());
    interleaved += x.spec.virtual_stages > 1;
    // The compute stream runs the passes in the stage order (independently of the checker).
    std::vector<tide::stage_step> seen;
    for (auto const& o : s.ops) {
      auto const m = v.stage.micro_batch_of(o.layer), c = v.stage.chunk_of(o.layer);
      if (o.kind == tide::op_kind::forward && v.first_layer(o.layer)) seen.push_back({tide::stage_pass::forward, m, c});
      if (o.kind == tide::op_kind::backward && v.last_layer(o.layer)) seen.push_back({tide::stage_pass::backward, m, c});
      grouped += tide::is_boundary(o.kind) && o.chunks > 2;
    }
    EXPECT_EQ(seen, tide::stage_steps(x.spec));
    // Every unit's saved data is placed by its own policy, over its chunk's layers.
    std::uint32_t begin = 0;
    for (std::uint32_t c = 0; c < x.spec.virtual_stages; ++c) {
      auto const n = x.chunks.layers.empty() ? x.stack.layer_count() : x.chunks.layers[c];
      EXPECT_EQ(v.stage.chunk_begin(c), begin);
      EXPECT_EQ(v.stage.chunk_end(c), begin + n);
      tide::stack_spec part = x.stack;
      part.layer_types.assign(x.stack.layer_types.begin() + begin, x.stack.layer_types.begin() + begin + n);
      for (std::uint32_t m = 0; m < x.spec.micro_batches; ++m) {
        auto const u = tide::stage_unit(x.spec, c, m);
        auto const one = tide::build_schedule(part, {.policy = x.policies.policies[x.policies.of_micro_batch[u]]});
        for (std::uint32_t l = 0; l < n; ++l) {
          auto const at = m * x.stack.layer_count() + begin + l;
          ASSERT_EQ(v.stage.unit_of(at), u);
          for (std::size_t k = 0; k < one.view().slots_of(l).size(); ++k) ASSERT_EQ(v.slots_of(at)[k].where, one.view().slots_of(l)[k].where);
        }
      }
      begin += n;
    }
  }
  EXPECT_GT(interleaved, 300);
  EXPECT_GT(grouped, 300);  // rounds post more than a send and a receive together
}

TEST(StageSchedule, OffloadingEveryMicroBatchCutsStageZerosPeak) {
  tide::stack_spec st;
  st.carry = {"x", 1024};
  for (int l = 0; l < 4; ++l) st.append(tide::layer_spec{"t", {{"a", 8192}, {"b", 8192}, {"c", 4096}}});
  tide::stage_spec const sp{.stage = 0, .stages = 4, .micro_batches = 8};
  auto const keep = tide::build_stage_schedule(st, {}, sp);
  auto const off = tide::build_stage_schedule(st, {}, sp, {{{tide::rule_spec{.where = tide::placement::offload}}}, {}});
  // Four micro-batches in flight on stage 0: keep-all holds all their slots, offload-all the rings.
  EXPECT_EQ(keep.view().stage.instances, 4u);
  EXPECT_LE(off.peak_device_bytes() * 10, keep.peak_device_bytes() * 6);
  EXPECT_GE(off.peak_host_bytes(), 4u * 4 * (8192 + 8192 + 4096));
}

// A built stage program, then one thing broken: the checker names it.
TEST(StageSchedule, TheCheckerRefusesBrokenStagePrograms) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  for (int l = 0; l < 2; ++l) st.append(tide::layer_spec{"t", {{"a", 512}}});
  tide::stage_spec const sp{.stage = 1, .stages = 3, .micro_batches = 4};
  auto const good = tide::build_stage_schedule(st, {}, sp, {{{tide::rule_spec{.where = tide::placement::offload}}}, {}});
  ASSERT_NO_THROW((void)tide::check_schedule(good));
  auto broken = [&](auto&& edit) {
    auto s = good;
    edit(s);
    return what([&] { (void)tide::check_schedule(s); });
  };
  auto find = [&](tide::schedule const& s, tide::op_kind k, std::uint16_t slot, std::uint32_t layer) {
    for (std::size_t i = 0; i < s.ops.size(); ++i)
      if (s.ops[i].kind == k && s.ops[i].slot == slot && s.ops[i].layer == layer) return i;
    ADD_FAILURE() << "no such op";
    return std::size_t{0};
  };
  auto const L = 2u;
  auto has = [](std::string const& m, char const* part) { return m.find(part) != std::string::npos; };
  auto m = broken([&](tide::schedule& s) { s.ops[find(s, tide::op_kind::forward, tide::no_slot, 1 * L)].wait_count = 0; });
  EXPECT_TRUE(has(m, "reads the input it received")) << m;
  m = broken([&](tide::schedule& s) { s.ops[find(s, tide::op_kind::backward, tide::no_slot, 2 * L + 1)].wait_count = 0; });
  EXPECT_TRUE(has(m, "gradient is received before")) << m;
  m = broken([&](tide::schedule& s) {
    for (auto& o : s.ops)
      if (o.kind == tide::op_kind::send && o.chunks == 2 && o.event < 0) {
        o.event = static_cast<std::int32_t>(s.event_count++);
        break;
      }
  });
  EXPECT_TRUE(has(m, "of a group of 2 but records an event")) << m;
  m = broken([&](tide::schedule& s) { s.ops[find(s, tide::op_kind::receive, tide::carry_slot, 0)].bytes = 128; });
  EXPECT_TRUE(has(m, "not the whole carry")) << m;
  m = broken([&](tide::schedule& s) { s.ops[find(s, tide::op_kind::receive, tide::gradient_slot, 3 * L + 1)].slot = tide::carry_slot; });
  EXPECT_TRUE(has(m, "belongs to layer 0")) << m;
  m = broken([&](tide::schedule& s) { s.stage.spec.order = tide::stage_order::gpipe; });
  EXPECT_TRUE(has(m, "the stage order (gpipe)")) << m;
  m = broken([&](tide::schedule& s) { s.stage_instance_of[0] = s.stage.instances; });
  EXPECT_TRUE(has(m, "instance region")) << m;
  m = broken([&](tide::schedule& s) { s.ops[find(s, tide::op_kind::send, tide::gradient_slot, 0)].stream = tide::stream_role::compute; });
  EXPECT_TRUE(has(m, "run on the comm stream")) << m;
  // A send outside a stage schedule.
  m = broken([&](tide::schedule& s) { s.stage = {}; });
  EXPECT_TRUE(has(m, "no stage's")) << m;
}

TEST(StageSchedule, HostileInputsAreRefusedByName) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  st.append(tide::layer_spec{"t", {{"a", 512}}});
  auto has = [](std::string const& m, char const* part) { return m.find(part) != std::string::npos; };
  auto m = what([&] { (void)tide::build_stage_schedule(st, {}, {.stage = 0, .stages = 4, .micro_batches = 3}); });
  EXPECT_TRUE(has(m, "1F1B needs at least as many micro-batches as stages")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, {.stage = 4, .stages = 4, .micro_batches = 4}); });
  EXPECT_TRUE(has(m, "stage_spec::stage")) << m;
  tide::stack_spec no_carry;
  no_carry.append(tide::layer_spec{"t", {{"a", 512}}});
  m = what([&] { (void)tide::build_stage_schedule(no_carry, {}, {.stages = 2, .micro_batches = 2}); });
  EXPECT_TRUE(has(m, "has no carry")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {.collectives = {.after_backward = true}}, {.stages = 2, .micro_batches = 2}); });
  EXPECT_TRUE(has(m, "collective hooks")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, {.stages = 2, .micro_batches = 2}, {{{}}, {0, 0, 0}}); });
  EXPECT_TRUE(has(m, "of_micro_batch has 3 entries for 2 micro-batches")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, {.stages = 2, .micro_batches = 2}, {{{}}, {0, 1}}); });
  EXPECT_TRUE(has(m, "of_micro_batch[1] is 1, but there are 1 policies")) << m;
  m = what([&] {
    (void)tide::build_stage_schedule(st, {}, {.stages = 2, .micro_batches = 2},
                                     {{{}, {tide::rule_spec{.where = tide::placement::offload, .slots = {"nope"}}}}, {0, 1}});
  });
  EXPECT_TRUE(has(m, "policy 1:")) << m;
  // Spilling: refused by name (a spill ring per unit in flight is not built yet).
  m = what([&] { (void)tide::build_stage_schedule(st, {.policy = {tide::rule_spec{.where = tide::placement::spill}}}, {.stages = 2, .micro_batches = 2}); });
  EXPECT_TRUE(has(m, "spills slots to storage, which a stage schedule does not take yet")) << m;
  // The executor: a stage schedule needs a transport, and a transport a stage schedule.
  auto const s = tide::build_stage_schedule(st, {}, {.stages = 2, .micro_batches = 2});
  tide::host_backend b;
  tide::executor ex(b, s);
  auto nop = [](auto const&) {};
  m = what([&] { ex.step(nop, nop); });
  EXPECT_TRUE(has(m, "pass tide::hooks{.transport = t}")) << m;
  auto const plain = tide::build_schedule(st, {});
  tide::executor ex2(b, plain);
  struct null_transport {
    void send(tide::transport_context<tide::host_backend::stream_type> const&) {}
    void receive(tide::transport_context<tide::host_backend::stream_type> const&) {}
  } t;
  m = what([&] { ex2.step(nop, nop, tide::hooks{.transport = std::ref(t)}); });
  EXPECT_TRUE(has(m, "is no pipeline stage's")) << m;
  // The simulator does not run stages yet: it says so.
  m = what([&] {
    tide::cost_table costs;
    costs.layers.resize(s.layer_count());
    tide::sim_backend sb(costs);
    tide::executor se(sb, s);
    se.step(nop, nop, tide::hooks{.transport = std::ref(t)});
  });
  EXPECT_TRUE(has(m, "the simulator runs one stack's step")) << m;
}

}  // namespace

namespace {

// Stages on threads: a transport of queues between neighbours (the MPI one is proven under
// mpirun by examples/pipeline_parallel), and a chain workload whose layer i + 1 reads layer i's
// output, whose recompute is its unchanged forward, and whose backward reads every slot, the
// input and the boundary gradient. The queues are rendezvous, as NCCL's transfers are: a group of
// transfers completes only once its peers took every send, so an order that deadlocks a transport
// without buffering deadlocks here (and times out).
struct mailbox {
  using key = std::tuple<std::uint32_t, std::uint32_t, bool>;  // (from, to, gradient)
  std::mutex mu;
  std::condition_variable cv;
  std::map<key, std::deque<std::vector<std::byte>>> q;
  std::map<key, std::uint64_t> puts, takes;
  // Posts a send; returns its place on its queue.
  std::pair<key, std::uint64_t> put(std::uint32_t from, std::uint32_t to, bool grad, std::span<std::byte const> x) {
    std::pair<key, std::uint64_t> r{{from, to, grad}, 0};
    {
      std::lock_guard l(mu);
      q[r.first].emplace_back(x.begin(), x.end());
      r.second = puts[r.first]++;
    }
    cv.notify_all();
    return r;
  }
  void take(std::uint32_t from, std::uint32_t to, bool grad, std::span<std::byte> x) {
    {
      std::unique_lock l(mu);
      auto& d = q[{from, to, grad}];
      if (!cv.wait_for(l, std::chrono::seconds(30), [&] { return !d.empty(); })) throw std::runtime_error("mailbox: timed out");
      if (d.front().size() != x.size()) throw std::runtime_error("mailbox: a boundary of another size");
      std::copy(d.front().begin(), d.front().end(), x.begin());
      d.pop_front();
      ++takes[{from, to, grad}];
    }
    cv.notify_all();
  }
  // Waits until the peers took the sends `sent`.
  void taken(std::vector<std::pair<key, std::uint64_t>>& sent) {
    std::unique_lock l(mu);
    for (auto const& [k, i] : sent)
      if (!cv.wait_for(l, std::chrono::seconds(30), [&] { return takes[k] > i; })) throw std::runtime_error("mailbox: a send timed out");
    sent.clear();
  }
};

struct chain_stage {
  std::vector<std::uint32_t> model;       // per stage layer: its layer in the whole chain
  std::vector<std::uint64_t>* grad = nullptr;  // per layer of the whole chain
  std::uint64_t* input_grad = nullptr;    // stage 0: the fold of every input gradient
  std::uint32_t step = 0;

  static std::uint64_t param(std::uint32_t l, std::uint32_t step) { return mix(0xC0FFEEull + l * 7919ull + step); }
  template <class Ctx>
  void forward(Ctx const& c) const {
    auto const x = c.carry_in();
    auto const h = fold(param(model[c.layer], step), x);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) derive(c.slot(k), h + 0x9E3779B97F4A7C15ull * (k + 1), x);
    derive(c.carry_out(), h, x);
  }
  template <class Ctx>
  void backward(Ctx const& c) const {
    auto const g = c.gradient();
    auto const x = c.carry_in();
    auto h = fold(fold(param(model[c.layer], step), std::span<std::byte const>(g)), x);
    for (std::uint16_t k = 0; k < c.slot_count(); ++k) h = fold(h ^ k, c.slot(k));
    (*grad)[model[c.layer]] = mix((*grad)[model[c.layer]] + h);
    for (std::size_t i = 0, n = words(g.size()); i < n; ++i) store_word(g, i, mix(h + i) ^ load_word(x, i) ^ load_word(g, i));
  }
};
void write_input(std::span<std::byte> x, std::uint32_t m, std::uint32_t step) {
  for (std::size_t i = 0, n = words(x.size()); i < n; ++i) store_word(x, i, mix((std::uint64_t{step} << 40) + (std::uint64_t{m} << 20) + i));
}
void seed(std::span<std::byte> g, std::span<std::byte const> y, double scale) {
  for (std::size_t i = 0, n = words(g.size()); i < n; ++i)
    store_word(g, i, load_word(y, i) - mix(0x7A67 + i) + static_cast<std::uint64_t>(scale * 1e6));
}

// One process: the whole chain, micro-batch after micro-batch, with plain buffers.
void reference(tide::stack_spec const& whole, std::uint32_t M, std::uint32_t step, std::vector<std::uint64_t>& grad,
               std::uint64_t& input_grad) {
  auto const L = whole.layer_count();
  auto const cb = whole.carry.bytes;
  for (std::uint32_t m = 0; m < M; ++m) {
    std::vector<std::vector<std::byte>> xs(L + 1, std::vector<std::byte>(cb));
    std::vector<std::vector<std::vector<std::byte>>> slots(L);
    write_input(xs[0], m, step);
    for (std::uint32_t l = 0; l < L; ++l) {
      auto const h = fold(chain_stage::param(l, step), std::span<std::byte const>(xs[l]));
      auto const& t = whole.layer(l);
      for (std::size_t k = 0; k < t.slots.size(); ++k) {
        slots[l].emplace_back(t.slots[k].bytes);
        derive(slots[l][k], h + 0x9E3779B97F4A7C15ull * (k + 1), std::span<std::byte const>(xs[l]));
      }
      derive(xs[l + 1], h, std::span<std::byte const>(xs[l]));
    }
    std::vector<std::byte> g(cb);
    seed(g, xs[L], 1.0 / M);
    for (std::uint32_t l = L; l-- > 0;) {
      auto h = fold(fold(chain_stage::param(l, step), std::span<std::byte const>(g)), std::span<std::byte const>(xs[l]));
      for (std::size_t k = 0; k < slots[l].size(); ++k) h = fold(h ^ k, std::span<std::byte const>(slots[l][k]));
      grad[l] = mix(grad[l] + h);
      for (std::size_t i = 0, n = words(cb); i < n; ++i)
        store_word(std::span(g), i, mix(h + i) ^ load_word(std::span<std::byte const>(xs[l]), i) ^ load_word(std::span<std::byte const>(g), i));
    }
    input_grad = fold(input_grad, std::span<std::byte const>(g));
  }
}

}  // namespace

namespace {

// Per stage, its layers' places in the whole chain under `p` (one entry per virtual stage: stage
// s's chunk c is entry c * S + s).
std::vector<std::vector<std::uint32_t>> model_layers(tide::stage_partition const& p, std::uint32_t S) {
  std::vector<std::vector<std::uint32_t>> r(S);
  for (std::uint32_t s = 0; s < S; ++s) r[s] = tide::model_layers_of(p, s, S, static_cast<std::uint32_t>(p.layers.size()) / S);
  return r;
}

// The S stages of a chain on threads (stage s's layers at `model[s]` in the chain), each stage's
// schedule from `schedule_of`, two steps of M micro-batches: the weight gradients of the whole
// chain and stage 0's input gradient, with each stage's error (empty when none).
template <class ScheduleOf>
void train_on_threads(std::vector<std::vector<std::uint32_t>> const& model, ScheduleOf&& schedule_of, std::vector<std::uint64_t>& grad,
                      std::uint64_t& input_grad, std::vector<std::string>& errors) {
  auto const S = static_cast<std::uint32_t>(model.size());
  mailbox box;
  errors.assign(S, "");
  std::vector<std::thread> threads;
  for (std::uint32_t st = 0; st < S; ++st)
    threads.emplace_back([&, st] {
      try {
        auto const& s = schedule_of(st);
        tide::host_backend b;
        tide::executor ex(b, s, [&] {
          auto o = tide::executor_options::checked();
          o.loss_scale = 1.0 / tide::schedule_view(s).stage.spec.micro_batches;  // the reference's mean
          return o;
        }());
        chain_stage w{model[st], &grad, &input_grad};
        struct queues {
          mailbox* box;
          std::uint32_t* step;
          std::vector<std::pair<mailbox::key, std::uint64_t>> sent{};  // the open group's sends
          void send(tide::transport_context<tide::host_backend::stream_type> const& c) {
            if (c.peer() >= 0) sent.push_back(box->put(c.stage, static_cast<std::uint32_t>(c.peer()), c.gradient, c.span()));
            if (c.pair != 1) box->taken(sent);  // stage 0's input gradient: folded below
          }
          void receive(tide::transport_context<tide::host_backend::stream_type> const& c) {
            if (c.peer() < 0) write_input(c.span(), c.micro_batch, *step);
            else box->take(static_cast<std::uint32_t>(c.peer()), c.stage, c.gradient, c.span());
            if (c.pair != 1) box->taken(sent);
          }
        } q{&box, &w.step};
        struct with_input_grad : queues {
          std::uint64_t* input_grad;
          void send(tide::transport_context<tide::host_backend::stream_type> const& c) {
            if (c.peer() < 0) *input_grad = fold(*input_grad, std::span<std::byte const>(c.span()));
            queues::send(c);
          }
        } t{q, &input_grad};
        for (std::uint32_t step = 0; step < 2; ++step) {
          w.step = step;
          ex.step([&](auto const& c) { w.forward(c); }, [&](auto const& c) { w.backward(c); },
                  tide::turn{[](auto const& c) { seed(c.gradient(), c.output(), c.loss_scale); }},
                  tide::hooks{.transport = std::ref(t)});
        }
      } catch (std::exception const& e) {
        errors[st] = e.what();
      }
    });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST(StageSchedule, StagesOnThreadsTrainBitwiseLikeOneProcessUnderEveryPlacement) {
  std::uint32_t const S = 3, K = 2;
  tide::stack_spec stage_stack;
  stage_stack.carry = {"x", 192};
  for (std::uint32_t l = 0; l < K; ++l) stage_stack.append(tide::layer_spec{"t", {{"a", 320}, {"b", 96}}});
  tide::stack_spec whole;
  whole.carry = stage_stack.carry;
  for (std::uint32_t l = 0; l < S * K; ++l) whole.append(tide::layer_spec{"t", {{"a", 320}, {"b", 96}}});
  using tide::placement;
  std::vector<tide::policy_spec> const policies{{},
                                                {tide::rule_spec{.where = placement::offload}},
                                                {tide::rule_spec{.where = placement::remat}},
                                                {tide::rule_spec{.where = placement::offload, .slots = {"a"}},
                                                 tide::rule_spec{.where = placement::remat}}};
  for (auto order : {tide::stage_order::gpipe, tide::stage_order::one_f_one_b})
    for (int mixed = 0; mixed < 5; ++mixed) {
      std::uint32_t const M = 5;
      SCOPED_TRACE(std::string(to_string(order)) + ", placement " + std::to_string(mixed));
      std::vector<std::uint64_t> grad(S * K, 0), want(S * K, 0);
      std::uint64_t input_grad = 0, want_input = 0;
      std::vector<tide::schedule> built(S);
      for (std::uint32_t st = 0; st < S; ++st) {
        tide::stage_spec const sp{.stage = st, .stages = S, .micro_batches = M, .order = order};
        tide::stage_policies pol{policies, {}};
        for (std::uint32_t m = 0; m < M; ++m) pol.of_micro_batch.push_back(mixed < 4 ? mixed : (m + st) % 4);
        built[st] = tide::build_stage_schedule(stage_stack, {.buffers = {.guard_bytes = 8}}, sp, pol);
      }
      std::vector<std::string> errors;
      train_on_threads(model_layers(tide::even_partition(S * K, S), S), [&](std::uint32_t st) -> tide::schedule const& { return built[st]; }, grad, input_grad, errors);
      for (std::uint32_t st = 0; st < S; ++st) EXPECT_EQ(errors[st], "") << "stage " << st;
      for (std::uint32_t step = 0; step < 2; ++step) reference(whole, M, step, want, want_input);
      EXPECT_EQ(grad, want);
      EXPECT_EQ(input_grad, want_input);
    }
}

// The compile-time form (core/static_stage_schedule.hpp): each stage's schedule is a constant,
// equal field for field to the run-time build of the same stage and rule, its peaks constants a
// static_assert can bound, and the stages train bitwise like one process from it.
namespace {
using chain_layer = tide::layer<"t", tide::slot<"a", 320>, tide::slot<"b", 96>>;
using chain_stack = tide::stack<tide::carry<"x", 192>, tide::repeat<chain_layer, 2>>;
using held_offload = tide::held_policy<tide::policy<tide::offload<>>>;
template <std::uint32_t St>
constexpr auto static_stage = tide::make_stage_schedule<chain_stack, tide::strategy_of<tide::debug_buffers>,
                                                        tide::stage_spec{.stage = St, .stages = 3, .micro_batches = 5}, held_offload>();
constexpr auto static_keep = tide::make_stage_schedule<chain_stack, tide::strategy_of<tide::debug_buffers>, tide::stage_spec{.stage = 0, .stages = 3, .micro_batches = 5}>();
// Stage 0 holds three micro-batches in flight under 1F1B: offloading them costs less device memory.
static_assert(static_stage<0>.peak_device_bytes() < static_keep.peak_device_bytes());
static_assert(static_stage<0>.view().stage.instances == 3 && static_keep.view().stage.instances == 3);

template <class Static>
void expect_same(Static const& c, tide::schedule const& r) {
  auto const a = c.view(), b = r.view();
  EXPECT_TRUE(std::ranges::equal(a.ops, b.ops));
  EXPECT_TRUE(std::ranges::equal(a.waits, b.waits));
  EXPECT_TRUE(std::ranges::equal(a.stage.instance_of, b.stage.instance_of));
  EXPECT_TRUE(std::ranges::equal(a.stage.gradient, b.stage.gradient));
  EXPECT_TRUE(std::ranges::equal(a.stage.recompute_carry, b.stage.recompute_carry));
  EXPECT_EQ(a.event_count, b.event_count);
  EXPECT_EQ(a.peak_device_bytes(), b.peak_device_bytes());
  EXPECT_EQ(a.peak_host_bytes(), b.peak_host_bytes());
  EXPECT_EQ(a.stage.layers, b.stage.layers);
  EXPECT_EQ(a.stage.instances, b.stage.instances);
  ASSERT_EQ(a.slots.size(), b.slots.size());
  for (std::size_t k = 0; k < a.slots.size(); ++k) {
    EXPECT_EQ(a.slots[k].forward_offset, b.slots[k].forward_offset) << k;
    EXPECT_EQ(a.slots[k].backward_offset, b.slots[k].backward_offset) << k;
    EXPECT_EQ(a.slots[k].host_offset, b.slots[k].host_offset) << k;
    EXPECT_EQ(a.slots[k].where, b.slots[k].where) << k;
  }
}
}  // namespace

TEST(StageSchedule, CompileTimeStagesEqualRunTimeOnesAndTrainBitwise) {
  std::uint32_t const S = 3, K = 2, M = 5;
  auto const off = tide::policy<tide::offload<>>::spec();
  auto const runtime = [&](std::uint32_t st, bool held) {
    tide::stage_spec const sp{.stage = st, .stages = S, .micro_batches = M};
    return tide::build_stage_schedule(chain_stack::spec(), tide::strategy_of<tide::debug_buffers>::spec(), sp,
                                      held ? tide::held_policies(sp, off) : tide::stage_policies{});
  };
  expect_same(static_stage<0>, runtime(0, true));
  expect_same(static_stage<1>, runtime(1, true));
  expect_same(static_stage<2>, runtime(2, true));
  expect_same(static_keep, runtime(0, false));
  EXPECT_NO_THROW(tide::check_schedule(static_stage<0>));

  tide::stack_spec whole;
  whole.carry = chain_stack::spec().carry;
  for (std::uint32_t l = 0; l < S * K; ++l) whole.append(chain_layer::spec());
  std::vector<std::uint64_t> grad(S * K, 0), want(S * K, 0);
  std::uint64_t input_grad = 0, want_input = 0;
  std::vector<std::string> errors;
  train_on_threads(
      model_layers(tide::even_partition(S * K, S), S),
      [](std::uint32_t st) -> tide::schedule_view {
        return st == 0 ? static_stage<0>.view() : st == 1 ? static_stage<1>.view() : static_stage<2>.view();
      },
      grad, input_grad, errors);
  for (std::uint32_t st = 0; st < S; ++st) EXPECT_EQ(errors[st], "") << "stage " << st;
  for (std::uint32_t step = 0; step < 2; ++step) reference(whole, M, step, want, want_input);
  EXPECT_EQ(grad, want);
  EXPECT_EQ(input_grad, want_input);
}

TEST(StageSchedule, PipeOffloadsRuleFromTheTimeline) {
  // 4 equal stages, f = 1, b = 2: on stage s a micro-batch waits (3 - s) * 3, plus m * 2 for the
  // first 4 - s micro-batches (docs/concepts.md).
  std::vector<tide::stage_costs> const costs{{.forward_us = 1, .backward_us = 2, .transfer_us = 0}};
  auto const t = tide::time_stages(tide::stage_order::one_f_one_b, 4, 8, costs);
  tide::policy_spec const off{tide::rule_spec{.where = tide::placement::offload}};
  // Round trip 1: three round trips are 3 us; stage 0's micro-batches all wait 9 or more, the last
  // stage's none.
  auto const p0 = tide::offload_by_wait(t, 0, 1.0, off);
  EXPECT_EQ(p0.of_micro_batch, std::vector<std::uint32_t>(8, 1));
  auto const p3 = tide::offload_by_wait(t, 3, 1.0, off);
  EXPECT_EQ(p3.of_micro_batch, std::vector<std::uint32_t>(8, 0));
  // Round trip 3.5 (10.5 us): on stage 0 only micro-batches 1 to 3 (waits 11, 13, 15) qualify.
  auto const longest = tide::offload_by_wait(t, 0, 3.5, off);
  EXPECT_EQ(longest.of_micro_batch, (std::vector<std::uint32_t>{0, 1, 1, 1, 0, 0, 0, 0}));
  tide::stack_spec st;
  st.carry = {"x", 256};
  st.append(tide::layer_spec{"t", {{"a", 1024}}});
  for (std::uint32_t s = 0; s < 4; ++s) {
    auto const sch = tide::build_stage_schedule(st, {}, {.stage = s, .stages = 4, .micro_batches = 8}, tide::offload_by_wait(t, s, 1.0, off));
    EXPECT_NO_THROW((void)tide::check_schedule(sch));
    EXPECT_EQ(sch.peak_host_bytes() > 0, s < 3) << "stage " << s;
  }
}

TEST(StageSchedule, PipeOffloadsRuleRefusesHostileValues) {
  std::vector<tide::stage_costs> const costs{{.forward_us = 1, .backward_us = 2, .transfer_us = 0}};
  auto const t = tide::time_stages(tide::stage_order::one_f_one_b, 2, 4, costs);
  auto m = what([&] { (void)tide::offload_by_wait(t, 0, std::numeric_limits<double>::quiet_NaN(), {}); });
  EXPECT_NE(m.find("must be finite and not negative"), std::string::npos) << m;
  m = what([&] { (void)tide::offload_by_wait(t, 0, 1, {}, {}, -1); });
  EXPECT_NE(m.find("must be finite and not negative"), std::string::npos) << m;
  m = what([&] { (void)tide::offload_by_wait(t, 2, 1, {}); });
  EXPECT_NE(m.find("stage 2 of a 2-stage timeline"), std::string::npos) << m;
}

// Interleaved stages on threads (2 and 3 stages of 2 chunks, the first and last virtual stages a
// layer lighter, as Meta's), each (chunk, micro-batch) unit under its own placement: the same
// gradients as one process, bitwise, over rendezvous queues.
TEST(StageSchedule, InterleavedStagesOnThreadsTrainBitwiseLikeOneProcess) {
  using tide::placement;
  std::vector<tide::policy_spec> const policies{{},
                                                {tide::rule_spec{.where = placement::offload}},
                                                {tide::rule_spec{.where = placement::remat}},
                                                {tide::rule_spec{.where = placement::offload, .slots = {"a"}},
                                                 tide::rule_spec{.where = placement::remat}}};
  for (std::uint32_t S : {2u, 3u})
    for (std::uint32_t V : {2u, 3u})
      for (int mixed = 0; mixed < 5; ++mixed) {
        std::uint32_t const M = 2 * S;
        SCOPED_TRACE(std::to_string(S) + " stages of " + std::to_string(V) + " chunks, placement " + std::to_string(mixed));
        tide::stage_partition p{std::vector<std::uint32_t>(S * V, 2)};
        p.layers.front() = p.layers.back() = 1;
        std::uint32_t total = 0;
        for (auto n : p.layers) total += n;
        tide::stack_spec whole;
        whole.carry = {"x", 192};
        for (std::uint32_t l = 0; l < total; ++l) whole.append(tide::layer_spec{"t", {{"a", 320}, {"b", 96}}});
        std::vector<tide::schedule> built(S);
        for (std::uint32_t st = 0; st < S; ++st) {
          tide::stage_spec const sp{.stage = st, .stages = S, .micro_batches = M, .order = tide::stage_order::interleaved, .virtual_stages = V};
          auto const chunks = tide::chunks_of(p, st, S, V);
          tide::stack_spec stack;
          stack.carry = whole.carry;
          for (auto n : chunks.layers)
            for (std::uint32_t l = 0; l < n; ++l) stack.append(tide::layer_spec{"t", {{"a", 320}, {"b", 96}}});
          tide::stage_policies pol{policies, {}};
          for (std::uint32_t u = 0; u < sp.units(); ++u) pol.of_micro_batch.push_back(mixed < 4 ? mixed : (u + st) % 4);
          built[st] = tide::build_stage_schedule(stack, {.buffers = {.guard_bytes = 8}}, sp, pol, chunks);
        }
        std::vector<std::uint64_t> grad(total, 0), want(total, 0);
        std::uint64_t input_grad = 0, want_input = 0;
        std::vector<std::string> errors;
        train_on_threads(model_layers(p, S), [&](std::uint32_t st) -> tide::schedule const& { return built[st]; }, grad, input_grad, errors);
        for (std::uint32_t st = 0; st < S; ++st) EXPECT_EQ(errors[st], "") << "stage " << st;
        for (std::uint32_t step = 0; step < 2; ++step) reference(whole, M, step, want, want_input);
        EXPECT_EQ(grad, want);
        EXPECT_EQ(input_grad, want_input);
      }
}

// Interleaved builds refuse chunks that do not split the stack; broken interleaved programs are
// refused by name.
TEST(StageSchedule, InterleavedHostileInputsAndBrokenProgramsAreRefused) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  for (int l = 0; l < 5; ++l) st.append(tide::layer_spec{"t", {{"a", 512}}});
  tide::stage_spec const sp{.stage = 0, .stages = 2, .micro_batches = 4, .order = tide::stage_order::interleaved, .virtual_stages = 2};
  auto has = [](std::string const& m, char const* part) { return m.find(part) != std::string::npos; };
  auto m = what([&] { (void)tide::build_stage_schedule(st, {}, sp); });
  EXPECT_TRUE(has(m, "do not split evenly into its 2 chunks")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, sp, {}, {{1, 2, 2}}); });
  EXPECT_TRUE(has(m, "stage_chunks::layers has 3 entries for 2 chunks")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, sp, {}, {{0, 5}}); });
  EXPECT_TRUE(has(m, "chunk 0 of the stage gets no layer")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, sp, {}, {{2, 2}}); });
  EXPECT_TRUE(has(m, "gives the chunks 4 layers, but the stage's stack has 5")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, sp, {}, {{4, 0xFFFFFFFFu}}); });
  EXPECT_TRUE(has(m, "more layers than the stage's stack has")) << m;
  m = what([&] { (void)tide::build_stage_schedule(st, {}, sp, {{{}}, {0, 0, 0, 0}}, {{2, 3}}); });
  EXPECT_TRUE(has(m, "of_micro_batch has 4 entries for 8 (chunk, micro-batch) units")) << m;
  m = what([&] { (void)tide::chunks_of({{1, 2, 3}}, 0, 2, 2); });
  EXPECT_TRUE(has(m, "3 entries, not one per chunk of 2 stages of 2 chunks")) << m;
  m = what([&] { (void)tide::chunks_of({{1, 2, 3, 4}}, 2, 2, 2); });
  EXPECT_TRUE(has(m, "stage 2 of 2")) << m;
  EXPECT_EQ(tide::chunks_of({{1, 2, 3, 4}}, 1, 2, 2).layers, (std::vector<std::uint32_t>{2, 4}));

  auto const good = tide::build_stage_schedule(st, {.policy = {tide::rule_spec{.where = tide::placement::offload}}}, sp, {}, {{2, 3}});
  EXPECT_NO_THROW((void)tide::check_schedule(good));
  auto broken = [&](auto&& f) {
    auto s = good;
    f(s);
    return what([&] { (void)tide::check_schedule(s); });
  };
  m = broken([](tide::schedule& s) {
    for (auto& o : s.ops)
      if (tide::is_boundary(o.kind) && o.chunks > 2 && o.chunk == 1 && o.event < 0) {
        o.event = static_cast<std::int32_t>(s.event_count++);
        break;
      }
  });
  EXPECT_TRUE(has(m, "records an event: it is posted, not completed")) << m;
  m = broken([](tide::schedule& s) {
    for (auto& o : s.ops)
      if (tide::is_boundary(o.kind) && o.chunks > 2 && o.chunk == 1) {
        o.chunk = 2;
        break;
      }
  });
  EXPECT_TRUE(has(m, "is not the group's next transfer")) << m;
  m = broken([](tide::schedule& s) {  // a group's receive onto the bytes its send reads
    for (std::size_t i = 0; i + 1 < s.ops.size(); ++i)
      if (tide::is_boundary(s.ops[i].kind) && s.ops[i].kind == tide::op_kind::send && s.ops[i].chunks >= 2 &&
          s.ops[i + 1].kind == tide::op_kind::receive && s.ops[i + 1].chunk == s.ops[i].chunk + 1) {
        s.ops[i + 1].device_offset = s.ops[i].device_offset;
        break;
      }
  });
  EXPECT_TRUE(has(m, "are posted together (one group) but touch the same device bytes")) << m;
  m = broken([](tide::schedule& s) { s.stage_chunk_first[1] = 0; });
  EXPECT_TRUE(has(m, "does not split the stage's layers into non-empty chunks")) << m;
  m = broken([](tide::schedule& s) { s.stage_chunk_first.pop_back(); });
  EXPECT_TRUE(has(m, "chunk table has 2 entries for 2 chunks")) << m;
  m = broken([](tide::schedule& s) { s.stage_gradient.pop_back(); });
  EXPECT_TRUE(has(m, "not one per unit (8)")) << m;
}

// A policy's layer bounds count the stage's layers over all its chunks (a rule for stage layers
// 1 to 3 remats those, whichever chunk they are in), and a rule unused on the whole stage is
// refused as on a stack.
TEST(StageSchedule, InterleavedRulesCountTheStagesLayers) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  st.append(tide::layer_spec{"block", {{"a", 512}}}, 4);
  tide::stage_spec const sp{.stage = 0, .stages = 2, .micro_batches = 2, .order = tide::stage_order::interleaved, .virtual_stages = 2};
  auto const where = [&](tide::policy_spec const& p, tide::stage_chunks const& ch) {
    auto const s = tide::build_stage_schedule(st, {.policy = p}, sp, {}, ch);
    std::string r;
    for (std::uint32_t l = 0; l < 4; ++l) r += s.view().slots_of(l)[0].where == tide::placement::remat ? 'r' : s.view().slots_of(l)[0].where == tide::placement::offload ? 'o' : 'k';
    return r;
  };
  tide::policy_spec const tail{tide::rule_spec{.where = tide::placement::remat, .first_layer = 1}};
  EXPECT_EQ(where(tail, {{2, 2}}), "krrr");
  EXPECT_EQ(where(tail, {{1, 3}}), "krrr");
  tide::policy_spec const last{tide::rule_spec{.where = tide::placement::offload, .first_layer = tide::from_end(1)}};
  EXPECT_EQ(where(last, {{2, 2}}), "kkko");  // the stage's last layer, not each chunk's
  tide::policy_spec const second_chunk{tide::rule_spec{.where = tide::placement::offload, .first_layer = 2}};
  EXPECT_EQ(where(second_chunk, {{2, 2}}), "kkoo");  // a rule that misses chunk 0 is not unused there
  auto const m = what([&] {
    (void)tide::build_stage_schedule(st, {.policy = {tide::rule_spec{.where = tide::placement::offload, .first_layer = 4}}}, sp, {}, {{2, 2}});
  });
  EXPECT_NE(m.find("decides no (layer, slot)"), std::string::npos) << m;
}
