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

template <typename TI, typename TO>
__global__ void cast_kernel(const TI* in, TO* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = st<TO>(ld(in[i]));
}

template <typename TA, typename TB, typename TO>
__global__ void add_kernel(const TA* a, const TB* b, TO* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = st<TO>(ld(a[i]) + ld(b[i]));
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = ld(a[i]);
    out[i] = st<T>(x / (1.0f + expf(-x)) * ld(b[i]));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* a, const T* b, const T* dout, T* da, T* db, std::int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = ld(a[i]), s = 1.0f / (1.0f + expf(-x)), g = ld(dout[i]);
    da[i] = st<T>(g * ld(b[i]) * s * (1.0f + x * (1.0f - s)));
    db[i] = st<T>(g * x * s);
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, float beta1, float beta2,
                             float eps, float alpha, float decay, const float* grad_norm, float max_norm,
                             __nv_bfloat16* lowp) {
  const float clip = grad_norm ? fminf(1.0f, max_norm / (*grad_norm + 1e-6f)) : 1.0f;
  GRID_STRIDE(i, n) {
    const float gi = g[i] * clip;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi, vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] - alpha * mi / (sqrtf(vi) + eps);
    pi -= decay * pi;
    p[i] = pi;
    if (lowp) lowp[i] = __float2bfloat16(pi);
  }
}

__global__ void sum_squares_kernel(const float* x, std::int64_t n, double* sum) {
  float acc = 0;
  GRID_STRIDE(i, n) acc += x[i] * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(sum, static_cast<double>(acc));
}

__global__ void sqrt_kernel(const double* sum, float* out) { *out = static_cast<float>(sqrt(*sum)); }

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
      cast_kernel<TI, TO><<<grid_for(n, kBlock), kBlock, 0, s>>>(static_cast<const TI*>(in), static_cast<TO*>(out), n);
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
    swiglu_forward_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                    static_cast<T*>(out), n);
  });
  check_launch("swiglu_forward_kernel");
}

void swiglu_backward(const void* a, const void* b, const void* dout, void* da, void* db, Elem e, std::int64_t n,
                     cudaStream_t s) {
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    swiglu_backward_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                     static_cast<const T*>(dout), static_cast<T*>(da),
                                                                     static_cast<T*>(db), n);
  });
  check_launch("swiglu_backward_kernel");
}

void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float beta1, float beta2, float eps,
           float alpha, float decay, const float* grad_norm, float max_norm, void* lowp, cudaStream_t s) {
  adamw_kernel<<<grid_for(n, kBlock), kBlock, 0, s>>>(p, g, m, v, n, beta1, beta2, eps, alpha, decay, grad_norm,
                                                      max_norm, static_cast<__nv_bfloat16*>(lowp));
  check_launch("adamw_kernel");
}

void sum_squares(const float* x, std::int64_t n, double* sum, cudaStream_t s) {
  sum_squares_kernel<<<std::min(grid_for(n, kBlock), 1024u), kBlock, 0, s>>>(x, n, sum);
  check_launch("sum_squares_kernel");
}

void sqrt_to_float(const double* sum, float* out, cudaStream_t s) {
  sqrt_kernel<<<1, 1, 0, s>>>(sum, out);
  check_launch("sqrt_kernel");
}

}  // namespace lmscope::cuda
