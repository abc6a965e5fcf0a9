// The CUDA twin of examples/adjoint: the same 2-D acoustic wave stepper and its exact discrete
// adjoint (wave.hpp) as CUDA kernels, the time steps a tide stack whose carry is the state, run on
// the CUDA backend under store-all, Revolve and two tiers (the copies between the tiers on the
// backend's d2h and h2d streams, overlapped with the steps). The gradients are compared bitwise
// across the three schedules on the GPU, and with the CPU's gradient (wave.hpp, store-all) to a
// relative 1e-9: nvcc contracts a * b + c into fused multiply-adds, so GPU and CPU round
// differently. `--check` exits 1 otherwise. Without a GPU it says so and exits 77 (Meson: skipped).
//
//   adjoint_cuda [--steps N] [--size N] [--snapshots S] [--host-snapshots H] [--json] [--check]
#include <tide/backends/cuda/cuda_backend.hpp>
#include <tide/plan/checkpointing.hpp>
#include <tide/tide.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_device.hpp"
#include "example.hpp"
#include "wave.hpp"

namespace {


//! Device memory for `n` values of T, freed on scope exit.
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t n) : n_(n) { TIDE_CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T))); }
  device_array(std::vector<T> const& h) : device_array(h.size()) {
    TIDE_CUDA_CHECK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~device_array() { static_cast<void>(cudaFree(p_)); }
  device_array(device_array const&) = delete;
  device_array& operator=(device_array const&) = delete;
  T* get() const noexcept { return p_; }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    TIDE_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  //! Zeroed on `stream`: tide's streams do not wait for the legacy stream a cudaMemset uses.
  void zero(cudaStream_t stream) const { TIDE_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), stream)); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

//! What the kernels read of the problem, in device memory.
struct device_problem {
  int nx = 0, nz = 0, steps = 0, receivers = 0, source = 0;
  double k = 0;                      //!< dt^2
  double const* m = nullptr;         //!< c^2 per cell
  double const* wavelet = nullptr;   //!< per step
  double const* observed = nullptr;  //!< steps x receivers
  int const* receiver_of = nullptr;  //!< per cell: its receiver index, or -1
};

__device__ bool interior(device_problem const& P, int c) {
  int const x = c % P.nx, z = c / P.nx;
  return x > 0 && x < P.nx - 1 && z > 0 && z < P.nz - 1;
}
__device__ double laplacian(double const* p, int c, int nx) { return p[c - 1] + p[c + 1] + p[c - nx] + p[c + nx] - 4 * p[c]; }

//! Step n: `in` = (p[n], p[n-1]) gives `out` = (p[n+1], p[n]); zero on the boundary, as wave.hpp.
__global__ void step_kernel(device_problem P, int n, double const* in, double* out) {
  int const N = P.nx * P.nz;
  int const c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= N) return;
  double const* p = in;
  double const* q = in + N;
  double next = interior(P, c) ? 2 * p[c] - q[c] + P.k * P.m[c] * laplacian(p, c, P.nx) : q[c];
  if (c == P.source) next += P.k * P.wavelet[n];
  out[c] = next;
  out[N + c] = p[c];
}

//! mu = (mu[N], mu[N+1]) from the last state s[N-1]: the residual of p[N] at the receivers.
__global__ void seed_kernel(device_problem P, double const* last, double* m1, double* m2) {
  int const N = P.nx * P.nz;
  int const c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= N) return;
  m2[c] = 0;
  m1[c] = 0;
  int const r = P.receiver_of[c];
  if (r < 0) return;
  double const* p = last;
  double const* q = last + N;
  double next = 2 * p[c] - q[c] + P.k * P.m[c] * laplacian(p, c, P.nx);
  if (c == P.source) next += P.k * P.wavelet[P.steps - 1];
  m1[c] = next - P.observed[(P.steps - 1) * P.receivers + r];
}

//! The reverse of step n (state s = s[n]): grad += k (L p[n]) mu[n+1]; m2 (mu[n+2]) becomes mu[n].
__global__ void backward_kernel(device_problem P, int n, double const* s, double const* m1, double* m2, double* grad) {
  int const N = P.nx * P.nz;
  int const c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= N) return;
  double const* p = s;
  if (interior(P, c)) {
    int const nx = P.nx;
    grad[c] += P.k * laplacian(p, c, nx) * m1[c];
    auto km = [&](int i) { return P.k * P.m[i] * m1[i]; };
    m2[c] = 2 * m1[c] + (km(c - 1) + km(c + 1) + km(c - nx) + km(c + nx) - 4 * km(c)) - m2[c];
  }
  int const r = P.receiver_of[c];
  if (n >= 1 && r >= 0) m2[c] += p[c] - P.observed[(n - 1) * P.receivers + r];
}

