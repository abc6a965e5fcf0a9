// tide::basic_nccl_transport against a fake NCCL, without a GPU: every stage of GPipe, 1F1B and
// interleaved pipelines feeds its stage schedule's boundary ops to the transport as the executor
// does, the fake logs each rank's NCCL groups, and a rendezvous replay of all ranks' groups (a
// group completes once its peers have posted every matching transfer, as NCCL's do) proves that
// every send meets its receive, of the same size, and that no rank waits forever. Then: the
// user's ends on stage 0's first chunk only, a failed step still making every transfer, an error
// inside a group closing it, and misuse refused by name.
#include <gtest/gtest.h>

#include <tide/collectives/nccl_transport.hpp>
#include <tide/core/stage_schedule.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct transfer {
  bool send = false;
  int peer = -1;
  std::size_t bytes = 0;
  bool gradient = false;  // what the transport was asked to move (not on NCCL's wire: checked by the replay)
  std::uint32_t micro_batch = 0, chunk = 0;
};
using group = std::vector<transfer>;

//! NCCL and CUDA as far as the transport uses them, for one rank at a time: state in statics.
struct fake {
  static inline int rank = 0, ranks = 1;
  static inline ncclResult_t calls = ncclSuccess;  // what ncclSend and ncclRecv return
  static inline bool group_open = false;
  static inline std::vector<group> groups;  // this rank's, in issue order (a call outside a group is one alone)
  static inline transfer asked{};           // the transfer the transport is asked for (set by run_boundaries)
  static void reset(int r, int n) {
    rank = r, ranks = n, calls = ncclSuccess, group_open = false;
    groups.clear();
  }
  static ncclResult_t user_rank(ncclComm_t, int* r) { return *r = rank, ncclSuccess; }
  static ncclResult_t count(ncclComm_t, int* n) { return *n = ranks, ncclSuccess; }
  static ncclResult_t cu_device(ncclComm_t, int* d) { return *d = 0, ncclSuccess; }
  struct scope {};
  static scope device_scope(int) { return {}; }
  static ncclResult_t group_start() {
    group_open = true;
    groups.emplace_back();
    return ncclSuccess;
  }
  static ncclResult_t group_end() { return group_open = false, ncclSuccess; }
  static ncclResult_t p2p(bool send, std::size_t n, int peer) {
    if (calls != ncclSuccess) return calls;
    if (!group_open) groups.emplace_back();
    auto t = asked;
    t.send = send, t.peer = peer, t.bytes = n;
    groups.back().push_back(t);
    return ncclSuccess;
  }
  static ncclResult_t send(void const*, std::size_t n, int peer, ncclComm_t, cudaStream_t) { return p2p(true, n, peer); }
  static ncclResult_t recv(void*, std::size_t n, int peer, ncclComm_t, cudaStream_t) { return p2p(false, n, peer); }
  static ncclResult_t all_reduce(void const*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclSuccess;
  }
  static ncclResult_t async_error(ncclComm_t, ncclResult_t* e) { return *e = ncclSuccess, ncclSuccess; }
  static ncclResult_t abort(ncclComm_t) { return ncclSuccess; }
  static cudaError_t device_alloc(void** p, std::size_t n) { return *p = std::calloc(1, n), cudaSuccess; }
  static cudaError_t host_alloc(void** p, std::size_t n) { return *p = std::calloc(1, n), cudaSuccess; }
  static void device_free(void* p) noexcept { std::free(p); }
  static void host_free(void* p) noexcept { std::free(p); }
  static cudaError_t copy_async(void* d, void const* s, std::size_t n, cudaMemcpyKind, cudaStream_t) {
    return std::memcpy(d, s, n), cudaSuccess;
  }
};

ncclComm_t const comm = reinterpret_cast<ncclComm_t>(0x1);

struct ends_log {
  int inputs = 0, input_gradients = 0;
};
auto ends_of(ends_log& log) {
  return tide::nccl_stage_ends{[&log](tide::transport_context<cudaStream_t> const&) { ++log.inputs; },
                               [&log](tide::transport_context<cudaStream_t> const&) { ++log.input_gradients; }};
}
using transport_t = tide::basic_nccl_transport<decltype(ends_of(std::declval<ends_log&>())), fake>;

