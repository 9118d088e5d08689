// Every CPU op: forward against a direct evaluation of MODEL.md's formula, backward against
// central finite differences in f64.
#include "gradcheck.h"

#include "lmscope/backend/op_scratch.h"

#include <numeric>

namespace lmscope::test {
namespace {

class Ops : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
  Rng rng{42};
};

TEST_F(Ops, RmsNormForwardMatchesFormula) {
  auto x = random_tensor(*be, {3, 5}, rng), w = random_tensor(*be, {5}, rng);
  auto y = zeros(*be, {3, 5}), r = zeros(*be, {3});
  be->rmsnorm_forward(x, w, y, r, 1e-5);
  for (int n = 0; n < 3; ++n) {
    double ms = 0;
    for (int j = 0; j < 5; ++j) ms += std::pow(x.tensor().as<double>()[n * 5 + j], 2) / 5;
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(y.tensor().as<double>()[n * 5 + j],
                  x.tensor().as<double>()[n * 5 + j] / std::sqrt(ms + 1e-5) * w.tensor().as<double>()[j], 1e-12);
  }
}

TEST_F(Ops, RmsNormBackward) {
  auto x = random_tensor(*be, {4, 7}, rng), w = random_tensor(*be, {7}, rng), R = random_tensor(*be, {4, 7}, rng);
  auto y = zeros(*be, {4, 7}), r = zeros(*be, {4}), dx = zeros(*be, {4, 7}), dw = zeros(*be, {7});
  auto loss = [&] {
    be->rmsnorm_forward(x, w, y, r, 1e-5);
    return dot(y, R);
  };
  loss();
  be->rmsnorm_backward(R, x, w, r, dx, dw);
  expect_gradient("rmsnorm dx", x, dx, loss);
  expect_gradient("rmsnorm dw", w, dw, loss);
}

// The fused residual add + RMSNorm (forward) and RMSNorm backward + residual gradient: the values
// of the two ops they replace, on odd sizes, in f64 and f32.
TEST_F(Ops, FusedResidualAndRmsNormEqualTheTwoOps) {
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const Shape s{7, 37};
    auto make = [&](const Shape& shape, bool random) {
      Allocation a = be->allocator().allocate(shape, t, {});
      std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)), 0.0);
      if (random)
        for (double& x : v) x = rng.normal();
      upload(*be, a, v);
      return a;
    };
    auto x = make(s, true), y = make(s, true), w = make({37}, true), dy = make(s, true), dres = make(s, true);
    auto h = make(s, false), out = make(s, false), r = make({7}, false), dx = make(s, false), dw = make({37}, false);
    auto h2 = make(s, false), out2 = make(s, false), r2 = make({7}, false), dx2 = make(s, false),
         dw2 = make({37}, false);
    be->add_rmsnorm_forward(x, y, h, w, out, r, 1e-5);
    // dx in f32 beside it, from the f64 pass (the CPU computes in one dtype: this checks the contract).
    Allocation dx_lowp = be->allocator().allocate(s, t == DType::f64 ? DType::f32 : t, {}),
               cast = be->allocator().allocate(s, dx_lowp.tensor().dtype, {});
    be->rmsnorm_backward_add(dy, h, w, r, dres, dx, dw, dx_lowp);
    be->cast(dx, cast);
    EXPECT_EQ(download(*be, dx_lowp), download(*be, cast));
    be->add(x, y, h2);
    be->rmsnorm_forward(h2, w, out2, r2, 1e-5);
    be->rmsnorm_backward(dy, h2, w, r2, dx2, dw2);
    be->add(dx2, dres, dx2);
    const std::pair<const Allocation*, const Allocation*> pairs[] = {
        {&h, &h2}, {&out, &out2}, {&r, &r2}, {&dx, &dx2}, {&dw, &dw2}};
    for (auto [fused, plain] : pairs) {
      const std::vector<double> a = download(*be, *fused), b = download(*be, *plain);
      double err = 0, ref = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        err += (a[i] - b[i]) * (a[i] - b[i]);
        ref += b[i] * b[i];
      }
      EXPECT_GT(ref, 0);
      EXPECT_LE(std::sqrt(err / ref), 1e-7) << fused->tag().what;
    }
  }
}

TEST_F(Ops, SplitHeadsRopeMatchesFormula) {
  const std::int64_t B = 2, T = 5, H = 3, dk = 4;
  const double theta = 10000;
  auto x = random_tensor(*be, {B, T, H, dk}, rng), y = zeros(*be, {B, H, T, dk});
  be->split_heads(x, y, theta);
  const double* X = x.tensor().as<double>();
  const double* Y = y.tensor().as<double>();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < dk / 2; ++i) {
          const double ang = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / dk);
          const double x0 = X[((b * T + t) * H + h) * dk + 2 * i], x1 = X[((b * T + t) * H + h) * dk + 2 * i + 1];
          EXPECT_NEAR(Y[((b * H + h) * T + t) * dk + 2 * i], x0 * std::cos(ang) - x1 * std::sin(ang), 1e-12);
          EXPECT_NEAR(Y[((b * H + h) * T + t) * dk + 2 * i + 1], x0 * std::sin(ang) + x1 * std::cos(ang), 1e-12);
        }
}

