// What programmatic dependent launch buys a chain of short kernels replayed as a device graph, as a
// small model's step is (hundreds of kernels of 2-10 µs): 200 elementwise kernels, each reading the
// previous one's output, launched plainly against launched with programmatic stream serialization
// (each kernel waits for its predecessor's memory with griddepcontrol.wait before reading; with
// "trigger" it also lets its successor be scheduled at once). Every variant's final buffer is checked
// against the plain chain's bits (x·1.0001 + 1 a kernel: a kernel reading its input early would
// leave another value); times are medians of 20 graph replays after 3.
//
//   pdl_chain [ELEMENTS a kernel, comma list; default 65536,262144,786432,3145728]
#include "probe_support.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kChain = 200;
constexpr int kBlock = 256;

enum class Mode { plain, wait, wait_and_trigger };

template <Mode M>
__global__ void step(const float4* in, float4* out, long long n4, float a) {
  if constexpr (M != Mode::plain) asm volatile("griddepcontrol.wait;" ::: "memory");
  if constexpr (M == Mode::wait_and_trigger) asm volatile("griddepcontrol.launch_dependents;");
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float4 x = in[i];
    x.x = __fmaf_rn(x.x, a, 1.0f);
    x.y = __fmaf_rn(x.y, a, 1.0f);
    x.z = __fmaf_rn(x.z, a, 1.0f);
    x.w = __fmaf_rn(x.w, a, 1.0f);
    out[i] = x;
  }
}

template <Mode M>
void launch(const float4* in, float4* out, long long n4, cudaStream_t s) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>((n4 + kBlock - 1) / kBlock));
  config.blockDim = dim3(kBlock);
  config.stream = s;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (M != Mode::plain) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  CHECK_CUDA(cudaLaunchKernelEx(&config, step<M>, in, out, n4, 1.0001f));
}

template <Mode M>
float chain_us(float4* a, float4* b, long long n4, cudaStream_t s, std::vector<float>& result) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kChain; ++i) launch<M>(i % 2 ? b : a, i % 2 ? a : b, n4, s);
  CHECK_CUDA(cudaStreamEndCapture(s, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int rep = 0; rep < 23; ++rep) {
    CHECK_CUDA(cudaEventRecord(start, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaEventRecord(stop, s));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (rep >= 3) ms.push_back(t);
  }
  // One more replay from a known start, for the bits.
  std::vector<float> ones(n4 * 4, 1.0f);
  // On s itself: a pageable copy may return before its DMA lands, and s does not wait on the
  // legacy stream.
  CHECK_CUDA(cudaMemcpyAsync(a, ones.data(), n4 * 16, cudaMemcpyHostToDevice, s));
  CHECK_CUDA(cudaGraphLaunch(exec, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  result.resize(n4 * 4);
  CHECK_CUDA(cudaMemcpy(result.data(), kChain % 2 ? b : a, n4 * 16, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0f / kChain;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> sizes{65536, 262144, 786432, 3145728};
  if (argc > 1) {
    sizes.clear();
    for (char* t = std::strtok(argv[1], ","); t; t = std::strtok(nullptr, ",")) sizes.push_back(std::atoll(t));
  }
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf(
      "| elements a kernel | MB moved a kernel | plain µs a kernel | wait µs | wait + trigger µs | elements unlike "
      "plain's (wait, trigger) |\n");
  std::printf("|---:|---:|---:|---:|---:|---|\n");
  for (long long n : sizes) {
    const long long n4 = (n + 3) / 4;
    float4 *a, *b;
    CHECK_CUDA(cudaMalloc(&a, n4 * 16));
    CHECK_CUDA(cudaMalloc(&b, n4 * 16));
    CHECK_CUDA(cudaMemset(a, 0, n4 * 16));
    std::vector<float> plain, wait, trigger;
    const float t0 = chain_us<Mode::plain>(a, b, n4, s, plain);
    const float t1 = chain_us<Mode::wait>(a, b, n4, s, wait);
    const float t2 = chain_us<Mode::wait_and_trigger>(a, b, n4, s, trigger);
    auto differing = [&](const std::vector<float>& x) {
      long long count = 0;
      for (size_t i = 0; i < x.size(); ++i) count += std::memcmp(&x[i], &plain[i], 4) != 0;
      return count;
    };
    std::printf("| %lld | %.1f | %.2f | %.2f | %.2f | %lld, %lld (plain %.6g) |\n", n4 * 4, n4 * 32e-6, t0, t1, t2,
                differing(wait), differing(trigger), plain[0]);
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
  }
  return 0;
}
