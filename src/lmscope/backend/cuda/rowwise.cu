// Kernels that work a row at a time: one block per row, block reductions for the row statistics,
// fp32 arithmetic whatever the storage.
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/launch_check.cuh"
#include "lmscope/backend/cuda/per_device.cuh"
#include "lmscope/backend/cuda/reduce.cuh"
#include "lmscope/backend/cuda/storage.cuh"

#include <cooperative_groups.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace lmscope::cuda {
namespace {

// Each thread takes N consecutive elements at a time: 4 where d allows it (16-byte loads of the fp32
// rows; at large ctx 1024 the fused kernel ran at 67% of its memory floor one element at a time, 91%
// so), else 1. N follows from d alone, and where a base is off alignment for packs (PACKED false) the
// same four are moved one by one, so this kernel and the fused one below sum each row in the same
// order whatever their buffers' alignment, and give the same bits (a recomputed layer reruns this
// one on the sum the fused one made).
// out = src·r·w over a row, N elements a thread: both forward kernels' second pass.
template <int N, bool PACKED, typename TW, typename TO>
__device__ __forceinline__ void scale_row(const TW* src, const TW* w, TO* out, float r, std::int64_t d) {
  for (std::int64_t j = threadIdx.x * std::int64_t{N}; j < d; j += std::int64_t{blockDim.x} * N) {
    float v[N], wv[N], o[N];
    load_as<PACKED>(src + j, v);
    load_as<PACKED>(w + j, wv);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = v[k] * r * wv[k];
    store_as<PACKED>(out + j, o);
  }
}

template <typename TW, typename TO, int N, bool PACKED>
__global__ void rmsnorm_forward_kernel(const TW* x, const TW* w, TO* out, float* rstd, std::int64_t d, float eps) {
  const std::int64_t base = blockIdx.x * d;
  float ss = 0;
  for (std::int64_t j = threadIdx.x * std::int64_t{N}; j < d; j += std::int64_t{blockDim.x} * N) {
    float xv[N];
    load_as<PACKED>(x + base + j, xv);
#pragma unroll
    for (int k = 0; k < N; ++k) ss += xv[k] * xv[k];
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  scale_row<N, PACKED>(x + base, w, out + base, r, d);
}

// The residual add before it in the same pass: h = x + y, written, then normalised as above. Each
// thread reads back only what it wrote itself. The statistics are of h as stored (rounded to bf16
// under bf16 masters), as the unfused norm reads it.
template <typename TW, typename TO, typename TY, int N, bool PACKED>
__global__ void add_rmsnorm_forward_kernel(const TW* x, const TY* y, TW* h, const TW* w, TO* out, float* rstd,
                                           std::int64_t d, float eps) {
  const std::int64_t base = blockIdx.x * d;
  float ss = 0;
  for (std::int64_t j = threadIdx.x * std::int64_t{N}; j < d; j += std::int64_t{blockDim.x} * N) {
    float xv[N], yv[N], v[N];
    load_as<PACKED>(x + base + j, xv);
    load_as<PACKED>(y + base + j, yv);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      v[k] = ld(st<TW>(xv[k] + yv[k]));
      ss += v[k] * v[k];
    }
    store_as<PACKED>(h + base + j, v);
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  scale_row<N, PACKED>(h + base, w, out + base, r, d);
}

// Runs f with N (4 where d is a multiple of 4, else 1) and PACKED (whether the bases allow packs of N).
template <typename F>
void with_row_elements(std::int64_t d, std::initializer_list<std::pair<const void*, std::size_t>> bases, F&& f) {
  if (d % 4 != 0)
    f(std::integral_constant<int, 1>{}, std::true_type{});
  else if (packs_fit(d, 4, bases))
    f(std::integral_constant<int, 4>{}, std::true_type{});
  else
    f(std::integral_constant<int, 4>{}, std::false_type{});
}

// dx = r·(w∘dy) − x·r³·mean(x∘w∘dy) of one row, plus the residual's gradient when one is given
// (fused: the add after the norm's backward), in two passes over the row. Each thread takes N
// consecutive elements at a time (one 16-byte load of the fp32 rows with N = 4; N = 1 where rows or
// buffers do not allow it): one element at a time, the kernel ran at 69% of its memory floor
// (docs/speed.md). dx_lowp_row, unless null, gets dx in TD too (the GEMMs after read it so; a cast
// would read dx again). With PARTIALS the second pass also adds dy·x·r of each element it loads into
// its column's sum in column_sums (a thread loads the same columns in every row, so no two threads
// add to one column and no barrier guards them).
template <typename TD, typename TW, int N, bool PARTIALS>
__device__ __forceinline__ void rmsnorm_dx_row(const TD* gr, const TW* xr, const TW* w, float r,
                                               const TW* dresidual_row, TW* dx_row, TD* dx_lowp_row, float* column_sums,
                                               int d) {
  const int first = threadIdx.x * N, step = blockDim.x * N;
  float dot = 0;
  for (int j = first; j < d; j += step) {
    float xv[N], wv[N], gv[N];
    load(xr + j, xv);
    load(w + j, wv);
    load(gr + j, gv);
#pragma unroll
    for (int k = 0; k < N; ++k) dot += xv[k] * wv[k] * gv[k];
  }
  const float c = r * r * r * block_sum(dot) / static_cast<float>(d);
  auto second_pass = [&](int j) {
    float xv[N], wv[N], gv[N], rv[N] = {}, out[N];
    load(xr + j, xv);
    load(w + j, wv);
    load(gr + j, gv);
    if (dresidual_row) load(dresidual_row + j, rv);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float g = r * wv[k] * gv[k] - xv[k] * c;
      out[k] = dresidual_row ? g + rv[k] : g;
      if constexpr (PARTIALS) column_sums[j + k] += gv[k] * xv[k] * r;
    }
    store(dx_row + j, out);
    if (dx_lowp_row) store(dx_lowp_row + j, out);
  };
  if constexpr (PARTIALS) {
    // Unrolled it spilled at 32 registers (fp16 with dx_lowp still spills 16 bytes on sm_90a).
#pragma unroll 1
    for (int j = first; j < d; j += step) second_pass(j);
  } else {
    for (int j = first; j < d; j += step) second_pass(j);
  }
}

// dx alone, a block a row.
template <typename TD, typename TW, int N>
__global__ void rmsnorm_backward_dx_kernel(const TD* dout, const TW* x, const TW* w, const float* rstd,
                                           const TW* dresidual, TW* dx, TD* dx_lowp, int d) {
  const std::int64_t base = blockIdx.x * std::int64_t{d};
  rmsnorm_dx_row<TD, TW, N, false>(dout + base, x + base, w, rstd[blockIdx.x], dresidual ? dresidual + base : nullptr,
                                   dx + base, dx_lowp ? dx_lowp + base : nullptr, nullptr, d);
}

// The dx kernel's values, and dw's sums a block at a time: block b takes rows b, b + G, b + 2G, ...
// (G blocks), summing in shared memory, and the block's sums go to partials[b]. dy and x are read
// once for both gradients, leaving dw a sum of the G rows of partials (rmsnorm_backward_dw_kernel,
// unscaled): 8 bytes an element of the rows over the rows a block, where the dw kernel alone reads
// 6. The 1024 blocks are one wave on 132 SMs only at 8 blocks an SM, so at most 32 registers a
// thread: with the 40 the compiler chose it made 6 an SM and two waves (H100, large ctx 1024: 35.4 µs
// a call against the dx kernel's 26.9, where the partials' bytes add 1.7).
template <typename TD, typename TW, int N>
__global__ void __launch_bounds__(256, 8)
    rmsnorm_backward_dx_dw_kernel(const TD* dout, const TW* x, const TW* w, const float* rstd, const TW* dresidual,
                                  TW* dx, TD* dx_lowp, float* partials, std::int64_t n, int d) {
  extern __shared__ float column_sums[];
  const int first = threadIdx.x * N, step = blockDim.x * N;
  for (int j = first; j < d; j += step)
#pragma unroll
    for (int k = 0; k < N; ++k) column_sums[j + k] = 0;
  for (std::int64_t row = blockIdx.x; row < n; row += gridDim.x)
    rmsnorm_dx_row<TD, TW, N, true>(dout + row * d, x + row * d, w, rstd[row],
                                    dresidual ? dresidual + row * d : nullptr, dx + row * d,
                                    dx_lowp ? dx_lowp + row * d : nullptr, column_sums, d);
  for (int j = first; j < d; j += step) {
    float sums[N];
#pragma unroll
    for (int k = 0; k < N; ++k) sums[k] = column_sums[j + k];
    store(partials + std::int64_t{blockIdx.x} * d + j, sums);
  }
}

// dw[j] = Σ_rows dy·x·r (SCALED), or Σ_rows dy (the dx kernel's partial sums), in a fixed order
// (deterministic, no atomics): a block takes 32·V columns, its thread (lane, g) V consecutive columns
// of rows g, g + 16·RANKS, ... (one load of V elements of each row, four rows' loads issued before
// their sums), then the threads g < V add the 16 row groups' sums of a column in order. d/(32·V)
// blocks alone leave most SMs idle, so on Hopper RANKS = 8 blocks of a cluster share a column tile's
// rows, and rank 0 adds their sums from distributed shared memory in rank order: eight times the
// blocks, and no scratch memory to account for. V (2 where d and the rows' alignment allow, else 1)
// changes which thread sums a column, not the order of its sum, so both give the same bits. One row's
// loads in flight left the kernel at 35% of its memory floor; the shape kept was timed against
// others (docs/speed.md, "RMSNorm's weight gradient").
constexpr int kDwLanes = 32, kDwRowGroups = 16, kDwClusterRanks = 8, kDwUnroll = 4;
template <typename TD, typename TX, int RANKS, int V, bool SCALED>
__global__ void __launch_bounds__(kDwLanes* kDwRowGroups)
    rmsnorm_backward_dw_kernel(const TD* dout, const TX* x, const float* rstd, float* dw, std::int64_t n,
                               std::int64_t d) {
  constexpr int kColumns = kDwLanes * V;
  __shared__ float sums[kDwRowGroups][kColumns + 1];
  __shared__ float block_sums[kColumns];
  const std::int64_t j = blockIdx.x * std::int64_t{kColumns} + threadIdx.x * std::int64_t{V};
  float acc[V] = {};
  if (j < d) {
    const std::int64_t stride = std::int64_t{kDwRowGroups} * RANKS;
    std::int64_t r = blockIdx.y * std::int64_t{kDwRowGroups} + threadIdx.y;
    for (; r + (kDwUnroll - 1) * stride < n; r += kDwUnroll * stride) {
      float g[kDwUnroll][V], xv[kDwUnroll][V], rs[kDwUnroll];
#pragma unroll
      for (int u = 0; u < kDwUnroll; ++u) {
        load(dout + (r + u * stride) * d + j, g[u]);
        if constexpr (SCALED) {
          load(x + (r + u * stride) * d + j, xv[u]);
          rs[u] = rstd[r + u * stride];
        }
      }
#pragma unroll
      for (int u = 0; u < kDwUnroll; ++u)
#pragma unroll
        for (int c = 0; c < V; ++c) acc[c] += SCALED ? g[u][c] * xv[u][c] * rs[u] : g[u][c];
    }
    for (; r < n; r += stride) {
      float g[V], xv[V];
      load(dout + r * d + j, g);
      if constexpr (SCALED) load(x + r * d + j, xv);
#pragma unroll
      for (int c = 0; c < V; ++c) acc[c] += SCALED ? g[c] * xv[c] * rstd[r] : g[c];
    }
  }
#pragma unroll
  for (int c = 0; c < V; ++c) sums[threadIdx.y][threadIdx.x * V + c] = acc[c];
  __syncthreads();
  // Thread (lane, g < V) adds column g·32 + lane of the tile.
  const int column = threadIdx.y * kDwLanes + threadIdx.x;
  const bool adds = threadIdx.y < V;
  if (adds) {
    float total = 0;
    for (int k = 0; k < kDwRowGroups; ++k) total += sums[k][column];
    block_sums[column] = total;
  }
  const std::int64_t jc = blockIdx.x * std::int64_t{kColumns} + column;
  if constexpr (RANKS == 1) {
    if (adds && jc < d) dw[jc] = block_sums[column];
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    if (cluster.block_rank() == 0 && adds && jc < d) {
      float total = 0;
      for (int b = 0; b < RANKS; ++b) total += *cluster.map_shared_rank(&block_sums[column], b);
      dw[jc] = total;
    }
    cluster.sync();  // the other blocks' shared memory lives until rank 0 has read it
#endif
  }
}

// Whether the current GPU runs this binary's clustered dw kernel: compute capability 9 or more, and
// code for it built in (a build for sm_80 alone runs its PTX, which has no clusters). Per device.
bool dw_clusters() {
  static PerDevice<int, bool> known;
  return known.get(0, [](int device) {
    int major = 0;
    cudaFuncAttributes attr{};
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 &&
           cudaFuncGetAttributes(&attr, rmsnorm_backward_dw_kernel<float, float, kDwClusterRanks, 1, true>) ==
               cudaSuccess &&
           attr.ptxVersion >= 90;
  });
}

// Columns a thread of the dw kernel takes: 2 where d and the rows' bases allow pairs, else 1 (the
// same bits either way).
int dw_columns_per_thread(std::int64_t d, const void* dy, std::size_t dy_bytes, const void* x, std::size_t x_bytes) {
  return packs_fit(d, 2, {{dy, dy_bytes}, {x, x_bytes}}) ? 2 : 1;
}

// dw from the n rows of dy (and x and rstd where SCALED; else dy's rows are sums to add).
template <typename TD, typename TX, bool SCALED>
void launch_dw(const TD* dy, const TX* x, const float* rstd, float* dw, std::int64_t n, std::int64_t d,
               cudaStream_t s) {
  const int ranks = dw_clusters() ? kDwClusterRanks : 1;
  const int v = dw_columns_per_thread(d, dy, sizeof(TD), x, sizeof(TX));
  const auto tiles = static_cast<unsigned>((d + kDwLanes * v - 1) / (kDwLanes * v));
  auto launch = [&](auto columns) {
    constexpr int V = decltype(columns)::value;
    if (ranks == 1) {
      rmsnorm_backward_dw_kernel<TD, TX, 1, V, SCALED>
          <<<tiles, dim3(kDwLanes, kDwRowGroups), 0, s>>>(dy, x, rstd, dw, n, d);
      return;
    }
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = kDwClusterRanks;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(tiles, kDwClusterRanks);
    config.blockDim = dim3(kDwLanes, kDwRowGroups);
    config.stream = s;
    config.attrs = &cluster;
    config.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, rmsnorm_backward_dw_kernel<TD, TX, kDwClusterRanks, V, SCALED>,
                                               dy, x, rstd, dw, n, d);
    if (err != cudaSuccess)
      throw std::runtime_error(std::string("CUDA launch of rmsnorm_backward_dw_kernel failed: ") +
                               cudaGetErrorString(err));
  };
  if (v == 2)
    launch(std::integral_constant<int, 2>{});
  else
    launch(std::integral_constant<int, 1>{});
  check_launch("rmsnorm_backward_dw_kernel");
}

