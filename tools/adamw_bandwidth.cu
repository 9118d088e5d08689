// How near the fused AdamW step can come to the memory's rate, and what the launch's shape costs:
// a model's parameter tensors (fp32 p, g, m, v; 28 bytes a parameter moved) updated in launches of
// 24 tensors as `adamw_many` does, timed for the grid shape lmscope used before 7b881c2 (one block
// row per tensor, as many blocks as the largest tensor needs, one 16-byte vector a thread) against
// blocks that each take a chunk of one tensor (no idle blocks; 1, 2 or 4 vectors in flight a thread),
// beside the rate of a plain grid-stride copy (as much read as written) for reference. Each shape's parameters are
// checked against the first shape's bits; times are medians of 10 full steps after 3.
//
//   adamw_bandwidth D_MODEL D_FF LAYERS [VOCAB, default 10000]
//   (2.7B's layers, eight of them: adamw_bandwidth 2560 10240 8)
#include "probe_support.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int kGroup = 24;  // tensors a launch, as kTensorsPerLaunch
constexpr int kBlock = 256;

struct Consts {
  float beta1 = 0.9f, beta2 = 0.95f, alpha = 1e-4f, eps = 1e-8f, decay = 1e-5f;
};

// lmscope's element update, every operation rounded as written.
__device__ __forceinline__ void update(float& p, float g, float& m, float& v, const Consts& c) {
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(1.0f - c.beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(1.0f - c.beta2, g), g));
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(c.alpha, m), __fadd_rn(__fsqrt_rn(v), c.eps)));
  p = __fsub_rn(p, __fmul_rn(c.decay, p));
}

__device__ __forceinline__ void update4(float4& p, const float4& g, float4& m, float4& v, const Consts& c) {
  update(p.x, g.x, m.x, v.x, c);
  update(p.y, g.y, m.y, v.y, c);
  update(p.z, g.z, m.z, v.z, c);
  update(p.w, g.w, m.w, v.w, c);
}

// A launch's tensors (element counts are multiples of 4 here); chunk_end[k] is the running count of
// chunks through tensor k, for the chunked shape.
struct Group {
  float4 *p[kGroup], *g[kGroup], *m[kGroup], *v[kGroup];
  long long n4[kGroup];
  long long chunk_end[kGroup];
  int count;
};

// The shape before 7b881c2: blockIdx.y picks the tensor; the grid's x dimension covers the largest one.
__global__ void as_now(Group t, Consts c) {
  const int k = blockIdx.y;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < t.n4[k];
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float4 p = t.p[k][i], g = t.g[k][i], m = t.m[k][i], v = t.v[k][i];
    update4(p, g, m, v, c);
    t.p[k][i] = p;
    t.m[k][i] = m;
    t.v[k][i] = v;
  }
}

// Chunked: block b takes the b-th chunk of kBlock·U vectors in the launch; U vectors a thread, all
// loaded before any is updated.
template <int U>
__global__ void chunked(Group t, Consts c) {
  const long long b = blockIdx.x;
  int k = 0;
  while (b >= t.chunk_end[k]) ++k;
  const long long first = (b - (k ? t.chunk_end[k - 1] : 0)) * kBlock * U + threadIdx.x;
  float4 p[U], g[U], m[U], v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = first + u * kBlock;
    if (i < t.n4[k]) {
      p[u] = t.p[k][i];
      g[u] = t.g[k][i];
      m[u] = t.m[k][i];
      v[u] = t.v[k][i];
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = first + u * kBlock;
    if (i < t.n4[k]) {
      update4(p[u], g[u], m[u], v[u], c);
      t.p[k][i] = p[u];
      t.m[k][i] = m[u];
      t.v[k][i] = v[u];
    }
  }
}

__global__ void copy4(const float4* from, float4* to, long long n4) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    to[i] = from[i];
}

__global__ void count_different(const float* a, const float* b, long long n, unsigned long long* out) {
  unsigned long long local = 0;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    local += __float_as_uint(a[i]) != __float_as_uint(b[i]);
  if (local) atomicAdd(out, local);
}

struct Arena {
  float *p, *g, *m, *v;
  long long total;  // floats in each array, tensors at 256-byte boundaries
};

void fill_state(const Arena& a) {
  fill_random<<<1024, 256>>>(a.p, a.total, 1, -0.05f, 0.05f);
  fill_random<<<1024, 256>>>(a.g, a.total, 2, -1e-3f, 1e-3f);
  fill_random<<<1024, 256>>>(a.m, a.total, 3, -1e-4f, 1e-4f);
  fill_random<<<1024, 256>>>(a.v, a.total, 4, 0.0f, 1e-6f);
  CHECK_CUDA(cudaDeviceSynchronize());
}

