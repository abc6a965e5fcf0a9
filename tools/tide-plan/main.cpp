// tide-plan: what should I offload on my model and machine, and how fast will it be?
//
// Takes a preset model (with its sequence length, micro-batch and parallel layout) or a model
// file, a hardware preset or a calibration file, and budgets; prints the strategy table (keep all,
// full remat, naive offload, latency-hidden offload, pipelined, the planner's choice) and writes
// the chosen plan as a policy file, as C++ types and as a predicted timeline. `--help` lists every
// flag. Bad input exits 2 with a message that names it; docs/planning.md has a walk-through.
#include "args.hpp"  // the command line, its checks and the preset models (also driven by tests/fuzz/fuzz_files.cpp)
#include "sweep.hpp"  // --micro-batch 1-8, 2,4,8 or auto: the per-micro-batch table (issue 42)

#include <tide/io/json.hpp>
#include <tide/plan/policy_codegen.hpp>
#include <tide/tide.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using tide_plan::args;

constexpr char const* preamble =
    "tide-plan: plans where the data saved for backward lives (kept, offloaded to host memory and\n"
    "prefetched back, or recomputed) on a model and a machine, and predicts the step.\n\n"
    "  tide-plan --model deepseek-v3 --hardware gb200 --micro-batch 8 --gpus 128 --fsdp 128 --ep 64\n"
    "  tide-plan --model-file my_model.json --calibration measured.json --policy-out plan.json\n\n";
constexpr char const* epilog =
    "\nModels: deepseek-v3, llama-3.1-405b (public dimensions; see tide/plan/transformer.hpp), or a\n"
    "model file (docs/model.schema.json). Hardware: h100, h200, gh200, gb200, vera-rubin (datasheets;\n"
    "see tide/plan/hardware.hpp). A calibration file (docs/calibration.schema.json, written by\n"
    "tide::io::write_calibration_file from tide::calibrate's table) replaces the preset's host link\n"
    "and overheads, and gives a model file's layer costs when the file has none.\n"
    "The device budget is the device memory less what the model keeps resident (weights, gradients,\n"
    "optimizer state, workspaces: from the parallel layout for presets, resident_bytes in a model file).\n"
    "A progress line goes to stderr when planning takes over a second (TIDE_PLAN_PROGRESS_AFTER: seconds).\n"
    "Exit status: 0 done; 2 bad input (unknown preset, impossible layout, malformed file, outputs that would overwrite an\n"
    "input or each other, budget below the smallest schedule); 1 an internal error.\n";

[[noreturn]] void bad_input(std::string message) {
  if (message.starts_with("tide: ")) message.erase(0, 6);
  std::fprintf(stderr, "tide-plan: %s\n", message.c_str());
  std::exit(2);
}

std::vector<tide::name> split_names(std::string const& list, tide::stack_spec const& stack) {
  std::vector<tide::name> r;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    auto const end = std::min(list.find(',', pos), list.size());
    auto const name = list.substr(pos, end - pos);
    bool found = false;
    for (auto const& t : stack.types)
      for (auto const& s : t.slots)
        if (!found && s.name == name) r.push_back(s.name), found = true;
    if (!found) bad_input("--offload: unknown slot '" + tide_plan::echo(name) + "' (the model's slots: " + tide::io::detail::slot_list(stack) + ")");
    pos = end + 1;
  }
  return r;
}

//! Where tide-plot-trace is: beside this program (installed, or in the build folder).
std::string plot_script() {
  std::error_code ec;
  auto const self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  auto const p = self.parent_path() / "tide-plot-trace";
  return std::filesystem::exists(p) ? p.string() : std::string();
}

// A name as a terminal shows it: control bytes (a NUL, which cut the printed name short, an
// escape sequence, a newline) as \xNN; other bytes, UTF-8 included, as they are.
std::string shown(std::string_view s) {
  std::string r;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      r += b;
    } else {
      r += static_cast<char>(c);
    }
  }
  return r;
}