// Softmax rows are short (T keys) and many (B·h·T), so a warp takes a row: shuffles instead of
// block barriers, and VEC elements per 16-byte load where the row length allows.
constexpr int kSoftmaxWarps = 4;

template <typename T, int VEC>
__global__ void softmax_forward_kernel(const T* scores, T* probs, std::int64_t rows, std::int64_t tq, std::int64_t tk,
                                       float scale, bool causal) {
  const std::int64_t row = blockIdx.x * std::int64_t{kSoftmaxWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* s = scores + row * tk;
  T* p = probs + row * tk;
  const std::int64_t valid = causal ? min(tk, row % tq + 1) : tk;
  float mx = -FLT_MAX, sum = 0, x[VEC];
  for (std::int64_t j = lane * VEC; j < valid; j += 32 * VEC) {
    load<VEC>(s + j, x);
    for (int k = 0; k < VEC; ++k)
      if (j + k < valid) mx = fmaxf(mx, x[k]);
  }
  mx = warp_max(mx);
  for (std::int64_t j = lane * VEC; j < valid; j += 32 * VEC) {
    load<VEC>(s + j, x);
    for (int k = 0; k < VEC; ++k)
      if (j + k < valid) sum += expf(scale * (x[k] - mx));
  }
  const float inv = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane * VEC; j < tk; j += 32 * VEC) {
    if (j < valid) load<VEC>(s + j, x);
    for (int k = 0; k < VEC; ++k) x[k] = j + k < valid ? expf(scale * (x[k] - mx)) * inv : 0.0f;
    store<VEC>(p + j, x);
  }
}

