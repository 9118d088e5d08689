// Attention evaluated straight from its definition in double precision, with the full score
// matrix: the reference the flash kernels (CPU and GPU) are held to. Independent of every backend.
#pragma once

#include "lmscope/core/rng.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace lmscope::test {

// x rounded to the nearest bf16 (ties to even), as the GPU stores it.
inline double round_to_bf16(double x) {
  float f = static_cast<float>(x);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

struct AttentionProblem {
  std::int64_t n = 1, tq = 1, tk = 1, d = 16;
  bool causal = true;
  std::vector<double> q, k, v, dout;       // inputs and the upstream gradient, standard normal
  std::vector<double> o, lse, dq, dk, dv;  // the reference results

  // bf16_inputs: the inputs are rounded to bf16 first, so the reference sees what a bf16 kernel reads.
  AttentionProblem(std::int64_t n_, std::int64_t tq_, std::int64_t tk_, std::int64_t d_, bool causal_,
                   std::uint64_t seed, bool bf16_inputs = false)
      : n(n_), tq(tq_), tk(tk_), d(d_), causal(causal_) {
    Rng rng(seed);
    auto fill = [&](std::vector<double>& x, std::int64_t size) {
      x.resize(static_cast<std::size_t>(size));
      for (double& e : x) e = bf16_inputs ? round_to_bf16(rng.normal()) : rng.normal();
    };
    fill(q, n * tq * d);
    fill(k, n * tk * d);
    fill(v, n * tk * d);
    fill(dout, n * tq * d);
    solve();
  }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(d)); }

 private:
  void solve() {
    o.assign(q.size(), 0), lse.assign(static_cast<std::size_t>(n * tq), 0);
    dq.assign(q.size(), 0), dk.assign(k.size(), 0), dv.assign(v.size(), 0);
    std::vector<double> p(static_cast<std::size_t>(tk)), dp(static_cast<std::size_t>(tk));
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t i = 0; i < tq; ++i) {
        const double* qi = &q[(b * tq + i) * d];
        const double* gi = &dout[(b * tq + i) * d];
        const std::int64_t seen = causal ? std::min(tk, i + 1) : tk;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < seen; ++j) {
          double s = 0;
          for (std::int64_t c = 0; c < d; ++c) s += qi[c] * k[(b * tk + j) * d + c];
          p[j] = s * scale();
          mx = std::max(mx, p[j]);
        }
        double z = 0;
        for (std::int64_t j = 0; j < seen; ++j) z += (p[j] = std::exp(p[j] - mx));
        lse[b * tq + i] = mx + std::log(z);
        double delta = 0;
        for (std::int64_t j = 0; j < seen; ++j) {
          p[j] /= z;
          dp[j] = 0;
          for (std::int64_t c = 0; c < d; ++c) {
            o[(b * tq + i) * d + c] += p[j] * v[(b * tk + j) * d + c];
            dp[j] += gi[c] * v[(b * tk + j) * d + c];
          }
          delta += p[j] * dp[j];
        }
        for (std::int64_t j = 0; j < seen; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale();
          for (std::int64_t c = 0; c < d; ++c) {
            dq[(b * tq + i) * d + c] += ds * k[(b * tk + j) * d + c];
            dk[(b * tk + j) * d + c] += ds * qi[c];
            dv[(b * tk + j) * d + c] += p[j] * gi[c];
          }
        }
      }
  }
};

// ‖a − b‖ / max(‖b‖, 1): one number per tensor, robust to the few entries near zero; absolute for
// a reference that is zero up to rounding (one key: dq = dk = 0).
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) err += (a[i] - b[i]) * (a[i] - b[i]), ref += b[i] * b[i];
  return a.size() == b.size() ? std::sqrt(err / std::max(ref, 1.0)) : INFINITY;
}

inline double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace lmscope::test
