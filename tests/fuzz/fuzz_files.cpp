// libFuzzer target: bytes -> the file readers (<tide/io/json.hpp>) and tide-plan's command line.
//
// The first byte picks the surface (mod 4), the rest is its input:
//   0  a policy file, read for a small stack whose slot names hold a quote and a backslash; what
//      reads must write and read back the same, and build (or be refused by the builder);
//   1  a model file; what reads gives costs on a preset (or refuses them) and, when small, builds;
//   2  a calibration file; what reads must write and read back bit for bit (-0.0 included);
//   3  tide-plan's arguments, split on NUL bytes (tools/tide-plan/args.hpp: parsed and checked,
//      the preset and its layout resolved; nothing is read or written).
// A tide::error (json_error, cost_model_error, schedule_error, tide-plan's usage_error) is the
// documented way to refuse. Anything else is a finding: another exception (std::bad_alloc,
// nlohmann's own), a crash, a sanitizer report, a hang, or a round trip that changes a value.
//
// Run: fuzz_files [libFuzzer flags] CORPUS_DIR...   or   fuzz_files FILE... (replay).
// tests/fuzz/corpus_files/ holds the seeds (valid files and the cases of issue 21).
#include <tide/io/json.hpp>
#include <tide/tide.hpp>

#include "../../tools/tide-plan/args.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void finding(char const* what, std::string const& detail = {}) {
  std::fprintf(stderr, "fuzz_files: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

tide::stack_spec const& policy_stack() {
  static tide::stack_spec const st = [] {
    tide::stack_spec s;
    s.independent_layers = true;  // no layer reads another's output
    s.append({"blk", {{"x", 4096, true}, {"qkv", 12288}, {"mlp_up", 16384}, {"q\"k", 256}, {"b\\s", 512}}}, 4);
    s.append({"head", {{"x", 4096, true}, {"logits", 8192}}});
    return s;
  }();
  return st;
}

void policy(std::string_view text) {
  auto const& st = policy_stack();
  auto const s = tide::io::strategy_from_json(tide::io::parse_json(text, "policy file"), st);
  auto const written = tide::io::to_json(s);
  auto const back = tide::io::strategy_from_json(tide::io::parse_json(written.dump(2), "written policy file"), st);
  if (tide::io::to_json(back) != written) finding("a policy read back differs", written.dump());
  (void)tide::build_schedule(st, s);  // may refuse with schedule_error
}

void model(std::string_view text) {
  auto const m = tide::io::model_from_json(tide::io::parse_json(text, "model file"), "model file");
  auto const hw = tide::hardware::h100_sxm();
  auto const costs = m.has_costs() ? m.costs(hw, hw.link()) : tide::cost_table{};
  if (m.has_costs()) {
    costs.check_against(m.stack);
    for (auto const& l : costs.layers)
      if (!(l.forward_us <= tide::io::max_time_us && l.backward_us <= tide::io::max_time_us)) finding("a time past max_time_us");
  }
  if (m.stack.layer_count() <= 64) (void)tide::build_schedule(m.stack, tide::strategy{});  // may refuse
}

void calibration(std::string_view text) {
  auto const t = tide::io::cost_table_from_json(tide::io::parse_json(text, "calibration file"));
  auto const back = tide::io::cost_table_from_json(tide::io::parse_json(tide::io::to_json(t).dump(2), "written calibration file"));
  if (back.layers.size() != t.layers.size()) finding("a calibration read back has another layer count");
  for (std::size_t l = 0; l < t.layers.size(); ++l) {
    auto const &a = t.layers[l], &b = back.layers[l];
    if (!same_bits(a.forward_us, b.forward_us) || !same_bits(a.backward_us, b.backward_us) ||
        a.recompute_us.has_value() != b.recompute_us.has_value() ||  // "as forward_us" reads back as such
        !same_bits(a.full_recompute_us(), b.full_recompute_us()) || !same_bits(a.gather_us, b.gather_us) ||
        !same_bits(a.reduce_us, b.reduce_us) || !same_bits(a.regather_us, b.regather_us) ||
        a.slot_recompute_us.size() != b.slot_recompute_us.size())
      finding("a calibration layer read back differs", std::to_string(l));
    for (std::size_t k = 0; k < a.slot_recompute_us.size(); ++k)
      if (!same_bits(a.slot_recompute_us[k], b.slot_recompute_us[k])) finding("a slot recompute time read back differs");
  }
  if (!same_bits(t.link.d2h.bytes_per_second, back.link.d2h.bytes_per_second) || !same_bits(t.link.h2d.latency_us, back.link.h2d.latency_us) ||
      !same_bits(t.sync_latency_us, back.sync_latency_us) || !same_bits(t.op_overhead_us, back.op_overhead_us))
    finding("a calibration's link or overheads read back differ");
}

void arguments(std::string_view text) {
  std::vector<std::string> words{"tide-plan"};
  std::size_t pos = 0;
  while (pos <= text.size() && words.size() < 64) {
    auto const end = std::min(text.find('\0', pos), text.size());
    words.emplace_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  std::vector<char const*> argv;
  for (auto const& w : words) argv.push_back(w.c_str());
  auto const a = tide_plan::parse_args(static_cast<int>(argv.size()), argv.data());
  if (a.help) return;
  // "Not given" is an empty optional: whatever number was given was checked (issue 40).
  for (auto const& g : {a.device_memory_gib, a.host_budget_gib})
    if (g && !(*g >= 0 && *g <= double(1u << 24))) finding("a budget outside [0, 2^24] GiB was accepted");
  if (a.max_decisions && (*a.max_decisions == 0 || *a.max_decisions > 100'000'000)) finding("--max-decisions out of range was accepted");
  // --micro-batch lists and ranges (issue 42): what was accepted is increasing, each from 1 to 65536, at most 64.
  auto const& mb = a.micro_batches;
  if (mb.size() > tide_plan::max_micro_batches || (!mb.empty() && (mb.front() == 0 || mb.back() > (1u << 16))))
    finding("a --micro-batch list out of range was accepted");
  for (std::size_t i = 1; i < mb.size(); ++i)
    if (mb[i] <= mb[i - 1]) finding("a --micro-batch list not increasing (or with a repeat) was accepted");
  // What parse_args accepted is a preset the cost model can price, or a model file.
  if (!a.model.empty()) {
    auto const [m, t] = tide_plan::preset_model(a);
    (void)tide::transformer_costs(m, tide_plan::hardware_named(a.hardware), t);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  if (size == 0) return 0;
  std::string_view const text(reinterpret_cast<char const*>(data) + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0: policy(text); break;
      case 1: model(text); break;
      case 2: calibration(text); break;
      default: arguments(text); break;
    }
  } catch (tide::error const&) {
    // the documented refusal
  } catch (std::exception const& e) {
    finding("an undocumented exception", e.what());
  }
  return 0;
}
