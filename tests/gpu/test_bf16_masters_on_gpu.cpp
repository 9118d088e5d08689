// bf16 masters (--master-dtype bf16) on the GPU, op by op: each op that takes the master dtype, given
// bf16 tensors, computes in fp32 exactly what it computes on fp32 tensors holding the same values,
// and rounds once as it stores. So against the fp32 op on those values each bf16 output is the fp32
// output rounded to bf16, bit for bit, and each fp32 output (rstd, the weight gradients) is the same
// bits. The fused add and norm makes the statistics of the sum as stored, so the unfused norm
// rerunning on it (a recomputed layer) gives the same bits. Skipped without a GPU.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/core/rng.h"

#include "../common/one_step.h"

#include <gtest/gtest.h>

#include <vector>

namespace lmscope::test {
namespace {

// A tensor's values in fp32 and the same values in bf16: drawn, rounded to bf16 once, and held in both.
struct Pair {
  Allocation f32, bf16;
};
Pair pair(Backend& be, Shape shape, std::uint64_t seed, double scale, double offset = 0) {
  Allocator& mem = be.allocator();
  Pair p{mem.allocate(shape, DType::f32, {MemKind::workspace, "test.f32", -1}),
         mem.allocate(shape, DType::bf16, {MemKind::workspace, "test.bf16", -1})};
  Rng rng(seed);
  std::vector<double> v(static_cast<std::size_t>(p.f32.tensor().numel()));
  for (double& x : v) x = offset + scale * (2 * rng.uniform() - 1);
  upload(be, p.bf16, v);  // rounded to nearest even on the host
  be.cast(p.bf16, p.f32);
  return p;
}
Allocation empty_like(Backend& be, const Tensor& t, DType dtype) {
  return be.allocator().allocate(t.shape, dtype, {MemKind::workspace, "test.out", -1});
}
// An fp32 tensor's values rounded to bf16 on the device, as the ops store them.
std::vector<double> rounded(Backend& be, const Tensor& t) {
  Allocation b = empty_like(be, t, DType::bf16);
  be.cast(t, b);
  return download(be, b);
}

class Bf16MastersOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
    be_ = make_backend("cuda", "bf16");
  }
  std::unique_ptr<Backend> be_;
};

TEST_F(Bf16MastersOnGpu, RmsNormForwardAndTheFusedAddRoundOnce) {
  Backend& be = *be_;
  for (std::int64_t d : {256, 250}) {  // packs of four, and one at a time
    const std::int64_t n = 37;
    const Pair x = pair(be, {n, d}, 1, 2.0), y = pair(be, {n, d}, 2, 1.0), w = pair(be, {d}, 3, 0.3, 1.0);
    Allocation rstd_f = empty_like(be, Tensor{nullptr, DType::f32, {n}}, DType::f32),
               rstd_b = empty_like(be, rstd_f.tensor(), DType::f32);
    // The norm: the fp32 op writing bf16 out, against the bf16 op.
    Allocation out_f = empty_like(be, x.f32.tensor(), DType::bf16), out_b = empty_like(be, x.f32.tensor(), DType::bf16);
    be.rmsnorm_forward(x.f32, w.f32, out_f, rstd_f, 1e-5);
    be.rmsnorm_forward(x.bf16, w.bf16, out_b, rstd_b, 1e-5);
    EXPECT_EQ(download(be, out_b), download(be, out_f)) << "d " << d;
    EXPECT_EQ(download(be, rstd_b), download(be, rstd_f)) << "d " << d;
    // The fused add: h is the fp32 sum rounded; the norm's statistics and output are the unfused
    // norm's on that h.
    Allocation h_f = empty_like(be, x.f32.tensor(), DType::f32), h_b = empty_like(be, x.f32.tensor(), DType::bf16);
    be.add(x.f32, y.f32, h_f);
    be.add_rmsnorm_forward(x.bf16, y.bf16, h_b, w.bf16, out_b, rstd_b, 1e-5);
    EXPECT_EQ(download(be, h_b), rounded(be, h_f)) << "d " << d;
    Allocation again = empty_like(be, x.f32.tensor(), DType::bf16), rstd_again = empty_like(be, rstd_f, DType::f32);
    be.rmsnorm_forward(h_b, w.bf16, again, rstd_again, 1e-5);
    EXPECT_EQ(download(be, again), download(be, out_b)) << "d " << d;
    EXPECT_EQ(download(be, rstd_again), download(be, rstd_b)) << "d " << d;
  }
}

