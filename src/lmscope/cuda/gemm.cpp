#include "lmscope/cuda/gemm.h"
#include "lmscope/cuda/cuda_check.h"

namespace lmscope::cuda {

Gemm::Gemm(GemmMath math, cudaStream_t stream) : math_(math), stream_(stream) {
  LMSCOPE_CUBLAS_CHECK(cublasLtCreate(&handle_));
  LMSCOPE_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

namespace {

cudaDataType_t cuda_type(DType t) {
  if (t == DType::f32) return CUDA_R_32F;
  if (t == DType::bf16) return CUDA_R_16BF;
  if (t == DType::f16) return CUDA_R_16F;
  throw Unsupported(fmt::format("the CUDA GEMM takes f32, bf16 or f16, not {}", dtype_name(t)));
}

cublasLtMatrixLayout_t layout(DType type, std::uint64_t rows, std::uint64_t cols, std::int64_t ld, std::int64_t batch,
                              std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  LMSCOPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(type), rows, cols, ld));
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    LMSCOPE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    LMSCOPE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

}  // namespace

Gemm::Plan& Gemm::plan(const GemmArgs& g) {
  const Key key{g.trans_a, g.trans_b, g.m,        g.n,        g.k,        g.lda,     g.ldb,
                g.ldc,     g.batch,   g.stride_a, g.stride_b, g.stride_c, g.a.dtype, g.c.dtype};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  // bf16 and f16 operands run on tensor cores with fp32 accumulation; f32 operands in fp32 or tf32 math.
  const cublasComputeType_t compute =
      g.a.dtype == DType::f32 && math_ == GemmMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LMSCOPE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  // Column-major view: first operand is B (op(B)ᵀ is [N, K]), second is A (op(A)ᵀ is [K, M]).
  const cublasOperation_t first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LMSCOPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof(first)));
  LMSCOPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof(second)));
  const DType in = g.a.dtype;
  p.a = g.trans_b ? layout(in, g.k, g.n, g.ldb, g.batch, g.stride_b) : layout(in, g.n, g.k, g.ldb, g.batch, g.stride_b);
  p.b = g.trans_a ? layout(in, g.m, g.k, g.lda, g.batch, g.stride_a) : layout(in, g.k, g.m, g.lda, g.batch, g.stride_a);
  p.c = layout(g.c.dtype, g.n, g.m, g.ldc, g.batch, g.stride_c);
  cublasLtMatmulPreference_t pref = nullptr;
  LMSCOPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LMSCOPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    throw std::runtime_error(
        fmt::format("cuBLASLt has no algorithm for a {}x{}x{} GEMM (batch {})", g.m, g.n, g.k, g.batch));
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void Gemm::run(const GemmArgs& g) {
  LMSCOPE_CHECK(g.a.dtype == g.b.dtype, "GEMM operands of two types: {} and {}", dtype_name(g.a.dtype),
                dtype_name(g.b.dtype));
  LMSCOPE_CHECK(g.a.dtype == g.c.dtype || (dtype_size(g.a.dtype) == 2 && g.c.dtype == DType::f32),
                "GEMM of {} operands into {}", dtype_name(g.a.dtype), dtype_name(g.c.dtype));
  Plan& p = plan(g);
  LMSCOPE_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &g.alpha, g.b.data, p.a, g.a.data, p.b, &g.beta, g.c.data, p.c,
                                      g.c.data, p.c, &p.algo, workspace_, workspace_bytes_, stream_));
}

}  // namespace lmscope::cuda
