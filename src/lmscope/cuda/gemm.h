// Row-major (batched) GEMMs on cuBLASLt: f32 operands (IEEE fp32 or tf32 math) or bf16/f16 operands
// (fp32 accumulation) with a result of their type or f32. A row-major C = op(A)·op(B) is the column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ, so B is passed first. Plans (descriptors and the heuristic's algorithm)
// are made once per shape and reused: a training step repeats its shapes exactly.
#pragma once

#include "lmscope/backend/backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

namespace lmscope::cuda {

class Gemm {
 public:
  Gemm(GemmMath math, cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  void run(const GemmArgs& g);
  std::size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, std::int64_t, DType, DType>;
  Plan& plan(const GemmArgs& g);

  GemmMath math_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t(32) << 20;
  std::map<Key, Plan> plans_;
};

}  // namespace lmscope::cuda
