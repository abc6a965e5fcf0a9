#pragma once
//! \file
//! Calibration: measure a cost table from a real backend run. Per-layer forward, backward
//! and recompute times come from timelines of keep-all and remat-all steps; the link comes from
//! a line fitted (latency + bytes / bandwidth) to the copies of offload-all steps, whole and
//! chunked so that sizes vary. Any backend works: timelines are part of the backend concept.
//! `calibrate_storage` measures the storage tier's path (a spill file) the same way.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include <tide/core/config.hpp>
#include <tide/backends/host/host_backend.hpp>
#include <tide/core/error.hpp>
#include <tide/core/build.hpp>
#include <tide/core/schedule.hpp>
#include <tide/core/storage_link.hpp>
#include <tide/core/strategy.hpp>
#include <tide/executor/executor.hpp>
#include <tide/storage/spill_file.hpp>
#include <tide/backends/sim/cost_table.hpp>
#include <tide/plan/detail/median.hpp>
#include <tide/trace/timeline.hpp>

#if TIDE_DEFINITIONS
#include <chrono>
#endif

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! What `calibrate` measures and how often.
struct calibration_options {
  std::uint32_t repeats = 3;  //!< steps per measured schedule (1 to `max_repeats`); each time is the median
  //! The most `repeats` may be: each is a timeline held at once and a step per schedule.
  static constexpr std::uint32_t max_repeats = 100'000;
  bool full_duplex = true;    //!< the link's duplex (not measured: the calibration copies one way at a time)
  bool measure_recompute = true;  //!< run remat-all steps for `layer_cost::recompute_us` (off: forward time stands in)
  bool measure_link = true;       //!< run offload-all steps to fit `cost_table::link` (off: unpaced)
  bool measure_sync = true;  //!< the cross-stream wake-up latency (`cost_table::sync_latency_us`)
  //! Fills a stack's input carry (arena bytes, on the backend's device) before each measured
  //! schedule's steps, so the lambdas time real data (a router on zeros sends every token to the
  //! same experts). Empty: zeros where the device memory is host-accessible, else left as it is.
  std::function<void(std::span<std::byte>)> input{};
};

namespace detail {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

//! Least-squares latency (us) and bandwidth (bytes/s) of (bytes, microseconds) samples. Without
//! spread in sizes the latency is taken as zero.
inline link_direction fit_link(std::vector<std::pair<double, double>> const& xy) {
  if (xy.empty()) return {};
  double mx = 0, my = 0;
  for (auto [x, y] : xy) mx += x, my += y;
  mx /= static_cast<double>(xy.size());
  my /= static_cast<double>(xy.size());
  double sxx = 0, sxy = 0;
  for (auto [x, y] : xy) sxx += (x - mx) * (x - mx), sxy += (x - mx) * (y - my);
  if (sxx > 0 && sxy > 0) {
    auto const slope = sxy / sxx;
    auto const latency = my - slope * mx;
    if (latency >= 0) return {1e6 / slope, latency};
  }
  return {1e6 * mx / my, 0};
}

template <class Backend, class Forward, class Backward>
void measured_steps(Backend& backend, schedule const& s, std::uint32_t repeats, Forward& f, Backward& b,
                    std::vector<timeline>& out, calibration_options const& opt) {
  // The lambdas see ctx.calibrating: a backward that applies the optimizer skips it here.
  executor_options eo;
  eo.calibrating = true;
  executor<Backend> ex(backend, s.view(), eo);
  // A stack's input carry holds defined data (left poisoned, an input that passes through a
  // residual unchanged would read as an unwritten carry out).
  if (auto in = ex.carry_input(); !in.empty()) {
    if (opt.input) opt.input(in);
    else if constexpr (Backend::device_memory_is_host_accessible) std::fill(in.begin(), in.end(), std::byte{0});
  }
  out.assign(repeats, {});
  ex.step(f, b);  // warm-up: arenas touched, threads running
  for (auto& t : out) {
    ex.record_timeline(&t);
    ex.step(f, b);
  }
  ex.record_timeline(nullptr);
}

}  // namespace detail

