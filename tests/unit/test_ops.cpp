// CPU ops beyond the op table (tests/unit/test_op_table.cpp, where each op's forward meets its formula
// and its backward central finite differences in f64): the fused RMSNorm's values against the two ops
// it replaces, the heads' split and merge as adjoints, the types it refuses, and the scratch rule.
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

TEST_F(Ops, SplitAndMergeHeadsAreAdjoint) {
  for (double theta : {0.0, 10000.0, 7.5}) {
    auto x = random_tensor(*be, {2, 6, 3, 8}, rng), y = random_tensor(*be, {2, 3, 6, 8}, rng);
    auto sx = zeros(*be, {2, 3, 6, 8}), my = zeros(*be, {2, 6, 3, 8});
    be->split_heads(x, sx, theta);
    be->merge_heads(y, my, theta);
    EXPECT_NEAR(dot(sx, y), dot(x, my), 1e-10) << "theta " << theta;  // <split x, y> = <x, merge y>
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
