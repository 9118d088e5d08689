// FlashAttention-2 on the GPU: both paths (tensor cores for bf16 and fp16, CUDA cores for fp32 and other head
// dims) against attention evaluated from its definition, both dq strategies, and the whole model
// with flash against the model with naive attention. Skipped where no GPU is visible.
#include "../common/attention_reference.h"
#include "../common/training.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/devices.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <gtest/gtest.h>

namespace lmscope::test {
namespace {

class FlashOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
    gpu = make_cuda_backend(GemmMath::fp32);
  }
  // Uploads a host vector (through f32) into a tensor of the given dtype.
  Allocation tensor(Shape s, DType dtype, const std::vector<double>* values) {
    Allocation wide = gpu->allocator().allocate(s, DType::f32, {});
    Allocation a = gpu->allocator().allocate(s, dtype, {});
    if (values) {
      upload(*gpu, wide, *values);
      gpu->cast(wide, a);
    } else {
      gpu->fill(a, NAN);  // an element a kernel forgets to write shows up as a NaN
    }
    return a;
  }
  std::vector<double> fetch(const Tensor& t) {
    Allocation wide = gpu->allocator().allocate(t.shape, DType::f32, {});
    gpu->cast(t, wide);
    return download(*gpu, wide);
  }

  struct Result {
    std::vector<double> o, lse, dq, dk, dv;
    FlashDq dq_sum;  // how the backward summed dq
  };
  Result run(const AttentionProblem& p, DType dtype, FlashDq dq_sum) {
    Allocation q = tensor({p.n, p.tq, p.d}, dtype, &p.q), k = tensor({p.n, p.tk, p.d}, dtype, &p.k),
               v = tensor({p.n, p.tk, p.d}, dtype, &p.v), g = tensor({p.n, p.tq, p.d}, dtype, &p.dout);
    Allocation o = tensor({p.n, p.tq, p.d}, dtype, nullptr), lse = tensor({p.n, p.tq}, DType::f32, nullptr);
    Allocation dq = tensor({p.n, p.tq, p.d}, dtype, nullptr), dk = tensor({p.n, p.tk, p.d}, dtype, nullptr),
               dv = tensor({p.n, p.tk, p.d}, dtype, nullptr);
    gpu->flash_attention_forward(q, k, v, o, lse, p.scale(), p.causal);
    const FlashDq used = gpu->flash_attention_backward(q, k, v, o, lse, g, dq, dk, dv, p.scale(), p.causal, dq_sum);
    if (dq_sum == FlashDq::deterministic) {
      EXPECT_EQ(used, dq_sum) << "a deterministic dq was asked for";
    }
    return {fetch(o), fetch(lse), fetch(dq), fetch(dk), fetch(dv), used};
  }
  void expect_matches(const Result& r, const AttentionProblem& p, double tol, const std::string& what) {
    for (const auto* x : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv})
      for (double e : *x) ASSERT_FALSE(std::isnan(e)) << what << ": NaN (an unwritten element?)";
    EXPECT_LT(relative_error(r.o, p.o), tol) << what << ": o";
    EXPECT_LT(relative_error(r.lse, p.lse), tol) << what << ": lse";
    EXPECT_LT(relative_error(r.dq, p.dq), tol) << what << ": dq";
    EXPECT_LT(relative_error(r.dk, p.dk), tol) << what << ": dk";
    EXPECT_LT(relative_error(r.dv, p.dv), tol) << what << ": dv";
  }
  std::unique_ptr<Backend> gpu;
};

struct Case {
  std::int64_t n, tq, tk, d;
};
constexpr FlashDq kBothDqSums[] = {FlashDq::atomic, FlashDq::deterministic};
const char* name(FlashDq dq) { return dq == FlashDq::atomic ? "atomic" : "deterministic"; }
// Every tensor-core head dim, dims only the CUDA-core path takes, lengths of 1, tile ± 1 and
// several partial tiles, tq ≠ tk both ways.
const Case kCases[] = {{1, 1, 1, 16},     {2, 63, 63, 32}, {1, 65, 65, 64},   {3, 130, 130, 80}, {1, 200, 77, 96},
                       {2, 64, 129, 128}, {2, 37, 37, 5},  {1, 129, 129, 24}, {2, 300, 300, 64}, {1, 97, 97, 100}};

TEST_F(FlashOnGpu, Fp32MatchesTheDefinition) {
  std::uint64_t seed = 100;
  for (const Case& c : kCases)
    for (bool causal : {true, false}) {
      const AttentionProblem p(c.n, c.tq, c.tk, c.d, causal, seed++);
      expect_matches(run(p, DType::f32, FlashDq::deterministic), p, 1e-5,
                     fmt::format("fp32 n {} tq {} tk {} d {} causal {}", c.n, c.tq, c.tk, c.d, causal));
    }
}