template <typename T, int VEC>
__global__ void softmax_backward_kernel(const T* probs, const T* dprobs, T* dscores, std::int64_t rows, std::int64_t tk,
                                        float scale) {
  const std::int64_t row = blockIdx.x * std::int64_t{kSoftmaxWarps} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const std::int64_t base = row * tk;
  float dot = 0, pv[VEC], dv[VEC];
  for (std::int64_t j = lane * VEC; j < tk; j += 32 * VEC) {
    load<VEC>(probs + base + j, pv);
    load<VEC>(dprobs + base + j, dv);
    for (int k = 0; k < VEC; ++k) dot += pv[k] * dv[k];
  }
  dot = warp_sum(dot);
  for (std::int64_t j = lane * VEC; j < tk; j += 32 * VEC) {
    load<VEC>(probs + base + j, pv);
    load<VEC>(dprobs + base + j, dv);
    for (int k = 0; k < VEC; ++k) pv[k] = scale * pv[k] * (dv[k] - dot);
    store<VEC>(dscores + base + j, pv);
  }
}

// Logit rows are long (the vocabulary) and few (the tokens): a block a row, VEC elements per 16-byte
// load where the row length and the buffers allow (one 2-byte load at a time, the kernels took
// 25-32% of their memory floor: docs/speed.md). Two passes over the row, the max and then the sum of
// exponentials, the second from cache.
template <typename T, int VEC>
__global__ void cross_entropy_rows_kernel(const T* logits, const std::int32_t* targets, float* lse, float* row_loss,
                                          std::int64_t v) {
  const T* x = logits + blockIdx.x * v;
  float mx = -FLT_MAX, xv[VEC];
  for (std::int64_t j = threadIdx.x * std::int64_t{VEC}; j < v; j += std::int64_t{blockDim.x} * VEC) {
    load<VEC>(x + j, xv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) mx = fmaxf(mx, xv[k]);
  }
  mx = block_max(mx);
  float sum = 0;
  for (std::int64_t j = threadIdx.x * std::int64_t{VEC}; j < v; j += std::int64_t{blockDim.x} * VEC) {
    load<VEC>(x + j, xv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += expf(xv[k] - mx);
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    const float l = mx + logf(sum);
    lse[blockIdx.x] = l;
    row_loss[blockIdx.x] = l - ld(x[targets[blockIdx.x]]);
  }
}

// One block, a fixed order: the loss is the same bit for bit on every run.
__global__ void loss_sum_kernel(const float* values, float* out, std::int64_t n, float scale, bool accumulate) {
  float acc = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += values[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = (accumulate ? *out : 0.0f) + acc * scale;
}

// A block a row as above; each element's value is the one-element-a-thread kernel's (the same bits
// whatever VEC).
template <typename T, int VEC>
__global__ void cross_entropy_backward_kernel(const T* logits, const std::int32_t* targets, const float* lse,
                                              T* dlogits, std::int64_t v, float scale) {
  const std::int64_t base = blockIdx.x * v, target = targets[blockIdx.x];
  const float l = lse[blockIdx.x];
  for (std::int64_t j = threadIdx.x * std::int64_t{VEC}; j < v; j += std::int64_t{blockDim.x} * VEC) {
    float xv[VEC];
    load<VEC>(logits + base + j, xv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) xv[k] = (expf(xv[k] - l) - (j + k == target ? 1.0f : 0.0f)) * scale;
    store<VEC>(dlogits + base + j, xv);
  }
}

}  // namespace

void rmsnorm_forward(const void* x, const void* w, Elem ew, void* out, Elem eout, float* rstd, std::int64_t n,
                     std::int64_t d, float eps, cudaStream_t s) {
  with_wide(ew, eout, [&](auto tw, auto to) {
    using TW = typename decltype(tw)::type;
    using TO = typename decltype(to)::type;
    with_row_elements(d, {{x, sizeof(TW)}, {w, sizeof(TW)}, {out, sizeof(TO)}}, [&](auto elems, auto packed) {
      rmsnorm_forward_kernel<TW, TO, decltype(elems)::value, decltype(packed)::value>
          <<<static_cast<unsigned>(n), 256, 0, s>>>(static_cast<const TW*>(x), static_cast<const TW*>(w),
                                                    static_cast<TO*>(out), rstd, d, eps);
    });
  });
  check_launch("rmsnorm_forward_kernel");
}

void add_rmsnorm_forward(const void* x, const void* y, Elem ey, void* h, const void* w, Elem ew, void* out, Elem eout,
                         float* rstd, std::int64_t n, std::int64_t d, float eps, cudaStream_t s) {
  with_wide(ew, ey, [&](auto tw, auto ty) {
    with_wide(ew, eout, [&](auto, auto to) {
      using TW = typename decltype(tw)::type;
      using TY = typename decltype(ty)::type;
      using TO = typename decltype(to)::type;
      with_row_elements(d, {{x, sizeof(TW)}, {y, sizeof(TY)}, {h, sizeof(TW)}, {w, sizeof(TW)}, {out, sizeof(TO)}},
                        [&](auto elems, auto packed) {
                          add_rmsnorm_forward_kernel<TW, TO, TY, decltype(elems)::value, decltype(packed)::value>
                              <<<static_cast<unsigned>(n), 256, 0, s>>>(
                                  static_cast<const TW*>(x), static_cast<const TY*>(y), static_cast<TW*>(h),
                                  static_cast<const TW*>(w), static_cast<TO*>(out), rstd, d, eps);
                        });
    });
  });
  check_launch("add_rmsnorm_forward_kernel");
}

void rmsnorm_backward(const void* dout, Elem edout, const void* x_, const void* w_, Elem ew, const float* rstd,
                      const void* dresidual_, void* dx_, void* dx_lowp, float* dw, float* dw_partials, std::int64_t n,
                      std::int64_t d, cudaStream_t s) {
  if (d > std::numeric_limits<int>::max())
    throw std::logic_error("rmsnorm backward: rows of " + std::to_string(d) + " columns");
  const int columns = static_cast<int>(d);
  with_wide(ew, edout, [&](auto tw, auto t) {
    using TW = typename decltype(tw)::type;
    using T = typename decltype(t)::type;
    const T* dy = static_cast<const T*>(dout);
    T* lowp = static_cast<T*>(dx_lowp);
    const TW *x = static_cast<const TW*>(x_), *w = static_cast<const TW*>(w_),
             *dresidual = static_cast<const TW*>(dresidual_);
    TW* dx = static_cast<TW*>(dx_);
    const bool packed = d % 4 == 0 && aligned16({dy, x, w, dx, dw_partials}) &&
                        (!dresidual || aligned16({dresidual})) && (!lowp || aligned16({lowp}));
    if (dw_partials) {
      const auto bytes = static_cast<std::size_t>(d) * sizeof(float);
      if (bytes + 128 > 48 * 1024)  // the default limit; scratch::kRmsNormDwMaxD keeps below it
        throw std::logic_error("rmsnorm backward: partial sums of " + std::to_string(d) +
                               " columns exceed shared memory");
      if (packed)
        rmsnorm_backward_dx_dw_kernel<T, TW, 4>
            <<<kRmsNormDwBlocks, 256, bytes, s>>>(dy, x, w, rstd, dresidual, dx, lowp, dw_partials, n, columns);
      else
        rmsnorm_backward_dx_dw_kernel<T, TW, 1>
            <<<kRmsNormDwBlocks, 256, bytes, s>>>(dy, x, w, rstd, dresidual, dx, lowp, dw_partials, n, columns);
      check_launch("rmsnorm_backward_dx_dw_kernel");
      launch_dw<float, float, false>(dw_partials, nullptr, nullptr, dw, kRmsNormDwBlocks, d, s);
      return;
    }
    if (packed)
      rmsnorm_backward_dx_kernel<T, TW, 4>
          <<<static_cast<unsigned>(n), 256, 0, s>>>(dy, x, w, rstd, dresidual, dx, lowp, columns);
    else
      rmsnorm_backward_dx_kernel<T, TW, 1>
          <<<static_cast<unsigned>(n), 256, 0, s>>>(dy, x, w, rstd, dresidual, dx, lowp, columns);
    check_launch("rmsnorm_backward_dx_kernel");
    launch_dw<T, TW, true>(dy, x, rstd, dw, n, d, s);
  });
}

void softmax_forward(const void* scores, void* probs, Elem e, std::int64_t rows, std::int64_t tq, std::int64_t tk,
                     float scale, bool causal, cudaStream_t s) {
  const auto grid = static_cast<unsigned>((rows + kSoftmaxWarps - 1) / kSoftmaxWarps);
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto* in = static_cast<const T*>(scores);
    auto* out = static_cast<T*>(probs);
    if (tk % kPack<T> == 0 && aligned16({in, out}))
      softmax_forward_kernel<T, kPack<T>><<<grid, 32 * kSoftmaxWarps, 0, s>>>(in, out, rows, tq, tk, scale, causal);
    else
      softmax_forward_kernel<T, 1><<<grid, 32 * kSoftmaxWarps, 0, s>>>(in, out, rows, tq, tk, scale, causal);
  });
  check_launch("softmax_forward_kernel");
}

