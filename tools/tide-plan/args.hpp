#pragma once
// tide-plan's command line: the flags, their bounds, the preset model and layout they describe,
// and the output paths. Nothing here exits or writes: bad input throws (`usage_error` for a bad
// command line, which main prints with the usage line; `tide::error` otherwise), so the fuzz
// target (tests/fuzz/fuzz_files.cpp) drives it too.

#include <tide/plan/hardware.hpp>
#include <tide/plan/transformer.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace tide_plan {

//! A bad command line: main prints the message and the usage line, exit code 2.
struct usage_error : tide::error {
  using tide::error::error;
};

//! `s` quoted in a message: at most 64 bytes, then "..." and the length.
inline std::string echo(std::string_view s) {
  if (s.size() <= 64) return std::string(s);
  return std::string(s.substr(0, 64)) + "... (" + std::to_string(s.size()) + " bytes)";
}

struct args {
  std::string model, model_file, hardware = "h200", calibration;
  std::optional<std::uint64_t> seq;  // none: the preset's (0 is a value, refused; it had meant "not given")
  std::uint64_t micro_batch = 1, tp = 1, gpus = 1, fsdp = 1, ep = 1, pp = 1;
  bool fp8 = false;
  // Not given: the hardware preset's. An optional, not a value a number could equal: any number
  // given, -1.79e308 included, is checked as a number.
  std::optional<double> device_memory_gib, host_budget_gib;
  double storage_budget_gib = 0;
  std::optional<std::uint64_t> max_decisions;  // not given: plan_options' default
  // --micro-batch as given: one micro-batch (`micro_batch`), or a list or range (`micro_batches`,
  // increasing) or auto (`micro_batch_auto`): the per-micro-batch table (tools/tide-plan/sweep.hpp).
  // `parse_micro_batches` reads it.
  std::optional<std::string> micro_batch_text;
  std::vector<std::uint64_t> micro_batches;
  bool micro_batch_auto = false;
  //! True when several micro-batches are planned (a list, a range or auto).
  [[nodiscard]] bool sweep() const noexcept { return micro_batch_auto || !micro_batches.empty(); }
  std::string offload, policy, policy_out, cpp, trace;
  bool json = false, quiet = false, help = false;
};

//! The flags: each names the field it sets.
class command_line {
 public:
  explicit command_line(args& a) {
    option("--model", a.model, "NAME", "a preset model: deepseek-v3 or llama-3.1-405b");
    option("--model-file", a.model_file, "FILE", "a model described in JSON (docs/model.schema.json)");
    option("--seq", a.seq, "N", "preset: sequence length (default: 4096 for deepseek-v3, 8192 for llama-3.1-405b)");
    option("--micro-batch", a.micro_batch_text, "N",
           "preset: sequences per micro-batch (default 1); a range (1-8), a list (2,4,8) or auto (1, 2, ... while a plan fits) "
           "plans each and prints tokens per second per micro-batch, the best marked");
    option("--tp", a.tp, "N", "preset: tensor-parallel degree (default 1)");
    option("--gpus", a.gpus, "N", "preset: GPUs in the job (default 1)");
    option("--fsdp", a.fsdp, "N", "preset: FSDP (ZeRO-3) sharding degree (default 1)");
    option("--ep", a.ep, "N", "preset: expert-parallel degree (default 1)");
    option("--pp", a.pp, "N", "preset: pipeline-parallel stages (default 1)");
    flag("--fp8", a.fp8, "preset: FP8 matrix products");
    option("--hardware", a.hardware, "NAME", "h100, h200, gh200, gb200 or vera-rubin (default h200)");
    option("--calibration", a.calibration, "FILE", "a measured cost table (docs/calibration.schema.json)");
    option("--device-memory", a.device_memory_gib, "GIB",
           "device memory for the whole step, in GiB (2^30 bytes; default: the GPU's HBM; the presets' 141 GB is 131.3 GiB)");
    option("--host-budget", a.host_budget_gib, "GIB", "pinned host memory for offloaded data, in GiB (default: the preset's pinnable share; "
                                                       "0: none)");
    option("--storage-budget", a.storage_budget_gib, "GIB",
           "spill file for offloaded data the host budget cannot hold, in GiB (default 0: no storage tier; the link is the "
           "preset's NVMe, or the calibration's)");
    option("--max-decisions", a.max_decisions, "N",
           "most (layer, slot) decisions the planner takes, from 1 to 100000000 (default 40000; above 20,000 runs of "
           "identical layers are planned as groups: 100,000 layers of one 8-slot type take seconds, a stack of many "
           "distinct layers minutes)");
    option("--offload", a.offload, "SLOTS", "the slots the offload rows offload, comma separated (default: the preset's choice, "
                                             "or every slot but the layer inputs)");
    option("--policy", a.policy, "FILE", "a policy file to evaluate as one more row (with the model's collective hooks)");
    flag("--json", a.json, "the table and the plan as JSON on stdout");
    option("--policy-out", a.policy_out, "FILE", "write the plan as a policy file (docs/policy.schema.json)");
    option("--cpp", a.cpp, "FILE", "write the plan as C++ types (tide::strategy_of<...>); - for stdout");
    option("--trace", a.trace, "FILE", "write the plan's predicted timeline: FILE (Chrome trace) and FILE.png");
    flag("--quiet", a.quiet, "no progress line");
    flag("--help", a.help, "this text");
  }

