#include "lmscope/backend/cpu/flash_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace lmscope::cpu {
namespace {

constexpr std::int64_t kTile = 64;  // query and key tile: a 64×64 score tile stays in L1/L2

// C [m, n] = alpha·op(A)·op(B) + beta·C, row-major.
template <typename T>
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  const auto M = static_cast<blasint>(m), N = static_cast<blasint>(n), K = static_cast<blasint>(k);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta,
                c, static_cast<blasint>(ldc));
  else
    cblas_dgemm(CblasRowMajor, TA, TB, M, N, K, alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta,
                c, static_cast<blasint>(ldc));
}

// Keys of the tile starting at k0 (cols of them) that query qi sees.
std::int64_t visible(std::int64_t qi, std::int64_t k0, std::int64_t cols, bool causal) {
  return causal ? std::clamp<std::int64_t>(qi - k0 + 1, 0, cols) : cols;
}

// Keys any query of [q0, q0 + rows) sees: all of them, or up to the last query when causal.
std::int64_t key_end(std::int64_t q0, std::int64_t rows, std::int64_t tk, bool causal) {
  return causal ? std::min(tk, q0 + rows) : tk;
}

// s [rows, kTile] scores of queries q0.. against keys k0.. -> P = exp(scale·s − lse), masked to 0.
template <typename T>
void recompute_probabilities(T* s, std::int64_t rows, std::int64_t cols, std::int64_t q0, std::int64_t k0, const T* lse,
                             T scale, bool causal) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = s + r * kTile;
    const std::int64_t seen = visible(q0 + r, k0, cols, causal);
    for (std::int64_t c = 0; c < seen; ++c) row[c] = std::exp(scale * row[c] - lse[r]);
    std::fill(row + seen, row + cols, T(0));
  }
}

// P [rows, kTile] -> dS = P ∘ (dP − delta) with dP = dout·vᵀ computed into dp.
template <typename T>
void score_gradient(T* p, T* dp, std::int64_t rows, std::int64_t cols, std::int64_t d, const T* dout, const T* v,
                    const T* delta) {
  gemm<T>(false, true, rows, cols, d, T(1), dout, d, v, d, T(0), dp, kTile);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) p[r * kTile + c] *= dp[r * kTile + c] - delta[r];
}

}  // namespace

template <typename T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* o, T* lse, std::int64_t n, std::int64_t tq,
                             std::int64_t tk, std::int64_t d, T scale, bool causal) {
  const std::int64_t q_tiles = (tq + kTile - 1) / kTile;
#pragma omp parallel
  {
    std::vector<T> s(kTile * kTile), acc(kTile * d), m(kTile), l(kTile);
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t qt = 0; qt < q_tiles; ++qt) {
        const std::int64_t q0 = qt * kTile, rows = std::min(kTile, tq - q0);
        const T* Q = q + (b * tq + q0) * d;
        std::fill(acc.begin(), acc.end(), T(0));
        std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
        std::fill(l.begin(), l.end(), T(0));
        const std::int64_t kend = key_end(q0, rows, tk, causal);
        for (std::int64_t k0 = 0; k0 < kend; k0 += kTile) {
          const std::int64_t cols = std::min(kTile, kend - k0);
          gemm<T>(false, true, rows, cols, d, scale, Q, d, k + (b * tk + k0) * d, d, T(0), s.data(), kTile);
          for (std::int64_t r = 0; r < rows; ++r) {  // online softmax: S -> P̃, rescale what came before
            T* row = s.data() + r * kTile;
            const std::int64_t seen = visible(q0 + r, k0, cols, causal);
            T mx = m[r];
            for (std::int64_t c = 0; c < seen; ++c) mx = std::max(mx, row[c]);
            const T corr = seen > 0 ? std::exp(m[r] - mx) : T(1);  // exp(−inf) = 0 on the first tile
            T sum = 0;
            for (std::int64_t c = 0; c < seen; ++c) sum += (row[c] = std::exp(row[c] - mx));
            std::fill(row + seen, row + cols, T(0));
            if (seen == 0) continue;
            m[r] = mx;
            l[r] = l[r] * corr + sum;
            for (std::int64_t j = 0; j < d; ++j) acc[r * d + j] *= corr;
          }
          gemm<T>(false, false, rows, d, cols, T(1), s.data(), kTile, v + (b * tk + k0) * d, d, T(1), acc.data(), d);
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const T inv = T(1) / l[r];
          for (std::int64_t j = 0; j < d; ++j) o[(b * tq + q0 + r) * d + j] = acc[r * d + j] * inv;
          lse[b * tq + q0 + r] = m[r] + std::log(l[r]);
        }
      }
  }
}

