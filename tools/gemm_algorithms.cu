// What a step's small GEMMs leave on the table: for each GEMM shape of a model's bf16 train step
// (lmscope's orientation: forward Y = X·Wᵀ, input gradient dX = dY·W, weight gradient dW = dYᵀ·X into
// f32), the time of cuBLASLt's heuristic's first algorithm (what lmscope runs) against the fastest of
// its first `count`, and the same for the products merged side by side (q, k and v as one
// projection, w1 with w3) that a layer could run instead, and as batches of separate products
// (cuBLASLt's batch of 3 or 2, with the shared operand given once: by fixed strides, as if the
// weights lay side by side, or by arrays of pointers, which need nothing side by side; the input
// gradients sum their products, so they have no batched form). Random bf16 operands; each algorithm timed
// as the median of 3 loops of about 2 ms, each loop one device graph (as a step's GEMMs are replayed),
// operands warm in L2 as in a step.
//
//   gemm_algorithms D_MODEL D_FF ROWS [VOCAB, default 10000] [COUNT, default 16]
//   (small at batch 4, ctx 256: gemm_algorithms 768 3072 1024)
#include "probe_support.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

enum class Batch { none, strided, pointers };

struct Product {
  std::string name;
  int m, n, k;  // row-major C[m, n] = op(A)[m, k] · op(B)[k, n]
  bool trans_a, trans_b;
  bool f32_out;
  int per_layer;  // launches of this shape in one layer's forward and backward (0: once a step)
  int count = 1;  // products in the batch, each C its own; A or B shared where shared_a or shared_b
  Batch batch = Batch::none;
  bool shared_a = false, shared_b = false;
};

// A linear layer of `in` to `out` over `rows` tokens: its forward, input gradient and weight gradient.
void add_linear(std::vector<Product>& list, const std::string& name, int rows, int in, int out, int per_layer) {
  list.push_back({name + " fwd", rows, out, in, false, true, false, per_layer});
  list.push_back({name + " dgrad", rows, in, out, false, false, false, per_layer});
  list.push_back({name + " wgrad", out, in, rows, true, false, true, per_layer});
}