void softmax_backward(const void* probs, const void* dprobs, void* dscores, Elem e, std::int64_t rows, std::int64_t tk,
                      float scale, cudaStream_t s) {
  const auto grid = static_cast<unsigned>((rows + kSoftmaxWarps - 1) / kSoftmaxWarps);
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto *p = static_cast<const T*>(probs), *dp = static_cast<const T*>(dprobs);
    auto* ds = static_cast<T*>(dscores);
    if (tk % kPack<T> == 0 && aligned16({p, dp, ds}))
      softmax_backward_kernel<T, kPack<T>><<<grid, 32 * kSoftmaxWarps, 0, s>>>(p, dp, ds, rows, tk, scale);
    else
      softmax_backward_kernel<T, 1><<<grid, 32 * kSoftmaxWarps, 0, s>>>(p, dp, ds, rows, tk, scale);
  });
  check_launch("softmax_backward_kernel");
}

void cross_entropy_forward(const void* logits, Elem e, const std::int32_t* targets, float* lse, float* row_loss,
                           float* loss, std::int64_t n, std::int64_t v, float scale, bool accumulate, cudaStream_t s) {
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto* x = static_cast<const T*>(logits);
    const auto rows = static_cast<unsigned>(n);
    if (v % kPack<T> == 0 && aligned16({x}))
      cross_entropy_rows_kernel<T, kPack<T>><<<rows, 256, 0, s>>>(x, targets, lse, row_loss, v);
    else
      cross_entropy_rows_kernel<T, 1><<<rows, 256, 0, s>>>(x, targets, lse, row_loss, v);
  });
  check_launch("cross_entropy_rows_kernel");
  loss_sum_kernel<<<1, 1024, 0, s>>>(row_loss, loss, n, scale, accumulate);
  check_launch("loss_sum_kernel");
}

void cross_entropy_backward(const void* logits, const std::int32_t* targets, const float* lse, void* dlogits, Elem e,
                            std::int64_t n, std::int64_t v, float scale, cudaStream_t s) {
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto* x = static_cast<const T*>(logits);
    auto* dx = static_cast<T*>(dlogits);
    const auto rows = static_cast<unsigned>(n);
    if (v % kPack<T> == 0 && aligned16({x, dx}))
      cross_entropy_backward_kernel<T, kPack<T>><<<rows, 256, 0, s>>>(x, targets, lse, dx, v, scale);
    else
      cross_entropy_backward_kernel<T, 1><<<rows, 256, 0, s>>>(x, targets, lse, dx, v, scale);
  });
  check_launch("cross_entropy_backward_kernel");
}

}  // namespace lmscope::cuda
