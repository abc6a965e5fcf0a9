// Pipeline parallelism across processes: the transformer example's decoder split into S stages,
// one MPI rank each, trained with a stage order (GPipe, 1F1B or interleaved 1F1B) over M
// micro-batches a step.
// Each stage's step is a tide stage schedule (tide::build_stage_schedule): every micro-batch's
// saved data kept, offloaded and prefetched back, or recomputed, as the policy says, the boundary
// tensor and its gradient moved by tide::mpi::transport on the communication stream.
//
//   mpirun -np S pipeline_parallel --pp-schedule gpipe|1f1b|interleaved [--virtual-stages v]
//          --micro-batches M --policy keep-all|offload-all|offload-warmup|remat [--steps N]
//          [--check] [--json] [--fail-rank R] [--kill-rank R] [--partition K0,K1,... [--layers N]]
//
// Policies: keep-all; offload-all, every in-flight micro-batch's saved data (one held while
// another pass runs: under 1F1B not the last stage's, whose backward follows its forward at once,
// tide::held_policies); offload-warmup, only the warm-up micro-batches' (tide::warmup_policies);
// remat, everything but the layer inputs recomputed.
//
// --check trains the same micro-batches in one process on rank 0 (the whole model, the same loss
// scale 1/M and the same accumulation order) and compares every stage's loss and gradients
// bitwise, exiting 1 on any difference. The head is tied to the embedding: the last stage keeps
// the head's share of the embedding's gradient apart, and sends it to stage 0 after the step,
// which adds it to its own (the one-process run keeps the same two sums and adds them the same
// way). Every rank then applies AdamW to the whole model from the gathered gradients, so the
// weights stay equal everywhere. --fail-rank R makes rank R's forward throw in the second step:
// every rank exits non-zero, the others naming rank R. --kill-rank R makes rank R kill itself
// (SIGKILL) in the second step: mpirun ends the job. --stall-rank R (with a short --timeout-ms)
// makes its neighbours time out naming it; --longer-rank R gives rank R's boundary tensors another
// size than its neighbours': they refuse them by name. --partition K0,K1,... gives stage s Ks of
// the model's layers (uneven, as Llama 3 405B's first and last stages are a layer lighter;
// tide::check_partition refuses one that does not cover --layers, default their sum).
// --pp-schedule interleaved gives each stage v chunks (--virtual-stages, default 2), Megatron-LM's
// interleaved 1F1B: stage s's chunk c is virtual stage c * S + s, so --partition then lists S * v
// counts in model order (stage 0's chunk 0, stage 1's chunk 0, ..., stage 0's chunk 1, ...) and
// --layers-per-stage counts each chunk's layers.
#include "example.hpp"
#include "../transformer/task.hpp"
#include "../transformer/tide_model.hpp"

#include <tide/collectives/mpi_transport.hpp>
#include <tide/core/stage_partition.hpp>
#include <tide/core/stage_schedule.hpp>
#include <tide/tide.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t) { return std::chrono::duration<double, std::milli>(clock_type::now() - t).count(); }

struct options {
  std::string order = "1f1b", policy = "keep-all", trace, partition;
  std::uint32_t micro_batches = 8, layers_per_stage = 2, layers = 0, virtual_stages = 0;
  int steps = 2, fail_rank = -1, kill_rank = -1, stall_rank = -1, longer_rank = -1;
  long timeout_ms = 60'000;
  bool check = false, json = false, no_debug_checks = false;
  double link_gbps = 0;  // 0: copies unpaced
  std::size_t batch = 2, length = 8, width = 32;
};

tide::policy_spec offload_everything() { return {tide::rule_spec{.where = tide::placement::offload}}; }

//! The stage's policies by name, per micro-batch.
tide::stage_policies policies_of(std::string const& name, tide::stage_spec const& st) {
  if (name == "keep-all") return {};
  // Every micro-batch in flight: held while another pass runs (not the last stage's under 1F1B,
  // whose backward follows its forward at once).
  if (name == "offload-all") return tide::held_policies(st, offload_everything());
  if (name == "remat") return {{tide::policy_spec{tide::rule_spec{.where = tide::placement::remat}}}, {}};
  if (name == "offload-warmup") return tide::warmup_policies(st, offload_everything());
  throw std::invalid_argument("--policy: '" + name + "' is none of keep-all, offload-all, offload-warmup, remat");
}