TEST_F(Ops, SplitAndMergeHeadsAreAdjoint) {
  for (double theta : {0.0, 10000.0, 7.5}) {
    auto x = random_tensor(*be, {2, 6, 3, 8}, rng), y = random_tensor(*be, {2, 3, 6, 8}, rng);
    auto sx = zeros(*be, {2, 3, 6, 8}), my = zeros(*be, {2, 6, 3, 8});
    be->split_heads(x, sx, theta);
    be->merge_heads(y, my, theta);
    EXPECT_NEAR(dot(sx, y), dot(x, my), 1e-10) << "theta " << theta;  // <split x, y> = <x, merge y>
  }
}

TEST_F(Ops, SplitHeadsBackward) {
  auto x = random_tensor(*be, {2, 5, 2, 6}, rng), R = random_tensor(*be, {2, 2, 5, 6}, rng);
  auto y = zeros(*be, {2, 2, 5, 6}), dx = zeros(*be, {2, 5, 2, 6});
  auto loss = [&] {
    be->split_heads(x, y, 100.0);
    return dot(y, R);
  };
  be->merge_heads(R, dx, 100.0);
  expect_gradient("split_heads with RoPE", x, dx, loss);
}

TEST_F(Ops, SoftmaxForwardCausal) {
  auto s = random_tensor(*be, {2, 4, 4}, rng), p = zeros(*be, {2, 4, 4});
  be->softmax_forward(s, p, 0.5, true);
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      const double* row = p.tensor().as<double>() + (n * 4 + i) * 4;
      const double* srow = s.tensor().as<double>() + (n * 4 + i) * 4;
      double z = 0;
      for (int j = 0; j <= i; ++j) z += std::exp(0.5 * srow[j]);
      for (int j = 0; j < 4; ++j) EXPECT_NEAR(row[j], j <= i ? std::exp(0.5 * srow[j]) / z : 0.0, 1e-12);
    }
}

TEST_F(Ops, SoftmaxBackward) {
  for (bool causal : {true, false}) {
    auto s = random_tensor(*be, {3, 5, 5}, rng), R = random_tensor(*be, {3, 5, 5}, rng);
    auto p = zeros(*be, {3, 5, 5}), ds = zeros(*be, {3, 5, 5});
    auto loss = [&] {
      be->softmax_forward(s, p, 0.37, causal);
      return dot(p, R);
    };
    loss();
    be->softmax_backward(p, R, ds, 0.37);
    expect_gradient(causal ? "causal softmax" : "softmax", s, ds, loss);
  }
}

TEST_F(Ops, SwigluForwardAndBackward) {
  auto a = random_tensor(*be, {3, 6}, rng, 2.0), b = random_tensor(*be, {3, 6}, rng),
       R = random_tensor(*be, {3, 6}, rng);
  auto y = zeros(*be, {3, 6}), da = zeros(*be, {3, 6}), db = zeros(*be, {3, 6});
  be->swiglu_forward(a, b, y);
  const double a0 = a.tensor().as<double>()[0];
  EXPECT_NEAR(y.tensor().as<double>()[0], a0 / (1 + std::exp(-a0)) * b.tensor().as<double>()[0], 1e-12);
  auto loss = [&] {
    be->swiglu_forward(a, b, y);
    return dot(y, R);
  };
  be->swiglu_backward(a, b, R, da, db);
  expect_gradient("swiglu da", a, da, loss);
  expect_gradient("swiglu db", b, db, loss);
}

TEST_F(Ops, CrossEntropyForwardAndBackward) {
  const std::int64_t N = 5, V = 7;
  auto x = random_tensor(*be, {N, V}, rng, 3.0), lse = zeros(*be, {N}), l = zeros(*be, {1}), dx = zeros(*be, {N, V});
  auto tg = zeros(*be, {N}, DType::i32);
  for (int n = 0; n < N; ++n) tg.tensor().as<std::int32_t>()[n] = (n * 3) % V;
  be->cross_entropy_forward(x, tg, lse, l);
  double expected = 0;
  for (int n = 0; n < N; ++n) {
    double z = 0;
    for (int j = 0; j < V; ++j) z += std::exp(x.tensor().as<double>()[n * V + j]);
    expected += (std::log(z) - x.tensor().as<double>()[n * V + (n * 3) % V]) / N;
  }
  EXPECT_NEAR(l.tensor().as<double>()[0], expected, 1e-12);
  auto loss = [&] {
    be->cross_entropy_forward(x, tg, lse, l);
    return l.tensor().as<double>()[0];
  };
  loss();
  be->cross_entropy_backward(x, tg, lse, dx, 1.0 / N);
  expect_gradient("cross-entropy", x, dx, loss);
}

