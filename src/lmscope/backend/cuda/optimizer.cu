// The optimizer step's kernels: the global gradient norm and AdamW, per tensor and, for the fused
// step, over many tensors a launch. Both forms share the per-element code and the norm's partition,
// so they give the same bits.
#include "lmscope/backend/cuda/grid_stride.cuh"
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/launch_check.cuh"
#include "lmscope/backend/cuda/multi_tensor.cuh"
#include "lmscope/backend/cuda/reduce.cuh"
#include "lmscope/backend/cuda/storage.cuh"

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace lmscope::cuda {
namespace {

// AdamW and the gradient norm are bound by memory (AdamW moves 30 bytes per parameter: p, g, m, v
// read, p, m, v and the bf16 copy written; 28 with bf16 gradients), so they load and store four
// elements at a time wherever the pointers are 16-byte aligned, which the allocator's blocks are; a
// tail goes one by one. Gradients are fp32 or bf16 (G), read into fp32 exactly either way. p, m and v
// are fp32, or bf16 under bf16 masters (P; 14 bytes a parameter then, no copy), computed in fp32 and
// each rounded once as it is stored.

// Every operation here and in the norm is rounded as written, never contracted into a fused
// multiply-add: the compiler chooses contractions per call site, so the per-tensor kernel, the
// many-tensor one, and a vector loop and its tail could otherwise differ in the last bit.
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWConsts& c) {
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(1.0f - c.beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(1.0f - c.beta2, g), g));
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(c.alpha, m), __fadd_rn(__fsqrt_rn(v), c.eps)));
  p = __fsub_rn(p, __fmul_rn(c.decay, p));
}

// This step's constants (the step scalars from the device where given) and the factor on each
// gradient element; false when the norm is not finite and skip_nonfinite asks for no update.
__device__ __forceinline__ bool adamw_step(AdamWConsts& c, const float* step_scalars, const float* grad_norm,
                                           float& clip) {
  if (step_scalars) {
    c.alpha = step_scalars[0];
    c.decay = step_scalars[1];
    c.grad_scale = step_scalars[2];
  }
  const float norm = grad_norm ? *grad_norm : 0.0f;
  clip = __fmul_rn(
      c.max_norm > 0 ? fminf(1.0f, __fdiv_rn(c.max_norm, __fadd_rn(__fmul_rn(norm, c.grad_scale), 1e-6f))) : 1.0f,
      c.grad_scale);
  return !(c.skip_nonfinite && !isfinite(norm));
}

// A tensor's units: its 16-byte vectors (n4, 0 where a pointer is off alignment), then the rest of
// its elements one by one.
__host__ __device__ __forceinline__ std::int64_t adamw_units(std::int64_t n, std::int64_t n4) { return n - 3 * n4; }

// A tensor's vectors of four: n / 4 where every pointer is 16-byte aligned (8-byte loads and stores
// of four 16-bit values need less, the copy's included), else 0.
std::int64_t adamw_vectors(const void* p, const void* g, const void* m, const void* v, const void* lowp,
                           std::int64_t n) {
  return aligned16({p, g, m, v}) && reinterpret_cast<std::uintptr_t>(lowp) % 8 == 0 ? n / 4 : 0;
}

// Unit j of one tensor's update (j < adamw_units).
template <typename P, typename G, typename L>
__device__ __forceinline__ void adamw_unit(std::int64_t j, P* p, const G* g, P* m, P* v, std::int64_t n4,
                                           const AdamWConsts& c, float clip, L* lowp) {
  if (j < n4) {
    float pi[4], mi[4], vi[4], gi[4];
    load<4>(p + 4 * j, pi);
    load<4>(m + 4 * j, mi);
    load<4>(v + 4 * j, vi);
    load<4>(g + 4 * j, gi);
#pragma unroll
    for (int k = 0; k < 4; ++k) adamw_update(pi[k], __fmul_rn(gi[k], clip), mi[k], vi[k], c);
    store<4>(p + 4 * j, pi);
    store<4>(m + 4 * j, mi);
    store<4>(v + 4 * j, vi);
    if (lowp) store<4>(lowp + 4 * j, pi);
  } else {
    const std::int64_t i = 3 * n4 + j;
    float pi = ld(p[i]), mi = ld(m[i]), vi = ld(v[i]);
    adamw_update(pi, __fmul_rn(ld(g[i]), clip), mi, vi, c);
    p[i] = st<P>(pi);
    m[i] = st<P>(mi);
    v[i] = st<P>(vi);
    if (lowp) lowp[i] = st<L>(pi);
  }
}

// Unit j after an overflow (the norm not finite, skip_nonfinite): the parameter left as it is and
// only its copy written.
template <typename P, typename L>
__device__ __forceinline__ void keep_unit(std::int64_t j, const P* p, std::int64_t n4, L* lowp) {
  if (!lowp) return;
  if (j < n4) {
    float pi[4];
    load<4>(p + 4 * j, pi);
    store<4>(lowp + 4 * j, pi);
  } else {
    lowp[3 * n4 + j] = st<L>(ld(p[3 * n4 + j]));
  }
}

