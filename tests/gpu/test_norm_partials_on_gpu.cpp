// The global gradient norm in parts (Backend::norm_partials, norm_from_partials), as data parallelism
// takes it: each bucket's partial sums on the exchange's own stream (Backend::on_stream) as its
// all-reduce ends, last bucket first; the optimizer adds them up. Bit for bit the norm taken at once,
// in fp32 and bf16 gradients, tensors off 16-byte alignment among them; and the fused AdamW told the
// norm is ready updates as the one that takes it. Skipped without a GPU.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/core/rng.h"
#include "lmscope/cuda/stream_pool.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <vector>

namespace lmscope::test {
namespace {

std::vector<double> draws(std::uint64_t seed, std::int64_t n, double scale) {
  Rng rng(seed);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = scale * (2 * rng.uniform() - 1);
  return v;
}

std::uint32_t bits(Backend& be, const Tensor& norm) {
  const float f = static_cast<float>(download(be, norm)[0]);
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(NormPartialsOnGpu, BucketsOnAnotherStreamGiveTheNormTakenAtOnce) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto be = make_backend("cuda", "bf16");
    Allocator& mem = be->allocator();
    // 70 tensors (more than one launch's worth), odd sizes, every fifth from its second element.
    std::vector<Allocation> held;
    std::vector<Tensor> grads;
    for (int i = 0; i < 70; ++i) {
      const std::int64_t n = 1 + (i * 7919) % 20011;
      Allocation values = mem.allocate({n + 1}, DType::f32, {MemKind::workspace, "values", -1});
      upload(*be, values, draws(static_cast<std::uint64_t>(i), n + 1, 0.2));
      held.push_back(mem.allocate({n + 1}, dtype, {MemKind::gradient, "g", -1}));
      be->cast(values, held.back());
      grads.push_back(i % 5 == 2 ? held.back().tensor().rows(1, n) : held.back().tensor().rows(0, n));
    }
    Allocation once = mem.allocate({1}, DType::f32, {MemKind::workspace, "norm", -1});
    Allocation parts = mem.allocate({1}, DType::f32, {MemKind::workspace, "norm", -1});
    be->fill(parts, -1.0);
    be->global_norm(grads, once);
    const std::uint32_t want = bits(*be, once);
    EXPECT_GT(download(*be, once)[0], 1.0);

    // The buckets as the exchange's stream sees them: the model's order reversed, uneven sizes.
    cudaStream_t side = cuda::take_stream();
    cudaEvent_t ready = nullptr, done = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ready, static_cast<cudaStream_t>(be->cuda_stream())), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side, ready, 0), cudaSuccess);
    const std::span<const Tensor> all(grads);
    for (std::size_t end = grads.size(), size = 1; end > 0; size = size * 3 % 17 + 1) {
      const std::size_t first = end > size ? end - size : 0;
      be->on_stream(side, [&] { be->norm_partials(all.subspan(first, end - first), first, grads.size()); });
      end = first;
    }
    ASSERT_EQ(cudaEventRecord(done, side), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(static_cast<cudaStream_t>(be->cuda_stream()), done, 0), cudaSuccess);
    be->norm_from_partials(grads.size(), parts);
    EXPECT_EQ(bits(*be, parts), want);

    // And the ops after on_stream go to the backend's own stream again: a fill seen at once.
    be->fill(parts, 2.0);
    EXPECT_EQ(download(*be, parts)[0], 2.0);
    be->synchronize();
    cudaEventDestroy(ready);
    cudaEventDestroy(done);
    cuda::give_back_stream(side);
  }
}

TEST(NormPartialsOnGpu, FusedAdamWWithTheNormReadyUpdatesAsTheOneThatTakesIt) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  auto be = make_backend("cuda", "bf16");
  Allocator& mem = be->allocator();
  const std::vector<std::int64_t> sizes = {4096, 1027, 3, 50001, 77};
  struct State {
    std::vector<Allocation> p, m, v;
    Allocation norm;
  };
  std::vector<Allocation> g;
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    g.push_back(mem.allocate({sizes[i]}, DType::f32, {MemKind::gradient, "g", -1}));
    upload(*be, g.back(), draws(300 + i, sizes[i], 0.5));
    grads.push_back(g.back().tensor());
  }
  auto run = [&](bool ready) {
    State s;
    std::vector<Tensor> p, m, v;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (auto* list : {&s.p, &s.m, &s.v}) list->push_back(mem.allocate({sizes[i]}, DType::f32, {}));
      upload(*be, s.p.back(), draws(100 + i, sizes[i], 1.0));
      upload(*be, s.m.back(), draws(200 + i, sizes[i], 0.01));
      std::vector<double> vv = draws(400 + i, sizes[i], 0.01);
      for (double& x : vv) x = x * x;
      upload(*be, s.v.back(), vv);
      p.push_back(s.p.back().tensor());
      m.push_back(s.m.back().tensor());
      v.push_back(s.v.back().tensor());
    }
    s.norm = mem.allocate({1}, DType::f32, {});
    be->fill(s.norm, -1.0);
    AdamWArgs args{.lr = 1e-2, .step = 2, .max_norm = 1.0, .norm_ready = ready};
    if (ready) {
      be->norm_partials(grads, 0, grads.size());
      be->norm_from_partials(grads.size(), s.norm);
    }
    be->adamw_all(
        p, grads, m, v, args, s.norm, [](std::size_t) { return Tensor{}; }, [](std::size_t) {});
    return s;
  };
  const State a = run(false), b = run(true);
  EXPECT_EQ(bits(*be, a.norm), bits(*be, b.norm));
  EXPECT_GT(download(*be, a.norm)[0], 1.0) << "the norm must clip";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(download(*be, a.p[i]), download(*be, b.p[i])) << "parameter " << i;
    EXPECT_EQ(download(*be, a.m[i]), download(*be, b.m[i])) << "first moment " << i;
    EXPECT_EQ(download(*be, a.v[i]), download(*be, b.v[i])) << "second moment " << i;
  }
}

}  // namespace
}  // namespace lmscope::test