// bf16 and fp16 alike (fp16 on the mma.sync kernels only, the Hopper ones taking bf16).
TEST_F(FlashOnGpu, SixteenBitMatchesTheDefinitionWithEitherDqStrategy) {
  std::uint64_t seed = 200;
  for (DType type : {DType::bf16, DType::f16})
    for (const Case& c : kCases)
      for (bool causal : {true, false})
        for (FlashDq dq : kBothDqSums) {
          const AttentionProblem p(c.n, c.tq, c.tk, c.d, causal, seed++, true);
          expect_matches(run(p, type, dq), p, 1e-2,
                         fmt::format("{} n {} tq {} tk {} d {} causal {} dq {}", dtype_name(type), c.n, c.tq, c.tk, c.d,
                                     causal, name(dq)));
        }
}

// The Hopper kernels (wgmma) run only with 128-row tiles for 7/8 of the SMs or more (queries forward, keys
// backward), so they need many sequences: partial tiles, tq ≠ tk both ways, every head dim they take,
// both dq strategies.
TEST_F(FlashOnGpu, HopperKernelsMatchTheDefinition) {
  const std::vector<GpuInfo> gpus = list_gpus();
  const Case cases[] = {{64, 300, 300, 64}, {140, 200, 77, 64}, {48, 257, 257, 128}, {140, 77, 200, 128},
                        {64, 300, 300, 32}, {140, 77, 200, 32}, {64, 300, 300, 80},  {140, 77, 200, 80}};
  std::uint64_t seed = 300;
  for (const Case& c : cases) {
    const int d = static_cast<int>(c.d);
    const FlashAttentionPlan plan =
        flash_attention_plan(cuda::flash_kernel_facts(), Elem::bf16, d, c.n, c.tq, c.tk, true, true);
    const bool forward = plan.forward_wgmma, backward = plan.dkdv_wgmma;
    if (gpus[0].compute_major == 9) {
      EXPECT_TRUE(forward && backward) << "a Hopper GPU takes the wgmma kernels for n " << c.n << " tq " << c.tq
                                       << " tk " << c.tk << " d " << c.d;
    }
    for (bool causal : {true, false})
      for (FlashDq dq : kBothDqSums) {
        const AttentionProblem p(c.n, c.tq, c.tk, c.d, causal, seed++, true);
        const Result r = run(p, DType::bf16, dq);
        const std::string what = fmt::format("bf16 n {} tq {} tk {} d {} causal {} dq {} (wgmma {} {})", c.n, c.tq,
                                             c.tk, c.d, causal, name(dq), forward, backward);
        expect_matches(r, p, 1e-2, what);
        EXPECT_EQ(r.dq_sum, dq) << what;
      }
    // The fastest sum: atomics where the Hopper dK/dV kernel runs with them (not at d 80), its own
    // pass elsewhere.
    const AttentionProblem p(c.n, c.tq, c.tk, c.d, true, seed++, true);
    const Result fastest = run(p, DType::bf16, FlashDq::fastest);
    expect_matches(fastest, p, 1e-2, fmt::format("bf16 n {} tq {} tk {} d {} dq fastest", c.n, c.tq, c.tk, c.d));
    EXPECT_EQ(fastest.dq_sum, backward && hopper_atomic_head_dim(d) ? FlashDq::atomic : FlashDq::deterministic)
        << "d " << d;
  }
}

// With too few tiles to fill the GPU (one or two sequences), each CTA walks one part of its tile's
// loop and a second kernel adds the parts' fp32 results (src/lmscope/device/tile_order.h): every
// kernel in parts, on mma.sync and, on a Hopper GPU, on wgmma (from 4096 positions), partial tiles,
// tq ≠ tk both ways, causal and not, both dq strategies.
TEST_F(FlashOnGpu, TilesCutIntoPartsMatchTheDefinition) {
  const bool hopper = list_gpus()[0].compute_major == 9;
  struct Split {
    Case c;
    bool forward_wgmma, dkdv_wgmma;  // on a Hopper GPU, causal (measured there: the d 128 forward stays on mma.sync)
  };
  const Split cases[] = {{{1, 3000, 3000, 64}, false, false}, {{1, 1100, 2500, 32}, false, false},
                         {{2, 1800, 1300, 80}, false, false}, {{1, 4100, 4100, 64}, true, true},
                         {{1, 4200, 4000, 128}, false, true}, {{1, 4100, 4100, 32}, true, true}};
  std::uint64_t seed = 400;
  for (const Split& split : cases) {
    const Case& c = split.c;
    for (bool causal : {true, false}) {
      const AttentionProblem p(c.n, c.tq, c.tk, c.d, causal, seed++, true);
      for (FlashDq dq : kBothDqSums) {
        const bool deterministic = dq == FlashDq::deterministic;
        const FlashAttentionPlan plan = flash_attention_plan(
            cuda::flash_kernel_facts(), Elem::bf16, static_cast<int>(c.d), c.n, c.tq, c.tk, causal, deterministic);
        const std::string what =
            fmt::format("n {} tq {} tk {} d {} causal {} dq {} (wgmma {} {} {}, parts {} {} {})", c.n, c.tq, c.tk, c.d,
                        causal, name(dq), plan.forward_wgmma, plan.dkdv_wgmma, plan.dq_wgmma, plan.forward_parts,
                        plan.dkdv_parts, plan.dq_parts);
        if (causal) {  // (without the mask the heaviest tile is fewer shares: some kernels stay whole)
          EXPECT_GT(plan.forward_parts, 1) << what;
          EXPECT_GT(plan.dkdv_parts, 1) << what;
          EXPECT_TRUE(!deterministic || plan.dq_parts > 1) << what;
          if (hopper) {
            EXPECT_EQ(plan.forward_wgmma, split.forward_wgmma) << what;
            EXPECT_EQ(plan.dkdv_wgmma, split.dkdv_wgmma) << what;
          }
        }
        expect_matches(run(p, DType::bf16, dq), p, 1e-2, what);
        expect_matches(run(p, DType::f16, dq), p, 1e-2, "f16 " + what);  // on mma.sync, its parts as planned
      }
    }
  }
}