  //! Sets the fields from `argv`; throws `usage_error` naming an unknown flag, a missing value or
  //! a value that does not parse whole. Stops at `--help` or `-h`.
  void parse(int argc, char const* const* argv, args& a) const {
    for (int i = 1; i < argc; ++i) {
      std::string_view const s = argv[i];
      if (s == "--help" || s == "-h") {
        a.help = true;
        return;
      }
      entry const* e = nullptr;
      for (auto const& x : entries_)
        if (x.name == s) e = &x;
      if (!e) throw usage_error("unknown argument '" + echo(s) + "'");
      if (e->metavar.empty()) {
        e->set({});
        continue;
      }
      if (i + 1 >= argc) throw usage_error(e->name + " needs a value (" + e->metavar + ")");
      std::string_view const v = argv[++i];
      if (!e->set(v)) throw usage_error(e->name + ": cannot use '" + echo(v) + "' as " + e->metavar);
    }
  }

  //! One line: `usage: tide-plan [--model NAME] ...`.
  std::string usage() const {
    std::string u = "usage: tide-plan";
    for (auto const& e : entries_) u += " [" + spelled(e) + "]";
    return u + "\n";
  }
  //! The usage and one line per flag.
  std::string help() const {
    std::string h = usage();
    std::size_t width = 0;
    for (auto const& e : entries_) width = std::max(width, spelled(e).size());
    for (auto const& e : entries_) h += "  " + spelled(e) + std::string(width - spelled(e).size() + 2, ' ') + e.help + "\n";
    return h;
  }

 private:
  struct entry {
    std::string name, metavar, help;  // no metavar: a flag
    std::function<bool(std::string_view)> set;
  };
  static std::string spelled(entry const& e) { return e.metavar.empty() ? e.name : e.name + " " + e.metavar; }

  void flag(std::string name, bool& target, std::string help) {
    entries_.push_back({std::move(name), {}, std::move(help), [&target](std::string_view) { return target = true; }});
  }
  template <class T>
  void option(std::string name, T& target, std::string metavar, std::string help) {
    entries_.push_back({std::move(name), std::move(metavar), std::move(help), [&target](std::string_view v) { return parse_value(v, target); }});
  }
  static bool parse_value(std::string_view v, std::string& out) {
    out = std::string(v);
    return true;
  }
  static bool parse_value(std::string_view v, std::uint64_t& out) {
    auto const [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    return ec == std::errc{} && end == v.data() + v.size();
  }
  static bool parse_value(std::string_view v, std::optional<std::string>& out) {
    out = std::string(v);
    return true;
  }
  static bool parse_value(std::string_view v, std::optional<std::uint64_t>& out) {
    std::uint64_t x = 0;
    if (!parse_value(v, x)) return false;
    out = x;
    return true;
  }
  static bool parse_value(std::string_view v, std::optional<double>& out) {
    double x = 0;
    if (!parse_value(v, x)) return false;
    out = x;
    return true;
  }
  static bool parse_value(std::string_view v, double& out) {
    std::string const s(v);
    char* end = nullptr;
    errno = 0;
    double const x = std::strtod(s.c_str(), &end);
    // Underflow (1e-320: ERANGE with a finite, tiny result) is a number, which check_args then
    // names as below a byte; overflow (1e999) is not.
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(x) || (errno == ERANGE && std::abs(x) >= 1)) return false;
    out = x;
    return true;
  }