std::string shell_quote(std::string const& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

double gib(std::size_t b) { return static_cast<double>(b) / double(1ull << 30); }

// The problem to plan: a stack, its costs and what else the device holds.
struct problem {
  std::string name;
  tide::stack_spec stack;
  tide::cost_table costs;
  tide::strategy_options options;  // the budgets (activations, host), resident bytes, collectives, rows
  tide::io::model_description file;  // owns a model file's names
  std::vector<std::string> notes;
};

// Before the cost table and the strategy table: a model over the planner's limit is refused in a
// moment, not after the table's schedules were built (seconds and gigabytes for a deep model file).
void check_decisions(args const& a, problem& p) {
  if (a.max_decisions) p.options.max_decisions = static_cast<std::size_t>(*a.max_decisions);
  if (auto const n = tide::decision_count(p.stack); n > p.options.max_decisions)
    bad_input("the model has " + std::to_string(n) + " (layer, slot) decisions (" + std::to_string(p.stack.layer_count()) +
              " layers) and the planner takes at most " + std::to_string(p.options.max_decisions) +
              ": raise --max-decisions (runs of identical layers, or of a repeating block of up to 8 layers, are planned "
              "as groups: a deep stack of few layer types plans in seconds), or plan a representative part of it");
}

problem make_problem(args const& a, tide::hardware_spec const& hw, std::optional<tide::cost_table> const& calibration) {
  using namespace tide;
  problem p;
  std::size_t const device_memory =
      a.device_memory_gib ? static_cast<std::size_t>(*a.device_memory_gib * double(1ull << 30)) : hw.hbm_bytes;
  if (!a.model.empty()) {
    transformer_spec m;
    training_spec t;
    std::vector<tide::name> offload;
    try {
      std::tie(m, t) = tide_plan::preset_model(a, &offload);
      p.stack = transformer_stack(m);
      p.costs = transformer_costs(m, hw, t);
      p.options.resident_bytes = transformer_resident_memory(m, hw, t).total();
      p.options.collectives = training_collectives(t);
    } catch (tide::error const& e) {
      bad_input(e.what());
    }
    if (calibration) {
      p.costs.link = calibration->link;
      p.costs.sync_latency_us = calibration->sync_latency_us;
      p.costs.op_overhead_us = calibration->op_overhead_us;
      p.notes.push_back("host link and overheads from the calibration file");
    }
    p.options.offload_slots = offload;
    p.options.remat_rest = true;  // selective offload on top of full remat, as in the published study
    char buf[400];
    std::snprintf(buf, sizeof buf, "%s, seq %llu, micro-batch %llu, TP %llu, %llu GPUs (FSDP %llu, EP %llu, PP %llu)%s",
                  std::string(m.name).c_str(), static_cast<unsigned long long>(m.seq_len),
                  static_cast<unsigned long long>(m.micro_batch), static_cast<unsigned long long>(a.tp),
                  static_cast<unsigned long long>(a.gpus), static_cast<unsigned long long>(a.fsdp),
                  static_cast<unsigned long long>(a.ep), static_cast<unsigned long long>(a.pp), a.fp8 ? ", FP8" : "");
    p.name = buf;
  } else {
    try {
      p.file = io::read_model_file(a.model_file);
    } catch (tide::error const& e) {
      bad_input(e.what());
    }
    p.stack = p.file.stack;
    check_decisions(a, p);  // before the cost table: a deep file is refused before any per-layer work
    p.name = p.file.name.empty() ? a.model_file : p.file.name;
    p.options.resident_bytes = p.file.resident_bytes;
    p.options.collectives = p.file.collectives();
    auto const link = calibration ? calibration->link : hw.link();
    try {
      if (p.file.has_costs()) {
        p.costs = p.file.costs(hw, link);
      } else if (calibration) {
        if (calibration->layers.size() != p.stack.layer_count())
          bad_input("the model file gives no costs and the calibration file has " + std::to_string(calibration->layers.size()) +
                    " layers, the model " + std::to_string(p.stack.layer_count()) +
                    ": calibrate the same stack, or give \"cost\" per layer type in the model file");
        p.costs = *calibration;
        p.notes.push_back("layer costs from the calibration file");
      } else {
        p.costs = p.file.costs(hw, link);  // throws, naming the type without a cost
      }
      p.costs.check_against(p.stack);
    } catch (tide::error const& e) {
      bad_input(e.what());
    }
    if (calibration) {
      p.costs.sync_latency_us = calibration->sync_latency_us;
      p.costs.op_overhead_us = calibration->op_overhead_us;
      if (p.file.has_costs()) p.notes.push_back("host link and overheads from the calibration file");
    }
    // The remat and offload rows keep the layers' inputs: what a recompute starts from.
    p.options.keep_slots.clear();
    for (auto const& t : p.stack.types)
      for (auto const& s : t.slots)
        if (s.input) p.options.keep_slots.push_back(s.name);
  }
  if (!a.offload.empty()) p.options.offload_slots = split_names(a.offload, p.stack);
  if (p.options.resident_bytes >= device_memory) {
    // Say which flags make it fit: the layout shards a preset's state; a model file states its own.
    std::string hint = a.model_file.empty()
                           ? ": shard the model state over more GPUs with --gpus, --fsdp and --ep (--tp, --pp), or raise --device-memory"
                           : ": lower the file's resident_bytes, or raise --device-memory";
    if (a.model == "deepseek-v3") hint += " (the published study's layout: --gpus 128 --fsdp 128 --ep 64)";
    if (a.model == "llama-3.1-405b") hint += " (the published study's layout: --gpus 128 --fsdp 128)";
    bad_input("the model keeps " + tide::format_bytes(static_cast<double>(p.options.resident_bytes)) +
              " resident (weights, gradients, optimizer state, workspaces), more than the device's " +
              tide::format_bytes(static_cast<double>(device_memory)) + ": nothing is left for activations" + hint);
  }
  p.options.device_budget = device_memory - p.options.resident_bytes;
  p.options.host_budget =
      a.host_budget_gib ? static_cast<std::size_t>(*a.host_budget_gib * double(1ull << 30)) : hw.pinnable_host_bytes();
  p.options.storage_budget = static_cast<std::size_t>(a.storage_budget_gib * double(1ull << 30));
  check_decisions(a, p);
  if (p.costs.storage.unpaced()) p.costs.storage = hw.storage();  // a model file's or calibration's table: the preset's drives
  if (p.options.storage_budget > 0 && p.costs.storage.unpaced())
    bad_input("--storage-budget needs a storage link: the hardware '" + std::string(hw.name) +
              "' has no NVMe figures: give --hardware h100, h200, gb200 or vera-rubin");
  return p;
}

// Runs `work` on a thread; after a second, a progress line on stderr until it is done.
template <class F>
auto with_progress(F&& work, bool quiet) {
  auto fut = std::async(std::launch::async, std::forward<F>(work));
  auto const t0 = std::chrono::steady_clock::now();
  double after = 1.0;  // seconds before the line shows; TIDE_PLAN_PROGRESS_AFTER overrides it
  if (char const* e = std::getenv("TIDE_PLAN_PROGRESS_AFTER")) after = std::atof(e);
  bool const tty = isatty(STDERR_FILENO) != 0;
  bool shown = false;
  while (fut.wait_for(std::chrono::milliseconds(quiet ? 1000 : after < 0.25 ? 1 : 250)) != std::future_status::ready) {
    auto const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (quiet || s < after) continue;
    if (tty) std::fprintf(stderr, "\rtide-plan: planning... %.0f s", s);
    else if (!shown) std::fprintf(stderr, "tide-plan: planning (more than %g s)...\n", after);
    shown = true;
  }
  if (shown) {
    auto const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%stide-plan: planned in %.1f s\n", tty ? "\r" : "", s);
  }
  return fut.get();  // rethrows what the work threw
}

}  // namespace

