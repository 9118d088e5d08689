// Elementwise kernels: grid-stride loops, one pass over memory each, fp32 arithmetic.
#include "lmscope/cuda/kernels.h"
#include "lmscope/cuda/launch_check.cuh"
#include "lmscope/cuda/reduce.cuh"
#include "lmscope/cuda/storage.cuh"

namespace lmscope::cuda {
namespace {

constexpr int kBlock = 256;

#define GRID_STRIDE(i, n)                                                             \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{gridDim.x} * blockDim.x)

template <typename T>
__global__ void fill_kernel(T* x, std::int64_t n, float value) {
  GRID_STRIDE(i, n) x[i] = st<T>(value);
}

// VEC elements per access in the main loop (VEC = 1 where a pointer is not aligned), then the tail.
// The transient weight copies cast every matmul weight twice a step (fp32 to bf16: 6 bytes an
// element), so this runs at the bandwidth's edge: one element per thread made 2-byte stores, 64
// bytes a warp.
template <typename TI, typename TO, int VEC>
__global__ void cast_kernel(const TI* in, TO* out, std::int64_t n) {
  const std::int64_t packs = n / VEC;
  float x[VEC];
  GRID_STRIDE(i, packs) {
    load<VEC>(in + i * VEC, x);
    store<VEC>(out + i * VEC, x);
  }
  GRID_STRIDE(j, n - packs * VEC) {
    const std::int64_t i = packs * VEC + j;
    out[i] = st<TO>(ld(in[i]));
  }
}

template <typename TA, typename TB, typename TO>
__global__ void add_kernel(const TA* a, const TB* b, TO* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = st<TO>(ld(a[i]) + ld(b[i]));
}

// SwiGLU moves 3 (forward) and 5 (backward) tensors of B·T·d_ff: VEC elements per 16-byte access
// in the main loop (VEC = 1 where a pointer is not aligned), then the tail one by one.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

template <typename T, int VEC>
__global__ void swiglu_forward_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  const std::int64_t packs = n / VEC;
  float x[VEC], y[VEC];
  GRID_STRIDE(i, packs) {
    load<VEC>(a + i * VEC, x);
    load<VEC>(b + i * VEC, y);
    for (int k = 0; k < VEC; ++k) x[k] = silu(x[k]) * y[k];
    store<VEC>(out + i * VEC, x);
  }
  GRID_STRIDE(j, n - packs * VEC) {
    const std::int64_t i = packs * VEC + j;
    out[i] = st<T>(silu(ld(a[i])) * ld(b[i]));
  }
}

__device__ __forceinline__ void swiglu_grad(float x, float y, float g, float& dx, float& dy) {
  const float s = 1.0f / (1.0f + expf(-x));
  dx = g * y * s * (1.0f + x * (1.0f - s));
  dy = g * x * s;
}

template <typename T, int VEC>
__global__ void swiglu_backward_kernel(const T* a, const T* b, const T* dout, T* da, T* db, std::int64_t n) {
  const std::int64_t packs = n / VEC;
  float x[VEC], y[VEC], g[VEC];
  GRID_STRIDE(i, packs) {
    load<VEC>(a + i * VEC, x);
    load<VEC>(b + i * VEC, y);
    load<VEC>(dout + i * VEC, g);
    for (int k = 0; k < VEC; ++k) swiglu_grad(x[k], y[k], g[k], x[k], y[k]);
    store<VEC>(da + i * VEC, x);
    store<VEC>(db + i * VEC, y);
  }
  GRID_STRIDE(j, n - packs * VEC) {
    const std::int64_t i = packs * VEC + j;
    float dx, dy;
    swiglu_grad(ld(a[i]), ld(b[i]), ld(dout[i]), dx, dy);
    da[i] = st<T>(dx);
    db[i] = st<T>(dy);
  }
}

// AdamW and the gradient norm are bound by memory (AdamW moves 30 bytes per parameter: p, g, m, v
// read, p, m, v and the bf16 copy written), so they load and store four floats at a time wherever
// the pointers are 16-byte aligned, which the allocator's blocks are; a tail goes one by one.

__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWConsts& c) {
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  p -= c.alpha * m / (sqrtf(v) + c.eps);
  p -= c.decay * p;
}

template <typename L>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, std::int64_t n4,
                             AdamWConsts c, const float* step_scalars, const float* grad_norm, L* lowp) {
  if (step_scalars) {
    c.alpha = step_scalars[0];
    c.decay = step_scalars[1];
    c.grad_scale = step_scalars[2];
  }
  const float norm = grad_norm ? *grad_norm : 0.0f;
  if (c.skip_nonfinite && !isfinite(norm)) {  // an overflow: the parameter stays, its copy is written
    if (lowp) GRID_STRIDE(i, n) lowp[i] = st<L>(p[i]);
    return;
  }
  const float clip = (c.max_norm > 0 ? fminf(1.0f, c.max_norm / (norm * c.grad_scale + 1e-6f)) : 1.0f) * c.grad_scale;
  GRID_STRIDE(i, n4) {
    float4 pi = reinterpret_cast<float4*>(p)[i], mi = reinterpret_cast<float4*>(m)[i],
           vi = reinterpret_cast<float4*>(v)[i];
    const float4 gi = reinterpret_cast<const float4*>(g)[i];
    adamw_update(pi.x, gi.x * clip, mi.x, vi.x, c);
    adamw_update(pi.y, gi.y * clip, mi.y, vi.y, c);
    adamw_update(pi.z, gi.z * clip, mi.z, vi.z, c);
    adamw_update(pi.w, gi.w * clip, mi.w, vi.w, c);
    reinterpret_cast<float4*>(p)[i] = pi;
    reinterpret_cast<float4*>(m)[i] = mi;
    reinterpret_cast<float4*>(v)[i] = vi;
    if (lowp) store<4>(lowp + 4 * i, {pi.x, pi.y, pi.z, pi.w});
  }
  GRID_STRIDE(j, n - 4 * n4) {
    const std::int64_t i = 4 * n4 + j;
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_update(pi, g[i] * clip, mi, vi, c);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (lowp) lowp[i] = st<L>(pi);
  }
}

