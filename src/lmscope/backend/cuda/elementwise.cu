// Elementwise kernels: grid-stride loops, one pass over memory each, fp32 arithmetic.
#include "lmscope/backend/cuda/grid_stride.cuh"
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/launch_check.cuh"
#include "lmscope/backend/cuda/multi_tensor.cuh"
#include "lmscope/backend/cuda/reduce.cuh"
#include "lmscope/backend/cuda/storage.cuh"

#include <algorithm>

namespace lmscope::cuda {
namespace {

template <typename T>
__global__ void fill_kernel(T* x, std::int64_t n, float value) {
  GRID_STRIDE(i, n) x[i] = st<T>(value);
}

// Casting n elements by units: `packs` of VEC elements each (16-byte accesses for the wider type),
// then the rest one by one, a unit a thread. The transient weight copies cast every matmul weight
// twice a step (fp32 to bf16: 6 bytes an element), so this runs at the bandwidth's edge: one element
// per thread made 2-byte stores, 64 bytes a warp.
__host__ __device__ __forceinline__ std::int64_t cast_units(std::int64_t n, std::int64_t packs, int vec) {
  return n - (vec - 1) * packs;
}

template <typename TI, typename TO, int VEC>
__device__ __forceinline__ void cast_unit(std::int64_t j, const TI* in, TO* out, std::int64_t packs) {
  if (j < packs) {
    float x[VEC];
    load<VEC>(in + j * VEC, x);
    store<VEC>(out + j * VEC, x);
  } else {
    const std::int64_t i = (VEC - 1) * packs + j;
    out[i] = st<TO>(ld(in[i]));
  }
}

// VEC = 1 where a pointer is not aligned.
template <typename TI, typename TO, int VEC>
__global__ void cast_kernel(const TI* in, TO* out, std::int64_t n) {
  const std::int64_t packs = n / VEC;
  GRID_STRIDE(j, cast_units(n, packs, VEC)) cast_unit<TI, TO, VEC>(j, in, out, packs);
}

// cast_kernel over up to kTensorsPerLaunch tensors, a chunk of one a block (multi_tensor.cuh);
// `packs` is 0 for a tensor whose pointers are not 16-byte aligned (all of it then goes element by
// element).
template <typename TI, typename TO>
struct CastList {
  const TI* in[kTensorsPerLaunch];
  TO* out[kTensorsPerLaunch];
  std::int64_t n[kTensorsPerLaunch], packs[kTensorsPerLaunch];
  ChunkEnds chunks;
  int count;
};

template <typename TI, typename TO, int VEC>
__global__ void cast_many_kernel(CastList<TI, TO> t) {
  const auto [k, j] = chunk_place(t.chunks, t.count);
  if (j < cast_units(t.n[k], t.packs[k], VEC)) cast_unit<TI, TO, VEC>(j, t.in[k], t.out[k], t.packs[k]);
}

// By units as cast_kernel: packs of VEC elements (16-byte accesses for the widest type), then the rest
// one by one. Data parallelism's all-gather sums every gradient this way after the backward (over two
// ranks, 3 bf16 tensors of every parameter's size), which one element a thread left at about half the
// bandwidth.
template <typename TA, typename TB, typename TO, int VEC>
__device__ __forceinline__ void add_unit(std::int64_t j, const TA* a, const TB* b, TO* out, std::int64_t packs) {
  if (j < packs) {
    float x[VEC], y[VEC];
    load<VEC>(a + j * VEC, x);
    load<VEC>(b + j * VEC, y);
    for (int k = 0; k < VEC; ++k) x[k] += y[k];
    store<VEC>(out + j * VEC, x);
  } else {
    const std::int64_t i = (VEC - 1) * packs + j;
    out[i] = st<TO>(ld(a[i]) + ld(b[i]));
  }
}

template <typename TA, typename TB, typename TO, int VEC>
__global__ void add_kernel(const TA* a, const TB* b, TO* out, std::int64_t n) {
  const std::int64_t packs = n / VEC;
  GRID_STRIDE(j, cast_units(n, packs, VEC)) add_unit<TA, TB, TO, VEC>(j, a, b, out, packs);
}

// add_kernel over up to kTensorsPerLaunch triples of one dtype, a chunk of one a block, as
// cast_many_kernel (`packs` 0 for a triple not 16-byte aligned).
template <typename T>
struct AddList {
  const T* a[kTensorsPerLaunch];
  const T* b[kTensorsPerLaunch];
  T* out[kTensorsPerLaunch];
  std::int64_t n[kTensorsPerLaunch], packs[kTensorsPerLaunch];
  ChunkEnds chunks;
  int count;
};

template <typename T>
__global__ void add_many_kernel(AddList<T> t) {
  const auto [k, j] = chunk_place(t.chunks, t.count);
  if (j < cast_units(t.n[k], t.packs[k], kPack<T>))
    add_unit<T, T, T, kPack<T>>(j, t.a[k], t.b[k], t.out[k], t.packs[k]);
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
        cast_kernel<TI, TO, kVec><<<grid_for(cast_units(n, n / kVec, kVec), kBlock), kBlock, 0, s>>>(x, y, n);
      else
        cast_kernel<TI, TO, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, y, n);
    });
  });
  check_launch("cast_kernel");
}