template <typename Run>
float median_ms(Run run) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    run();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: adamw_bandwidth D_MODEL D_FF LAYERS [VOCAB]\n");
    return 2;
  }
  const long long d = std::atoll(argv[1]), ff = std::atoll(argv[2]), layers = std::atoll(argv[3]);
  const long long vocab = argc > 4 ? std::atoll(argv[4]) : 10000;
  // The model's tensors in its order: embedding, each layer's q, k, v, output, ln1, w1, w2, w3, ln2,
  // the final norm, the LM head.
  std::vector<long long> sizes{vocab * d};
  for (long long l = 0; l < layers; ++l)
    for (long long s : {d * d, d * d, d * d, d * d, d, ff * d, d * ff, ff * d, d}) sizes.push_back(s);
  sizes.push_back(d);
  sizes.push_back(vocab * d);

  std::vector<long long> offset;
  Arena a{};
  for (long long s : sizes) {
    offset.push_back(a.total);
    a.total += (s + 63) / 64 * 64;
  }
  for (float** x : {&a.p, &a.g, &a.m, &a.v}) CHECK_CUDA(cudaMalloc(x, a.total * 4));
  float* reference = nullptr;
  CHECK_CUDA(cudaMalloc(&reference, a.total * 4));
  unsigned long long* different = nullptr;
  CHECK_CUDA(cudaMalloc(&different, sizeof(unsigned long long)));
  long long params = 0;
  for (long long s : sizes) params += s;

  auto groups_for = [&](int vectors_a_thread) {
    std::vector<Group> groups;
    for (size_t first = 0; first < sizes.size(); first += kGroup) {
      Group gr{};
      gr.count = static_cast<int>(std::min<size_t>(kGroup, sizes.size() - first));
      long long chunks = 0;
      for (int k = 0; k < gr.count; ++k) {
        const long long o = offset[first + k];
        gr.p[k] = reinterpret_cast<float4*>(a.p + o);
        gr.g[k] = reinterpret_cast<float4*>(a.g + o);
        gr.m[k] = reinterpret_cast<float4*>(a.m + o);
        gr.v[k] = reinterpret_cast<float4*>(a.v + o);
        gr.n4[k] = sizes[first + k] / 4;
        const long long per_chunk = static_cast<long long>(kBlock) * vectors_a_thread;
        chunks += (gr.n4[k] + per_chunk - 1) / per_chunk;
        gr.chunk_end[k] = chunks;
      }
      groups.push_back(gr);
    }
    return groups;
  };

  const Consts c;
  struct Shape {
    std::string name;
    int u;  // vectors a thread (0: the shape before 7b881c2)
  };
  const std::vector<Shape> shapes{{"before 7b881c2: a block row per tensor, 1 vector a thread", 0},
                                  {"chunks, 1 vector a thread", 1},
                                  {"chunks, 2 vectors a thread", 2},
                                  {"chunks, 4 vectors a thread", 4}};
  auto run_shape = [&](const Shape& s) {
    const std::vector<Group> groups = groups_for(s.u > 0 ? s.u : 1);
    return [groups, s, c]() {
      for (const Group& gr : groups) {
        if (s.u == 0) {
          long long most = 1;
          for (int k = 0; k < gr.count; ++k) most = std::max(most, gr.n4[k]);
          as_now<<<dim3(static_cast<unsigned>((most + kBlock - 1) / kBlock), gr.count), kBlock>>>(gr, c);
        } else {
          const unsigned blocks = static_cast<unsigned>(gr.chunk_end[gr.count - 1]);
          if (s.u == 1) chunked<1><<<blocks, kBlock>>>(gr, c);
          if (s.u == 2) chunked<2><<<blocks, kBlock>>>(gr, c);
          if (s.u == 4) chunked<4><<<blocks, kBlock>>>(gr, c);
        }
      }
    };
  };

  std::printf("%lld parameters in %zu tensors, %zu launches; AdamW moves %.2f GB a step\n\n", params, sizes.size(),
              (sizes.size() + kGroup - 1) / kGroup, params * 28e-9);
  std::printf("| shape | ms a step | TB/s | parameters differing from the first shape |\n|---|---:|---:|---:|\n");
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto run = run_shape(shapes[i]);
    fill_state(a);
    run();
    unsigned long long differ = 0;
    if (i == 0) {
      CHECK_CUDA(cudaMemcpy(reference, a.p, a.total * 4, cudaMemcpyDeviceToDevice));
    } else {
      CHECK_CUDA(cudaMemset(different, 0, sizeof(unsigned long long)));
      count_different<<<1024, 256>>>(a.p, reference, a.total, different);
      CHECK_CUDA(cudaMemcpy(&differ, different, sizeof differ, cudaMemcpyDeviceToHost));
    }
    CHECK_CUDA(cudaGetLastError());
    const float ms = median_ms(run);
    std::printf("| %s | %.3f | %.2f | %llu |\n", shapes[i].name.c_str(), ms, params * 28e-9 / ms, differ);
  }
  // For reference, the rate of a plain copy (as much read as written): g into p and m into v, each
  // array whole, seven times over.
  const long long vectors = a.total / 4;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const float copy_ms = median_ms([&] {
    for (int rep = 0; rep < 7; ++rep) {
      copy4<<<sms * 8, kBlock>>>(reinterpret_cast<float4*>(a.g), reinterpret_cast<float4*>(a.p), vectors);
      copy4<<<sms * 8, kBlock>>>(reinterpret_cast<float4*>(a.m), reinterpret_cast<float4*>(a.v), vectors);
    }
  });
  std::printf("| plain copy, for its rate (%.1f GB moved) | | %.2f | |\n", 112.0 * a.total * 1e-9,
              112.0 * a.total * 1e-9 / copy_ms);
  return 0;
}