//! Measures the cost table of `stack` by running `forward` and `backward` (the same lambdas a
//! training step uses) on `backend`. The backend must have room for the keep-all schedule. It
//! runs up to five schedules (keep-all; remat-all, `measure_recompute`; offload-all whole and in
//! thirds, `measure_link`; latency-hidden offload, `measure_sync`) for `repeats + 1` steps each:
//! the backward `repeats + 1` times per layer and schedule (20 with the defaults), the forward as
//! often plus each remat-all step's recomputes. The contexts' `calibrating` is true throughout, so
//! a backward that applies the optimizer can skip it.
template <class Backend, class Forward, class Backward>
cost_table calibrate(stack_spec const& stack, Backend& backend, Forward&& forward, Backward&& backward,
                     calibration_options const& opt = {}) {
  if (opt.repeats == 0 || opt.repeats > calibration_options::max_repeats)
    throw cost_model_error("tide: calibration_options::repeats is " + std::to_string(opt.repeats) + ": give 1 to " +
                           std::to_string(calibration_options::max_repeats) + " measured steps per schedule");
  auto const L = stack.layer_count();
  cost_table c;
  c.layers.resize(L);
  c.link.full_duplex = opt.full_duplex;
  std::vector<timeline> runs;
  auto per_layer = [&](schedule const& s, op_kind kind, auto set) {
    std::vector<std::vector<double>> samples(L);
    for (auto const& t : runs)
      for (auto const& sp : t.ops)
        if (s.ops[sp.op].kind == kind) samples[s.ops[sp.op].layer].push_back(sp.end_us - sp.begin_us);
    for (std::uint32_t l = 0; l < L; ++l) set(c.layers[l], detail::median(samples[l]));
  };

  auto keep = build_schedule(stack, strategy{});
  detail::measured_steps(backend, keep, opt.repeats, forward, backward, runs, opt);
  per_layer(keep, op_kind::forward, [](layer_cost& lc, double us) { lc.forward_us = us; });
  per_layer(keep, op_kind::backward, [](layer_cost& lc, double us) { lc.backward_us = us; });
  {  // Keep-all has no waits: the gaps between consecutive compute ops are the dispatch overhead.
    std::vector<double> gaps;
    for (auto const& t : runs)
      for (std::size_t i = 1; i < t.ops.size(); ++i)
        if (t.ops[i].stream == stream_role::compute && t.ops[i - 1].stream == stream_role::compute)
          gaps.push_back(std::max(0.0, t.ops[i].begin_us - t.ops[i - 1].end_us));
    c.op_overhead_us = detail::median(gaps);
  }

  // Every slot rematerialized but the layers' inputs (slot_spec::input), which no recompute rebuilds.
  rule_spec all_but_inputs{.where = placement::remat};
  for (auto const& t : stack.types)
    for (auto const& sl : t.slots)
      if (!stack.is_input_slot(sl.name) &&
          std::find(all_but_inputs.slots.begin(), all_but_inputs.slots.end(), sl.name) == all_but_inputs.slots.end())
        all_but_inputs.slots.push_back(sl.name);
  if (opt.measure_recompute && !all_but_inputs.slots.empty()) {
    auto remat = build_schedule(stack, {.policy = {all_but_inputs}});
    detail::measured_steps(backend, remat, opt.repeats, forward, backward, runs, opt);
    per_layer(remat, op_kind::recompute, [](layer_cost& lc, double us) { lc.recompute_us = us; });
  }

  if (opt.measure_link) {
    auto const largest = stack.largest_slot_bytes();
    std::vector<std::pair<double, double>> d2h, h2d;
    // Copies on the compute stream, one at a time, whole and in thirds: sizes vary for the fit.
    for (std::size_t chunk : {std::size_t{0}, std::max<std::size_t>(largest / 3, 1)}) {
      auto off = build_schedule(stack, {.policy = {rule_spec{.where = placement::offload}},
                                        .pipeline = {.latency_hiding = false,
                                                     .prefetch_distance = 0,
                                                     .chunk_bytes = chunk,
                                                     .max_offloads_in_flight = 1}});
      detail::measured_steps(backend, off, opt.repeats, forward, backward, runs, opt);
      for (auto const& t : runs)
        for (auto const& sp : t.ops) {
          auto const& o = off.ops[sp.op];
          if (!is_copy(o.kind)) continue;
          (o.kind == op_kind::offload ? d2h : h2d).push_back({static_cast<double>(o.bytes), sp.end_us - sp.begin_us});
        }
    }
    c.link.d2h = detail::fit_link(d2h);
    c.link.h2d = detail::fit_link(h2d);
  }

  if (opt.measure_sync) {
    // Cross-stream waits: from the end of the op that records the event to the end of the
    // blocked wait, in a latency-hiding offload step (copies and compute on different streams).
    auto hide = build_schedule(stack, {.policy = {rule_spec{.where = placement::offload}},
                                       .pipeline = {.prefetch_distance = std::min<std::uint32_t>(1, L - 1)}});
    std::vector<double> recorded_by(hide.event_count, -1), gaps;
    detail::measured_steps(backend, hide, opt.repeats, forward, backward, runs, opt);
    for (auto const& t : runs) {
      std::fill(recorded_by.begin(), recorded_by.end(), -1.0);
      for (auto const& sp : t.ops)
        if (hide.ops[sp.op].event >= 0) recorded_by[static_cast<std::size_t>(hide.ops[sp.op].event)] = sp.end_us;
      for (auto const& w : t.waits)
        if (w.event < recorded_by.size() && recorded_by[w.event] >= 0)
          gaps.push_back(std::max(0.0, w.end_us - recorded_by[w.event]));
    }
    c.sync_latency_us = detail::median(gaps);
  }
  return c;
}

