// The token embedding's lookup and its gradient: a block per token row forward, and backward a block
// per group of table rows, deterministic (no atomics).
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/launch_check.cuh"
#include "lmscope/backend/cuda/storage.cuh"

#include <cstdint>

namespace lmscope::cuda {
namespace {

// The table and the rows it gives are of the master dtype, T (f32, or bf16 with --master-dtype bf16).
template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* ids, const T* table, T* out, std::int64_t d) {
  const std::int64_t row = blockIdx.x, src = std::int64_t{ids[row]} * d;
  for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) out[row * d + j] = table[src + j];
}

// Deterministic, so a resumed run equals the run never stopped bit for bit: block b owns the table
// rows [b·rows, (b+1)·rows), zeroes them unless accumulating (no fill launch before it: docs/speed.md)
// and adds the tokens that land in them in token order, its threads over the columns; no row is
// written by two blocks, and no atomics. The block reads the ids a tile at a time, one per thread
// (coalesced, from L2), and lists the tile's hits in order in shared memory (ballot and prefix
// count), so no thread walks the ids one dependent load after another. dout is of the master dtype
// (T); dtable is f32 whatever it is, so each row's sum is rounded once, where the caller casts it.
constexpr int kEmbeddingThreads = 256, kEmbeddingWarps = kEmbeddingThreads / 32;
template <typename T>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_backward_kernel(const std::int32_t* ids, const T* dout, float* dtable, std::int64_t n, std::int64_t v,
                              std::int64_t d, std::int64_t rows, bool accumulate) {
  __shared__ std::int32_t hits[kEmbeddingThreads];
  __shared__ int warp_hits[kEmbeddingWarps];
  const std::int64_t first = blockIdx.x * rows, last = first + rows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (!accumulate) {
    const std::int64_t end = (last < v ? last : v) * d;
    for (std::int64_t i = first * d + threadIdx.x; i < end; i += blockDim.x) dtable[i] = 0.0f;
    __syncthreads();
  }
  for (std::int64_t tile = 0; tile < n; tile += kEmbeddingThreads) {
    const std::int64_t t = tile + threadIdx.x;
    const std::int64_t id = t < n ? std::int64_t{ids[t]} : -1;
    const bool hit = id >= first && id < last;
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_hits[warp] = __popc(mask);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kEmbeddingWarps; ++w) {
      before += w < warp ? warp_hits[w] : 0;
      total += warp_hits[w];
    }
    if (hit) hits[before + __popc(mask & ((1u << lane) - 1))] = static_cast<std::int32_t>(threadIdx.x);
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const std::int64_t tk = tile + hits[k], row = ids[tk];
      for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) dtable[row * d + j] += ld(dout[tk * d + j]);
    }
    __syncthreads();
  }
}

}  // namespace

void embedding_forward(const std::int32_t* ids, const void* table, void* out, Elem e, std::int64_t n, std::int64_t d,
                       cudaStream_t s) {
  with_elem<false>(e, [&](auto t) {
    using T = typename decltype(t)::type;
    embedding_forward_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(ids, static_cast<const T*>(table),
                                                                      static_cast<T*>(out), d);
  });
  check_launch("embedding_forward_kernel");
}

void embedding_backward(const std::int32_t* ids, const void* dout, Elem e, float* dtable, std::int64_t n,
                        std::int64_t v, std::int64_t d, bool accumulate, cudaStream_t s) {
  constexpr std::int64_t kBlocks = 1024;  // several per SM; each reads all n ids
  const std::int64_t rows = (v + kBlocks - 1) / kBlocks;
  with_elem<false>(e, [&](auto t) {
    using T = typename decltype(t)::type;
    embedding_backward_kernel<<<static_cast<unsigned>((v + rows - 1) / rows), kEmbeddingThreads, 0, s>>>(
        ids, static_cast<const T*>(dout), dtable, n, v, d, rows, accumulate);
  });
  check_launch("embedding_backward_kernel");
}

}  // namespace lmscope::cuda
