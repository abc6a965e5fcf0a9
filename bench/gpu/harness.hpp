#pragma once
// The GPU benchmarks' timing harness: a few dozen lines in place of Google Benchmark, so that the
// GPU check builds on a machine with no network and no Google Benchmark package (the GPU
// machines it is meant for), and so that a run cut short still leaves every finished row.
//
// Each case writes one JSON object on its own line (JSON Lines), flushed as soon as the case ends:
// a run killed by a timeout or ended by an error keeps what it measured, and a reader skips at most
// one cut line. A case that throws writes a row with its "error" and the run goes on; the program
// then exits 1.
//
//   gpu_bench [--out FILE] [--filter SUBSTRING] [--min-time SECONDS] [--list]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpu_bench {

using clock_type = std::chrono::steady_clock;

//! Seconds since `t0`.
[[nodiscard]] inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

//! One case's result: named numbers and strings, written as one JSON object.
class row {
 public:
  explicit row(std::string name) : name_(std::move(name)) {}
  void set(std::string_view key, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    fields_.emplace_back(std::string(key), buf);
  }
  void set(std::string_view key, std::string_view s) { fields_.emplace_back(std::string(key), quoted(s)); }
  [[nodiscard]] std::string const& name() const noexcept { return name_; }
  [[nodiscard]] std::string json() const {
    std::string j = "{\"name\": " + quoted(name_) + ", \"run_type\": \"iteration\"";
    for (auto const& [k, v] : fields_) j += ", " + quoted(k) + ": " + v;
    return j + "}";
  }

 private:
  static std::string quoted(std::string_view s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        q += buf;
      } else {
        q += c;
      }
    }
    return q + "\"";
  }
  std::string name_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

//! Times `body` (one iteration, returning its own measured seconds) until `min_time` seconds of
//! measured time and at least `min_iterations`: returns the iterations and their total seconds.
template <class Body>
[[nodiscard]] std::pair<int, double> repeat(Body&& body, double min_time, int min_iterations) {
  int n = 0;
  double total = 0;
  while (n < min_iterations || total < min_time) {
    total += body();
    ++n;
  }
  return {n, total};
}

//! The cases, in the order registered; runs those whose name contains the filter.
class runner {
 public:
  runner(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string_view const a = argv[i];
      auto value = [&]() -> char const* {
        if (i + 1 >= argc) {
          std::fprintf(stderr, "gpu_bench: %s needs a value\n", argv[i]);
          std::exit(2);
        }
        return argv[++i];
      };
      if (a == "--out") out_path_ = value();
      else if (a == "--filter") filter_ = value();
      else if (a == "--min-time") min_time_ = std::atof(value());
      else if (a == "--list") list_ = true;
      else {
        std::fprintf(stderr, "gpu_bench: unknown option %s (--out FILE, --filter SUBSTRING, --min-time SECONDS, --list)\n", argv[i]);
        std::exit(2);
      }
    }
    if (!(min_time_ >= 0 && min_time_ < 3600)) {
      std::fprintf(stderr, "gpu_bench: --min-time must be between 0 and 3600 seconds\n");
      std::exit(2);
    }
  }

  //! True with --list: the run prints the cases' names and measures nothing.
  [[nodiscard]] bool listing() const noexcept { return list_; }
  //! Seconds of measured time each bandwidth case repeats for (--min-time, default 0.2).
  [[nodiscard]] double min_time() const noexcept { return min_time_; }

  void add(std::string name, std::function<void(row&)> body) { cases_.emplace_back(std::move(name), std::move(body)); }

  //! Runs the cases; 0 when every case ran, 1 when one failed, 2 when the output cannot be written.
  [[nodiscard]] int run() {
    if (list_) {
      for (auto const& c : cases_) std::printf("%s\n", c.first.c_str());
      return 0;
    }
    std::FILE* out = nullptr;
    if (!out_path_.empty() && !(out = std::fopen(out_path_.c_str(), "w"))) {
      std::fprintf(stderr, "gpu_bench: cannot write %s\n", out_path_.c_str());
      return 2;
    }
    int failed = 0;
    for (auto const& [name, body] : cases_) {
      if (name.find(filter_) == std::string::npos) continue;
      row r(name);
      auto const t0 = clock_type::now();
      try {
        body(r);
      } catch (std::exception const& e) {
        r.set("error", e.what());
        ++failed;
      }
      std::printf("%-46s %8.2f s  %s\n", name.c_str(), seconds_since(t0), r.json().c_str());
      std::fflush(stdout);
      if (out) {
        std::fprintf(out, "%s\n", r.json().c_str());
        std::fflush(out);  // a run killed after this case keeps it
      }
    }
    if (out) std::fclose(out);
    if (failed) std::fprintf(stderr, "gpu_bench: %d case(s) failed (their rows carry the error)\n", failed);
    return failed ? 1 : 0;
  }

 private:
  std::vector<std::pair<std::string, std::function<void(row&)>>> cases_;
  std::string out_path_, filter_;
  double min_time_ = 0.2;
  bool list_ = false;
};

}  // namespace gpu_bench
