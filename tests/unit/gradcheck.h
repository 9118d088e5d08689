// Central finite differences in double precision on the CPU backend: the reference every
// hand-written backward is held to.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace lmscope::test {

inline Allocation random_tensor(Backend& be, Shape shape, Rng& rng, double scale = 1.0) {
  Allocation a = be.allocator().allocate(std::move(shape), DType::f64, {MemKind::workspace, "test", -1});
  for (std::int64_t i = 0; i < a.tensor().numel(); ++i) a.tensor().as<double>()[i] = scale * rng.normal();
  return a;
}

inline Allocation zeros(Backend& be, Shape shape, DType dtype = DType::f64) {
  Allocation a = be.allocator().allocate(std::move(shape), dtype, {MemKind::workspace, "test", -1});
  std::fill_n(static_cast<char*>(a.tensor().data), a.tensor().bytes(), 0);
  return a;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.as<double>()[i] * b.as<double>()[i];
  return s;
}

// Checks analytic[i] against (L(x+h) − L(x−h)) / 2h for every element of x, where loss()
// recomputes the scalar loss from the current contents of x.
inline void expect_gradient(const std::string& what, const Tensor& x, const Tensor& analytic,
                            const std::function<double()>& loss, double tol = 1e-6) {
  ASSERT_EQ(x.numel(), analytic.numel()) << what;
  const double h = 1e-6;
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double& xi = x.as<double>()[i];
    const double saved = xi;
    xi = saved + h;
    const double lp = loss();
    xi = saved - h;
    const double lm = loss();
    xi = saved;
    const double numeric = (lp - lm) / (2 * h), a = analytic.as<double>()[i];
    err2 += (numeric - a) * (numeric - a);
    ref2 += numeric * numeric;
  }
  ASSERT_GT(ref2, 0.0) << what << ": the numeric gradient is all zero, the check would prove nothing";
  EXPECT_LT(std::sqrt(err2 / ref2), tol) << what << ": relative error of the analytic gradient";
}

}  // namespace lmscope::test