  std::vector<entry> entries_;
};

//! Valid UTF-8 (what a JSON string must be).
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto const c = static_cast<unsigned char>(s[i]);
    std::size_t const n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (std::size_t k = 1; k < n; ++k) {
      auto const d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = cp << 6 | (d & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

//! `x` as the shortest text that reads back as it (what the user typed, give or take a spelling).
inline std::string number_text(double x) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

//! Most micro-batches one --micro-batch plans (each a whole plan: a fraction of a second to
//! seconds), and the largest `auto` tries.
inline constexpr std::size_t max_micro_batches = 64;

//! Reads `a.micro_batch_text` into `a.micro_batch` (one), or `a.micro_batches` (a list of
//! micro-batches and ranges, sorted) or `a.micro_batch_auto`; throws `usage_error` naming what is
//! wrong with it and what to write instead.
inline void parse_micro_batches(args& a) {
  if (!a.micro_batch_text) return;
  std::string_view const text = *a.micro_batch_text;
  auto const say = [&](std::string const& what) {
    return usage_error("--micro-batch " + echo(text) + ": " + what +
                       " (give N, a range A-B such as 1-8, a list such as 2,4,8, or auto)");
  };
  if (text == "auto") {
    a.micro_batch_auto = true;
    return;
  }
  auto const number = [&](std::string_view s) {
    std::uint64_t x = 0;
    auto const [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    // All digits but too large for 64 bits is a number above the limit, not "not a micro-batch".
    if (ec == std::errc::result_out_of_range && end == s.data() + s.size()) throw say("micro-batch " + echo(s) + " is above 65536");
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) throw say("'" + echo(s) + "' is not a micro-batch");
    if (x == 0) throw say("micro-batches must be at least 1");
    if (x > (1u << 16)) throw say("micro-batch " + std::string(s) + " is above 65536");
    return x;
  };
  if (text.find_first_of(",-") == std::string_view::npos) {
    a.micro_batch = number(text);
    return;
  }
  std::vector<std::uint64_t> list;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    auto const end = std::min(text.find(',', pos), text.size());
    auto const item = text.substr(pos, end - pos);
    if (item.empty()) throw say("an empty entry");
    if (item.front() == '-')  // "-3" is negative; "-" or "-x" is no number at all
      throw say(item.size() > 1 && std::isdigit(static_cast<unsigned char>(item[1])) ? "'" + echo(item) + "' is negative: micro-batches must be at least 1"
                                                                                      : "'" + echo(item) + "' is not a micro-batch or a range");
    auto const dash = item.find('-');
    if (dash == std::string_view::npos) {
      list.push_back(number(item));
    } else {
      auto const lo = number(item.substr(0, dash)), hi = number(item.substr(dash + 1));
      if (lo > hi) throw say("the range " + std::string(item) + " runs backwards: write " + std::to_string(hi) + "-" + std::to_string(lo));
      if (hi - lo >= max_micro_batches) throw say("more than " + std::to_string(max_micro_batches) + " micro-batches, each planned whole");
      for (auto b = lo; b <= hi; ++b) list.push_back(b);
    }
    if (list.size() > max_micro_batches) throw say("more than " + std::to_string(max_micro_batches) + " micro-batches, each planned whole");
    pos = end + 1;
  }
  std::sort(list.begin(), list.end());
  for (std::size_t i = 1; i < list.size(); ++i)
    if (list[i] == list[i - 1]) throw say("micro-batch " + std::to_string(list[i]) + " is given twice");
  a.micro_batches = std::move(list);
  a.micro_batch = a.micro_batches.front();
}

//! The largest micro-batch `a` plans.
[[nodiscard]] inline std::uint64_t largest_micro_batch(args const& a) noexcept {
  if (a.micro_batch_auto) return max_micro_batches;
  return a.micro_batches.empty() ? a.micro_batch : a.micro_batches.back();
}

//! The command line's checks that need no file: one model, a preset's flags only with a preset,
//! every bound (so no derived size overflows), and, with --json, paths that JSON can hold.
//! Throws `usage_error`.
inline void check_args(args const& a) {
  if (a.model.empty() == a.model_file.empty()) throw usage_error("give one of --model NAME and --model-file FILE");
  if (!a.model_file.empty() && (a.seq.has_value() || a.micro_batch != 1 || a.sweep() || a.tp != 1 || a.gpus != 1 || a.fsdp != 1 || a.ep != 1 || a.pp != 1 || a.fp8))
    throw usage_error("--seq, --micro-batch, --tp, --gpus, --fsdp, --ep, --pp and --fp8 describe a preset: a model file gives its sizes itself");
  if (a.micro_batch == 0 || a.tp == 0 || a.gpus == 0 || a.fsdp == 0 || a.ep == 0 || a.pp == 0)
    throw usage_error("--micro-batch, --tp, --gpus, --fsdp, --ep and --pp must be at least 1");
  // Bounds that keep every derived size far from overflow: tokens, slot bytes, FLOPs.
  if (a.seq == 0u) throw usage_error("--seq 0: give a sequence length of at least 1 (leave the flag out for the preset's)");
  // The bound on tokens holds for the preset's default length too (it was checked as 0).
  auto const seq = a.seq.value_or(a.model == "llama-3.1-405b" ? 8192 : 4096);
  if (seq > (1u << 22) || largest_micro_batch(a) > (1u << 16) || seq * largest_micro_batch(a) > (std::uint64_t{1} << 28))
    throw usage_error("--seq is at most 4194304, --micro-batch at most 65536, and their product at most 2^28 tokens");
  if (a.gpus > (1u << 20)) throw usage_error("--gpus is at most 1048576");
  if (a.tp > 1024) throw usage_error("--tp is at most 1024");
  if (a.fsdp > a.gpus || a.ep > a.gpus || a.pp > a.gpus) throw usage_error("--fsdp, --ep and --pp cannot exceed --gpus");
  auto gib = [](char const* flag, double g) {
    if (!std::isfinite(g) || g < 0 || g > double(1u << 24))
      throw usage_error(std::string(flag) + " " + number_text(g) + ": give GiB from 0 to 16777216" +
                        (g < 0 ? " (a budget is not negative; leave the flag out for the preset's)" : ""));
    if (g > 0 && g * double(1ull << 30) < 1)
      throw usage_error(std::string(flag) + " " + number_text(g) + ": less than one byte (GiB are 2^30 bytes): give 0 or at least 1e-9");
  };
  if (a.device_memory_gib) gib("--device-memory", *a.device_memory_gib);
  if (a.host_budget_gib) gib("--host-budget", *a.host_budget_gib);
  gib("--storage-budget", a.storage_budget_gib);
  if (a.max_decisions && (*a.max_decisions == 0 || *a.max_decisions > 100'000'000))
    throw usage_error("--max-decisions " + std::to_string(*a.max_decisions) + ": give a count from 1 to 100000000");
  if (a.device_memory_gib == 0.0) throw usage_error("--device-memory 0 leaves nothing for the step");
  if (a.cpp == "-" && a.json) throw usage_error("--cpp - and --json both write to stdout: give --cpp a file");
  if (a.json)  // --json writes the model file's path (as the name) and the outputs' paths as JSON strings
    for (auto const& [flag, path] : {std::pair{"--model-file", &a.model_file}, {"--policy-out", &a.policy_out}, {"--cpp", &a.cpp},
                                     {"--trace", &a.trace}})
      if (!valid_utf8(*path))
        throw usage_error(std::string(flag) + ": the path is not valid UTF-8, and --json writes it as a JSON string: rename the file or leave out --json");
}

//! True when `a` and `b` name the same file: the same file when both exist, else the same
//! resolved path (`weakly_canonical`: symbolic links and `..` resolved as far as the path exists).
inline bool same_file(std::string const& a, std::string const& b) {
  std::error_code e1, e2;
  if (std::filesystem::exists(a, e1) && std::filesystem::exists(b, e2)) {
    auto const eq = std::filesystem::equivalent(a, b, e1);
    if (!e1) return eq;
  }
  auto const ca = std::filesystem::weakly_canonical(a, e1), cb = std::filesystem::weakly_canonical(b, e2);
  if (e1 || e2) return a == b;
  return ca == cb;
}

//! Refuses outputs that would overwrite an input or one another (--trace also writes FILE.png):
//! throws `tide::error` naming both flags and the path.
inline void check_paths(args const& a) {
  struct named {
    std::string what, path;
  };
  std::vector<named> outputs, inputs;
  if (!a.policy_out.empty()) outputs.push_back({"--policy-out", a.policy_out});
  if (!a.cpp.empty() && a.cpp != "-") outputs.push_back({"--cpp", a.cpp});
  if (!a.trace.empty()) outputs.push_back({"--trace", a.trace}), outputs.push_back({"--trace's PNG", a.trace + ".png"});
  if (!a.model_file.empty()) inputs.push_back({"--model-file", a.model_file});
  if (!a.policy.empty()) inputs.push_back({"--policy", a.policy});
  if (!a.calibration.empty()) inputs.push_back({"--calibration", a.calibration});
  auto refuse = [](named const& x, named const& y, char const* would) {
    throw tide::error("tide: " + x.what + " and " + y.what + " name the same file '" + echo(x.path) + "': " + would);
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t k = i + 1; k < outputs.size(); ++k)
      if (same_file(outputs[i].path, outputs[k].path)) refuse(outputs[i], outputs[k], "one output would overwrite the other");
    for (auto const& in : inputs)
      if (same_file(outputs[i].path, in.path)) refuse(outputs[i], in, "the output would overwrite the input");
  }
}

