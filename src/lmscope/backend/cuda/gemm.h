// Row-major (batched) GEMMs on cuBLASLt: f32 operands (IEEE fp32 or tf32 math) or bf16/f16 operands
// (fp32 accumulation) with a result of their type or f32. A row-major C = op(A)·op(B) is the column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ, so B is passed first. Plans (descriptors and the heuristic's algorithm)
// are made once per shape and reused: a training step repeats its shapes exactly.
//
// Beside collectives (data parallelism's exchange during the backward), NCCL's kernels hold some SMs
// for as long as they run, and the heuristic's GEMM, planned for every SM, waits on the ones it
// cannot have: 1.3-1.9x slower with 24 SMs held on an H100, 1.5x with 2 held for some shapes
// (docs/distributed.md). While set_held_sms(n) is in force a shape gets a plan of its own, chosen
// by timing: the heuristic's first algorithm and its first eight for the SMs left
// (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), each run on the GEMM's own operands and output (kept on
// the host meanwhile when the call adds to it) while a kernel holds n SMs as NCCL's would; the
// fastest is kept. Being chosen by the clock, such a plan may differ from run to run (and rank to
// rank), and with it the product's rounding: runs that must repeat bit for bit take --comm-sms 0.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/backend/op_scratch.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>
#include <vector>

namespace lmscope::cuda {

class Gemm {
 public:
  Gemm(GemmMath math, cudaStream_t stream, Allocator& mem);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // The workspace, made the first time (the host side of every GEMM: a replayed one too).
  void take_workspace() {
    if (workspace_.empty()) workspace_ = scratch::cuda_gemm_workspace(mem_);
  }
  void run(const GemmArgs& g);
  // SMs that collectives may hold beside the GEMMs from now on (0: none; see above).
  void set_held_sms(int sms) { held_sms_ = sms; }
  void set_stream(cudaStream_t stream) { stream_ = stream; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, DType, DType>;
  Plan& plan(const GemmArgs& g);
  std::vector<cublasLtMatmulHeuristicResult_t> heuristic(const Plan& p, int count) const;
  void choose_beside_held_sms(const GemmArgs& g, Plan& p);

  GemmMath math_;
  cudaStream_t stream_;
  Allocator& mem_;
  cublasLtHandle_t handle_ = nullptr;
  Allocation workspace_;
  std::size_t workspace_bytes_ = scratch::kCublasLtWorkspaceBytes;
  std::map<Key, Plan> plans_;
  int held_sms_ = 0;
};

}  // namespace lmscope::cuda
