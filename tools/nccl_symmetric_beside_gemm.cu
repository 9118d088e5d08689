// What a GEMM loses beside NCCL's all-reduce when the buffer is an ordinary one (NCCL's ring kernel,
// 24 blocks on two H100s over NVLink) and when it lies in a symmetric window (ncclMemAlloc,
// ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC: NCCL's symmetric kernels, which its cost
// model runs on the fewest blocks within 2.5% of their peak), and beside an all-gather of as many
// bytes a rank moved by the copy engines (NCCL 2.28's zero-block policy over a symmetric window), which
// an exchange could use instead, summing the gathered parts itself. Two ranks, one thread and one GPU
// each. For each: the collective alone (ms, bus bandwidth), and GEMMs of the xl and 2.7B steps'
// shapes alone and beside a loop of those collectives (cuBLASLt's first algorithm, and the fastest
// beside of its first eight asked for `held` SMs fewer). Random bf16 operands; medians of 3 loops;
// each collective's result checked.
//
//   nccl_symmetric_beside_gemm [MiB a rank per collective, default 25] [SMs fewer for the GEMMs, default 8]
#include "probe_support.cuh"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define CHECK_NCCL(x) PROBE_CHECK(x, s_ == ncclSuccess, ncclGetErrorString(s_))

namespace {

// p[i] = rank + 1 + (i % 7): after the sum over two ranks, 3 + 2·(i % 7), exact in bf16 too.
template <typename T>
__global__ void fill_known(T* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = T(float(rank + 1 + int(i % 7)));
}

// After the all-gather: the first half += the second (the sum an all-reduce would give), bf16.
__global__ void add_halves(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(__bfloat162float(p[i]) + __bfloat162float(p[n + i]));
}

template <typename T>
__global__ void count_wrong(const T* p, size_t n, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (float(p[i]) != float(3 + 2 * int(i % 7))) atomicAdd(wrong, 1ull);
}

const GemmShape kShapes[] = {
    {"xl ffn up fwd", 4096, 6400, 1600, false},     {"xl ffn up dgrad", 4096, 1600, 6400, false},
    {"xl ffn up wgrad", 6400, 1600, 4096, true},    {"xl ffn down wgrad", 1600, 6400, 4096, true},
    {"2.7B ffn up wgrad", 10240, 2560, 4096, true},
};

// Both ranks' threads meet here (C++17's nvcc has no std::barrier).
class Meet {
 public:
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    const long round = round_;
    if (++arrived_ == 2) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long round_ = 0;
};

struct Shared {
  ncclUniqueId id{};
  Meet both;
  int reps[2] = {0, 0};  // each rank's background length; both run the larger
  std::mutex out;
  std::vector<std::string> lines[2];
};

float median3(std::vector<float> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void run_rank(int rank, Shared& sh, size_t bytes, int fewer) {
  CHECK_CUDA(cudaSetDevice(rank));
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, 2, sh.id, rank));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rank));
  auto say = [&](std::string s) { sh.lines[rank].push_back(std::move(s)); };

  const Operands ops = random_operands(kShapes, 1 + rank, 7 + rank);
  size_t workspace_bytes = size_t(32) << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));
  cudaStream_t fg, bg;
  CHECK_CUDA(cudaStreamCreateWithFlags(&fg, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&bg, cudaStreamNonBlocking));
  cudaEvent_t b0, b1;
  for (cudaEvent_t* e : {&b0, &b1}) CHECK_CUDA(cudaEventCreate(e));
  unsigned long long* wrong;
  CHECK_CUDA(cudaMalloc(&wrong, sizeof *wrong));

  void* plain;
  CHECK_CUDA(cudaMalloc(&plain, bytes));
  void* symmetric;
  CHECK_NCCL(ncclMemAlloc(&symmetric, bytes));
  ncclWindow_t window;
  CHECK_NCCL(ncclCommWindowRegister(comm, symmetric, bytes, &window, NCCL_WIN_COLL_SYMMETRIC));
  // The copy engines' all-gather: a communicator asked to use no blocks where it can
  // (NCCL_CTA_POLICY_ZERO, NCCL 2.28 on; left out when built against older headers), each rank's
  // `bytes` gathered in place into a symmetric window of both ranks' (rank r's at r·bytes): as much
  // of each rank's gradient as the all-reduce sums.
  ncclComm_t ce_comm = nullptr;
  void* gathered = nullptr;
  ncclWindow_t gathered_window{};
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  ncclConfig_t zero_cta = NCCL_CONFIG_INITIALIZER;
  zero_cta.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  CHECK_NCCL(ncclCommSplit(comm, 0, rank, &ce_comm, &zero_cta));
  CHECK_NCCL(ncclMemAlloc(&gathered, 2 * bytes));
  CHECK_NCCL(ncclCommWindowRegister(ce_comm, gathered, 2 * bytes, &gathered_window, NCCL_WIN_COLL_SYMMETRIC));
