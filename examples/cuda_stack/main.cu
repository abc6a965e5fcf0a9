// The GPU demo: a real CUDA layer stack (GEMMs, ReLU, RMSNorm, backward included) run under
// keep-all, remat and offload (copies on the compute stream, latency-hidden, chunked), then under
// a device budget that keep-all exceeds, and finally replayed from a CUDA graph. Prints the same
// table as the host demo (examples/mlp), `--json` too; gradients are compared bitwise between
// policies on the GPU. Without a GPU it says so and exits 77 (Meson: skipped).
#include "example.hpp"
#include "model.hpp"

#include <cstdio>
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
  example::cli cli("cuda_stack");
  cli.flag("--json", o.json, "print the results as JSON")
      .option("--layers", o.net.layers, "N", "layers (at least 3)")
      .option("--width", o.net.width, "N", "features per token")
      .option("--batch", o.net.batch, "N", "tokens")
      .option("--steps", o.steps, "N", "steps per policy (at least 2; the first is a warm-up)");
  cli.parse(argc, argv);
  // Three layers at least: the latency-hiding cases prefetch two layers ahead.
  if (o.net.layers < 3 || o.net.width == 0 || o.net.batch == 0 || o.steps < 2)
    cli.fail("need --layers >= 3, --steps >= 2 and a positive width and batch");
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

}  // namespace

int main(int argc, char** argv) {
  auto const opt = parse(argc, argv);
  if (auto const rc = example::without_device("cuda_stack")) return *rc;
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
      std::vector<example::json_object> runs;
      for (auto const& r : rows) {
        auto& j = runs.emplace_back();
        j.field("policy", r.name);
        if (!r.error.empty()) {
          j.field("error", r.error);
          continue;
        }
        auto const& s = r.result.summary;
        j.field("step_ms", r.result.step_ms, 3)
            .field("predicted_device_bytes", r.device_bytes)
            .field("measured_device_bytes", s.measured_device_bytes)
            .field("host_bytes", r.host_bytes)
            .field("exposed_transfer_ms", s.exposed_transfer_us / 1000, 3)
            .field("overlap", s.overlap_fraction, 3)
            .field("checksum", example::hex(cuda_stack::checksum(r.result.grads)));
      }
      example::json_object out;
      out.field("layers", opt.net.layers)
          .field("width", opt.net.width)
          .field("batch", opt.net.batch)
          .field("steps", opt.steps)
          .field("device_budget", budget.backend.device_budget)
          .field("gradients_bitwise_equal", same)
          .raw("runs", example::json_array(runs));
      std::printf("%s\n", out.str().c_str());
    } else {
      cudaDeviceProp p{};
      TIDE_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
      std::printf("tide cuda_stack demo on %s: %u layers, width %u, batch %u, %d steps\n\n", p.name,
                  opt.net.layers, opt.net.width, opt.net.batch, opt.steps);
      example::table t({{"policy", -40},
                        {"step ms", 9},
                        {"pred device", 12},
                        {"meas device", 12},
                        {"host", 11},
                        {"exposed ms", 11},
                        {"overlap", 8},
                        {"grad checksum", -13, 2}});
      for (auto const& r : rows) {
        if (!r.error.empty()) {
          t.note(r.name, r.error);
          continue;
        }
        auto const& s = r.result.summary;
        bool const traced = !r.result.trace.ops.empty();  // a graph replay records no timeline
        t.row({r.name, example::fixed(r.result.step_ms, 3), tide::format_bytes(static_cast<double>(r.device_bytes)),
               traced ? tide::format_bytes(static_cast<double>(s.measured_device_bytes)) : "-",
               tide::format_bytes(static_cast<double>(r.host_bytes)),
               traced ? example::fixed(s.exposed_transfer_us / 1000, 3) : "-",
               traced ? example::percent(s.overlap_fraction) : "-", example::hex(cuda_stack::checksum(r.result.grads))});
      }
      t.print();
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