// The global norm in a fixed order, so the same gradients give the same norm bit for bit (a resumed
// run equals the run never stopped): kNormBlocks blocks per tensor, each writing its partial sum to
// its own slot, then one block adding the slots in index order.
__global__ void sum_squares_kernel(const float* x, std::int64_t n, std::int64_t n4, double* partials) {
  float acc = 0;
  GRID_STRIDE(i, n4) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    acc += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  GRID_STRIDE(j, n - 4 * n4) acc += x[4 * n4 + j] * x[4 * n4 + j];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = static_cast<double>(acc);
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

}  // namespace

void fill(void* x, Elem ex, std::int64_t n, float value, cudaStream_t s) {
  with_elem(ex, [&](auto t) {
    using T = typename decltype(t)::type;
    fill_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s>>>(static_cast<T*>(x), n, value);
  });
  check_launch("fill_kernel");
}

void cast(const void* in, Elem ein, void* out, Elem eout, std::int64_t n, cudaStream_t s) {
  with_elem(ein, [&](auto ti) {
    with_elem(eout, [&](auto to) {
      using TI = typename decltype(ti)::type;
      using TO = typename decltype(to)::type;
      const auto* x = static_cast<const TI*>(in);
      auto* y = static_cast<TO*>(out);
      constexpr int kVec = kPack<TI> < kPack<TO> ? kPack<TI> : kPack<TO>;  // the wider type's 16 bytes
      if (aligned16({x, y}))
        cast_kernel<TI, TO, kVec><<<grid_for(n / kVec + 1, kBlock), kBlock, 0, s>>>(x, y, n);
      else
        cast_kernel<TI, TO, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, y, n);
    });
  });
  check_launch("cast_kernel");
}

void add(const void* a, Elem ea, const void* b, Elem eb, void* out, Elem eout, std::int64_t n, cudaStream_t s) {
  with_elem(ea, [&](auto ta) {
    with_elem(eb, [&](auto tb) {
      with_elem(eout, [&](auto to) {
        using TA = typename decltype(ta)::type;
        using TB = typename decltype(tb)::type;
        using TO = typename decltype(to)::type;
        add_kernel<TA, TB, TO><<<grid_for(n, kBlock), kBlock, 0, s>>>(
            static_cast<const TA*>(a), static_cast<const TB*>(b), static_cast<TO*>(out), n);
      });
    });
  });
  check_launch("add_kernel");
}

void swiglu_forward(const void* a, const void* b, void* out, Elem e, std::int64_t n, cudaStream_t s) {
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto *x = static_cast<const T*>(a), *y = static_cast<const T*>(b);
    auto* o = static_cast<T*>(out);
    if (aligned16({x, y, o}))
      swiglu_forward_kernel<T, kPack<T>><<<grid_for(n / kPack<T> + 1, kBlock), kBlock, 0, s>>>(x, y, o, n);
    else
      swiglu_forward_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, y, o, n);
  });
  check_launch("swiglu_forward_kernel");
}

void swiglu_backward(const void* a, const void* b, const void* dout, void* da, void* db, Elem e, std::int64_t n,
                     cudaStream_t s) {
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto *x = static_cast<const T*>(a), *y = static_cast<const T*>(b), *g = static_cast<const T*>(dout);
    auto *dx = static_cast<T*>(da), *dy = static_cast<T*>(db);
    if (aligned16({x, y, g, dx, dy}))
      swiglu_backward_kernel<T, kPack<T>><<<grid_for(n / kPack<T> + 1, kBlock), kBlock, 0, s>>>(x, y, g, dx, dy, n);
    else
      swiglu_backward_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, y, g, dx, dy, n);
  });
  check_launch("swiglu_backward_kernel");
}

void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, const AdamWConsts& c,
           const float* step_scalars, const float* grad_norm, void* lowp, Elem elow, cudaStream_t s) {
  const bool vec = aligned16({p, g, m, v}) && reinterpret_cast<std::uintptr_t>(lowp) % 8 == 0;
  const std::int64_t n4 = vec ? n / 4 : 0;
  auto launch = [&](auto* copy) {
    adamw_kernel<<<grid_for(n4 > 0 ? n4 : n, kBlock), kBlock, 0, s>>>(p, g, m, v, n, n4, c, step_scalars, grad_norm,
                                                                      copy);
  };
  if (elow == Elem::f16)
    launch(static_cast<__half*>(lowp));
  else
    launch(static_cast<__nv_bfloat16*>(lowp));
  check_launch("adamw_kernel");
}

void sum_squares(const float* x, std::int64_t n, double* partials, cudaStream_t s) {
  const std::int64_t n4 = aligned16({x}) ? n / 4 : 0;
  sum_squares_kernel<<<kNormBlocks, kBlock, 0, s>>>(x, n, n4, partials);
  check_launch("sum_squares_kernel");
}

void sum_partials_sqrt(const double* partials, std::int64_t count, float* out, cudaStream_t s) {
  sum_partials_sqrt_kernel<<<1, kBlock, 0, s>>>(partials, count, out);
  check_launch("sum_partials_sqrt_kernel");
}

}  // namespace lmscope::cuda
