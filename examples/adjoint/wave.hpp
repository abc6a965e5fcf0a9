#pragma once
// A 2-D acoustic wave equation and its discrete adjoint: the model problem of seismic imaging.
//
// The pressure p on an nx x nz grid (spacing 1, zero on the boundary) steps by second-order
// finite differences in time and space:
//
//   p[n+1] = 2 p[n] - p[n-1] + dt^2 m (L p[n]) + dt^2 w[n] e_src,
//
// with m = c^2 the squared velocity per cell (the parameter), L the 5-point Laplacian and w a
// Ricker wavelet injected at one cell. Receivers record p[n+1] after each step n; the misfit is
// J(m) = 1/2 sum_n sum_r (p[n+1][r] - d[n][r])^2 against observed data d.
//
// The state a step reads and writes (the "carry" of the chain) is s[n] = (p[n], p[n-1]); step n
// maps s[n] to s[n+1]. The gradient dJ/dm comes from the adjoint-state method, by the exact
// discrete adjoint of the recurrence, so a Taylor test shows second-order convergence:
//
//   mu[k]  = R^T (p[k][r] - d[k-1]) + 2 mu[k+1] + L (dt^2 m mu[k+1]) - mu[k+2]     (L = L^T)
//   dJ/dm += dt^2 (L p[n]) mu[n+1]                                                   for each n,
//
// seeded by mu[N] = R^T (p[N][r] - d[N-1]), mu[N+1] = 0. The reverse sweep needs the states in
// reverse order: `backward(n)` reads s[n]. Which states are stored, recomputed or moved to host
// memory is the checkpointing schedule's business (main.cpp), not this file's.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