//! The CPU gradient with every state stored (wave.hpp's step, seed and backward).
std::vector<double> cpu_gradient(adjoint::problem const& P) {
  std::vector<std::vector<double>> states{std::vector<double>(P.state_size(), 0.0)};
  for (int n = 0; n + 1 < P.steps; ++n) {
    states.push_back(states.back());
    adjoint::step(P, n, states.back());
  }
  std::vector<double> mu(P.state_size()), grad(P.cells(), 0.0);
  adjoint::seed(P, states.back(), mu);
  for (int n = P.steps - 1; n >= 0; --n) adjoint::backward(P, n, states[static_cast<std::size_t>(n)], mu, grad);
  return grad;
}

struct outcome {
  std::string name;
  std::vector<double> grad;
  std::uint64_t advances = 0;
  std::size_t device_bytes = 0, host_bytes = 0;
  double ms = 0;
};

outcome reverse(adjoint::problem const& P, device_problem const& D, std::string name, tide::checkpoint_spec checkpoints) {
  outcome o;
  o.name = std::move(name);
  tide::stack_spec st;
  st.append({"step", {}}, static_cast<std::uint32_t>(P.steps));
  st.carry = {"state", P.state_size() * sizeof(double)};
  auto const s = tide::build_schedule(st, tide::strategy{.checkpoints = std::move(checkpoints)});
  o.advances = s.carry.advances;
  o.device_bytes = s.peak_device_bytes();
  o.host_bytes = s.peak_host_bytes();
  auto const N = P.cells();
  device_array<double> mu_a(N), mu_b(N), grad(N);
  tide::cuda_backend backend(example::backend_options());
  tide::executor ex(backend, s);
  // Zeroed on the compute stream, which the step is ordered after (tide's streams are
  // non-blocking: a cudaMemset on the legacy stream could still be running when the step reads).
  auto const compute = backend.stream(tide::stream_role::compute);
  grad.zero(compute);
  TIDE_CUDA_CHECK(cudaMemsetAsync(ex.carry_input().data(), 0, ex.carry_input().size(), compute));  // state 0: at rest
  unsigned const threads = 256, blocks = static_cast<unsigned>((N + threads - 1) / threads);
  bool flipped = false;  // the lambdas run on this thread, in issue order: mu's halves swap by name
  auto forward = [&](tide::forward_context<cudaStream_t> const& c) {
    if (!c.produces_carry()) return;  // no recomputes: the stack saves no slots
    step_kernel<<<blocks, threads, 0, c.stream>>>(D, static_cast<int>(c.layer), c.carry_in<double>().data(),
                                                  c.carry_out<double>().data());
    TIDE_CUDA_CHECK(cudaGetLastError());
  };
  auto backward = [&](tide::backward_context<cudaStream_t> const& c) {
    auto const* state = c.carry_in<double>().data();
    if (c.layer + 1 == static_cast<std::uint32_t>(P.steps)) {
      seed_kernel<<<blocks, threads, 0, c.stream>>>(D, state, mu_a.get(), mu_b.get());
      flipped = false;
    }
    double* m1 = flipped ? mu_b.get() : mu_a.get();
    double* m2 = flipped ? mu_a.get() : mu_b.get();
    backward_kernel<<<blocks, threads, 0, c.stream>>>(D, static_cast<int>(c.layer), state, m1, m2, grad.get());
    TIDE_CUDA_CHECK(cudaGetLastError());
    flipped = !flipped;  // mu[n] is now where mu[n+2] was
  };
  auto const t0 = std::chrono::steady_clock::now();
  ex.step(forward, backward);
  o.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  o.grad = grad.download();
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, size = 96, snapshots = 6, host_snapshots = 3;
  bool json = false, check = false;
  example::cli cli("adjoint_cuda");
  cli.option("--steps", steps, "N", "time steps (default 200)")
      .option("--size", size, "N", "grid cells a side (default 96)")
      .option("--snapshots", snapshots, "S", "device snapshots, the initial state included")
      .option("--host-snapshots", host_snapshots, "H", "host snapshots of the two-tier run (0: none)")
      .flag("--json", json, "the results as JSON on stdout")
      .flag("--check", check, "exit 1 unless the GPU gradients are bitwise equal and match the CPU's");
  cli.parse(argc, argv);
  if (steps < 2 || size < 8 || snapshots < 1 || host_snapshots < 0) cli.fail("need --steps >= 2, --size >= 8, --snapshots >= 1");
  if (auto const rc = example::without_device("adjoint_cuda")) return *rc;
  auto const P = adjoint::make_problem(size, steps);
  std::vector<int> receiver_of(P.cells(), -1);
  for (std::size_t r = 0; r < P.receivers.size(); ++r) receiver_of[static_cast<std::size_t>(P.receivers[r])] = static_cast<int>(r);
  device_array<double> m(P.m), wavelet(P.wavelet), observed(P.observed);
  device_array<int> rec(receiver_of);
  device_problem const D{P.nx, P.nz, P.steps, static_cast<int>(P.receivers.size()), P.source, P.dt * P.dt,
                         m.get(), wavelet.get(), observed.get(), rec.get()};

  auto const s = static_cast<std::uint32_t>(std::min(snapshots, steps));
  std::vector<outcome> runs;
  runs.push_back(reverse(P, D, "store all", {}));
  runs.push_back(reverse(P, D, "revolve, " + std::to_string(s) + " snapshots", {.device_snapshots = s}));
  if (host_snapshots > 0) {
    // Costs for the two-tier model: assumed (a label, not a measurement): a backward step twice a
    // forward step, a state copy half of one each way.
    auto const plan = tide::two_tier_plan(steps, s, host_snapshots, tide::chain_costs::constant(1.0, 2.0, 0.5, 0.5));
    runs.push_back(reverse(P, D, "two tiers, " + std::to_string(s) + " + " + std::to_string(host_snapshots) + " host",
                           {.device_snapshots = s, .host_snapshots = static_cast<std::uint32_t>(host_snapshots),
                            .reversal = plan.actions}));
  }
  auto const cpu = cpu_gradient(P);
  double scale = 0, diff = 0;
  for (std::size_t c = 0; c < cpu.size(); ++c) {
    scale = std::max(scale, std::abs(cpu[c]));
    diff = std::max(diff, std::abs(cpu[c] - runs.front().grad[c]));
  }
  double const relative = scale > 0 ? diff / scale : diff;
  bool equal = true;
  for (auto const& r : runs) equal = equal && r.grad == runs.front().grad;
  bool const ok = equal && relative < 1e-9;

  if (json) {
    std::vector<example::json_object> rs;
    for (auto const& r : runs) {
      auto& j = rs.emplace_back();
      j.field("strategy", r.name)
          .field("advance_ops", r.advances)
          .field("peak_device_bytes", r.device_bytes)
          .field("peak_host_bytes", r.host_bytes)
          .field("step_ms", r.ms, 3)
          .field("gradient_checksum", example::hex(adjoint::checksum(r.grad)));
    }
    example::json_object out;
    out.field("steps", steps)
        .field("size", size)
        .field("gradients_bitwise_equal", equal)
        .field("relative_difference_to_cpu", relative, 12)
        .raw("runs", example::json_array(rs, true));
    std::printf("%s\n", out.str().c_str());
  } else {
    std::printf("adjoint_cuda: %d x %d cells, %d steps on the GPU\n\n", size, size, steps);
    example::table t({{"strategy", -32}, {"advances", 9}, {"device", 11}, {"host", 11}, {"ms", 9}, {"grad checksum", -16, 2}});
    for (auto const& r : runs)
      t.row({r.name, std::to_string(r.advances), tide::format_bytes(static_cast<double>(r.device_bytes)),
             tide::format_bytes(static_cast<double>(r.host_bytes)), example::fixed(r.ms, 2), example::hex(adjoint::checksum(r.grad))});
    t.print();
    std::printf("\nGPU gradients %s; largest difference to the CPU's %.3e of its largest value\n", equal ? "bitwise equal" : "DIFFER",
                relative);
  }
  if (check && !ok) {
    std::fprintf(stderr, "adjoint_cuda: check failed:%s%s\n", equal ? "" : " GPU gradients differ between schedules;",
                 relative < 1e-9 ? "" : " GPU and CPU gradients differ beyond 1e-9");
    return 1;
  }
  return 0;
}
