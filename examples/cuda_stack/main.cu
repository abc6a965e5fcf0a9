// The GPU demo: a real CUDA layer stack (GEMMs, ReLU, RMSNorm, backward included) run under
// keep-all, remat and offload (copies on the compute stream, latency-hidden, chunked), then under
// a device budget that keep-all exceeds, and finally replayed from a CUDA graph. Prints the same
// table as the host demo (examples/mlp), `--json` too; gradients are compared bitwise between
// policies on the GPU. Without a GPU it says so and exits 77 (Meson: skipped).
#include "model.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct options {
  cuda_stack::dims net;
  int steps = 4;
  bool json = false;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&]() -> char const* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cuda_stack: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") o.json = true;
    else if (a == "--layers") o.net.layers = static_cast<std::uint32_t>(std::atoi(next()));
    else if (a == "--width") o.net.width = static_cast<std::uint32_t>(std::atoi(next()));
    else if (a == "--batch") o.net.batch = static_cast<std::uint32_t>(std::atoi(next()));
    else if (a == "--steps") o.steps = std::atoi(next());
    else {
      std::fprintf(stderr, "usage: cuda_stack [--json] [--layers N] [--width N] [--batch N] [--steps N]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  // Three layers at least: the latency-hiding cases prefetch two layers ahead.
  if (o.net.layers < 3 || o.net.width == 0 || o.net.batch == 0 || o.steps < 2) {
    std::fprintf(stderr, "cuda_stack: need --layers >= 3, --steps >= 2 and a positive width and batch\n");
    std::exit(2);
  }
  return o;
}

struct row {
  std::string name;
  cuda_stack::run_result result;
  std::size_t device_bytes = 0, host_bytes = 0;
  std::string error;
};

row measure(std::string name, cuda_stack::model const& m, tide::schedule const& s, cuda_stack::run_options o) {
  row r{std::move(name), {}, s.peak_device_bytes(), s.peak_host_bytes(), {}};
  try {
    r.result = cuda_stack::run(m, s, o);
  } catch (tide::out_of_memory const& e) {
    r.error = e.what();
  }
  return r;
}

std::string json_escape(std::string const& s) {
  std::string e;
  for (char c : s) e += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  auto const opt = parse(argc, argv);
  if (!cuda_stack::have_device()) {
    std::printf("cuda_stack: no CUDA device is available; skipping\n");
    return cuda_stack::skip_exit_code;
  }
  try {
    cuda_stack::model const m(opt.net);
    auto const cases = cuda_stack::policy_cases(opt.net);
    cuda_stack::run_options ro;
    ro.steps = opt.steps;
    ro.trace = true;
    ro.exec.debug_checks = false;  // timed: no host-function round trips per op (on without NDEBUG)

    std::vector<row> rows;
    for (auto const& c : cases) rows.push_back(measure(c.name, m, cuda_stack::build(opt.net, c), ro));

    // A device budget keep-all exceeds and latency-hidden offload fits. With three layers the
    // offload's min(offloaded layers, staging buffers) staging buffers take as much as keep-all,
    // which then fits too: out_of_memory is expected only when the peaks differ.
    auto const hidden = cuda_stack::build(opt.net, cases[3]);
    auto const keep = cuda_stack::build(opt.net, cases[0]);
    bool const separable = hidden.peak_device_bytes() < keep.peak_device_bytes();
    auto budget = ro;
    budget.backend.device_budget = hidden.peak_device_bytes();
    auto over = measure("keep-all under budget", m, keep, budget);
    auto fits = measure("offload under budget", m, hidden, budget);
    rows.push_back(over);
    rows.push_back(fits);

    // The latency-hidden step captured into a CUDA graph and replayed.
    auto graph = ro;
    graph.graph = true;
    graph.trace = false;
    rows.push_back(measure("offload (latency hiding), graph replay", m, hidden, graph));

    bool same = true;
    for (auto const& r : rows)
      if (r.error.empty() && !cuda_stack::bitwise_equal(r.result.grads, rows[0].result.grads)) same = false;

    if (opt.json) {
      std::printf("{\"layers\":%u,\"width\":%u,\"batch\":%u,\"steps\":%d,\"device_budget\":%zu,"
                  "\"gradients_bitwise_equal\":%s,\"runs\":[",
                  opt.net.layers, opt.net.width, opt.net.batch, opt.steps, budget.backend.device_budget,
                  same ? "true" : "false");
      for (std::size_t i = 0; i < rows.size(); ++i) {
        auto const& r = rows[i];
        std::printf("%s{\"policy\":\"%s\",", i ? "," : "", r.name.c_str());
        if (!r.error.empty()) {
          std::printf("\"error\":\"%s\"}", json_escape(r.error).c_str());
          continue;
        }
        auto const& s = r.result.summary;
        std::printf("\"step_ms\":%.3f,\"predicted_device_bytes\":%zu,\"measured_device_bytes\":%zu,"
                    "\"host_bytes\":%zu,\"exposed_transfer_ms\":%.3f,\"overlap\":%.3f,\"checksum\":\"%016llx\"}",
                    r.result.step_ms, r.device_bytes, s.measured_device_bytes, r.host_bytes,
                    s.exposed_transfer_us / 1000, s.overlap_fraction,
                    static_cast<unsigned long long>(cuda_stack::checksum(r.result.grads)));
      }
      std::printf("]}\n");
    } else {
      cudaDeviceProp p{};
      TIDE_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
      std::printf("tide cuda_stack demo on %s: %u layers, width %u, batch %u, %d steps\n\n", p.name,
                  opt.net.layers, opt.net.width, opt.net.batch, opt.steps);
      std::printf("%-40s %9s %12s %12s %11s %11s %8s  %s\n", "policy", "step ms", "pred device", "meas device",
                  "host", "exposed ms", "overlap", "grad checksum");
      for (auto const& r : rows) {
        if (!r.error.empty()) {
          std::printf("%-40s %s\n", r.name.c_str(), r.error.c_str());
          continue;
        }
        auto const& s = r.result.summary;
        bool const traced = !r.result.trace.ops.empty();
        std::printf("%-40s %9.3f %12s %12s %11s %11s %7s  %016llx\n", r.name.c_str(), r.result.step_ms,
                    tide::format_bytes(static_cast<double>(r.device_bytes)).c_str(),
                    traced ? tide::format_bytes(static_cast<double>(s.measured_device_bytes)).c_str() : "-",
                    tide::format_bytes(static_cast<double>(r.host_bytes)).c_str(),
                    traced ? std::to_string(s.exposed_transfer_us / 1000).substr(0, 6).c_str() : "-",
                    traced ? (std::to_string(static_cast<int>(s.overlap_fraction * 100 + 0.5)) + "%").c_str() : "-",
                    static_cast<unsigned long long>(cuda_stack::checksum(r.result.grads)));
      }
      std::printf("\ndevice budget %s: keep-all %s; offload %s\n",
                  tide::format_bytes(static_cast<double>(budget.backend.device_budget)).c_str(),
                  over.error.empty() ? "fits" : "does not fit (out_of_memory)", fits.error.empty() ? "fits" : "fails");
      std::printf("gradients %s between policies\n", same ? "bitwise equal" : "DIFFER");
    }
    return same && over.error.empty() != separable && fits.error.empty() ? 0 : 1;
  } catch (tide::error const& e) {
    std::fprintf(stderr, "cuda_stack: %s\n", e.what());
    return 1;
  }
}