#endif

  struct Exchange {
    const char* kind;  // plain, symmetric, copy engines
    ncclDataType_t type;
  };
  for (const Exchange x :
       {Exchange{"plain", ncclFloat32}, Exchange{"plain", ncclBfloat16}, Exchange{"symmetric", ncclFloat32},
        Exchange{"symmetric", ncclBfloat16}, Exchange{"copy engines", ncclBfloat16}}) {
    if (std::string(x.kind) == "copy engines" && !ce_comm) continue;
    const ncclDataType_t type = x.type;
    const bool gather = std::string(x.kind) == "copy engines";
    void* buf = gather ? gathered : std::string(x.kind) == "plain" ? plain : symmetric;
    const size_t elem = type == ncclFloat32 ? 4 : 2, count = bytes / elem;
    char* own = static_cast<char*>(buf) + (gather ? rank * bytes : 0);
    const std::string what = std::string(x.kind) + (type == ncclFloat32 ? " f32" : " bf16");
    auto exchange = [&](int n) {
      for (int i = 0; i < n; ++i) {
        if (gather)
          CHECK_NCCL(ncclAllGather(own, buf, count, type, ce_comm, bg));
        else
          CHECK_NCCL(ncclAllReduce(buf, buf, count, type, ncclSum, comm, bg));
      }
    };
    // Correct first: after an all-reduce, element i holds 3 + 2·(i % 7); after the all-gather, rank
    // s's part holds s + 1 + (i % 7), so their sum is that again.
    if (type == ncclFloat32)
      fill_known<float><<<1024, 256, 0, bg>>>(reinterpret_cast<float*>(own), count, rank);
    else
      fill_known<__nv_bfloat16><<<1024, 256, 0, bg>>>(reinterpret_cast<__nv_bfloat16*>(own), count, rank);
    exchange(1);
    if (gather) add_halves<<<1024, 256, 0, bg>>>(static_cast<__nv_bfloat16*>(buf), count);
    CHECK_CUDA(cudaMemsetAsync(wrong, 0, sizeof *wrong, bg));
    if (type == ncclFloat32)
      count_wrong<float><<<1024, 256, 0, bg>>>(static_cast<float*>(buf), count, wrong);
    else
      count_wrong<__nv_bfloat16><<<1024, 256, 0, bg>>>(static_cast<__nv_bfloat16*>(buf), count, wrong);
    unsigned long long bad = 0;
    CHECK_CUDA(cudaMemcpyAsync(&bad, wrong, sizeof bad, cudaMemcpyDeviceToHost, bg));
    CHECK_CUDA(cudaStreamSynchronize(bg));
    // Alone: 20 after 3.
    exchange(3);
    CHECK_CUDA(cudaEventRecord(b0, bg));
    exchange(20);
    CHECK_CUDA(cudaEventRecord(b1, bg));
    CHECK_CUDA(cudaEventSynchronize(b1));
    float one_ms;
    CHECK_CUDA(cudaEventElapsedTime(&one_ms, b0, b1));
    one_ms /= 20;
    char line[512];
    std::snprintf(line, sizeof line, "%s %s of %.1f MiB a rank: %.3f ms alone, bus %.0f GB/s, %llu wrong", what.c_str(),
                  gather ? "all-gather" : "all-reduce", bytes / 1048576.0, one_ms, bytes / (one_ms * 1e-3) / 1e9, bad);
    say(line);

    for (const GemmShape& s : kShapes) {
      ProbeGemm gemm(lt, s, ops, workspace, workspace_bytes, fg);
      // Per GEMM, ms: alone, or beside a loop of the collective that both ranks run alike (4x the
      // slower rank's GEMM loop alone); says when the loop outlasted it.
      auto time_ms = [&](cublasLtMatmulDesc_t d, const cublasLtMatmulAlgo_t& algo, bool beside) {
        std::vector<float> t;
        int bg_reps = 0;
        if (beside) {
          sh.reps[rank] = std::max(1, static_cast<int>(4 * gemm.loop_ms(d, algo) / one_ms) + 1);
          sh.both.arrive_and_wait();
          bg_reps = std::max(sh.reps[0], sh.reps[1]);
          sh.both.arrive_and_wait();
        }
        for (int run = 0; run < 3; ++run) {
          if (beside) {
            sh.both.arrive_and_wait();
            CHECK_CUDA(cudaEventRecord(b0, bg));
            exchange(bg_reps);
            CHECK_CUDA(cudaEventRecord(b1, bg));
          }
          const float ms = gemm.loop_ms(d, algo);
          if (beside) {
            CHECK_CUDA(cudaEventSynchronize(b1));
            float bg_ms;
            CHECK_CUDA(cudaEventElapsedTime(&bg_ms, b0, b1));
            if (ms > bg_ms) say("(a GEMM loop outlasted the collectives)");
          }
          t.push_back(ms / gemm.reps);
        }
        return median3(t);
      };
      cublasLtMatmulDesc_t whole = gemm.desc(0), fewer_sms = gemm.desc(sms - fewer);
      const auto first = gemm.algos(whole, 1);
      time_ms(whole, first[0].algo, false);  // warm up
      const float alone = time_ms(whole, first[0].algo, false);
      const float beside = time_ms(whole, first[0].algo, true);
      float best_beside = 1e30f, best_alone = 0;
      for (const auto& cand : gemm.algos(fewer_sms, 8)) {
        const float t = time_ms(fewer_sms, cand.algo, true);
        if (t < best_beside) {
          best_beside = t;
          best_alone = time_ms(fewer_sms, cand.algo, false);
        }
      }
      std::snprintf(line, sizeof line, "| %s | %s %dx%dx%d | %.4f | %.4f (%.2fx) | %.4f | %.4f (%.2fx) |", what.c_str(),
                    s.name, s.m, s.n, s.k, alone, beside, beside / alone, best_alone, best_beside, best_beside / alone);
      say(line);
    }
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  if (ce_comm) {
    CHECK_NCCL(ncclCommWindowDeregister(ce_comm, gathered_window));
    CHECK_NCCL(ncclMemFree(gathered));
    CHECK_NCCL(ncclCommDestroy(ce_comm));
  }
  CHECK_NCCL(ncclCommWindowDeregister(comm, window));
  CHECK_NCCL(ncclMemFree(symmetric));
  CHECK_NCCL(ncclCommDestroy(comm));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = size_t(argc > 1 ? std::atof(argv[1]) : 25.0) * 1048576;
  const int fewer = argc > 2 ? std::atoi(argv[2]) : 8;
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::fprintf(stderr, "needs two GPUs, found %d\n", devices);
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  std::printf(
      "%s x2, NCCL %d; GEMMs' second pair of columns: the fastest beside of cuBLASLt's first 8 for %d SMs fewer\n\n",
      prop.name, version, fewer);
  Shared sh;
  CHECK_NCCL(ncclGetUniqueId(&sh.id));
  std::thread r1(run_rank, 1, std::ref(sh), bytes, fewer);
  run_rank(0, sh, bytes, fewer);
  r1.join();
  for (int r = 0; r < 2; ++r) {
    std::printf(
        "rank %d\n| buffer | GEMM | alone ms | beside | fewer SMs: alone | beside |\n|---|---|---:|---:|---:|---:|\n",
        r);
    for (const std::string& l : sh.lines[r]) std::printf("%s\n", l.c_str());
    std::printf("\n");
  }
  return 0;
}
