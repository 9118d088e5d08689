// Elementwise kernels: grid-stride loops, one pass over memory each.
#include "lmscope/cuda/kernels.h"
#include "lmscope/cuda/launch_check.cuh"
#include "lmscope/cuda/reduce.cuh"

namespace lmscope::cuda {
namespace {

constexpr int kBlock = 256;

#define GRID_STRIDE(i, n)                                                             \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{gridDim.x} * blockDim.x)

__global__ void fill_kernel(float* x, std::int64_t n, float value) { GRID_STRIDE(i, n) x[i] = value; }

__global__ void add_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void swiglu_forward_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = a[i];
    out[i] = x / (1.0f + expf(-x)) * b[i];
  }
}

__global__ void swiglu_backward_kernel(const float* a, const float* b, const float* dout, float* da, float* db,
                                       std::int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = a[i], s = 1.0f / (1.0f + expf(-x)), g = dout[i];
    da[i] = g * b[i] * s * (1.0f + x * (1.0f - s));
    db[i] = g * x * s;
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, float beta1, float beta2,
                             float eps, float alpha, float decay, const float* grad_norm, float max_norm) {
  const float clip = grad_norm ? fminf(1.0f, max_norm / (*grad_norm + 1e-6f)) : 1.0f;
  GRID_STRIDE(i, n) {
    const float gi = g[i] * clip;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi, vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] - alpha * mi / (sqrtf(vi) + eps);
    p[i] = pi - decay * pi;
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

void fill(float* x, std::int64_t n, float value, cudaStream_t s) {
  fill_kernel<<<grid_for(n, kBlock), kBlock, 0, s>>>(x, n, value);
  check_launch("fill_kernel");
}
void add(const float* a, const float* b, float* out, std::int64_t n, cudaStream_t s) {
  add_kernel<<<grid_for(n, kBlock), kBlock, 0, s>>>(a, b, out, n);
  check_launch("add_kernel");
}
void swiglu_forward(const float* a, const float* b, float* out, std::int64_t n, cudaStream_t s) {
  swiglu_forward_kernel<<<grid_for(n, kBlock), kBlock, 0, s>>>(a, b, out, n);
  check_launch("swiglu_forward_kernel");
}
void swiglu_backward(const float* a, const float* b, const float* dout, float* da, float* db, std::int64_t n,
                     cudaStream_t s) {
  swiglu_backward_kernel<<<grid_for(n, kBlock), kBlock, 0, s>>>(a, b, dout, da, db, n);
  check_launch("swiglu_backward_kernel");
}
void adamw(float* p, const float* g, float* m, float* v, std::int64_t n, float beta1, float beta2, float eps,
           float alpha, float decay, const float* grad_norm, float max_norm, cudaStream_t s) {
  adamw_kernel<<<grid_for(n, kBlock), kBlock, 0, s>>>(p, g, m, v, n, beta1, beta2, eps, alpha, decay, grad_norm,
                                                      max_norm);
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
