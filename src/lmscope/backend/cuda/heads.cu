// Head split/merge with RoPE. The rotation angles come from a table of cos and sin per (position,
// pair), formed once in double as the CPU reference forms them: evaluating pow and sincos in double
// for every pair made this kernel six times slower than its memory traffic. Each thread moves 16
// bytes (a few interleaved pairs) where the rows allow: one pair a thread, 4 bytes in bf16, kept the
// kernel at 40% of the memory's bandwidth (docs/speed.md).
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/launch_check.cuh"
#include "lmscope/backend/cuda/reduce.cuh"
#include "lmscope/backend/cuda/storage.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace lmscope::cuda {
namespace {

__global__ void rope_table_kernel(float2* table, std::int64_t t, std::int64_t dk, double theta) {
  const std::int64_t pairs = dk / 2;
  for (std::int64_t idx = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; idx < t * pairs;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t p = idx / pairs, i = idx % pairs;
    double sn, cs;
    sincos(static_cast<double>(p) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dk)), &sn, &cs);
    table[idx] = make_float2(static_cast<float>(cs), static_cast<float>(sn));
  }
}

// P interleaved pairs (2P elements) a thread, moved as one load and one store: 16 bytes' worth where
// dk and the buffers allow, else one pair. One block row per token (b, t), its threads over the
// token's h·dk/(2P) groups, and blockIdx.z the move (several tensors of one shape in a launch: each
// launch has a fixed cost of about 1.3 µs, as long as moving small's q): the only divisions left are
// one 32-bit divide per group (64-bit index arithmetic per element cost more than the memory
// traffic). rope: [T, dk/2] (cos, sin), or nullptr for no rotation; sign −1 undoes the rotation
// (backward). Every P does the same arithmetic per pair, so gives the same bits.
template <typename E>
struct Moves {
  static_assert(kMaxHeadMoves == 3, "permute_heads_kernel picks among three moves");
  const E* in[kMaxHeadMoves];
  E* out[kMaxHeadMoves];
  const float2* rope[kMaxHeadMoves];
};

template <typename E, int P>
__global__ void permute_heads_kernel(Moves<E> moves, std::int64_t T, int H, int dk, bool to_heads_major, float sign) {
  const int pairs = dk / 2, groups = pairs / P, j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= H * groups) return;
  // Picked by constant indices: indexing the kernel's arguments by blockIdx.z put them in local memory
  // (each thread's copy), and the moves took 3.5x as long as apart (H100, 2.7B ctx 1024).
  const unsigned z = blockIdx.z;
  const E* in = z == 0 ? moves.in[0] : z == 1 ? moves.in[1] : moves.in[2];
  E* out = z == 0 ? moves.out[0] : z == 1 ? moves.out[1] : moves.out[2];
  const float2* rope = z == 0 ? moves.rope[0] : z == 1 ? moves.rope[1] : moves.rope[2];
  const std::int64_t token = blockIdx.x, b = token / T, t = token % T;
  const int h = j / groups, i = (j - h * groups) * P;
  const std::int64_t token_major = token * H * dk + 2 * (h * pairs + i),
                     head_major = ((b * H + h) * T + t) * dk + 2 * i;
  float x[2 * P];
  load<2 * P>(in + (to_heads_major ? token_major : head_major), x);
  if (rope) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float2 cs = rope[t * pairs + i + k];
      const float c = cs.x, s = sign * cs.y, re = x[2 * k], im = x[2 * k + 1];
      x[2 * k] = re * c - im * s;
      x[2 * k + 1] = re * s + im * c;
    }
  }
  store<2 * P>(out + (to_heads_major ? head_major : token_major), x);
}

template <typename E, int P>
void launch_permute_heads(const Moves<E>& moves, int count, std::int64_t b, std::int64_t t, std::int64_t h,
                          std::int64_t dk, bool to_heads_major, cudaStream_t s) {
  // One block per token and move, as many threads as its groups (rounded to whole warps, at most 256).
  const std::int64_t groups = h * dk / (2 * P);
  if (groups == 0 || b * t == 0 || count == 0) return;  // nothing to move (and no grid of zero blocks)
  const int threads = static_cast<int>(std::min<std::int64_t>(256, (groups + 31) / 32 * 32));
  const dim3 grid(static_cast<unsigned>(b * t), static_cast<unsigned>((groups + threads - 1) / threads),
                  static_cast<unsigned>(count));
  permute_heads_kernel<E, P><<<grid, threads, 0, s>>>(moves, t, static_cast<int>(h), static_cast<int>(dk),
                                                      to_heads_major, to_heads_major ? 1.0f : -1.0f);
  check_launch("permute_heads_kernel");
}

}  // namespace

void rope_table(float* table, std::int64_t t, std::int64_t dk, double theta, cudaStream_t s) {
  rope_table_kernel<<<grid_for(t * (dk / 2), 256), 256, 0, s>>>(reinterpret_cast<float2*>(table), t, dk, theta);
  check_launch("rope_table_kernel");
}

void permute_heads(const HeadMove* moves, int count, Elem e, std::int64_t b, std::int64_t t, std::int64_t h,
                   std::int64_t dk, bool to_heads_major, cudaStream_t s) {
  if (count < 0 || count > kMaxHeadMoves)
    throw std::logic_error("permute_heads: " + std::to_string(count) + " moves in a launch");
  with_elem(e, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kPairs = kPack<T> / 2;  // pairs in 16 bytes
    Moves<T> m{};
    bool aligned = true;
    for (int i = 0; i < count; ++i) {
      m.in[i] = static_cast<const T*>(moves[i].in);
      m.out[i] = static_cast<T*>(moves[i].out);
      m.rope[i] = reinterpret_cast<const float2*>(moves[i].rope);
      aligned = aligned && aligned16({moves[i].in, moves[i].out});
    }
    if (dk % (2 * kPairs) == 0 && aligned)
      launch_permute_heads<T, kPairs>(m, count, b, t, h, dk, to_heads_major, s);
    else
      launch_permute_heads<T, 1>(m, count, b, t, h, dk, to_heads_major, s);
  });
}

}  // namespace lmscope::cuda