int run(int argc, char** argv) {
  using namespace tide;
  args a;
  try {
    a = tide_plan::parse_args(argc, argv);
  } catch (tide_plan::usage_error const& e) {
    args dummy;
    std::fprintf(stderr, "tide-plan: %s\n%s", e.what(), tide_plan::command_line(dummy).usage().c_str());
    return 2;
  }  // a tide::error (a bad layout, outputs over inputs): main prints it, exit 2
  if (a.help) {
    args dummy;
    std::printf("%s%s%s", preamble, tide_plan::command_line(dummy).help().c_str(), epilog);
    return 0;
  }

  auto const hw = tide_plan::hardware_named(a.hardware);
  std::optional<cost_table> calibration;
  if (!a.calibration.empty()) try {
      calibration = io::read_calibration_file(a.calibration);
    } catch (tide::error const& e) {
      bad_input(e.what());
    }
  // Several micro-batches: each planned for tokens per second (with the cost model's fixed work
  // per op and the optimizer step); the best one's strategy table and plan follow, in that model.
  std::optional<tide_plan::sweep_result> sweep;
  if (a.sweep()) {
    std::size_t const memory = a.device_memory_gib ? static_cast<std::size_t>(*a.device_memory_gib * double(1ull << 30)) : hw.hbm_bytes;
    try {
      sweep = tide_plan::plan_sweep(a, hw, memory, [&](args const& one) { return make_problem(one, hw, calibration); });
    } catch (tide::error const& e) {
      bad_input(e.what());
    }
    if (!sweep->plan.best)
      bad_input("no micro-batch of " + std::to_string(sweep->plan.results.front().micro_batch) + " to " +
                std::to_string(sweep->plan.results.back().micro_batch) +
                " fits: raise --device-memory or --host-budget, shard the model state over more GPUs, or shorten --seq");
    a.micro_batch = sweep->plan.results[*sweep->plan.best].micro_batch;
  }
  auto p = make_problem(a, hw, calibration);
  if (sweep) {
    auto const [m, t] = tide_plan::preset_model(a);
    add_fixed_work(p.costs, m, hw, t);
  }
  // An unpaced link (bandwidth 0: what calibrate writes when it does not measure the link) makes
  // every copy free: the plan's offloads are then not a prediction, so say so.
  std::vector<std::string> warnings;
  {
    std::string unpaced;
    if (p.costs.link.d2h.bytes_per_second == 0) unpaced = "d2h";
    if (p.costs.link.h2d.bytes_per_second == 0) unpaced += unpaced.empty() ? "h2d" : " and h2d";
    if (!unpaced.empty())
      warnings.push_back("the calibration file's host link is unpaced (bytes_per_second 0, " + unpaced +
                         "): offloads are planned as free copies; calibrate with a measured link for a real plan");
  }
  if (!a.json)
    for (auto const& w : warnings) std::fprintf(stderr, "tide-plan: warning: %s\n", w.c_str());
  std::optional<strategy> user_policy;
  if (!a.policy.empty()) try {
      user_policy = io::read_policy_file(a.policy, p.stack);
      // The model's hooks, as every row has them; a file that turns their overlap off keeps that
      // (a run without latency hiding, to compare against).
      auto const overlap = user_policy->collectives.overlap;
      user_policy->collectives = p.options.collectives;
      user_policy->collectives.overlap = overlap && p.options.collectives.overlap;
      auto const s = build_schedule(p.stack, *user_policy);  // names an unused rule or a bad field before planning
      // Spills with no storage link would be priced as free (issue 40): say so, as for an unpaced host link.
      if (s.peak_storage_bytes() > 0 && p.costs.storage.unpaced()) {
        warnings.push_back("the policy file spills " + format_bytes(static_cast<double>(s.peak_storage_bytes())) +
                           " but the hardware '" + std::string(hw.name) +
                           "' has no storage link: its stores and loads are priced as free and its row does not fit a storage "
                           "budget of " + format_bytes(static_cast<double>(p.options.storage_budget)) +
                           "; give --hardware h100, h200, gb200 or vera-rubin, or a policy that does not spill");
        if (!a.json) std::fprintf(stderr, "tide-plan: warning: %s\n", warnings.back().c_str());
      }
    } catch (tide::error const& e) {
      bad_input(e.what());
    }

  struct result {
    std::vector<strategy_row> rows;
    plan chosen;
  };
  result r;
  try {
    r = with_progress(
        [&] {
          result x;
          auto o = p.options;
          o.include_plan = false;  // planned below, with the policy file among the seeds
          x.rows = compare_strategies(p.stack, p.costs, o);
          std::vector<strategy> extra;
          if (user_policy) extra.push_back(*user_policy);
          x.chosen = plan_seeded_by(p.stack, p.costs, o, x.rows, std::move(extra));
          return x;
        },
        a.quiet);
  } catch (tide::error const& e) {
    bad_input(e.what());
  }
  if (user_policy) r.rows.push_back(evaluate_strategy(p.stack, p.costs, *user_policy, p.options, "policy-file", "policy file"));
  auto const& pl = r.chosen;
  if (!pl.fits)
    bad_input("no schedule fits: the device budget for activations is " + format_bytes(static_cast<double>(p.options.device_budget)) +
              " (device memory less " + format_bytes(static_cast<double>(p.options.resident_bytes)) +
              " resident) and the smallest schedule found needs " + format_bytes(static_cast<double>(pl.smallest_activation_bytes)) +
              (p.options.host_budget != static_cast<std::size_t>(-1)
                   ? " (host budget " + format_bytes(static_cast<double>(p.options.host_budget)) + ")"
                   : std::string()) +
              ": raise --device-memory or --host-budget, or shrink the micro-batch or sequence");
  auto const planned = evaluate_strategy(p.stack, p.costs, pl.strategy, p.options, "planner",
                                         pl.exact ? "planner (exact)" : "planner (heuristic)");
  r.rows.push_back(planned);

  std::vector<std::string> wrote;
  try {
    if (!a.policy_out.empty()) {
      io::write_policy_file(a.policy_out, pl.strategy);
      wrote.push_back(a.policy_out + " (policy file)");
    }
    if (!a.cpp.empty()) {
      // The name quoted as a literal: a newline or a final backslash would end or extend the comment.
      auto const code = "// tide-plan's plan for " + cpp_string_literal(p.name) + " on " + std::string(hw.name) + "\n" +
                        to_cpp_types(pl.strategy, "tide_plan");
      if (a.cpp == "-") {
        std::printf("%s", code.c_str());
      } else {
        std::ofstream out(a.cpp);
        out << code;
        if (!out) throw tide::error("tide: cannot write " + a.cpp);
        wrote.push_back(a.cpp + " (C++ types)");
      }
    }
    if (!a.trace.empty()) {
      auto s = pl.build(p.stack);
      auto sim = simulate(s, p.costs);
      {
        std::ofstream out(a.trace);
        write_chrome_trace(out, sim.trace, s, "tide-plan: " + p.name + " on " + std::string(hw.name));
        if (!out) throw tide::error("tide: cannot write " + a.trace);
      }
      wrote.push_back(a.trace + " (Chrome trace: chrome://tracing or ui.perfetto.dev)");
      auto const script = plot_script();
      auto const png = a.trace + ".png";
      if (script.empty()) {
        std::fprintf(stderr, "tide-plan: no PNG: tide-plot-trace is not installed beside tide-plan\n");
      } else if (std::system(("python3 " + shell_quote(script) + " " + shell_quote(a.trace) + " " + shell_quote(png) + " >/dev/null 2>&1").c_str()) != 0) {
        std::fprintf(stderr, "tide-plan: no PNG: tide-plot-trace needs python3 with matplotlib (pip install matplotlib)\n");
      } else {
        wrote.push_back(png + " (timeline)");
      }
    }
  } catch (tide::error const& e) {
    bad_input(e.what());
  }

  if (a.json) {
    io::json j;
    j["model"] = p.name;
    j["hardware"] = std::string(hw.name);
    j["layers"] = p.stack.layer_count();
    j["resident_bytes"] = p.options.resident_bytes;
    j["device_budget_bytes"] = p.options.device_budget;
    j["host_budget_bytes"] = p.options.host_budget == static_cast<std::size_t>(-1) ? io::json(nullptr) : io::json(p.options.host_budget);
    j["storage_budget_bytes"] = p.options.storage_budget;
    j["rows"] = io::json::array();
    for (auto const& row : r.rows)
      j["rows"].push_back({{"key", row.key},
                           {"name", row.name},
                           {"step_us", row.step_us},
                           {"forward_us", row.forward_us},
                           {"backward_us", row.backward_us},
                           {"recompute_us", row.recompute_us},
                           {"exposed_transfer_us", row.exposed_transfer_us},
                           {"exposed_collective_us", row.exposed_collective_us},
                           {"activation_bytes", row.activation_bytes},
                           {"whole_device_bytes", row.whole_device_bytes},
                           {"host_bytes", row.host_bytes},
                           {"storage_bytes", row.storage_bytes},
                           {"fits", row.fits},
                           {"over_budget", row.over_budget}});
    j["plan"] = {{"step_us", planned.step_us},
                 {"activation_bytes", pl.activation_bytes},
                 {"whole_device_bytes", pl.whole_device_bytes()},
                 {"host_bytes", pl.host_bytes},
                 {"storage_bytes", pl.storage_bytes},
                 {"exact", pl.exact},
                 {"lower_bound_ms", pl.lower_bound_us / 1e3},
                 {"gap_to_bound", pl.gap_to_bound()},
                 {"schedules_built", pl.evaluations},
                 {"grouped_layers", pl.grouped_layers},
                 {"policy", io::to_json(pl.strategy)}};
    if (sweep) j["micro_batches"] = tide_plan::sweep_json(*sweep);
    j["wrote"] = wrote;
    j["warnings"] = warnings;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (sweep)
    std::printf("tokens per second by micro-batch on %s (%zu planned):\n%s\nmicro-batch %llu, the most tokens per second:\n",
                std::string(hw.name).c_str(), sweep->plan.results.size(), tide_plan::format_sweep(*sweep).c_str(),
                static_cast<unsigned long long>(a.micro_batch));
  std::printf("%s on %s (%u layers)\n", shown(p.name).c_str(), std::string(hw.name).c_str(), p.stack.layer_count());
  if (p.options.storage_budget)
    std::printf("  storage budget %s (spill file; write %.1f GB/s, read %.1f GB/s)\n",
                format_bytes(static_cast<double>(p.options.storage_budget)).c_str(), p.costs.storage.write.bytes_per_second / 1e9,
                p.costs.storage.read.bytes_per_second / 1e9);
  std::printf("  resident %s; activation budget %s; host budget %s\n", format_bytes(static_cast<double>(p.options.resident_bytes)).c_str(),
              format_bytes(static_cast<double>(p.options.device_budget)).c_str(),
              p.options.host_budget == static_cast<std::size_t>(-1) ? "unlimited" : format_bytes(static_cast<double>(p.options.host_budget)).c_str());
  for (auto const& n : p.notes) std::printf("  %s\n", n.c_str());
  std::printf("%s", format_strategy_table(r.rows).c_str());
  std::size_t off = 0, rem = 0, spill = 0;
  for (auto d : pl.decisions) off += d == placement::offload, rem += d == placement::remat, spill += d == placement::spill;
  std::printf("  plan: %zu offloaded, %zu rematerialized%s of %zu (layer, slot) pairs; step %.2f ms, device peak %.1f GiB, host %.1f GiB%s\n",
              off, rem, spill ? (", " + std::to_string(spill) + " spilled").c_str() : "", pl.decisions.size(), planned.step_us / 1e3,
              gib(pl.whole_device_bytes()), gib(pl.host_bytes),
              p.options.storage_budget ? (", storage " + format_bytes(static_cast<double>(pl.storage_bytes))).c_str() : "");
  if (pl.grouped_layers > 0)
    std::printf("  grouped: %zu of %u layers planned as blocks of identical layers (runs' ends layer by layer); the gap below is the whole plan's\n",
                pl.grouped_layers, p.stack.layer_count());
  std::printf("  lower bound %.2f ms: no schedule over the candidate pipelines within these budgets steps faster in the sim; the plan is within %.2f%% of it\n",
              pl.lower_bound_us / 1e3, 100 * pl.gap_to_bound());
  for (auto const& w : wrote) std::printf("  wrote %s\n", w.c_str());
  return 0;
}

int main(int argc, char** argv) {
  // Bad input is reported where it is found (exit 2); what escapes is tide's or the system's.
  try {
    return run(argc, argv);
  } catch (tide::error const& e) {
    bad_input(e.what());
  } catch (std::exception const& e) {
    std::fprintf(stderr, "tide-plan: internal error: %s\n", e.what());
    return 1;
  }
}