//! The field-by-field median of cost tables measured of one stack (e.g. `calibrate` run in
//! several rounds, interleaved with other measurements): a burst of noise on the machine that
//! slows one round's measurement does not reach the median, as it reaches a median of steps run
//! back to back. Times and latencies are medians; so is each link direction's bandwidth (0,
//! unpaced, counts as a value) and the `full_duplex` flag (the majority). Throws
//! `cost_model_error` for no tables, a table `cost_table::check` refuses (a NaN among them), or
//! tables of different shapes (layer counts, per-slot entries, a recompute time measured in one
//! and "as forward" in another), naming the first that differs.
[[nodiscard]] inline cost_table median_costs(std::span<cost_table const> tables) {
  if (tables.empty()) throw cost_model_error("tide: median_costs needs at least one cost table (e.g. three calibration rounds)");
  auto const& first = tables.front();
  // Each table's values first (a NaN has no median), naming the table.
  for (std::size_t t = 0; t < tables.size(); ++t) {
    try {
      tables[t].check();
    } catch (cost_model_error const& e) {
      throw cost_model_error("tide: median_costs: table " + std::to_string(t) + ": " + e.what());
    }
  }
  for (std::size_t t = 1; t < tables.size(); ++t) {
    auto const& c = tables[t];
    auto const which = "tide: median_costs: table " + std::to_string(t) + " ";
    if (c.layers.size() != first.layers.size())
      throw cost_model_error(which + "has " + std::to_string(c.layers.size()) + " layers and table 0 " +
                             std::to_string(first.layers.size()) + ": give tables of one stack");
    for (std::size_t l = 0; l < c.layers.size(); ++l)
      if (c.layers[l].slot_recompute_us.size() != first.layers[l].slot_recompute_us.size() ||
          c.layers[l].slot_producer != first.layers[l].slot_producer)
        throw cost_model_error(which + "layer " + std::to_string(l) +
                               " has other per-slot entries (slot_recompute_us, slot_producer) than table 0's: give tables of one stack, "
                               "calibrated with the same options");
    // An empty recompute_us means "as forward_us": no median of a time and none.
    auto shown = [](std::optional<double> const& v) { return v ? std::to_string(*v) : std::string("none (as forward_us)"); };
    for (std::size_t l = 0; l < c.layers.size(); ++l)
      if (c.layers[l].recompute_us.has_value() != first.layers[l].recompute_us.has_value())
        throw cost_model_error(which + "layer " + std::to_string(l) + " has recompute_us " + shown(c.layers[l].recompute_us) +
                               " and table 0 " + shown(first.layers[l].recompute_us) +
                               ": one measured, one \"as forward_us\": calibrate every table with the same measure_recompute");
    // A bandwidth of 0 means "unpaced": a median over 0 and a rate mixes the marker with a value
    // (and can give 0.5 B/s, which check() refuses).
    for (auto const& [get, what] : {std::pair<double (*)(cost_table const&), char const*>{[](cost_table const& x) { return x.link.d2h.bytes_per_second; }, "link d2h"},
                                    {[](cost_table const& x) { return x.link.h2d.bytes_per_second; }, "link h2d"},
                                    {[](cost_table const& x) { return x.storage.write.bytes_per_second; }, "storage write"},
                                    {[](cost_table const& x) { return x.storage.read.bytes_per_second; }, "storage read"},
                                    {[](cost_table const& x) { return x.hbm_bytes_per_second; }, "hbm"}})
      if ((get(c) == 0) != (get(first) == 0))
        throw cost_model_error(which + "has " + what + " bytes_per_second " + std::to_string(get(c)) + " and table 0 " +
                               std::to_string(get(first)) + ": one unpaced (0), one paced: calibrate every table with the same measure_link");
  }
  auto med = [&](auto const& field) {
    std::vector<double> v;
    v.reserve(tables.size());
    for (auto const& c : tables) v.push_back(field(c));
    return detail::midpoint_median(std::move(v));
  };
  cost_table r = first;
  for (std::size_t l = 0; l < r.layers.size(); ++l) {
    auto& x = r.layers[l];
    x.forward_us = med([&](cost_table const& c) { return c.layers[l].forward_us; });
    x.backward_us = med([&](cost_table const& c) { return c.layers[l].backward_us; });
    if (x.recompute_us) x.recompute_us = med([&](cost_table const& c) { return *c.layers[l].recompute_us; });
    for (std::size_t k = 0; k < x.slot_recompute_us.size(); ++k)
      x.slot_recompute_us[k] = med([&](cost_table const& c) { return c.layers[l].slot_recompute_us[k]; });
    x.gather_us = med([&](cost_table const& c) { return c.layers[l].gather_us; });
    x.reduce_us = med([&](cost_table const& c) { return c.layers[l].reduce_us; });
    x.regather_us = med([&](cost_table const& c) { return c.layers[l].regather_us; });
    x.memory_bound_share = med([&](cost_table const& c) { return c.layers[l].memory_bound_share; });
  }
  // Each link direction by its member pointers (lambdas capturing structured bindings need Clang 16).
  using direction_of = link_direction host_link::*;
  for (direction_of d : {&host_link::d2h, &host_link::h2d}) {
    (r.link.*d).bytes_per_second = med([d](cost_table const& c) { return (c.link.*d).bytes_per_second; });
    (r.link.*d).latency_us = med([d](cost_table const& c) { return (c.link.*d).latency_us; });
  }
  using storage_direction_of = link_direction storage_link::*;
  for (storage_direction_of d : {&storage_link::write, &storage_link::read}) {
    (r.storage.*d).bytes_per_second = med([d](cost_table const& c) { return (c.storage.*d).bytes_per_second; });
    (r.storage.*d).latency_us = med([d](cost_table const& c) { return (c.storage.*d).latency_us; });
  }
  r.link.full_duplex = med([](cost_table const& c) { return c.link.full_duplex ? 1.0 : 0.0; }) > 0.5;
  r.storage.full_duplex = med([](cost_table const& c) { return c.storage.full_duplex ? 1.0 : 0.0; }) > 0.5;
  r.sync_latency_us = med([](cost_table const& c) { return c.sync_latency_us; });
  r.op_overhead_us = med([](cost_table const& c) { return c.op_overhead_us; });
  r.hbm_bytes_per_second = med([](cost_table const& c) { return c.hbm_bytes_per_second; });
  return r;
}

