// The kernel profile's pure parts: names as CUPTI gives them shortened for tables, categories, and
// per-step totals. (The CUPTI tracer itself is tested on the GPU: tests/gpu.)
#include "lmscope/profile/kernel_profile.h"

#include <gtest/gtest.h>

namespace lmscope {
namespace {

TEST(KernelNames, DemangledWithoutNamespacesReturnTypeOrArguments) {
  // void lmscope::cuda::(anonymous namespace)::rmsnorm_forward_kernel<__nv_bfloat16>(float const*, ...)
  EXPECT_EQ(short_kernel_name("_ZN7lmscope4cuda12_GLOBAL__N_122rmsnorm_forward_kernelI13__nv_bfloat16EEvPKfS5_PT_Pflf"),
            "rmsnorm_forward_kernel<__nv_bfloat16>");
  // void f<(int)64, true>(int): template arguments with spaces stay whole.
  EXPECT_EQ(short_kernel_name("_Z1fILi64ELb1EEvi"), "f<64, true>");
  // Not mangled (cuBLAS's own kernels): unchanged.
  EXPECT_EQ(short_kernel_name("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"),
            "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT");
  EXPECT_EQ(short_kernel_name("plain_kernel(int)"), "plain_kernel");
}

TEST(KernelNames, Categories) {
  EXPECT_STREQ(kernel_category("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"), "GEMM");
  EXPECT_STREQ(kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"), "GEMM");
  EXPECT_STREQ(kernel_category("flash_backward_dq_tc<64>"), "attention");
  EXPECT_STREQ(kernel_category("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
               "collective");
  EXPECT_STREQ(kernel_category("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_Sum_f32(ncclSymkDevWorkArgs4K)"),
               "collective");  // symmetric memory's
  EXPECT_STREQ(kernel_category("softmax_forward_kernel<float>"), "attention");
  EXPECT_STREQ(kernel_category("rmsnorm_backward_dw_kernel<float>"), "RMSNorm");
  EXPECT_STREQ(kernel_category("void lmscope::cuda::(anonymous namespace)::add_parts(const float *, int, long long, "
                               "__nv_bfloat16 *)"),
               "attention");
  EXPECT_STREQ(kernel_category("combine_parts"), "attention");
  EXPECT_STREQ(kernel_category("dq_from_tiles<64>"), "attention");
  EXPECT_STREQ(kernel_category("permute_heads_kernel<float>"), "RoPE/heads");
  EXPECT_STREQ(kernel_category("loss_mean_kernel"), "loss");
  EXPECT_STREQ(kernel_category("adamw_kernel"), "optimizer");
  EXPECT_STREQ(kernel_category("cast_kernel<float, __nv_bfloat16>"), "elementwise");
  EXPECT_STREQ(kernel_category("cast_many_kernel<float, __nv_bfloat16, 4>"), "elementwise");
  EXPECT_STREQ(kernel_category("[memset]"), "memset/memcpy");
  EXPECT_STREQ(kernel_category("mystery"), "other");
}

TEST(KernelSummary, PerStepTotalsByPhaseCategoryAndKernel) {
  auto kernel = [](const char* name, Phase phase, std::uint64_t start, std::uint64_t end) {
    KernelRecord r;
    r.name = name;
    r.phase = phase;
    r.start_ns = start;
    r.end_ns = end;
    return r;
  };
  const std::vector<KernelRecord> records = {
      kernel("nvjet_a", Phase::forward, 0, 4000),       kernel("nvjet_a", Phase::forward, 5000, 9000),
      kernel("nvjet_b", Phase::forward, 9000, 10000),   kernel("adamw_kernel", Phase::optimizer, 20000, 26000),
      kernel("nvjet_a", Phase::backward, 30000, 32000), kernel("add_kernel", Phase::forward, 10000, 10500),
  };
  const KernelProfile p = summarize_kernels(records, 2);
  ASSERT_EQ(p.steps, 2);
  ASSERT_EQ(p.kernels.size(), 5u);
  // Longest first: nvjet_a in forward (8 µs over 2 steps) leads.
  EXPECT_EQ(p.kernels[0].name, "nvjet_a");
  EXPECT_EQ(p.kernels[0].phase, Phase::forward);
  EXPECT_DOUBLE_EQ(p.kernels[0].calls_per_step, 1.0);
  EXPECT_DOUBLE_EQ(p.kernels[0].ms_per_step, 0.004);
  EXPECT_DOUBLE_EQ(p.busy_ms(Phase::forward), (4000 + 4000 + 1000 + 500) / 2e6);
  EXPECT_DOUBLE_EQ(p.busy_ms(Phase::optimizer), 0.003);
  EXPECT_DOUBLE_EQ(p.busy_ms(Phase::setup), 0.0);
  // Categories come in phase order, longest first within a phase.
  ASSERT_EQ(p.categories.size(), 4u);
  EXPECT_EQ(p.categories[0].category, "GEMM");
  EXPECT_EQ(p.categories[0].phase, Phase::forward);
  EXPECT_DOUBLE_EQ(p.categories[0].calls_per_step, 1.5);
  EXPECT_EQ(p.categories[1].category, "elementwise");
  EXPECT_EQ(p.categories[2].phase, Phase::backward);
  EXPECT_EQ(p.categories[3].category, "optimizer");
}

// NCCL's kernels run on their own stream beside the others: their time, and the part of it other
// kernels ran beside (merged where those overlap one another), kept out of the phases' busy time.
TEST(KernelSummary, CollectivesAndTheShareOtherKernelsRanBeside) {
  auto kernel = [](const char* name, std::uint64_t start, std::uint64_t end) {
    KernelRecord r;
    r.name = name;
    r.phase = Phase::backward;
    r.start_ns = start;
    r.end_ns = end;
    return r;
  };
  const char* nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
  const std::vector<KernelRecord> records = {
      kernel("nvjet_a", 0, 1000),    kernel(nccl, 500, 2500),  // 500 beside nvjet_a, 500 beside nvjet_b
      kernel("nvjet_b", 2000, 3000), kernel("add_kernel", 2200, 2800), kernel(nccl, 4000, 5000),  // alone
  };
  const KernelProfile p = summarize_kernels(records, 1);
  EXPECT_DOUBLE_EQ(p.collective_ms(), 0.003);
  EXPECT_DOUBLE_EQ(p.collective_overlapped_ms, 0.001);
  EXPECT_DOUBLE_EQ(p.busy_ms(Phase::backward), (1000 + 1000 + 600) / 1e6);
}

}  // namespace
}  // namespace lmscope