//! Feeds `s`'s boundary ops to `t` as the executor does (executor_impl.hpp: `pair` from the op's
//! place in its group).
void run_boundaries(tide::schedule const& s, transport_t& t, bool failed = false) {
  auto const v = s.view();
  static std::byte bytes[1];
  for (auto const& o : s.ops) {
    if (!tide::is_boundary(o.kind)) continue;
    tide::transport_context<cudaStream_t> c{nullptr, o.kind, o.slot == tide::gradient_slot, v.stage.micro_batch_of(o.layer),
                                            v.stage.spec.stage, v.stage.spec.stages, bytes, o.bytes,
                                            static_cast<std::uint8_t>(o.chunks < 2 ? 0 : o.chunk + 1 < o.chunks ? 1 : 2), failed};
    c.chunk = v.stage.chunk_of(o.layer);
    c.virtual_stages = v.stage.spec.virtual_stages;
    fake::asked = {.gradient = c.gradient, .micro_batch = c.micro_batch, .chunk = c.chunk};
    if (o.kind == tide::op_kind::send) t.send(c);
    else t.receive(c);
  }
}

//! Replays every rank's groups with rendezvous semantics; returns "" or what went wrong.
std::string replay(std::vector<std::vector<group>> const& ranks) {
  auto const S = ranks.size();
  std::vector<std::size_t> at(S, 0);
  std::vector<bool> posted(S, false);
  std::map<std::tuple<int, int>, std::vector<transfer>> sends, recvs;  // (from, to): transfers posted, in order
  std::vector<std::vector<std::tuple<bool, int, int, std::size_t>>> mine(S);  // the posted group: (send, from, to, index)
  for (;;) {
    bool progress = false, done = true;
    for (std::size_t r = 0; r < S; ++r) {
      if (at[r] == ranks[r].size()) continue;
      done = false;
      if (!posted[r]) {
        mine[r].clear();
        for (auto const& x : ranks[r][at[r]]) {
          auto const from = x.send ? static_cast<int>(r) : x.peer, to = x.send ? x.peer : static_cast<int>(r);
          auto& q = (x.send ? sends : recvs)[{from, to}];
          mine[r].emplace_back(x.send, from, to, q.size());
          q.push_back(x);
        }
        posted[r] = progress = true;
      }
      bool complete = true;
      for (auto const& [send, from, to, i] : mine[r]) {
        auto const& other = (send ? recvs : sends)[{from, to}];
        if (other.size() <= i) {
          complete = false;
          continue;
        }
        // The send and the receive NCCL matches must be the same boundary: its size, its
        // direction and micro-batch, and the chunk the ring maps it to (the last stage's chunk c
        // feeds stage 0's c + 1; the gradient goes back the other way).
        auto const& x = sends[{from, to}][i];
        auto const& y = recvs[{from, to}][i];
        bool const wrap = x.gradient ? from < to : from > to;
        auto const want_chunk = wrap ? (x.gradient ? x.chunk - 1 : x.chunk + 1) : x.chunk;
        if (x.bytes != y.bytes || x.gradient != y.gradient || x.micro_batch != y.micro_batch || y.chunk != want_chunk)
          return "rank " + std::to_string(from) + " sends " + (x.gradient ? "a gradient" : "a tensor") + " of micro-batch " +
                 std::to_string(x.micro_batch) + " chunk " + std::to_string(x.chunk) + " that rank " + std::to_string(to) +
                 " receives as " + (y.gradient ? "a gradient" : "a tensor") + " of micro-batch " + std::to_string(y.micro_batch) +
                 " chunk " + std::to_string(y.chunk);
      }
      if (complete) ++at[r], posted[r] = false, progress = true;
    }
    if (done) break;
    if (!progress) {
      std::string stuck;
      for (std::size_t r = 0; r < S; ++r)
        if (at[r] < ranks[r].size()) stuck += " rank " + std::to_string(r) + " at group " + std::to_string(at[r]);
      return "deadlock:" + stuck;
    }
  }
  for (auto const& [k, v] : sends)
    if (recvs[k].size() != v.size()) return "unmatched sends from rank " + std::to_string(std::get<0>(k));
  return "";
}

}  // namespace