//! The hardware preset named `n`; throws `tide::error` listing the presets.
inline tide::hardware_spec hardware_named(std::string const& n) {
  using namespace tide::hardware;
  if (n == "h100") return h100_sxm();
  if (n == "h200") return h200_sxm();
  if (n == "gh200") return gh200();
  if (n == "gb200") return gb200();
  if (n == "vera-rubin") return vera_rubin();
  throw tide::error("tide: unknown hardware preset '" + echo(n) + "' (the presets: h100, h200, gh200, gb200, vera-rubin)");
}

//! The preset model and job layout `a` describes, the layout checked (`tide::check_parallel_layout`,
//! naming the flags); throws `tide::error`. `offload` receives the preset's offload slots.
inline std::pair<tide::transformer_spec, tide::training_spec> preset_model(args const& a, std::vector<tide::name>* offload = nullptr) {
  using namespace tide;
  transformer_spec m;
  if (a.model == "deepseek-v3") {
    m = models::deepseek_v3(a.seq.value_or(4096), a.micro_batch, static_cast<std::uint32_t>(a.tp));
    if (offload) *offload = {"q_latent", "kv_latent", "mlp_up"};  // attention projections, MoE up-projections
  } else if (a.model == "llama-3.1-405b") {
    m = models::llama3_405b(a.seq.value_or(8192), a.micro_batch, static_cast<std::uint32_t>(a.tp));
    if (offload) *offload = {"qkv"};
  } else {
    throw tide::error("tide: unknown model preset '" + echo(a.model) +
                      "' (the presets: deepseek-v3, llama-3.1-405b; or --model-file FILE)");
  }
  if (a.fp8) m.matmul = precision::fp8;
  training_spec t{.layout = {.gpus = static_cast<std::uint32_t>(a.gpus),
                             .fsdp = static_cast<std::uint32_t>(a.fsdp),
                             .expert_parallel = static_cast<std::uint32_t>(a.ep),
                             .pipeline_parallel = static_cast<std::uint32_t>(a.pp)}};
  check_parallel_layout(m, t.layout, {.tensor_parallel = "--tp", .gpus = "--gpus", .fsdp = "--fsdp", .expert_parallel = "--ep",
                                      .pipeline_parallel = "--pp"});
  return {m, t};
}

//! Parses and checks `argv` (all but the files): throws `usage_error` or `tide::error`.
inline args parse_args(int argc, char const* const* argv) {
  args a;
  command_line(a).parse(argc, argv, a);
  if (a.help) return a;
  parse_micro_batches(a);
  check_args(a);
  check_paths(a);
  if (!a.model.empty()) (void)preset_model(a);
  (void)hardware_named(a.hardware);
  return a;
}

}  // namespace tide_plan