// `count` products of a linear layer's forward (the input shared) and weight gradient (the input
// shared) as one batched call.
void add_batched(std::vector<Product>& list, const std::string& name, int rows, int in, int out, int count) {
  for (Batch batch : {Batch::strided, Batch::pointers}) {
    const std::string how = batch == Batch::strided ? " (strided batch)" : " (pointer-array batch)";
    list.push_back({name + " fwd" + how, rows, out, in, false, true, false, 0, count, batch, true, false});
    list.push_back({name + " wgrad" + how, out, in, rows, true, false, true, 0, count, batch, false, true});
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: gemm_algorithms D_MODEL D_FF ROWS [VOCAB] [COUNT]\n");
    return 2;
  }
  const int d = std::atoi(argv[1]), f = std::atoi(argv[2]), rows = std::atoi(argv[3]);
  const int vocab = argc > 4 ? std::atoi(argv[4]) : 10000, count = argc > 5 ? std::atoi(argv[5]) : 16;
  if (d <= 0 || f <= 0 || rows <= 0 || vocab <= 0 || count <= 0) {
    std::fprintf(stderr, "gemm_algorithms: every size must be a positive number\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; d_model %d, d_ff %d, %d rows, vocab %d; first %d algorithms\n\n", prop.name,
              prop.multiProcessorCount, d, f, rows, vocab, count);

  std::vector<Product> list;
  add_linear(list, "q/k/v/o projection", rows, d, d, 4);
  add_linear(list, "w1/w3", rows, d, f, 2);
  add_linear(list, "w2", rows, f, d, 1);
  add_linear(list, "lm head", rows, d, vocab, 0);
  add_linear(list, "merged q,k,v", rows, d, 3 * d, 0);
  add_linear(list, "merged w1,w3", rows, d, 2 * f, 0);  // sizes the operands for the batches too
  add_batched(list, "batched q,k,v", rows, d, d, 3);
  add_batched(list, "batched w1,w3", rows, d, f, 2);

  const Operands ops = random_operands(list, 1, 2);
  __nv_bfloat16 *a = ops.a, *b = ops.b;
  float* c = ops.c;
  size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  const void** pointers;  // a pointer-array batch's A, B and C pointers, 3 of each at most
  CHECK_CUDA(cudaMalloc(&pointers, 9 * sizeof(void*)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  std::printf(
      "| product | m×n×k | per layer | GFLOP | first µs | first TFLOP/s | fastest µs | fastest TFLOP/s | fastest's "
      "rank | tile id (first → fastest) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (const Product& p : list) {
    // Column-major view as lmscope's cuda/gemm.cpp makes it: Cᵀ[n, m] = op(B)ᵀ · op(A)ᵀ.
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t first_op = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t second_op = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &first_op, sizeof(first_op)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &second_op, sizeof(second_op)));
    cublasLtMatrixLayout_t la, lb, lc;
    if (p.trans_b)
      CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.k, p.n, p.k));
    else
      CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.n, p.k, p.n));
    if (p.trans_a)
      CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.m, p.k, p.m));
    else
      CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.k, p.m, p.k));
    CHECK_LT(cublasLtMatrixLayoutCreate(&lc, p.f32_out ? CUDA_R_32F : CUDA_R_16BF, p.n, p.m, p.n));
    // A batch: each layout gets the count and either its stride (0 for the shared operand) or the
    // pointer-array mode; then the call's A, B and C are the device arrays of each product's pointers.
    const void *first = b, *second = a;
    void* out = c;
    if (p.batch != Batch::none) {
      const int32_t batch_count = p.count;
      const int64_t a_size = int64_t(p.m) * p.k, b_size = int64_t(p.k) * p.n, c_size = int64_t(p.m) * p.n;
      const cublasLtMatrixLayout_t layouts[3] = {la, lb, lc};
      const int64_t strides[3] = {p.shared_b ? 0 : b_size, p.shared_a ? 0 : a_size, c_size};
      for (int i = 0; i < 3; ++i) {
        CHECK_LT(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch_count,
                                                  sizeof(batch_count)));
        if (p.batch == Batch::strided) {
          CHECK_LT(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                    &strides[i], sizeof(strides[i])));
        } else {
          const cublasLtBatchMode_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
          CHECK_LT(
              cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
        }
      }
      if (p.batch == Batch::pointers) {
        std::vector<const void*> host;
        for (int i = 0; i < p.count; ++i) host.push_back(b + (p.shared_b ? 0 : i * b_size));
        for (int i = 0; i < p.count; ++i) host.push_back(a + (p.shared_a ? 0 : i * a_size));
        for (int i = 0; i < p.count; ++i) host.push_back(c + i * c_size);
        CHECK_CUDA(cudaMemcpy(pointers, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
        first = pointers;
        second = pointers + p.count;
        out = pointers + 2 * p.count;
      }
    }
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
    std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<size_t>(count));
    int got = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, count, found.data(), &got));
    cublasLtMatmulPreferenceDestroy(pref);
    const float alpha = 1, beta = 0;
    // A loop of `reps` launches recorded as one device graph, so the host's cost per launch (several µs
    // for cublasLtMatmul, as long as the small products themselves) is not what gets timed.
    auto graph_of = [&](const cublasLtMatmulAlgo_t& algo, int reps) -> cudaGraphExec_t {
      CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      bool ran = true;
      for (int i = 0; i < reps && ran; ++i)
        ran = cublasLtMatmul(lt, desc, &alpha, first, la, second, lb, &beta, out, lc, out, lc, &algo, workspace,
                             workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
      cudaGraph_t graph = nullptr;
      CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      if (ran) CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
      return exec;  // null: an algorithm this call cannot run
    };
    auto graph_ms = [&](cudaGraphExec_t exec) {
      CHECK_CUDA(cudaEventRecord(e0, stream));
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      return ms;
    };
    auto tile = [](const cublasLtMatmulAlgo_t& algo) {
      int id = -1;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &id, sizeof(id), &written);
      return id;
    };
    const double gflop = 2.0 * p.m * p.n * p.k * p.count / 1e9;
    std::vector<double> us(static_cast<size_t>(got), -1);
    for (int i = 0; i < got; ++i) {
      cudaGraphExec_t one = graph_of(found[i].algo, 1);
      if (!one) continue;
      graph_ms(one);  // warm-up
      const int reps = std::clamp(static_cast<int>(2.0 / std::max(graph_ms(one), 1e-3f)), 3, 2000);
      cudaGraphExecDestroy(one);
      cudaGraphExec_t loop = graph_of(found[i].algo, reps);
      graph_ms(loop);
      std::vector<float> runs;
      for (int r = 0; r < 3; ++r) runs.push_back(graph_ms(loop) / reps);
      cudaGraphExecDestroy(loop);
      std::sort(runs.begin(), runs.end());
      us[i] = runs[1] * 1e3;
    }
    int best = 0;
    for (int i = 0; i < got; ++i)
      if (us[i] > 0 && (us[best] < 0 || us[i] < us[best])) best = i;
    if (got == 0 || us[0] < 0) {
      std::printf("| %s | %dx%dx%d | %d | %.2f | (the heuristic's first did not run) |\n", p.name.c_str(), p.m, p.n,
                  p.k, p.per_layer, gflop);
    } else {
      std::printf("| %s | %dx%dx%d | %d | %.2f | %.2f | %.0f | %.2f | %.0f | %d of %d | %d → %d |\n", p.name.c_str(),
                  p.m, p.n, p.k, p.per_layer, gflop, us[0], gflop / us[0] * 1e3, us[best], gflop / us[best] * 1e3,
                  best + 1, got, tile(found[0].algo), tile(found[best].algo));
    }
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  return 0;
}