template <typename T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                              T* dv, T* delta, std::int64_t n, std::int64_t tq, std::int64_t tk, std::int64_t d,
                              T scale, bool causal) {
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < n * tq; ++r) {
    T sum = 0;
    for (std::int64_t j = 0; j < d; ++j) sum += dout[r * d + j] * o[r * d + j];
    delta[r] = sum;
  }
  const std::int64_t q_tiles = (tq + kTile - 1) / kTile, k_tiles = (tk + kTile - 1) / kTile;
#pragma omp parallel
  {
    std::vector<T> p(kTile * kTile), dp(kTile * kTile), acc_a(kTile * d), acc_b(kTile * d);
    // dK and dV: one key tile against every query tile that sees it.
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t kt = 0; kt < k_tiles; ++kt) {
        const std::int64_t k0 = kt * kTile, cols = std::min(kTile, tk - k0);
        const T *K = k + (b * tk + k0) * d, *V = v + (b * tk + k0) * d;
        std::fill(acc_a.begin(), acc_a.end(), T(0));  // dK
        std::fill(acc_b.begin(), acc_b.end(), T(0));  // dV
        for (std::int64_t q0 = causal ? k0 / kTile * kTile : 0; q0 < tq; q0 += kTile) {
          const std::int64_t rows = std::min(kTile, tq - q0), row0 = b * tq + q0;
          gemm<T>(false, true, rows, cols, d, T(1), q + row0 * d, d, K, d, T(0), p.data(), kTile);
          recompute_probabilities(p.data(), rows, cols, q0, k0, lse + row0, scale, causal);
          gemm<T>(true, false, cols, d, rows, T(1), p.data(), kTile, dout + row0 * d, d, T(1), acc_b.data(), d);
          score_gradient(p.data(), dp.data(), rows, cols, d, dout + row0 * d, V, delta + row0);
          gemm<T>(true, false, cols, d, rows, T(1), p.data(), kTile, q + row0 * d, d, T(1), acc_a.data(), d);
        }
        for (std::int64_t i = 0; i < cols * d; ++i) {
          dk[(b * tk + k0) * d + i] = scale * acc_a[i];
          dv[(b * tk + k0) * d + i] = acc_b[i];
        }
      }
      // dQ: one query tile against every key tile it sees.
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t qt = 0; qt < q_tiles; ++qt) {
        const std::int64_t q0 = qt * kTile, rows = std::min(kTile, tq - q0), row0 = b * tq + q0;
        std::fill(acc_a.begin(), acc_a.end(), T(0));
        const std::int64_t kend = key_end(q0, rows, tk, causal);
        for (std::int64_t k0 = 0; k0 < kend; k0 += kTile) {
          const std::int64_t cols = std::min(kTile, kend - k0);
          const T *K = k + (b * tk + k0) * d, *V = v + (b * tk + k0) * d;
          gemm<T>(false, true, rows, cols, d, T(1), q + row0 * d, d, K, d, T(0), p.data(), kTile);
          recompute_probabilities(p.data(), rows, cols, q0, k0, lse + row0, scale, causal);
          score_gradient(p.data(), dp.data(), rows, cols, d, dout + row0 * d, V, delta + row0);
          gemm<T>(false, false, rows, d, cols, T(1), p.data(), kTile, K, d, T(1), acc_a.data(), d);
        }
        for (std::int64_t i = 0; i < rows * d; ++i) dq[row0 * d + i] = scale * acc_a[i];
      }
  }
}

template void flash_attention_forward<float>(const float*, const float*, const float*, float*, float*, std::int64_t,
                                             std::int64_t, std::int64_t, std::int64_t, float, bool);
template void flash_attention_forward<double>(const double*, const double*, const double*, double*, double*,
                                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, double, bool);
template void flash_attention_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                              const float*, float*, float*, float*, float*, std::int64_t, std::int64_t,
                                              std::int64_t, std::int64_t, float, bool);
template void flash_attention_backward<double>(const double*, const double*, const double*, const double*,
                                               const double*, const double*, double*, double*, double*, double*,
                                               std::int64_t, std::int64_t, std::int64_t, std::int64_t, double, bool);

}  // namespace lmscope::cpu