struct data {
  std::vector<std::vector<std::int32_t>> tokens, targets;  // per micro-batch
};
data sample(transformer::copy_task const& task, std::size_t batch, std::uint32_t M, int step) {
  data d;
  d.tokens.resize(M);
  d.targets.resize(M);
  for (std::uint32_t m = 0; m < M; ++m) {
    transformer::rng r{0x5EEDull * 1000003u + static_cast<std::uint64_t>(step) * 4099u + m};
    task.sample(r, batch, d.tokens[m], d.targets[m]);
  }
  return d;
}

std::uint64_t fnv(std::span<float const> x) { return transformer::fnv1a(std::as_bytes(x)); }

//! "3,5,5,3" as layer counts; throws naming an entry that is not one.
tide::stage_partition parse_partition(std::string const& text) {
  tide::stage_partition p;
  std::size_t at = 0;
  for (;;) {
    auto const comma = text.find(',', at);
    auto const item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    std::size_t used = 0;
    unsigned long v = 0;
    try {
      v = std::stoul(item, &used);
    } catch (std::exception const&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || item[0] < '0' || item[0] > '9' || v > 1'000'000)
      throw std::invalid_argument("--partition: '" + item + "' is not a layer count (give counts like 3,5,5,3)");
    p.layers.push_back(static_cast<std::uint32_t>(v));
    if (comma == std::string::npos) return p;
    at = comma + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  tide::mpi::environment env(argc, argv);
  tide::mpi::communicator world;
  int const rank = world.rank(), S = world.size();
  options o;
  example::cli cli("pipeline_parallel");
  cli.option("--pp-schedule", o.order, "gpipe|1f1b|interleaved", "the stage order")
      .option("--virtual-stages", o.virtual_stages, "v", "chunks per stage under --pp-schedule interleaved (default 2)")
      .option("--micro-batches", o.micro_batches, "M", "micro-batches a step")
      .option("--policy", o.policy, "NAME", "keep-all, offload-all, offload-warmup or remat")
      .option("--steps", o.steps, "N", "training steps")
      .option("--layers-per-stage", o.layers_per_stage, "K", "decoder layers on each stage (each chunk, interleaved)")
      .option("--partition", o.partition, "K0,K1,...",
              "decoder layers per stage (per chunk, interleaved: S x v counts), uneven if you like (instead of --layers-per-stage)")
      .option("--layers", o.layers, "N", "the model's decoder layers, which --partition must cover (default: its sum)")
      .option("--width", o.width, "D", "the model's width (its MLP's hidden width is 2D)")
      .option("--link-gbps", o.link_gbps, "G", "pace the host link at G GB/s each way (0: unpaced)")
      .option("--fail-rank", o.fail_rank, "R", "rank R's forward throws in the second step")
      .option("--kill-rank", o.kill_rank, "R", "rank R kills itself (SIGKILL) in the second step")
      .option("--stall-rank", o.stall_rank, "R", "rank R stalls for 10 s in the second step (see --timeout-ms)")
      .option("--longer-rank", o.longer_rank, "R", "rank R's sequences are one token longer: its boundaries differ from its neighbours'")
      .option("--timeout-ms", o.timeout_ms, "T", "the transport's longest wait for a neighbour")
      .option("--trace", o.trace, "PREFIX", "write each stage's last step as a Chrome trace, PREFIX.stage<s>.json")
      .flag("--check", o.check, "compare every stage's loss and gradients bitwise with one process")
      .flag("--json", o.json, "print the result as JSON on rank 0")
      .flag("--no-debug-checks", o.no_debug_checks, "run without the executor's debug checks (for timing: they poison and guard every copy)");
  cli.parse(argc, argv);
  if (o.order != "gpipe" && o.order != "1f1b" && o.order != "interleaved") cli.fail("--pp-schedule must be gpipe, 1f1b or interleaved");
  if (o.virtual_stages == 0) o.virtual_stages = o.order == "interleaved" ? 2 : 1;
  if (o.order != "interleaved" && o.virtual_stages != 1) cli.fail("--virtual-stages needs --pp-schedule interleaved");
  if (o.steps < 1 || o.layers_per_stage < 1) cli.fail("--steps and --layers-per-stage must be at least 1");
  if (!(o.link_gbps >= 0)) cli.fail("--link-gbps must be >= 0");
  if (o.timeout_ms < 1) cli.fail("--timeout-ms must be at least 1");
  if (o.width < 4 || o.width % 4 != 0 || o.width > 4096) cli.fail("--width must be a multiple of 4 (the heads) from 4 to 4096");

  try {
    transformer::copy_task task{o.length + (rank == o.longer_rank ? 1 : 0), 16, false};
    auto const shape = task.batch_shape(o.batch);
    transformer::config cfg;
    // The partition: --partition's counts, checked against the model, or --layers-per-stage each.
    // Interleaved, one count per virtual stage (chunk c of stage s: entry c * S + s).
    auto const V = o.virtual_stages;
    tide::stage_spec const st{.stage = static_cast<std::uint32_t>(rank), .stages = static_cast<std::uint32_t>(S),
                              .micro_batches = o.micro_batches,
                              .order = o.order == "gpipe"   ? tide::stage_order::gpipe
                                       : o.order == "1f1b" ? tide::stage_order::one_f_one_b
                                                           : tide::stage_order::interleaved,
                              .virtual_stages = V};
    tide::check_stage(st);  // before sizing anything by its virtual stages
    auto const virtual_count = static_cast<std::uint32_t>(S) * V;
    tide::stage_partition part{std::vector<std::uint32_t>(virtual_count, o.layers_per_stage)};
    if (!o.partition.empty()) part = parse_partition(o.partition);
    std::uint32_t model_layers = o.layers;
    if (model_layers == 0)
      for (auto k : part.layers) model_layers += k;
    tide::check_partition(part, virtual_count, model_layers);
    auto const chunks = tide::chunks_of(part, st.stage, st.stages, V);
    auto const model_layer = tide::model_layers_of(part, st.stage, st.stages, V);  // per stage layer: its layer in the model
    cfg.layers = model_layers;
    cfg.width = o.width;
    cfg.mlp_hidden = 2 * o.width;
    cfg.dense_layers = cfg.layers;  // dense layers only: every stage has the same layer type
    transformer::model net(cfg, 7);  // every rank holds the same initial weights
    auto stage_cfg = cfg;
    stage_cfg.layers = stage_cfg.dense_layers = static_cast<std::uint32_t>(model_layer.size());
    auto const stack = transformer::make_stack(stage_cfg, shape);
    auto const slots = transformer::make_slot_map(stack);
    tide::strategy how{.buffers = {.staging_buffers = 2}, .pipeline = {.prefetch_distance = 1}};
    auto const schedule = tide::build_stage_schedule(stack, how, st, policies_of(o.policy, st), chunks);
    tide::host_backend_options bo;
    if (o.link_gbps > 0) bo.d2h = bo.h2d = {o.link_gbps * 1e9, 0};
    tide::host_backend backend(bo);
    double const loss_scale = 1.0 / o.micro_batches;
    tide::executor_options eo{.loss_scale = loss_scale};
    if (o.no_debug_checks) eo.debug_checks = false;
    tide::executor ex(backend, schedule, eo);

    bool const last_stage = rank + 1 == S;
    auto const emb = net.embedding_tensor();
    std::vector<float> head_emb(emb.size);  // the last stage's share of the embedding's gradient
    std::vector<double> losses(o.micro_batches);
    data d;
    int step = 0;
    double busy_ms = 0;  // compute-stream time in the lambdas this step

    auto forward = [&](auto const& ctx) {
      auto const t0 = clock_type::now();
      if (step == 1 && rank == o.fail_rank) throw std::runtime_error("rank " + std::to_string(rank) + " fails on purpose (--fail-rank)");
      if (step == 1 && rank == o.kill_rank) std::raise(SIGKILL);
      if (step == 1 && rank == o.stall_rank && ctx.micro_batch == 0 && ctx.layer == 0 && ctx.mode == tide::forward_mode::forward)
        std::this_thread::sleep_for(std::chrono::seconds(10));
      auto const in = ctx.template carry_in<float>();
      auto const l = model_layer[ctx.layer];
      if (ctx.mode == tide::forward_mode::recompute) {
        auto spans = slots.spans(ctx);
        auto const saved = slots.saved(ctx);
        for (std::size_t i = 0; i < transformer::tensor_count; ++i)
          if (!saved[i].empty()) spans[i] = {const_cast<float*>(saved[i].data()), saved[i].size()};
        net.layer_recompute(l, shape, in, spans, slots.produced(ctx), slots.bound(ctx));
      } else {
        net.layer_forward(l, shape, in, slots.spans(ctx), ctx.template carry_out<float>());
      }
      busy_ms += ms_since(t0);
    };
    auto backward = [&](auto const& ctx) {
      auto const t0 = clock_type::now();
      auto const g = ctx.template gradient<float>();
      net.layer_backward(model_layer[ctx.layer], shape, ctx.template carry_in<float>(), slots.spans(ctx), g, g);
      busy_ms += ms_since(t0);
    };
    auto turn = [&](auto const& ctx) {  // the last stage: the head and the loss, per micro-batch
      auto const t0 = clock_type::now();
      losses[ctx.micro_batch] = net.head(ctx.template output<float>(), d.targets[ctx.micro_batch], shape,
                                         ctx.template gradient<float>(), ctx.loss_scale, head_emb);
      busy_ms += ms_since(t0);
    };
    auto ends = tide::mpi::stage_ends{
        [&](auto const& ctx) {  // stage 0's input: the embedding of the micro-batch's tokens
          auto const x = ctx.span();
          net.embed(d.tokens[ctx.micro_batch], shape, {reinterpret_cast<float*>(x.data()), x.size() / sizeof(float)});
        },
        [&](auto const& ctx) {  // the gradient of stage 0's input: the embedding's backward
          auto const x = ctx.span();
          net.embed_backward(d.tokens[ctx.micro_batch], shape, {reinterpret_cast<float const*>(x.data()), x.size() / sizeof(float)});
        }};
    tide::mpi::transport transport(world, ends, {.timeout = std::chrono::milliseconds(o.timeout_ms)});

    // The one-process run (--check, rank 0): the whole model, the same micro-batches.
    std::optional<transformer::model> ref;
    std::vector<float> ref_head_emb(emb.size);
    if (o.check && rank == 0) ref.emplace(cfg, 7);

    bool all_equal = true;
    std::vector<double> step_times, busy_times;  // per step
    auto const params = net.parameter_tensors();
    // What each stage owns of the gradients: its layers', stage 0 the embedding, the last the final norm.
    auto owner = [&](std::string const& name) {
      if (name == "embedding") return 0;
      if (name == "final_norm") return S - 1;
      auto const l = std::stoul(name.substr(std::strlen("layers.")));
      return static_cast<int>(tide::stage_of_layer(part, static_cast<std::uint32_t>(l)) % static_cast<std::uint32_t>(S));
    };
    tide::timeline tl;
    for (step = 0; step < o.steps; ++step) {
      if (!o.trace.empty() && step + 1 == o.steps) {
        ex.record_timeline(&tl);
        // One clock for the picture: the stages start the traced step together.
        tide::mpi::check(MPI_Barrier(world.native()), "MPI_Barrier", rank);
      }
      d = sample(task, o.batch, o.micro_batches, step);
      net.zero_gradients();
      std::fill(head_emb.begin(), head_emb.end(), 0.0f);
      busy_ms = 0;
      auto const t0 = clock_type::now();
      ex.step(forward, backward, tide::turn{turn}, tide::hooks{.transport = std::ref(transport)});
      step_times.push_back(ms_since(t0));
      busy_times.push_back(busy_ms);
      // The tied embedding: the head's share goes to stage 0, which adds it to the embedding's.
      auto g = net.gradients();
      if (S == 1) {
        for (std::size_t i = 0; i < emb.size; ++i) g[emb.offset + i] += head_emb[i];
      } else if (last_stage) {
        tide::mpi::check(MPI_Send(head_emb.data(), static_cast<int>(emb.size), MPI_FLOAT, 0, 1, world.native()), "MPI_Send", rank);
      } else if (rank == 0) {
        std::vector<float> h(emb.size);
        tide::mpi::check(MPI_Recv(h.data(), static_cast<int>(emb.size), MPI_FLOAT, S - 1, 1, world.native(), MPI_STATUS_IGNORE),
                         "MPI_Recv", rank);
        for (std::size_t i = 0; i < emb.size; ++i) g[emb.offset + i] += h[i];
      }
      // Every stage's checksum of what it owns, and the losses (the last stage's), on rank 0.
      std::vector<unsigned long long> mine(params.size(), 0), sums(params.size(), 0);
      for (std::size_t k = 0; k < params.size(); ++k)
        if (owner(params[k].name) == rank) mine[k] = fnv(std::span<float const>(g.data() + params[k].offset, params[k].size));
      tide::mpi::check(MPI_Reduce(mine.data(), sums.data(), static_cast<int>(mine.size()), MPI_UNSIGNED_LONG_LONG, MPI_BOR, 0,
                                  world.native()), "MPI_Reduce", rank);
      std::vector<double> last_losses(o.micro_batches);
      if (S > 1 && last_stage)
        tide::mpi::check(MPI_Send(losses.data(), static_cast<int>(o.micro_batches), MPI_DOUBLE, 0, 2, world.native()), "MPI_Send", rank);
      if (rank == 0) {
        if (S > 1)
          tide::mpi::check(MPI_Recv(last_losses.data(), static_cast<int>(o.micro_batches), MPI_DOUBLE, S - 1, 2, world.native(),
                                    MPI_STATUS_IGNORE), "MPI_Recv", rank);
        else
          last_losses = losses;
      }
      if (ref) {
        ref->zero_gradients();
        std::fill(ref_head_emb.begin(), ref_head_emb.end(), 0.0f);
        for (std::uint32_t m = 0; m < o.micro_batches; ++m) {
          double const loss = ref->accumulate_micro_batch(d.tokens[m], d.targets[m], shape, loss_scale, ref_head_emb);
          if (std::memcmp(&loss, &last_losses[m], sizeof loss) != 0) {
            std::fprintf(stderr, "pipeline_parallel: step %d micro-batch %u: loss %.17g, one process %.17g\n", step, m,
                         last_losses[m], loss);
            all_equal = false;
          }
        }
        auto rg = ref->gradients();
        for (std::size_t i = 0; i < emb.size; ++i) rg[emb.offset + i] += ref_head_emb[i];
        for (std::size_t k = 0; k < params.size(); ++k) {
          auto const want = fnv(std::span<float const>(rg.data() + params[k].offset, params[k].size));
          if (want != sums[k]) {
            std::fprintf(stderr, "pipeline_parallel: step %d: the gradient of %s (stage %d) differs from one process's\n", step,
                         params[k].name.c_str(), owner(params[k].name));
            all_equal = false;
          }
        }
      }
      // The whole gradient on every rank (each part from its owner), then the same AdamW step.
      std::vector<float> full(g.size(), 0.0f);
      for (auto const& p : params)
        if (owner(p.name) == rank) std::copy_n(g.data() + p.offset, p.size, full.data() + p.offset);
      tide::mpi::check(MPI_Allreduce(MPI_IN_PLACE, full.data(), static_cast<int>(full.size()), MPI_FLOAT, MPI_SUM, world.native()),
                       "MPI_Allreduce", rank);
      std::copy(full.begin(), full.end(), g.begin());
      net.adamw_step({});
      if (ref) {
        // The reference's gradients equal the gathered ones exactly when the check passed; its
        // weights follow the same update.
        std::copy(full.begin(), full.end(), ref->gradients().begin());
        ref->adamw_step({});
      }
    }
    if (!o.trace.empty()) {
      auto const path = o.trace + ".stage" + std::to_string(rank) + ".json";
      std::ofstream f(path);
      tide::write_chrome_trace(f, tl, schedule, "stage " + std::to_string(rank));
      if (!f) throw std::runtime_error("cannot write " + path);
    }
    int equal = all_equal ? 1 : 0;
    tide::mpi::check(MPI_Bcast(&equal, 1, MPI_INT, 0, world.native()), "MPI_Bcast", rank);

    // Per stage: predicted and measured device peak, host bytes, the median step (the first step
    // left out when there are more: it warms the caches), its bubble (the step less the compute in
    // the lambdas), the compute, and the bytes offloaded a step, on rank 0.
    auto median = [](std::vector<double> v) {
      if (v.size() > 1) v.erase(v.begin());
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto const step_ms = median(step_times), busy = median(busy_times);
    std::size_t copied = 0;
    for (auto const& op : schedule.ops)
      if (op.kind == tide::op_kind::offload) copied += op.bytes;
    constexpr int fields = 7;
    std::array<double, fields> row{static_cast<double>(schedule.peak_device_bytes()), static_cast<double>(backend.device_peak_bytes()),
                                   static_cast<double>(schedule.peak_host_bytes()), step_ms, std::max(0.0, step_ms - busy), busy,
                                   static_cast<double>(copied)};
    std::vector<double> rows(fields * static_cast<std::size_t>(S));
    tide::mpi::check(MPI_Gather(row.data(), fields, MPI_DOUBLE, rows.data(), fields, MPI_DOUBLE, 0, world.native()), "MPI_Gather", rank);
    if (rank == 0) {
      if (o.json) {
        std::printf("{\"pp_schedule\": \"%s\", \"virtual_stages\": %u, \"policy\": \"%s\", \"micro_batches\": %u, \"stages\": [",
                    o.order.c_str(), V, o.policy.c_str(), o.micro_batches);
        for (int s = 0; s < S; ++s) {
          auto const* r = &rows[fields * static_cast<std::size_t>(s)];
          std::printf("%s{\"stage\": %d, \"predicted_device_peak_bytes\": %.0f, \"measured_device_peak_bytes\": %.0f, "
                      "\"host_bytes\": %.0f, \"step_ms\": %.3f, \"bubble_ms\": %.3f, \"compute_ms\": %.3f, "
                      "\"offloaded_bytes_per_step\": %.0f}",
                      s ? ", " : "", s, r[0], r[1], r[2], r[3], r[4], r[5], r[6]);
        }
        std::printf("], \"checksums_equal\": %s}\n", !o.check ? "null" : equal ? "true" : "false");
      } else {
        std::printf("pipeline_parallel: %d stages, %s, %u chunks a stage, %u micro-batches, policy %s, %d steps\n", S,
                    o.order.c_str(), V, o.micro_batches, o.policy.c_str(), o.steps);
        std::printf("%6s %16s %16s %12s %10s %10s\n", "stage", "predicted peak", "measured peak", "host bytes", "step ms", "bubble ms");
        for (int s = 0; s < S; ++s) {
          auto const* r = &rows[fields * static_cast<std::size_t>(s)];
          std::printf("%6d %16.0f %16.0f %12.0f %10.3f %10.3f\n", s, r[0], r[1], r[2], r[3], r[4]);
        }
        if (o.check) std::printf("one-process check: %s\n", equal ? "bitwise equal" : "DIFFERENT");
      }
    }
    return equal ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "pipeline_parallel: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    // Give the other ranks the time to report their own error (the failure notices reach them
    // within milliseconds) before the job is torn down.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