// GPipe, 1F1B and interleaved pipelines of 2 to 5 stages: every rank's NCCL groups meet their
// peers' without a deadlock, each send meeting the receive of the same boundary (NCCL has no tags:
// the order on each pair of ranks must agree), and stage 0's first chunk calls the user's ends
// once per micro-batch.
TEST(NcclTransport, EveryStagesGroupsMeetTheirPeersWithoutDeadlock) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  for (int l = 0; l < 4; ++l) st.append(tide::layer_spec{"t", {{"a", 512}}});
  int pipelines = 0;
  for (auto order : {tide::stage_order::gpipe, tide::stage_order::one_f_one_b, tide::stage_order::interleaved})
    for (std::uint32_t S = 2; S <= 5; ++S)
      for (std::uint32_t V : {1u, 2u, 4u})
        for (std::uint32_t M : {S, 2 * S}) {
          if ((order == tide::stage_order::interleaved) != (V > 1)) continue;
          SCOPED_TRACE(std::string(to_string(order)) + ", " + std::to_string(S) + " stages of " + std::to_string(V) + " chunks, " +
                       std::to_string(M) + " micro-batches");
          std::vector<std::vector<group>> groups(S);
          for (std::uint32_t s = 0; s < S; ++s) {
            tide::stage_spec const sp{.stage = s, .stages = S, .micro_batches = M, .order = order, .virtual_stages = V};
            auto const sched = tide::build_stage_schedule(st, {.policy = {tide::rule_spec{.where = tide::placement::offload}}}, sp);
            fake::reset(static_cast<int>(s), static_cast<int>(S));
            ends_log log;
            transport_t t(comm, ends_of(log));
            run_boundaries(sched, t);
            EXPECT_FALSE(fake::group_open);
            EXPECT_EQ(log.inputs, s == 0 ? static_cast<int>(M) : 0);
            EXPECT_EQ(log.input_gradients, s == 0 ? static_cast<int>(M) : 0);
            groups[s] = fake::groups;
          }
          EXPECT_EQ(replay(groups), "");
          ++pipelines;
        }
  EXPECT_GT(pipelines, 30);
}

// The replay catches what it is for: a schedule's groups split into single transfers (each send
// waiting alone for its peer) deadlock the interleaved ring.
TEST(NcclTransport, SingleTransfersWouldDeadlockTheInterleavedRing) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  for (int l = 0; l < 2; ++l) st.append(tide::layer_spec{"t", {{"a", 512}}});
  std::uint32_t const S = 2, M = 4;
  std::vector<std::vector<group>> single(S);
  for (std::uint32_t s = 0; s < S; ++s) {
    auto const sched = tide::build_stage_schedule(
        st, {}, {.stage = s, .stages = S, .micro_batches = M, .order = tide::stage_order::interleaved, .virtual_stages = 2});
    fake::reset(static_cast<int>(s), static_cast<int>(S));
    ends_log log;
    transport_t t(comm, ends_of(log));
    run_boundaries(sched, t);
    for (auto const& g : fake::groups)
      for (auto const& x : g) single[s].push_back({x});
  }
  EXPECT_NE(replay(single).find("deadlock"), std::string::npos);
}

// A failed step still makes every NCCL transfer (its peers must not wait) but skips the user's
// ends; an NCCL error inside a group closes the group and names the call; misuse is refused.
TEST(NcclTransport, FailuresAndMisuse) {
  tide::stack_spec st;
  st.carry = {"x", 256};
  for (int l = 0; l < 2; ++l) st.append(tide::layer_spec{"t", {{"a", 512}}});
  tide::stage_spec const sp{.stage = 0, .stages = 2, .micro_batches = 4, .order = tide::stage_order::interleaved, .virtual_stages = 2};
  auto const sched = tide::build_stage_schedule(st, {}, sp, {}, {{1, 1}});
  auto has = [](std::string const& m, char const* part) { return m.find(part) != std::string::npos; };
  auto what = [](auto&& f) -> std::string {
    try {
      f();
    } catch (std::exception const& e) {
      return e.what();
    }
    return "(no error)";
  };
  fake::reset(0, 2);
  ends_log ok_log;
  transport_t ok(comm, ends_of(ok_log));
  run_boundaries(sched, ok);
  auto const transfers = fake::groups;

  fake::reset(0, 2);
  ends_log failed_log;
  transport_t failed(comm, ends_of(failed_log));
  run_boundaries(sched, failed, true);
  EXPECT_EQ(failed_log.inputs + failed_log.input_gradients, 0);
  ASSERT_EQ(fake::groups.size(), transfers.size());
  for (std::size_t g = 0; g < transfers.size(); ++g) EXPECT_EQ(fake::groups[g].size(), transfers[g].size());

  fake::reset(0, 2);
  ends_log log;
  transport_t t(comm, ends_of(log));
  fake::calls = ncclRemoteError;
  auto m = what([&] { run_boundaries(sched, t); });
  EXPECT_TRUE(has(m, "ncclSend (a stage's boundary)") || has(m, "ncclRecv (a stage's boundary)")) << m;
  EXPECT_FALSE(fake::group_open);

  fake::reset(1, 2);  // this rank is stage 1, the schedule stage 0's
  ends_log other;
  transport_t wrong(comm, ends_of(other));
  m = what([&] { run_boundaries(sched, wrong); });
  EXPECT_TRUE(has(m, "rank 1 runs the schedule of stage 0")) << m;
  fake::reset(0, 3);
  transport_t three(comm, ends_of(other));
  m = what([&] { run_boundaries(sched, three); });
  EXPECT_TRUE(has(m, "the communicator has 3 ranks but the pipeline 2 stages")) << m;
}