TEST_F(Ops, EmbeddingBackwardAccumulatesRepeatedIds) {
  auto table = random_tensor(*be, {6, 3}, rng), R = random_tensor(*be, {5, 3}, rng);
  auto out = zeros(*be, {5, 3}), dt = zeros(*be, {6, 3});
  auto ids = zeros(*be, {5}, DType::i32);
  const std::int32_t id[] = {1, 4, 1, 0, 1};
  std::copy(id, id + 5, ids.tensor().as<std::int32_t>());
  auto loss = [&] {
    be->embedding_forward(ids, table, out);
    return dot(out, R);
  };
  be->embedding_backward(ids, R, dt, false);
  expect_gradient("embedding", table, dt, loss);
  // Accumulating adds the same gradient again.
  std::vector<double> once(18);
  for (int i = 0; i < 18; ++i) once[i] = dt.tensor().as<double>()[i];
  be->embedding_backward(ids, R, dt, true);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(dt.tensor().as<double>()[i], 2 * once[i]) << i;
}

TEST_F(Ops, GemmTransposesAndBatches) {
  // C[b] = A[b]ᵀ·B[b] for two batch items against a plain triple loop.
  const std::int64_t M = 3, N = 4, K = 5;
  auto a = random_tensor(*be, {2, K, M}, rng), b = random_tensor(*be, {2, K, N}, rng), c = zeros(*be, {2, M, N});
  be->gemm({.trans_a = true,
            .m = M,
            .n = N,
            .k = K,
            .a = a,
            .b = b,
            .c = c,
            .lda = M,
            .ldb = N,
            .ldc = N,
            .batch = 2,
            .stride_a = K * M,
            .stride_b = K * N,
            .stride_c = M * N});
  for (int z = 0; z < 2; ++z)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k)
          s += a.tensor().as<double>()[z * K * M + k * M + i] * b.tensor().as<double>()[z * K * N + k * N + j];
        EXPECT_NEAR(c.tensor().as<double>()[z * M * N + i * N + j], s, 1e-12);
      }
}

TEST_F(Ops, AdamWFollowsTheAssignmentsFormula) {
  auto p = random_tensor(*be, {4}, rng), g = random_tensor(*be, {4}, rng);
  auto m = zeros(*be, {4}), v = zeros(*be, {4}), norm = zeros(*be, {1});
  std::vector<double> p0(p.tensor().as<double>(), p.tensor().as<double>() + 4);
  be->global_norm(std::vector<Tensor>{g.tensor()}, norm);
  AdamWArgs args{.lr = 0.01, .step = 1, .max_norm = 0.5};
  be->adamw(p, g, m, v, args, norm, Tensor{});
  const double gn = std::sqrt(dot(g, g));
  EXPECT_NEAR(norm.tensor().as<double>()[0], gn, 1e-12);
  const double clip = std::min(1.0, 0.5 / (gn + 1e-6));
  for (int i = 0; i < 4; ++i) {
    const double gi = g.tensor().as<double>()[i] * clip;
    const double mi = 0.1 * gi, vi = 0.001 * gi * gi;
    const double alpha = 0.01 * std::sqrt(1 - 0.999) / (1 - 0.9);
    double pi = p0[i] - alpha * mi / (std::sqrt(vi) + 1e-8);
    pi -= 0.01 * 0.01 * pi;
    EXPECT_NEAR(p.tensor().as<double>()[i], pi, 1e-12);
    EXPECT_NEAR(m.tensor().as<double>()[i], mi, 1e-15);
  }
}

TEST_F(Ops, CpuBackendRefusesUnsupportedTypes) {
  auto x = zeros(*be, {4}, DType::bf16);
  EXPECT_THROW(be->fill(x, 1.0), UserError);
}

// The CUDA RMSNorm backward's partial sums of dw (the dry run accounts for them by the same rule): from
// two rows for each of the 1024 blocks, rows whose sums fit a block's shared memory.
TEST(OpScratch, RmsNormPartialsFromTwoRowsABlock) {
  HostAllocator mem(64 << 20);
  const Allocation partials = scratch::cuda_rmsnorm_backward(mem, 2048, 768);
  EXPECT_EQ(partials.tensor().numel(), 1024 * 768);
  EXPECT_EQ(partials.tag().what, std::string("rmsnorm.dw_partials"));
  EXPECT_TRUE(scratch::cuda_rmsnorm_backward(mem, 2047, 768).empty());
  EXPECT_TRUE(scratch::cuda_rmsnorm_backward(mem, 4096, scratch::kRmsNormDwMaxD + 1).empty());
  EXPECT_FALSE(scratch::cuda_rmsnorm_backward(mem, 4096, scratch::kRmsNormDwMaxD).empty());
}

}  // namespace
}  // namespace lmscope::test