TEST_F(Bf16MastersOnGpu, RmsNormBackwardRoundsDxOnceAndGivesDwsBits) {
  Backend& be = *be_;
  for (std::int64_t d : {256, 250}) {
    for (std::int64_t n : {37, 3000}) {  // fewer rows than the dw kernel's blocks, and more
      const Pair x = pair(be, {n, d}, 4, 2.0), w = pair(be, {d}, 5, 0.3, 1.0), dy = pair(be, {n, d}, 6, 0.5),
                 dres = pair(be, {n, d}, 7, 0.5);
      Allocation rstd = empty_like(be, Tensor{nullptr, DType::f32, {n}}, DType::f32),
                 out = empty_like(be, x.f32.tensor(), DType::bf16);
      be.rmsnorm_forward(x.f32, w.f32, out, rstd, 1e-5);
      for (bool fused : {false, true}) {
        Allocation dx_f = empty_like(be, x.f32.tensor(), DType::f32), dx_b = empty_like(be, x.f32, DType::bf16),
                   dw_f = empty_like(be, w.f32, DType::f32), dw_b = empty_like(be, w.f32, DType::f32);
        if (fused) {
          be.rmsnorm_backward_add(dy.bf16, x.f32, w.f32, rstd, dres.f32, dx_f, dw_f, Tensor{});
          be.rmsnorm_backward_add(dy.bf16, x.bf16, w.bf16, rstd, dres.bf16, dx_b, dw_b, Tensor{});
        } else {
          be.rmsnorm_backward(dy.bf16, x.f32, w.f32, rstd, dx_f, dw_f);
          be.rmsnorm_backward(dy.bf16, x.bf16, w.bf16, rstd, dx_b, dw_b);
        }
        EXPECT_EQ(download(be, dx_b), rounded(be, dx_f)) << "d " << d << ", n " << n << ", fused " << fused;
        EXPECT_EQ(download(be, dw_b), download(be, dw_f)) << "d " << d << ", n " << n << ", fused " << fused;
      }
    }
  }
}

TEST_F(Bf16MastersOnGpu, EmbeddingLooksUpBf16RowsAndSumsTheirGradientsInFp32) {
  Backend& be = *be_;
  const std::int64_t v = 301, d = 64, n = 500;
  const Pair table = pair(be, {v, d}, 8, 1.0), dout = pair(be, {n, d}, 9, 0.5);
  Allocation ids = be.allocator().allocate({n}, DType::i32, {MemKind::input, "ids", -1});
  std::vector<std::int32_t> host(static_cast<std::size_t>(n));
  Rng rng(10);
  for (auto& id : host) id = static_cast<std::int32_t>(rng.uniform() * 40);  // rows hit many times
  be.copy_from_host(ids, host.data());
  Allocation out_f = empty_like(be, dout.f32, DType::f32), out_b = empty_like(be, dout.f32, DType::bf16);
  be.embedding_forward(ids, table.f32, out_f);
  be.embedding_forward(ids, table.bf16, out_b);
  EXPECT_EQ(download(be, out_b), download(be, out_f));  // a row of bf16 values is itself
  for (bool accumulate : {false, true}) {
    Allocation g_f = empty_like(be, table.f32, DType::f32), g_b = empty_like(be, table.f32, DType::f32);
    be.fill(g_f, 0.25);
    be.fill(g_b, 0.25);
    be.embedding_backward(ids, dout.f32, g_f, accumulate);
    be.embedding_backward(ids, dout.bf16, g_b, accumulate);
    EXPECT_EQ(download(be, g_b), download(be, g_f)) << "accumulate " << accumulate;
  }
}

TEST_F(Bf16MastersOnGpu, AdamWUpdatesBf16StateAsFp32RoundedOnce) {
  Backend& be = *be_;
  const std::vector<std::int64_t> sizes = {4096, 1027, 3, 50001};                     // tails, and one below a vector
  const AdamWArgs args{.lr = 1e-2, .weight_decay = 0.1, .step = 3, .max_norm = 0.5};  // the norm clips
  for (bool fused : {false, true}) {
    std::vector<Pair> p, g, m, v;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      p.push_back(pair(be, {sizes[i]}, 20 + i, 1.0));
      g.push_back(pair(be, {sizes[i]}, 30 + i, 0.3));
      m.push_back(pair(be, {sizes[i]}, 40 + i, 0.01));
      v.push_back(pair(be, {sizes[i]}, 50 + i, 1e-4, 2e-4));  // positive
    }
    Allocation norm_f = be.allocator().allocate({1}, DType::f32, {MemKind::workspace, "norm", -1}),
               norm_b = be.allocator().allocate({1}, DType::f32, {MemKind::workspace, "norm", -1});
    for (int which = 0; which < 2; ++which) {
      const bool b16 = which == 1;
      std::vector<Tensor> ps, gs, ms, vs;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        ps.push_back(b16 ? p[i].bf16.tensor() : p[i].f32.tensor());
        gs.push_back(g[i].bf16);  // fp32 masters read bf16 gradients too (--grad-dtype bf16)
        ms.push_back(b16 ? m[i].bf16.tensor() : m[i].f32.tensor());
        vs.push_back(b16 ? v[i].bf16.tensor() : v[i].f32.tensor());
      }
      const Tensor norm = b16 ? norm_b.tensor() : norm_f.tensor();
      if (fused) {
        be.adamw_all(
            ps, gs, ms, vs, args, norm, [](std::size_t) { return Tensor{}; }, [](std::size_t) {});
      } else {
        be.global_norm(gs, norm);
        for (std::size_t i = 0; i < sizes.size(); ++i) be.adamw(ps[i], gs[i], ms[i], vs[i], args, norm, Tensor{});
      }
    }
    EXPECT_EQ(download(be, norm_b), download(be, norm_f));
    EXPECT_GT(download(be, norm_f)[0], 0.5) << "the norm must clip";
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const char* what = fused ? "fused" : "one by one";
      EXPECT_EQ(download(be, p[i].bf16), rounded(be, p[i].f32)) << what << ", tensor " << i;
      EXPECT_EQ(download(be, m[i].bf16), rounded(be, m[i].f32)) << what << ", tensor " << i;
      EXPECT_EQ(download(be, v[i].bf16), rounded(be, v[i].f32)) << what << ", tensor " << i;
    }
  }
}

}  // namespace
}  // namespace lmscope::test