//! What `calibrate_storage` measures.
struct storage_calibration_options {
  //! Transfer sizes: each is written and read back `repeats` times through one spill file; the
  //! line through them (latency plus bytes over bandwidth) is the storage link.
  std::vector<std::size_t> sizes = {std::size_t{1} << 20, std::size_t{8} << 20, std::size_t{64} << 20};
  std::uint32_t repeats = 3;  //!< transfers per size and direction; each time is the median
};

//! Measures the storage path of `where` (a spill file in `where.directory`, io_uring or
//! `pread`/`pwrite` as `where.io` says): writes then reads of each size, fitted per direction to
//! latency plus bytes over bandwidth. With `O_DIRECT` the reads come from the device; on a file
//! system without it (tmpfs) they come from the page cache, and so does the figure. Throws
//! `storage_error` as `spill_file` does.
[[nodiscard]] TIDE_INLINE storage_link calibrate_storage(storage_options const& where, storage_calibration_options const& opt = {});

#if TIDE_DEFINITIONS
TIDE_INLINE storage_link calibrate_storage(storage_options const& where, storage_calibration_options const& opt) {
  std::size_t largest = 0;
  for (auto s : opt.sizes) largest = std::max(largest, s);
  if (largest == 0 || opt.repeats == 0) throw cost_model_error("tide: calibrate_storage needs a positive size and repeats");
  constexpr std::size_t align = 4096;
  std::size_t padded = 0;
  if (!checked_align_up(largest, align, padded)) throw cost_model_error("tide: calibrate_storage: a size too large");
  spill_file file(where, padded, align);
  auto* buf = static_cast<std::byte*>(::operator new(padded, std::align_val_t{align}));
  struct release {
    std::byte* p;
    ~release() { ::operator delete(p, std::align_val_t{4096}); }
  } guard{buf};
  for (std::size_t i = 0; i < padded; ++i) buf[i] = static_cast<std::byte>(i * 2654435761u >> 24);  // not compressible
  file.register_memory({buf, padded});
  std::vector<std::pair<double, double>> wr, rd;
  using clock = std::chrono::steady_clock;
  auto us = [](clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  for (auto const asked : opt.sizes) {
    std::vector<double> w, r;
    // Direct I/O moves whole blocks: each size is timed as the padded transfer it is.
    auto const s = align_up(asked, align);
    for (std::uint32_t k = 0; k < opt.repeats; ++k) {
      auto const t0 = clock::now();
      file.write(buf, 0, s);
      auto const t1 = clock::now();
      file.read(buf, 0, s);
      auto const t2 = clock::now();
      w.push_back(us(t1 - t0));
      r.push_back(us(t2 - t1));
    }
    wr.push_back({static_cast<double>(s), detail::median(w)});
    rd.push_back({static_cast<double>(s), detail::median(r)});
  }
  return {.write = detail::fit_link(wr), .read = detail::fit_link(rd), .full_duplex = false};
}
#endif  // TIDE_DEFINITIONS

}  // namespace tide

TIDE_DESIGNATED_INIT_END
