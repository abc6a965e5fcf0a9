// The main demo: a 16-layer CPU network trained for a few steps on the host backend under
// keep-all, remat, and offload (latency-hidden and naive), then under a device budget that
// keep-all exceeds. Prints one table and a gradient checksum per policy; the checksums are
// bitwise equal. `--json` prints the same as JSON, `--trace FILE` writes the offload run's
// timeline as Chrome trace JSON.
#include "mlp.hpp"

#include <tide/tide.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

struct run_result {
  std::string name;
  tide::step_summary summary;
  double step_ms = 0;
  float first_loss = 0, last_loss = 0;
  std::uint64_t checksum = 0;
  std::string error;
};

struct options {
  mlp::config net;
  int steps = 4;
  double link_ratio = 0.5;  // copy time over the compute time it can hide behind
  bool json = false;
  std::string trace;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> char const* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mlp: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") o.json = true;
    else if (a == "--trace") o.trace = next();
    else if (a == "--layers") o.net.layers = static_cast<std::uint32_t>(std::atoi(next()));
    else if (a == "--width") o.net.width = static_cast<std::uint32_t>(std::atoi(next()));
    else if (a == "--batch") o.net.batch = static_cast<std::uint32_t>(std::atoi(next()));
    else if (a == "--steps") o.steps = std::atoi(next());
    else if (a == "--link-ratio") o.link_ratio = std::atof(next());
    else {
      std::fprintf(stderr,
                   "usage: mlp [--json] [--trace FILE] [--layers N] [--width N] [--batch N] [--steps N] "
                   "[--link-ratio R]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.net.layers < 2 || o.net.width == 0 || o.net.batch == 0 || o.steps < 2) {
    std::fprintf(stderr, "mlp: need --layers >= 2, --steps >= 2 and a positive width and batch\n");
    std::exit(2);
  }
  return o;
}

run_result train(std::string name, options const& opt, tide::schedule const& s, tide::host_backend_options bo,
                 tide::timeline* keep_trace = nullptr) {
  run_result r;
  r.name = std::move(name);
  try {
    tide::host_backend backend(bo);
    tide::timeline tl;
    backend.record_timeline(&tl);
    tide::executor exec(backend, s);
    mlp::network net(opt.net);
    auto fwd = [&](auto const& ctx) { net.forward(ctx); };
    auto bwd = [&](auto const& ctx) { net.backward(ctx); };
    double total_ms = 0;
    for (int i = 0; i < opt.steps; ++i) {
      auto const t0 = std::chrono::steady_clock::now();
      exec.step(fwd, bwd);
      auto const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) total_ms += ms;  // the first step warms caches and queues
      if (i == 0) r.first_loss = net.loss();
      r.last_loss = net.loss();
      r.checksum = net.update();
    }
    r.step_ms = total_ms / (opt.steps - 1);
    r.summary = tide::summarize(tl, s);
    if (keep_trace) *keep_trace = tl;
  } catch (tide::error const& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  auto const opt = parse(argc, argv);
  auto const stack = mlp::make_stack(opt.net);
  using tide::placement;
  tide::policy_spec const keep_all{};
  tide::policy_spec const remat{tide::rule_spec{placement::remat, {"pre_act", "act", "inv_rms"}, 0, tide::all_layers, 0}};
  // The last layer's activations are used right after they are produced: keep them.
  tide::policy_spec const offload{
      tide::rule_spec{placement::offload, {"input", "pre_act", "act"}, 0, opt.net.layers - 1, 0}};
  tide::buffer_spec buffers;
  buffers.staging_buffers = 3;
  tide::pipeline_spec const hidden{true, 2, 0, 2};
  tide::pipeline_spec const naive{false, 0, 0, 1};

  auto const s_keep = tide::build_schedule(stack, keep_all, buffers);
  auto const s_remat = tide::build_schedule(stack, remat, buffers);
  auto const s_hidden = tide::build_schedule(stack, offload, buffers, hidden);
  auto const s_naive = tide::build_schedule(stack, offload, buffers, naive);

  // Pace the link so that the offloads take `link_ratio` of the forward compute time they hide
  // behind, and the reloads `link_ratio` of the backward compute time.
  auto const base = train("keep-all", opt, s_keep, {});
  auto const bytes = static_cast<double>(s_hidden.peak_host_bytes());
  tide::host_backend_options paced;
  paced.d2h = {bytes / (opt.link_ratio * base.summary.forward_us * 1e-6), 0};
  paced.h2d = {bytes / (opt.link_ratio * base.summary.backward_us * 1e-6), 0};

  tide::timeline trace;
  std::vector<run_result> runs;
  runs.push_back(train("keep-all", opt, s_keep, paced));
  runs.push_back(train("remat", opt, s_remat, paced));
  runs.push_back(train("offload (copies on compute stream)", opt, s_naive, paced));
  runs.push_back(train("offload (latency hiding)", opt, s_hidden, paced, &trace));

  // A device budget keep-all exceeds and latency-hidden offload fits.
  auto budget_opts = paced;
  budget_opts.device_capacity = s_hidden.peak_device_bytes();
  auto over = train("keep-all under budget", opt, s_keep, budget_opts);
  auto fits = train("offload under budget", opt, s_hidden, budget_opts);
  runs.push_back(over);
  runs.push_back(fits);

  bool same = true;
  for (auto const& r : runs)
    if (r.error.empty() && r.checksum != runs[0].checksum) same = false;
  bool const descended = runs[0].last_loss < runs[0].first_loss;

  if (!opt.trace.empty()) {
    std::ofstream f(opt.trace);
    tide::write_chrome_trace(f, trace, s_hidden, "tide mlp: offload (latency hiding)");
  }

  if (opt.json) {
    std::printf("{\"layers\":%u,\"width\":%u,\"batch\":%u,\"steps\":%d,\"d2h_bytes_per_second\":%.0f,"
                "\"h2d_bytes_per_second\":%.0f,\"device_budget\":%zu,\"checksums_equal\":%s,\"loss_decreased\":%s,\"runs\":[",
                opt.net.layers, opt.net.width, opt.net.batch, opt.steps, paced.d2h.bytes_per_second,
                paced.h2d.bytes_per_second, budget_opts.device_capacity, same ? "true" : "false", descended ? "true" : "false");
    for (std::size_t i = 0; i < runs.size(); ++i) {
      auto const& r = runs[i];
      auto const& s = r.summary;
      std::printf("%s{\"policy\":\"%s\",", i ? "," : "", r.name.c_str());
      if (!r.error.empty()) {
        std::string e;
        for (char c : r.error) {
          if (c == '"' || c == '\\') e.push_back('\\');
          e.push_back(c);
        }
        std::printf("\"error\":\"%s\"}", e.c_str());
        continue;
      }
      std::printf("\"step_ms\":%.3f,\"predicted_device_bytes\":%zu,\"measured_device_bytes\":%zu,"
                  "\"host_bytes\":%zu,\"exposed_transfer_ms\":%.3f,\"overlap\":%.3f,\"first_loss\":%.6f,"
                  "\"last_loss\":%.6f,\"checksum\":\"%016llx\"}",
                  r.step_ms, s.predicted_device_bytes, s.measured_device_bytes, s.predicted_host_bytes,
                  s.exposed_transfer_us / 1000, s.overlap_fraction, r.first_loss, r.last_loss,
                  static_cast<unsigned long long>(r.checksum));
    }
    std::printf("]}\n");
  } else {
    std::printf("tide mlp demo: %u layers, width %u, batch %u, %d steps; link paced at %.1f MB/s d2h, %.1f MB/s h2d "
                "(copies = %.0f%% of the compute they can hide behind)\n\n",
                opt.net.layers, opt.net.width, opt.net.batch, opt.steps, paced.d2h.bytes_per_second / 1e6,
                paced.h2d.bytes_per_second / 1e6, opt.link_ratio * 100);
    std::printf("%-36s %9s %12s %12s %11s %11s %8s %10s  %s\n", "policy", "step ms", "pred device", "meas device",
                "host", "exposed ms", "overlap", "loss", "grad checksum");
    for (auto const& r : runs) {
      if (!r.error.empty()) {
        std::printf("%-36s %s\n", r.name.c_str(), r.error.c_str());
        continue;
      }
      auto const& s = r.summary;
      std::printf("%-36s %9.2f %12s %12s %11s %11.2f %7.0f%% %10.6f  %016llx\n", r.name.c_str(), r.step_ms,
                  tide::format_bytes(static_cast<double>(s.predicted_device_bytes)).c_str(),
                  tide::format_bytes(static_cast<double>(s.measured_device_bytes)).c_str(),
                  tide::format_bytes(static_cast<double>(s.predicted_host_bytes)).c_str(), s.exposed_transfer_us / 1000,
                  s.overlap_fraction * 100, r.last_loss, static_cast<unsigned long long>(r.checksum));
    }
    std::printf("\ndevice budget %s: keep-all %s; offload %s\n",
                tide::format_bytes(static_cast<double>(budget_opts.device_capacity)).c_str(),
                over.error.empty() ? "fits" : "does not fit (out_of_memory)", fits.error.empty() ? "fits" : "fails");
    std::printf("gradient checksums %s; loss %s (%.6f -> %.6f)\n", same ? "bitwise equal" : "DIFFER",
                descended ? "decreased" : "did NOT decrease", runs[0].first_loss, runs[0].last_loss);
  }
  // On tiny stacks the staging and source buffers can cost more than offloading saves; then
  // keep-all fits the budget too, and that is the right answer.
  bool const keep_should_fit = s_keep.peak_device_bytes() <= budget_opts.device_capacity;
  bool const ok = same && descended && over.error.empty() == keep_should_fit && fits.error.empty();
  return ok ? 0 : 1;
}