// The assignment's cases, (4, 128, 64) fp32, at its tolerance of 1e-2 on every element.
TEST_F(FlashOnGpu, TheAssignmentsCases) {
  for (bool causal : {false, true}) {
    const AttentionProblem p(4, 128, 128, 64, causal, 2026);
    const Result r = run(p, DType::f32, FlashDq::deterministic);
    EXPECT_LT(max_abs_error(r.o, p.o), 1e-2);
    EXPECT_LT(max_abs_error(r.lse, p.lse), 1e-2);
    EXPECT_LT(max_abs_error(r.dq, p.dq), 1e-2);
    EXPECT_LT(max_abs_error(r.dk, p.dk), 1e-2);
    EXPECT_LT(max_abs_error(r.dv, p.dv), 1e-2);
  }
}

TEST_F(FlashOnGpu, DeterministicBackwardRepeatsBitForBit) {
  // Four sequences, and one, whose tiles are cut into parts.
  for (const std::int64_t n : {4, 1}) {
    const AttentionProblem p(n, 3000, 3000, 64, true, 7, true);
    const Result a = run(p, DType::bf16, FlashDq::deterministic), b = run(p, DType::bf16, FlashDq::deterministic);
    EXPECT_EQ(a.dq, b.dq) << n;
    EXPECT_EQ(a.dk, b.dk) << n;
    EXPECT_EQ(a.dv, b.dv) << n;
  }
}

TEST_F(FlashOnGpu, UnsupportedHeadDimIsSaidSo) {
  Allocation q = tensor({1, 4, 136}, DType::bf16, nullptr), lse = tensor({1, 4}, DType::f32, nullptr);
  EXPECT_THROW(gpu->flash_attention_forward(q, q, q, q, lse, 1.0, true), Unsupported);
}

// One CTA per sequence and tile in a one-dimensional grid: more than 2^31 tiles is refused before any
// launch (the tensors' shapes alone say so; their memory is never touched).
TEST_F(FlashOnGpu, MoreTilesThanOneGridTakesAreSaidSo) {
  Allocation small = tensor({1, 1, 64}, DType::bf16, nullptr);
  const std::int64_t n = std::int64_t{1} << 26, t = 2048;  // 2^26 sequences × 64 tiles of 32 rows
  const Tensor q{small.tensor().data, DType::bf16, {n, t, 64}}, lse{small.tensor().data, DType::f32, {n, t}};
  try {
    gpu->flash_attention_forward(q, q, q, q, lse, 1.0, true);
    FAIL() << "no error";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("2^31 tiles"), std::string::npos) << e.what();
  }
}

// The criterion: the model with flash matches the model with naive attention, fp32 losses
// within 1e-4 over 20 steps, here on the GPU (tests/unit has the same on the CPU).
TEST_F(FlashOnGpu, ModelTrainsLikeNaive) {
  ModelConfig c = gpu_model();
  c.heads = 2;  // head dim 64
  const std::int64_t B = 3, T = 100;
  Rng rng(5);
  std::vector<std::int32_t> x(B * T), y(B * T);
  for (auto* v : {&x, &y})
    for (auto& t : *v) t = static_cast<std::int32_t>(rng.below(503));
  const std::vector<double> losses[2] = {twenty_step_losses(*gpu, c, std::nullopt, B, T, x, y, AttentionKind::naive),
                                         twenty_step_losses(*gpu, c, std::nullopt, B, T, x, y, AttentionKind::flash)};
  EXPECT_LT(losses[0].back(), losses[0].front() - 0.5) << "the run must train";
  for (int i = 0; i < 20; ++i)
    EXPECT_LT(std::fabs(losses[1][i] - losses[0][i]) / losses[0][i], 1e-4) << "step " << i + 1;
}

}  // namespace
}  // namespace lmscope::test