namespace adjoint {

//! FNV-1a over the bytes of a gradient: equal exactly when the gradients are bitwise equal.
inline std::uint64_t checksum(std::span<double const> v) {
  std::uint64_t h = 1469598103934665603ull;
  for (double x : v) {
    unsigned char b[sizeof x];
    std::memcpy(b, &x, sizeof x);
    for (auto c : b) h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

struct problem {
  int nx = 0, nz = 0;
  int steps = 0;
  double dt = 0.35;              //!< with c <= 1.65 and spacing 1: c dt <= 0.58 < 1/sqrt(2) (stable)
  std::vector<double> m;         //!< c^2 per cell
  int source = 0;                //!< cell of the source
  std::vector<int> receivers;    //!< cells recording p
  std::vector<double> wavelet;   //!< source amplitude per step
  std::vector<double> observed;  //!< steps x receivers

  std::size_t cells() const noexcept { return static_cast<std::size_t>(nx) * static_cast<std::size_t>(nz); }
  //! Doubles in one state s[n] = (p[n], p[n-1]).
  std::size_t state_size() const noexcept { return 2 * cells(); }
};

//! (L p) at interior cell c of an nx-wide grid.
inline double laplacian(std::span<double const> p, std::size_t c, std::size_t nx) {
  return p[c - 1] + p[c + 1] + p[c - nx] + p[c + nx] - 4 * p[c];
}

//! Step n: s = (p[n], p[n-1]) becomes (p[n+1], p[n]).
inline void step(problem const& P, int n, std::span<double> s) {
  auto const N = P.cells();
  auto p = s.first(N), q = s.subspan(N, N);
  double const k = P.dt * P.dt;
  for (int z = 1; z < P.nz - 1; ++z)
    for (int x = 1; x < P.nx - 1; ++x) {
      auto const c = static_cast<std::size_t>(z) * static_cast<std::size_t>(P.nx) + static_cast<std::size_t>(x);
      q[c] = 2 * p[c] - q[c] + k * P.m[c] * laplacian(p, c, static_cast<std::size_t>(P.nx));  // p[n+1] over p[n-1]
    }
  q[static_cast<std::size_t>(P.source)] += k * P.wavelet[static_cast<std::size_t>(n)];
  std::swap_ranges(p.begin(), p.end(), q.begin());
}

//! The misfit of the whole forward run from rest (the data term only).
inline double misfit(problem const& P) {
  std::vector<double> s(P.state_size(), 0.0);
  double j = 0;
  for (int n = 0; n < P.steps; ++n) {
    step(P, n, s);
    for (std::size_t r = 0; r < P.receivers.size(); ++r) {
      double const e = s[static_cast<std::size_t>(P.receivers[r])] - P.observed[static_cast<std::size_t>(n) * P.receivers.size() + r];
      j += 0.5 * e * e;
    }
  }
  return j;
}

//! The seed of the adjoint state `mu` = (mu[N], mu[N+1]) from the last state s[N-1], which it
//! only reads: mu[N] is the residual of p[N] = step(s[N-1]) at the receivers (computed there
//! only), mu[N+1] = 0.
inline void seed(problem const& P, std::span<double const> last, std::span<double> mu) {
  auto const N = P.cells();
  auto const nx = static_cast<std::size_t>(P.nx);
  auto p = last.first(N), q = last.subspan(N, N);
  std::fill(mu.begin(), mu.end(), 0.0);
  double const k = P.dt * P.dt;
  auto const R = P.receivers.size();
  for (std::size_t r = 0; r < R; ++r) {
    auto const c = static_cast<std::size_t>(P.receivers[r]);
    double next = 2 * p[c] - q[c] + k * P.m[c] * laplacian(p, c, nx);
    if (static_cast<int>(c) == P.source) next += k * P.wavelet[static_cast<std::size_t>(P.steps - 1)];
    mu[c] += next - P.observed[static_cast<std::size_t>(P.steps - 1) * R + r];
  }
}

//! The reverse of step n: needs s[n]; `mu` = (mu[n+1], mu[n+2]) becomes (mu[n], mu[n+1]); adds
//! step n's part of dJ/dm to `grad`.
inline void backward(problem const& P, int n, std::span<double const> s, std::span<double> mu, std::span<double> grad) {
  auto const N = P.cells();
  auto const nx = static_cast<std::size_t>(P.nx);
  auto m1 = mu.first(N), m2 = mu.subspan(N, N);  // mu[n+1], mu[n+2]
  auto p = s.first(N);
  double const k = P.dt * P.dt;
  for (int z = 1; z < P.nz - 1; ++z)
    for (int x = 1; x < P.nx - 1; ++x) {
      auto const c = static_cast<std::size_t>(z) * nx + static_cast<std::size_t>(x);
      grad[c] += k * laplacian(p, c, nx) * m1[c];
    }
  // mu[n] over mu[n+2]: L (k m mu[n+1]) reads mu[n+1] at the neighbours; mu is zero on the
  // boundary (only interior cells are written), as p is.
  auto km = [&](std::size_t c) { return k * P.m[c] * m1[c]; };
  for (int z = 1; z < P.nz - 1; ++z)
    for (int x = 1; x < P.nx - 1; ++x) {
      auto const c = static_cast<std::size_t>(z) * nx + static_cast<std::size_t>(x);
      m2[c] = 2 * m1[c] + (km(c - 1) + km(c + 1) + km(c - nx) + km(c + nx) - 4 * km(c)) - m2[c];
    }
  if (n >= 1) {
    auto const R = P.receivers.size();
    for (std::size_t r = 0; r < R; ++r) {
      auto const c = static_cast<std::size_t>(P.receivers[r]);
      m2[c] += p[c] - P.observed[static_cast<std::size_t>(n - 1) * R + r];
    }
  }
  std::swap_ranges(m1.begin(), m1.end(), m2.begin());
}

//! A Ricker wavelet of peak frequency f (per step units of dt), delayed by 1.5 / f.
inline std::vector<double> ricker(int steps, double dt, double f) {
  std::vector<double> w(static_cast<std::size_t>(steps));
  double const pi = 3.14159265358979323846, t0 = 1.5 / f;
  for (int n = 0; n < steps; ++n) {
    double const a = pi * f * (n * dt - t0);
    w[static_cast<std::size_t>(n)] = (1 - 2 * a * a) * std::exp(-a * a);
  }
  return w;
}

//! A square grid of `size` cells a side: a background velocity of 1.2 rising to 1.5 with depth
//! (the model the gradient is taken at), the "true" one with a slow disc in the middle (which made
//! the observed data), a source near the top and a line of receivers along it.
inline problem make_problem(int size, int steps) {
  problem P;
  P.nx = P.nz = size;
  P.steps = steps;
  auto const N = P.cells();
  P.m.resize(N);
  std::vector<double> truth(N);
  for (int z = 0; z < size; ++z)
    for (int x = 0; x < size; ++x) {
      auto const c = static_cast<std::size_t>(z) * static_cast<std::size_t>(size) + static_cast<std::size_t>(x);
      double const v = 1.2 + 0.3 * z / (size - 1.0);
      double const dx = x - 0.5 * size, dz = z - 0.55 * size, r = 0.12 * size;
      P.m[c] = v * v;
      double const vt = dx * dx + dz * dz < r * r ? v * 0.9 : v;
      truth[c] = vt * vt;
    }
  P.source = (size / 8) * size + size / 2;
  for (int x = 2; x < size - 2; x += 2) P.receivers.push_back((size / 8) * size + x);
  P.wavelet = ricker(steps, P.dt, 0.08);
  // The observed data: the same stepper on the true model.
  problem T = P;
  T.m = truth;
  std::vector<double> s(P.state_size(), 0.0);
  P.observed.resize(static_cast<std::size_t>(steps) * P.receivers.size());
  for (int n = 0; n < steps; ++n) {
    step(T, n, s);
    for (std::size_t r = 0; r < P.receivers.size(); ++r)
      P.observed[static_cast<std::size_t>(n) * P.receivers.size() + r] = s[static_cast<std::size_t>(P.receivers[r])];
  }
  return P;
}

}  // namespace adjoint
