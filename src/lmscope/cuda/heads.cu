// Head split/merge with RoPE: one thread per interleaved pair. The angle is formed in double, as
// the CPU reference does, so positions in the thousands keep their precision.
#include "lmscope/cuda/kernels.h"
#include "lmscope/cuda/launch_check.cuh"
#include "lmscope/cuda/reduce.cuh"
#include "lmscope/cuda/storage.cuh"

namespace lmscope::cuda {
namespace {

template <typename E>
__global__ void permute_heads_kernel(const E* in, E* out, std::int64_t B, std::int64_t T, std::int64_t H,
                                     std::int64_t dk, double theta, bool to_heads_major, double sign) {
  const std::int64_t pairs = dk / 2, total = B * T * H * pairs;
  for (std::int64_t idx = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = idx % pairs, h = (idx / pairs) % H, t = (idx / (pairs * H)) % T, b = idx / (pairs * H * T);
    const std::int64_t token_major = ((b * T + t) * H + h) * dk + 2 * i,
                       head_major = ((b * H + h) * T + t) * dk + 2 * i;
    const E* x = in + (to_heads_major ? token_major : head_major);
    E* y = out + (to_heads_major ? head_major : token_major);
    if (theta <= 0) {
      y[0] = x[0];
      y[1] = x[1];
      continue;
    }
    const float x0 = ld(x[0]), x1 = ld(x[1]);
    double sn, cs;
    sincos(static_cast<double>(t) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dk)), &sn, &cs);
    const float c = static_cast<float>(cs), si = static_cast<float>(sign * sn);
    y[0] = st<E>(x0 * c - x1 * si);
    y[1] = st<E>(x0 * si + x1 * c);
  }
}

}  // namespace

void permute_heads(const void* in, void* out, Elem e, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t dk,
                   double theta, bool to_heads_major, cudaStream_t s) {
  const std::int64_t total = b * t * h * (dk / 2);
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    permute_heads_kernel<T><<<grid_for(total, 256), 256, 0, s>>>(static_cast<const T*>(in), static_cast<T*>(out), b, t,
                                                                 h, dk, theta, to_heads_major,
                                                                 to_heads_major ? 1.0 : -1.0);
  });
  check_launch("permute_heads_kernel");
}

}  // namespace lmscope::cuda
