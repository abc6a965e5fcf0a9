#pragma once
// Matrix products of the transformer example, through CBLAS (OpenBLAS), on row-major matrices.
//
// OpenBLAS is pinned to one thread: its threaded kernels split a product's summation across
// threads in a way that depends on the thread count and on timing, while one thread always
// evaluates a given product (same shapes, same values) in the same order. With one thread every
// run, and every recomputation of a tensor, gives bitwise the same results.

#include <cblas.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace transformer::blas {

//! Pins OpenBLAS to one thread (see above). Idempotent and cheap; every model calls it.
inline void use_one_thread() {
  static bool const done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

namespace detail {
inline blasint to_blas_int(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw std::length_error("transformer::blas: dimension " + std::to_string(n) + " exceeds the BLAS int range");
  return static_cast<blasint>(n);
}

inline void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, float const* a,
                 std::size_t lda, float const* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blas_int(m),
              to_blas_int(n), to_blas_int(k), alpha, a, to_blas_int(lda), b, to_blas_int(ldb), beta, c,
              to_blas_int(ldc));
}
inline void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha, double const* a,
                 std::size_t lda, double const* b, std::size_t ldb, double beta, double* c, std::size_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blas_int(m),
              to_blas_int(n), to_blas_int(k), alpha, a, to_blas_int(lda), b, to_blas_int(ldb), beta, c,
              to_blas_int(ldc));
}

// An empty product still has to honour beta; BLAS would reject the zero leading dimensions.
template <class Real>
bool empty_product(std::size_t m, std::size_t n, std::size_t k, Real beta, Real* c) {
  if (m != 0 && n != 0 && k != 0) return false;
  if (k == 0 && beta != Real{1})
    for (std::size_t i = 0; i < m * n; ++i) c[i] = beta == Real{0} ? Real{0} : beta * c[i];
  return true;
}
}  // namespace detail

//! C[m,n] = A[m,k] B[k,n] + beta C (all contiguous, row-major).
template <class Real>
void gemm_nn(std::size_t m, std::size_t n, std::size_t k, Real const* a, Real const* b, Real beta, Real* c) {
  if (detail::empty_product(m, n, k, beta, c)) return;
  detail::gemm(false, false, m, n, k, Real{1}, a, k, b, n, beta, c, n);
}

//! C[m,n] = A[k,m]^T B[k,n] + beta C: a weight gradient, X^T dY, summed over the k tokens.
template <class Real>
void gemm_tn(std::size_t m, std::size_t n, std::size_t k, Real const* a, Real const* b, Real beta, Real* c) {
  if (detail::empty_product(m, n, k, beta, c)) return;
  detail::gemm(true, false, m, n, k, Real{1}, a, m, b, n, beta, c, n);
}

//! C[m,n] = A[m,k] B[n,k]^T + beta C: an input gradient, dY W^T, and the tied output projection.
template <class Real>
void gemm_nt(std::size_t m, std::size_t n, std::size_t k, Real const* a, Real const* b, Real beta, Real* c) {
  if (detail::empty_product(m, n, k, beta, c)) return;
  detail::gemm(false, true, m, n, k, Real{1}, a, k, b, k, beta, c, n);
}

}  // namespace transformer::blas
