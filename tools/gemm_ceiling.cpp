// The CPU's matrix-product ceiling as lmscope sees it: sgemm through the OpenBLAS lmscope links,
// square sizes, random operands, best and median of repeated runs in GFLOP/s.
#include <cblas.h>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2048, reps = argc > 2 ? std::atoi(argv[2]) : 7;
  std::vector<float> a(static_cast<std::size_t>(n) * n), b(a.size()), c(a.size());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto* v : {&a, &b})
    for (float& x : *v) x = u(rng);
  std::vector<double> gflops;
  for (int r = 0; r < reps + 1; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gflops.push_back(2.0 * n * n * n / s / 1e9);  // the first run warms up
  }
  std::sort(gflops.begin(), gflops.end());
  fmt::print("sgemm {}^3: best {:.1f} GFLOP/s, median {:.1f} GFLOP/s over {} runs ({} threads)\n", n, gflops.back(),
             gflops[gflops.size() / 2], reps, openblas_get_num_threads());
  return 0;
}
