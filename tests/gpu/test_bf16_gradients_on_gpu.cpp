// bf16 gradients (--grad-dtype bf16) on the GPU: AdamW and the gradient norm read a bf16 gradient as
// the fp32 value it is, bit for bit against the same values held in fp32; a training step's
// gradients are those of fp32 gradients to bf16's precision (and not the same bits, so the bf16 path
// ran); micro-batches add up to the whole batch's. Graphs on and off: test_graphs_on_gpu.cpp.
// Skipped without a GPU.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/core/rng.h"

#include "../common/one_step.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace lmscope::test {
namespace {

std::vector<double> draws(std::uint64_t seed, std::int64_t n, double scale) {
  Rng rng(seed);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = scale * (2 * rng.uniform() - 1);
  return v;
}

// f32 values on the backend, and the same values in bf16 after they were rounded to bf16 once.
struct TwoGradients {
  Allocation f32, bf16;
};
TwoGradients gradients(Backend& be, std::int64_t n, std::uint64_t seed) {
  Allocator& mem = be.allocator();
  TwoGradients g{mem.allocate({n}, DType::f32, {MemKind::gradient, "g.f32", -1}),
                 mem.allocate({n}, DType::bf16, {MemKind::gradient, "g.bf16", -1})};
  upload(be, g.f32, draws(seed, n, 0.3));
  be.cast(g.f32, g.bf16);
  be.cast(g.bf16, g.f32);  // now exactly the bf16 values
  return g;
}

TEST(Bf16GradientsOnGpu, AdamWAndTheNormReadThemAsTheirFp32Values) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  auto be = make_backend("cuda", "bf16");
  Allocator& mem = be->allocator();
  // Sizes with and without a tail of fewer than four, one below a vector's width, several tensors.
  const std::vector<std::int64_t> sizes = {4096, 1027, 3, 50001};
  struct State {
    std::vector<Allocation> p, m, v, copy;
    Allocation norm;
  };
  auto make_state = [&] {
    State s;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::int64_t n = sizes[i];
      s.p.push_back(mem.allocate({n}, DType::f32, {MemKind::parameter, "p", -1}));
      s.m.push_back(mem.allocate({n}, DType::f32, {MemKind::optimizer_state, "m", -1}));
      s.v.push_back(mem.allocate({n}, DType::f32, {MemKind::optimizer_state, "v", -1}));
      s.copy.push_back(mem.allocate({n}, DType::bf16, {MemKind::parameter, "copy", -1}));
      upload(*be, s.p.back(), draws(100 + i, n, 1.0));
      upload(*be, s.m.back(), draws(200 + i, n, 0.01));
      std::vector<double> v = draws(300 + i, n, 1e-4);
      for (double& x : v) x = x * x;
      upload(*be, s.v.back(), v);
    }
    s.norm = mem.allocate({1}, DType::f32, {MemKind::workspace, "norm", -1});
    return s;
  };
  std::vector<TwoGradients> grads;
  for (std::size_t i = 0; i < sizes.size(); ++i) grads.push_back(gradients(*be, sizes[i], 400 + i));
  const AdamWArgs args{.lr = 1e-3, .step = 3, .max_norm = 0.5};  // the norm clips
  auto bits = [&](const Allocation& a) { return host_floats(*be, a); };

  for (bool fused : {false, true}) {
    State a = make_state(), b = make_state();
    for (int which = 0; which < 2; ++which) {
      State& s = which == 0 ? a : b;
      std::vector<Tensor> params, g, m, v;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        params.push_back(s.p[i]);
        g.push_back(which == 0 ? grads[i].f32.tensor() : grads[i].bf16.tensor());
        m.push_back(s.m[i]);
        v.push_back(s.v[i]);
      }
      if (fused) {
        be->adamw_all(
            params, g, m, v, args, s.norm, [&](std::size_t i) { return s.copy[i].tensor(); }, [](std::size_t) {});
      } else {
        be->global_norm(g, s.norm);
        for (std::size_t i = 0; i < sizes.size(); ++i) be->adamw(params[i], g[i], m[i], v[i], args, s.norm, s.copy[i]);
      }
    }
    const char* what = fused ? "fused" : "one by one";
    EXPECT_EQ(bits(a.norm), bits(b.norm)) << what;
    EXPECT_GT(bits(a.norm)[0], 0.5f) << what << ": the norm must clip";
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(bits(a.p[i]), bits(b.p[i])) << what << ", tensor " << i;
      EXPECT_EQ(bits(a.m[i]), bits(b.m[i])) << what << ", tensor " << i;
      EXPECT_EQ(bits(a.v[i]), bits(b.v[i])) << what << ", tensor " << i;
      EXPECT_EQ(bits(a.copy[i]), bits(b.copy[i])) << what << ", tensor " << i;
    }
  }
}

OneStepSpec bf16_step() {
  OneStepSpec s;
  s.model = tiny_model();
  s.model.vocab = 301;
  s.model.d_model = 64;
  s.model.d_ff = 176;
  s.model.heads = 4;
  s.compute = DType::bf16;
  s.ctx = 64;
  s.fusion = true;
  return s;
}

TEST(Bf16GradientsOnGpu, AStepsGradientsAreFp32sToBf16Precision) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  auto be = make_backend("cuda", "bf16");
  for (bool fusion : {true, false}) {
    // The first step's gradients (the same weights either way), then the weights three steps on.
    OneStepSpec spec = bf16_step();
    spec.fusion = fusion;
    const OneStep wide = one_step(*be, spec);
    spec.grad_dtype = DType::bf16;
    const OneStep narrow = one_step(*be, spec);
    const double grads = largest_relative_difference(narrow.grads, wide.grads);
    EXPECT_LT(grads, 1e-2) << "fusion " << fusion;
    EXPECT_GT(grads, 0) << "fusion " << fusion << ": bf16 gradients must round somewhere";
    EXPECT_EQ(narrow.loss, wide.loss) << "fusion " << fusion << ": the first forward is the same";
    spec.steps = 3;
    const OneStep narrow3 = one_step(*be, spec);
    spec.grad_dtype = DType::f32;
    const OneStep wide3 = one_step(*be, spec);
    const double params = largest_relative_difference(narrow3.params, wide3.params);
    EXPECT_LT(params, 1e-3) << "fusion " << fusion;
    EXPECT_NEAR(narrow3.loss, wide3.loss, 1e-2 * std::abs(wide3.loss)) << "fusion " << fusion;
    std::printf("fusion %d: first gradients within %.2e, parameters after 3 steps within %.2e\n", fusion, grads,
                params);
  }
}

TEST(Bf16GradientsOnGpu, MicroBatchesAddUpToTheWholeBatch) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  auto be = make_backend("cuda", "bf16");
  OneStepSpec spec = bf16_step();
  spec.grad_dtype = DType::bf16;
  const OneStep whole = one_step(*be, spec);
  spec.micro = 2;
  const OneStep parts = one_step(*be, spec);
  const double grads = largest_relative_difference(parts.grads, whole.grads);
  EXPECT_LT(grads, 2e-2);
  EXPECT_NEAR(parts.loss, whole.loss, 1e-2 * std::abs(whole.loss));
  std::printf("two micro-batches against one batch: gradients within %.2e\n", grads);
}

}  // namespace
}  // namespace lmscope::test