template <typename P, typename G, typename L>
__global__ void adamw_kernel(P* p, const G* g, P* m, P* v, std::int64_t n, std::int64_t n4, AdamWConsts c,
                             const float* step_scalars, const float* grad_norm, L* lowp) {
  float clip = 1.0f;
  const bool update = adamw_step(c, step_scalars, grad_norm, clip);
  GRID_STRIDE(j, adamw_units(n, n4)) {
    if (update)
      adamw_unit(j, p, g, m, v, n4, c, clip, lowp);
    else
      keep_unit(j, p, n4, lowp);
  }
}

// Up to kTensorsPerLaunch tensors, their pointers in the kernel's arguments (a launch's arguments
// may take 4 KiB); each block takes a chunk of one tensor (multi_tensor.cuh).
template <typename P, typename G, typename L>
struct AdamWList {
  using Param = P;
  using Grad = G;
  using Copy = L;
  P* p[kTensorsPerLaunch];
  const G* g[kTensorsPerLaunch];
  P* m[kTensorsPerLaunch];
  P* v[kTensorsPerLaunch];
  L* lowp[kTensorsPerLaunch];
  std::int64_t n[kTensorsPerLaunch], n4[kTensorsPerLaunch];
  ChunkEnds chunks;
  int count;
};

template <typename P, typename G, typename L>
__global__ void adamw_many_kernel(AdamWList<P, G, L> t, AdamWConsts c, const float* step_scalars,
                                  const float* grad_norm) {
  const auto [k, j] = chunk_place(t.chunks, t.count);
  if (j >= adamw_units(t.n[k], t.n4[k])) return;
  float clip = 1.0f;
  if (adamw_step(c, step_scalars, grad_norm, clip))
    adamw_unit(j, t.p[k], t.g[k], t.m[k], t.v[k], t.n4[k], c, clip, t.lowp[k]);
  else
    keep_unit(j, t.p[k], t.n4[k], t.lowp[k]);
}

// The global norm in a fixed order, so the same gradients give the same norm bit for bit (a resumed
// run equals the run never stopped): kNormBlocks blocks per tensor, each writing its partial sum to
// its own slot, then one block adding the slots in index order.
template <typename G>
__device__ __forceinline__ void sum_squares_tensor(const G* x, std::int64_t n, std::int64_t n4, double* partials) {
  float acc = 0;
  GRID_STRIDE(i, n4) {
    float v[4];
    load<4>(x + 4 * i, v);
    acc = __fadd_rn(acc, __fmaf_rn(v[3], v[3], __fmaf_rn(v[2], v[2], __fmaf_rn(v[1], v[1], __fmul_rn(v[0], v[0])))));
  }
  GRID_STRIDE(j, n - 4 * n4) {
    const float v = ld(x[4 * n4 + j]);
    acc = __fmaf_rn(v, v, acc);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = static_cast<double>(acc);
}

template <typename G>
__global__ void sum_squares_kernel(const G* x, std::int64_t n, std::int64_t n4, double* partials) {
  sum_squares_tensor(x, n, n4, partials);
}

template <typename G>
struct NormList {
  const G* x[kTensorsPerLaunch];
  std::int64_t n[kTensorsPerLaunch], n4[kTensorsPerLaunch];
};

template <typename G>
__global__ void sum_squares_many_kernel(NormList<G> t, double* partials) {
  const int k = blockIdx.y;
  sum_squares_tensor(t.x[k], t.n[k], t.n4[k], partials + std::int64_t{k} * kNormBlocks);
}

__global__ void sum_partials_sqrt_kernel(const double* partials, std::int64_t count, float* out) {
  __shared__ double sums[kBlock];
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += kBlock) acc += partials[i];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kBlock / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<float>(sqrt(sums[0]));
}

// Calls f(Tag<P>{}, Tag<G>{}, Tag<L>{}) for the types that run together: fp32 p with gradients in
// eg and copies in elow (bf16 where there are none), or bf16 p with bf16 gradients and no copies.
template <typename F>
void with_adamw_types(Elem ep, Elem eg, Elem elow, bool copies, F&& f) {
  if (ep == Elem::bf16) {
    if (eg != Elem::bf16 || copies)
      throw std::invalid_argument("AdamW on bf16 parameters takes bf16 gradients, no copy");
    f(Tag<__nv_bfloat16>{}, Tag<__nv_bfloat16>{}, Tag<__nv_bfloat16>{});
    return;
  }
  if (ep != Elem::f32) throw std::invalid_argument("AdamW's parameters are f32 or bf16");
  with_elem<false>(eg, [&](auto g) {
    if (copies && elow == Elem::f16)
      f(Tag<float>{}, g, Tag<__half>{});
    else
      f(Tag<float>{}, g, Tag<__nv_bfloat16>{});
  });
}

}  // namespace