void cast_many(const CastPair* pairs, std::int64_t count, Elem ein, Elem eout, cudaStream_t s) {
  with_elem(ein, [&](auto ti) {
    with_elem(eout, [&](auto to) {
      using TI = typename decltype(ti)::type;
      using TO = typename decltype(to)::type;
      constexpr int kVec = kPack<TI> < kPack<TO> ? kPack<TI> : kPack<TO>;  // as cast()
      for (std::int64_t first = 0; first < count; first += kTensorsPerLaunch) {
        const int k = static_cast<int>(std::min<std::int64_t>(kTensorsPerLaunch, count - first));
        CastList<TI, TO> list{};
        std::int64_t units[kTensorsPerLaunch];
        for (int i = 0; i < k; ++i) {
          const CastPair& p = pairs[first + i];
          list.in[i] = static_cast<const TI*>(p.in);
          list.out[i] = static_cast<TO*>(p.out);
          list.n[i] = p.n;
          list.packs[i] = aligned16({p.in, p.out}) ? p.n / kVec : 0;
          units[i] = cast_units(p.n, list.packs[i], kVec);
        }
        list.count = k;
        cast_many_kernel<TI, TO, kVec><<<chunk_ends(units, k, list.chunks), kBlock, 0, s>>>(list);
      }
    });
  });
  check_launch("cast_many_kernel");
}

void add(const void* a, Elem ea, const void* b, Elem eb, void* out, Elem eout, std::int64_t n, cudaStream_t s) {
  with_elem(ea, [&](auto ta) {
    with_elem(eb, [&](auto tb) {
      with_elem(eout, [&](auto to) {
        using TA = typename decltype(ta)::type;
        using TB = typename decltype(tb)::type;
        using TO = typename decltype(to)::type;
        constexpr int kVec = std::min({kPack<TA>, kPack<TB>, kPack<TO>});  // the widest type's 16 bytes
        const auto* x = static_cast<const TA*>(a);
        const auto* y = static_cast<const TB*>(b);
        auto* o = static_cast<TO*>(out);
        if (aligned16({x, y, o}))
          add_kernel<TA, TB, TO, kVec><<<grid_for(cast_units(n, n / kVec, kVec), kBlock), kBlock, 0, s>>>(x, y, o, n);
        else
          add_kernel<TA, TB, TO, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, y, o, n);
      });
    });
  });
  check_launch("add_kernel");
}

void add_many(const AddTriple* triples, std::int64_t count, Elem e, cudaStream_t s) {
  with_elem(e, [&](auto t) {
    using T = typename decltype(t)::type;
    for (std::int64_t first = 0; first < count; first += kTensorsPerLaunch) {
      const int k = static_cast<int>(std::min<std::int64_t>(kTensorsPerLaunch, count - first));
      AddList<T> list{};
      std::int64_t units[kTensorsPerLaunch];
      for (int i = 0; i < k; ++i) {
        const AddTriple& p = triples[first + i];
        list.a[i] = static_cast<const T*>(p.a);
        list.b[i] = static_cast<const T*>(p.b);
        list.out[i] = static_cast<T*>(p.out);
        list.n[i] = p.n;
        list.packs[i] = aligned16({p.a, p.b, p.out}) ? p.n / kPack<T> : 0;
        units[i] = cast_units(p.n, list.packs[i], kPack<T>);
      }
      list.count = k;
      add_many_kernel<T><<<chunk_ends(units, k, list.chunks), kBlock, 0, s>>>(list);
    }
  });
  check_launch("add_many_kernel");
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

}  // namespace lmscope::cuda