void adamw(void* p, Elem ep, const void* g, Elem eg, void* m, void* v, std::int64_t n, const AdamWConsts& c,
           const float* step_scalars, const float* grad_norm, void* lowp, Elem elow, cudaStream_t s) {
  const std::int64_t n4 = adamw_vectors(p, g, m, v, lowp, n);
  with_adamw_types(ep, eg, elow, lowp != nullptr, [&](auto pt, auto gt, auto lt) {
    using P = typename decltype(pt)::type;
    using G = typename decltype(gt)::type;
    using L = typename decltype(lt)::type;
    adamw_kernel<<<grid_for(adamw_units(n, n4), kBlock), kBlock, 0, s>>>(
        static_cast<P*>(p), static_cast<const G*>(g), static_cast<P*>(m), static_cast<P*>(v), n, n4, c, step_scalars,
        grad_norm, static_cast<L*>(lowp));
  });
  check_launch("adamw_kernel");
}

void adamw_many(const AdamWTensor* tensors, std::int64_t count, const AdamWConsts& c, const float* step_scalars,
                const float* grad_norm, cudaStream_t s) {
  for (std::int64_t first = 0; first < count; first += kTensorsPerLaunch) {
    const int k = static_cast<int>(std::min<std::int64_t>(kTensorsPerLaunch, count - first));
    const AdamWTensor* group = tensors + first;
    Elem elow = Elem::bf16;
    bool copies = false;
    for (int i = 0; i < k; ++i)
      if (group[i].lowp) {
        elow = group[i].elow;
        copies = true;
      }
    with_adamw_types(group[0].ep, group[0].eg, elow, copies, [&](auto pt, auto gt, auto lt) {
      using P = typename decltype(pt)::type;
      using G = typename decltype(gt)::type;
      using L = typename decltype(lt)::type;
      AdamWList<P, G, L> list{};
      std::int64_t units[kTensorsPerLaunch];
      for (int i = 0; i < k; ++i) {
        const AdamWTensor& t = group[i];
        if (t.lowp && t.elow != elow) throw std::invalid_argument("adamw_many: copies of two types in one launch");
        if (t.eg != group[0].eg) throw std::invalid_argument("adamw_many: gradients of two types in one launch");
        if (t.ep != group[0].ep) throw std::invalid_argument("adamw_many: parameters of two types in one launch");
        list.p[i] = static_cast<P*>(t.p);
        list.g[i] = static_cast<const G*>(t.g);
        list.m[i] = static_cast<P*>(t.m);
        list.v[i] = static_cast<P*>(t.v);
        list.lowp[i] = static_cast<L*>(t.lowp);
        list.n[i] = t.n;
        list.n4[i] = adamw_vectors(t.p, t.g, t.m, t.v, t.lowp, t.n);
        units[i] = adamw_units(t.n, list.n4[i]);
      }
      list.count = k;
      adamw_many_kernel<<<chunk_ends(units, k, list.chunks), kBlock, 0, s>>>(list, c, step_scalars, grad_norm);
    });
    check_launch("adamw_many_kernel");
  }
}

void sum_squares(const void* x, Elem ex, std::int64_t n, double* partials, cudaStream_t s) {
  const std::int64_t n4 = aligned16({x}) ? n / 4 : 0;
  with_elem<false>(ex, [&](auto xt) {
    using G = typename decltype(xt)::type;
    sum_squares_kernel<<<kNormBlocks, kBlock, 0, s>>>(static_cast<const G*>(x), n, n4, partials);
  });
  check_launch("sum_squares_kernel");
}

void sum_squares_many(const void* const* x, Elem ex, const std::int64_t* n, std::int64_t count, double* partials,
                      cudaStream_t s) {
  with_elem<false>(ex, [&](auto xt) {
    using G = typename decltype(xt)::type;
    for (std::int64_t first = 0; first < count; first += kTensorsPerLaunch) {
      const int k = static_cast<int>(std::min<std::int64_t>(kTensorsPerLaunch, count - first));
      NormList<G> list{};
      for (int i = 0; i < k; ++i) {
        list.x[i] = static_cast<const G*>(x[first + i]);
        list.n[i] = n[first + i];
        list.n4[i] = aligned16({x[first + i]}) ? n[first + i] / 4 : 0;
      }
      sum_squares_many_kernel<<<dim3(kNormBlocks, static_cast<unsigned>(k)), kBlock, 0, s>>>(
          list, partials + first * kNormBlocks);
      check_launch("sum_squares_many_kernel");
    }
  });
}

void sum_partials_sqrt(const double* partials, std::int64_t count, float* out, cudaStream_t s) {
  sum_partials_sqrt_kernel<<<1, kBlock, 0, s>>>(partials, count, out);
  check_launch("sum_partials_sqrt_kernel");
}

}  // namespace lmscope::cuda
