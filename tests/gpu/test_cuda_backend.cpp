// The CUDA backend beyond the op table's values against the CPU (tests/gpu/test_op_table_on_gpu.cpp):
// each kernel variant's bits (packs, alignment, fused against unfused, launches of many), 20 training
// steps of a whole model, out of memory, and the kernel tracer.
// Every test skips (and ctest reports it skipped) where no GPU is visible. One file past 600 lines:
// the tests share one fixture (the twin CPU and CUDA backends and their helpers).
#include "../common/training.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/devices.h"
#include "lmscope/backend/op_scratch.h"
#include "lmscope/core/rng.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"
#include "lmscope/precision/number_formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace lmscope::test {
namespace {

// The same tensor on both backends.
struct Twin {
  Allocation cpu, gpu;
};

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
    cpu = make_cpu_backend();
    gpu = make_cuda_backend(GemmMath::fp32);
  }
  Twin random(Shape s, double scale = 1.0) {
    Twin t{cpu->allocator().allocate(s, DType::f32, {}), gpu->allocator().allocate(s, DType::f32, {})};
    std::vector<double> v(static_cast<std::size_t>(shape_numel(s)));
    for (double& x : v) x = scale * rng.normal();
    upload(*cpu, t.cpu, v);
    upload(*gpu, t.gpu, v);
    return t;
  }
  // Poisoned outputs: an element the kernel forgets to write shows up as a NaN.
  Twin output(Shape s) {
    Twin t{cpu->allocator().allocate(s, DType::f32, {}), gpu->allocator().allocate(s, DType::f32, {})};
    cpu->fill(t.cpu, NAN);
    gpu->fill(t.gpu, NAN);
    return t;
  }
  // Runs f; the kernel of its launches whose name starts with `kernel` (as the kernel tracer names
  // it, with its template arguments): which variant a dispatch chose. None where CUPTI is taken
  // (under compute-sanitizer): f still runs, and only the variant goes unchecked.
  std::optional<std::string> launched(const std::string& kernel, const std::function<void()>& f) {
    std::unique_ptr<KernelTracer> tracer;
    try {
      tracer = gpu->kernel_tracer();
    } catch (const std::exception&) {
      f();
      return std::nullopt;
    }
    f();
    for (const KernelRecord& r : tracer->finish().work)
      if (r.name.starts_with(kernel + "<")) return r.name;
    return "(" + kernel + " not launched)";
  }
  // A vector's elements from its second on: off alignment for packs, where the vector was not.
  static Tensor from_second(const Tensor& t) { return t.rows(1, t.numel() - 1); }
  // A copy of a twin's GPU side one element past its allocation's start: off alignment for packs.
  std::pair<Allocation, Tensor> shifted_copy(const Tensor& t) {
    Allocation a = gpu->allocator().allocate({t.numel() + 1}, t.dtype, {});
    const Tensor view = a.tensor().rows(1, t.numel()).view(t.shape);
    gpu->cast(t, view);
    return {std::move(a), view};
  }
  // RMSNorm forward and backward on both backends, each on its side of the twins.
  void rmsnorm_on_both(const Twin& x, const Twin& w, const Twin& dy, const Twin& y, const Twin& r, const Twin& dx,
                       const Twin& dw) {
    for (Backend* b : {cpu.get(), gpu.get()}) {
      const bool c = b == cpu.get();
      b->rmsnorm_forward(c ? x.cpu : x.gpu, c ? w.cpu : w.gpu, c ? y.cpu : y.gpu, c ? r.cpu : r.gpu, 1e-5);
      b->rmsnorm_backward(c ? dy.cpu : dy.gpu, c ? x.cpu : x.gpu, c ? w.cpu : w.gpu, c ? r.cpu : r.gpu,
                          c ? dx.cpu : dx.gpu, c ? dw.cpu : dw.gpu);
    }
  }
  // A GPU tensor's f32 values, as stored.
  std::vector<float> download_raw(const Tensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    gpu->copy_to_host(v.data(), t);
    return v;
  }
  // A 16-bit GPU tensor's bits.
  std::vector<std::uint16_t> download_bits16(const Tensor& t) {
    EXPECT_EQ(dtype_size(t.dtype), 2u);
    std::vector<std::uint16_t> v(static_cast<std::size_t>(t.numel()));
    gpu->copy_to_host(v.data(), t);
    return v;
  }
  Twin ids(std::int64_t n, std::int64_t vocab) {
    Twin t{cpu->allocator().allocate({n}, DType::i32, {}), gpu->allocator().allocate({n}, DType::i32, {})};
    std::vector<std::int32_t> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
    cpu->copy_from_host(t.cpu, v.data());
    gpu->copy_from_host(t.gpu, v.data());
    return t;
  }
  void expect_close(const Twin& t, double tol, const std::string& what) {
    auto a = download(*gpu, t.gpu), b = download(*cpu, t.cpu);
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_FALSE(std::isnan(a[i])) << what << ": element " << i << " is NaN (unwritten?)";
      err += (a[i] - b[i]) * (a[i] - b[i]);
      ref += b[i] * b[i];
    }
    ASSERT_GT(ref, 0) << what;
    EXPECT_LT(std::sqrt(err / ref), tol) << what;
  }
  std::unique_ptr<Backend> cpu, gpu;
  Rng rng{2024};
};

constexpr double kFp32 = 1e-5;

// The dw kernel takes two columns a thread where d is even and the rows aligned: the same bits as
// one, forced by a gradient one element off alignment; and the CPU's values. N 1001: rows that do
// not fill the last unrolled round; d 2562: a last column tile of one pair.
TEST_F(CudaVsCpu, RmsNormDwSameBitsWhateverColumnsAThread) {
  for (const std::int64_t d : {1280, 2562}) {
    SCOPED_TRACE(d);
    const std::int64_t N = 1001;
    auto x = random({N, d}), w = random({d}), dy = random({N, d});
    auto y = output({N, d}), r = output({N}), dx = output({N, d}), dw = output({d}), dw1 = output({d});
    rmsnorm_on_both(x, w, dy, y, r, dx, dw);
    expect_close(dw, kFp32, "rmsnorm dw");
    const auto [kept, unaligned] = shifted_copy(dy.gpu);
    const auto pairs = launched("rmsnorm_backward_dw_kernel",
                                [&] { gpu->rmsnorm_backward(dy.gpu, x.gpu, w.gpu, r.gpu, dx.gpu, dw.gpu); });
    EXPECT_TRUE(!pairs || pairs->ends_with(", 2, true>")) << *pairs;
    const auto ones = launched("rmsnorm_backward_dw_kernel",
                               [&] { gpu->rmsnorm_backward(unaligned, x.gpu, w.gpu, r.gpu, dx.gpu, dw1.gpu); });
    EXPECT_TRUE(!ones || ones->ends_with(", 1, true>")) << *ones;
    EXPECT_EQ(download(*gpu, dw.gpu), download(*gpu, dw1.gpu));
  }
}

// With two rows or more for each of the dx kernel's 1024 blocks, it also sums dw's terms into partials
// (rmsnorm_backward_dx_dw_kernel) and a second kernel adds them: the CPU's dx and dw, plain and fused
// with the residual's gradient, and dx the very bits of the kernel without partials, which row by row
// computes the same (the first 37 rows alone take that one). N 4133 and 2100: rows that do not fill
// the last round of blocks; d 203: one element a thread.
TEST_F(CudaVsCpu, RmsNormBackwardWithDwPartials) {
  for (auto [N, d] : {std::pair<std::int64_t, std::int64_t>{4133, 1280}, {4133, 203}, {2100, 1024}, {2100, 203}}) {
    SCOPED_TRACE(std::to_string(N) + " rows of " + std::to_string(d));
    const std::int64_t few = 37;
    auto x = random({N, d}), w = random({d}), dy = random({N, d}), dres = random({N, d});
    auto y = output({N, d}), r = output({N}), dx = output({N, d}), dw = output({d});
    auto dxf = output({N, d}), dwf = output({d});
    const auto kernel = launched("rmsnorm_backward_dx_dw_kernel", [&] { rmsnorm_on_both(x, w, dy, y, r, dx, dw); });
    EXPECT_TRUE(!kernel || kernel->ends_with(d % 4 == 0 ? ", 4>" : ", 1>")) << *kernel;
    expect_close(dx, kFp32, "rmsnorm dx");
    expect_close(dw, kFp32, "rmsnorm dw");
    for (Backend* b : {cpu.get(), gpu.get()}) {
      const bool c = b == cpu.get();
      b->rmsnorm_backward_add(c ? dy.cpu : dy.gpu, c ? x.cpu : x.gpu, c ? w.cpu : w.gpu, c ? r.cpu : r.gpu,
                              c ? dres.cpu : dres.gpu, c ? dxf.cpu : dxf.gpu, c ? dwf.cpu : dwf.gpu, Tensor{});
    }
    expect_close(dxf, kFp32, "fused rmsnorm dx");
    EXPECT_EQ(download(*gpu, dwf.gpu), download(*gpu, dw.gpu));
    auto dx_few = output({few, d}), dw_few = output({d});
    const auto plain = launched("rmsnorm_backward_dx_kernel", [&] {
      gpu->rmsnorm_backward(dy.gpu.tensor().rows(0, few), x.gpu.tensor().rows(0, few), w.gpu,
                            r.gpu.tensor().rows(0, few), dx_few.gpu, dw_few.gpu);
    });
    EXPECT_TRUE(!plain || plain->starts_with("rmsnorm_backward_dx_kernel<")) << *plain;
    const std::vector<float> all = download_raw(dx.gpu), first = download_raw(dx_few.gpu);
    EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + few * d), first);
  }
}

// The widest rows that take the partials: the block's column sums and its reduction's scratch fit the
// 48 KiB of shared memory a launch has without asking (one column more failed to launch).
TEST_F(CudaVsCpu, RmsNormBackwardWithDwPartialsAtTheWidestRows) {
  const std::int64_t N = scratch::kRmsNormDwBlocks * scratch::kRmsNormDwMinRows, d = scratch::kRmsNormDwMaxD;
  auto x = random({N, d}), w = random({d}), dy = random({N, d});
  auto y = output({N, d}), r = output({N}), dx = output({N, d}), dw = output({d});
  const auto kernel = launched("rmsnorm_backward_dx_dw_kernel", [&] { rmsnorm_on_both(x, w, dy, y, r, dx, dw); });
  EXPECT_TRUE(!kernel || kernel->ends_with(", 4>")) << *kernel;
  expect_close(dx, kFp32, "rmsnorm dx");
  expect_close(dw, kFp32, "rmsnorm dw");
}

// The forward kernels take four elements a thread where d is a multiple of 4, in packs where the
// buffers allow and one by one where not: the fused kernel on buffers off alignment gives the bits
// of the add and the plain kernel on aligned ones.
TEST_F(CudaVsCpu, RmsNormForwardSameBitsWhateverAlignment) {
  const std::int64_t N = 37, d = 256;
  auto x = random({N, d}), y = random({N, d}), w = random({d});
  auto h = output({N, d}), out = output({N, d}), r = output({N}), h2 = output({N, d}), out2 = output({N, d}),
       r2 = output({N});
  const auto [kx, x_off] = shifted_copy(x.gpu);
  const auto [ky, y_off] = shifted_copy(y.gpu);
  const auto fused = launched("add_rmsnorm_forward_kernel",
                              [&] { gpu->add_rmsnorm_forward(x_off, y_off, h.gpu, w.gpu, out.gpu, r.gpu, 1e-5); });
  EXPECT_TRUE(!fused || *fused == "add_rmsnorm_forward_kernel<float, float, float, 4, false>") << *fused;
  gpu->add(x.gpu, y.gpu, h2.gpu);
  const auto plain =
      launched("rmsnorm_forward_kernel", [&] { gpu->rmsnorm_forward(h2.gpu, w.gpu, out2.gpu, r2.gpu, 1e-5); });
  EXPECT_TRUE(!plain || *plain == "rmsnorm_forward_kernel<float, float, 4, true>") << *plain;
  for (auto [a, b] : {std::pair{&h, &h2}, {&out, &out2}, {&r, &r2}})
    EXPECT_EQ(download(*gpu, a->gpu), download(*gpu, b->gpu));
  cpu->add(x.cpu, y.cpu, h.cpu);
  cpu->rmsnorm_forward(h.cpu, w.cpu, out.cpu, r.cpu, 1e-5);
  expect_close(out, kFp32, "rmsnorm off alignment");
}

// The add in 16-byte packs gives the one-element-a-thread bits (its tail and unaligned tensors go that
// way), in f32 and in bf16 as the all-gather's gradient sums run it, out aliasing an input; f32 equals
// the CPU's to the bit; add_all's launches of many give add()'s bits.
TEST_F(CudaVsCpu, AddInPacksGivesTheElementByElementBits) {
  const std::int64_t n = 4099;  // not a multiple of any pack
  auto a = random({n}), b = random({n}), sum = output({n}), ref = output({n});
  const auto [ka, a_off] = shifted_copy(a.gpu);
  const auto packed = launched("add_kernel", [&] { gpu->add(a.gpu, b.gpu, sum.gpu); });
  EXPECT_TRUE(!packed || *packed == "add_kernel<float, float, float, 4>") << *packed;
  const auto single = launched("add_kernel", [&] { gpu->add(a_off, b.gpu, ref.gpu); });
  EXPECT_TRUE(!single || *single == "add_kernel<float, float, float, 1>") << *single;
  EXPECT_EQ(download(*gpu, sum.gpu), download(*gpu, ref.gpu));
  cpu->add(a.cpu, b.cpu, sum.cpu);
  EXPECT_EQ(download(*gpu, ref.gpu), download(*cpu, sum.cpu));
  for (DType t : {DType::bf16, DType::f16}) {
    Allocation x = gpu->allocator().allocate({n}, t, {}), y = gpu->allocator().allocate({n}, t, {});
    gpu->cast(a.gpu, x);
    gpu->cast(b.gpu, y);
    const auto [kx, x_off] = shifted_copy(x);
    const auto [ky, y_off] = shifted_copy(y);
    gpu->add(x_off, y_off, y_off);  // one by one, into an input
    gpu->add(x, y, y);              // in packs, into an input
    EXPECT_EQ(download_bits16(y), download_bits16(y_off)) << dtype_name(t);
  }
  // add_all: many triples a launch (28 bf16 in a row: two launches; aligned and not; then one in f32
  // and one of mixed dtypes; outputs aliasing either input), the bits of add() one by one.
  std::vector<Allocation> keep;
  std::vector<Tensor> as, bs, outs, outs_one;
  for (int i = 0; i < 30; ++i) {
    const std::int64_t m = 1 + 97 * i;
    const DType tx = i >= 28 ? DType::f32 : DType::bf16, ty = i == 28 ? DType::f32 : DType::bf16;
    for (int copy = 0; copy < 2; ++copy) {
      Allocation x = gpu->allocator().allocate({m + 1}, tx, {}), y = gpu->allocator().allocate({m + 1}, ty, {});
      gpu->cast(a.gpu.tensor().rows(0, m + 1), x);
      gpu->cast(b.gpu.tensor().rows(i, m + 1), y);
      const Tensor xs = i % 3 == 1 ? x.tensor().rows(1, m) : x.tensor().rows(0, m);
      const Tensor ys = i % 3 == 1 ? y.tensor().rows(1, m) : y.tensor().rows(0, m);
      (copy ? outs_one : outs).push_back(i % 2 ? xs : ys);
      if (!copy) {
        as.push_back(xs);
        bs.push_back(ys);
      } else {
        gpu->add(xs, ys, outs_one.back());
      }
      keep.push_back(std::move(x));
      keep.push_back(std::move(y));
    }
  }
  const auto fused = launched("add_many_kernel", [&] { gpu->add_all(as, bs, outs); });
  EXPECT_TRUE(!fused || *fused == "add_many_kernel<__nv_bfloat16>") << *fused;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].dtype == DType::f32)
      EXPECT_EQ(download_raw(outs[i]), download_raw(outs_one[i])) << "triple " << i;
    else
      EXPECT_EQ(download_bits16(outs[i]), download_bits16(outs_one[i])) << "triple " << i;
  }
}

// The fused residual add + RMSNorm and RMSNorm backward + residual gradient give on the GPU the very
// values of the two ops they replace (their values against the CPU's: the op table's add_rmsnorm rows).
TEST_F(CudaVsCpu, FusedResidualAndRmsNormGiveTheTwoOpsBits) {
  for (const std::int64_t d : {203, 256}) {  // 256: the dx kernel's four elements at a time
    SCOPED_TRACE(d);
    const std::int64_t N = 37;
    auto x = random({N, d}), y = random({N, d}), w = random({d}), dy = random({N, d}), dres = random({N, d});
    auto h = output({N, d}), out = output({N, d}), r = output({N}), dx = output({N, d}), dw = output({d});
    gpu->add_rmsnorm_forward(x.gpu, y.gpu, h.gpu, w.gpu, out.gpu, r.gpu, 1e-5);
    gpu->rmsnorm_backward_add(dy.gpu, h.gpu, w.gpu, r.gpu, dres.gpu, dx.gpu, dw.gpu, Tensor{});
    auto h2 = output({N, d}), out2 = output({N, d}), r2 = output({N}), dx2 = output({N, d}), dw2 = output({d});
    gpu->add(x.gpu, y.gpu, h2.gpu);
    gpu->rmsnorm_forward(h2.gpu, w.gpu, out2.gpu, r2.gpu, 1e-5);
    gpu->rmsnorm_backward(dy.gpu, h2.gpu, w.gpu, r2.gpu, dx2.gpu, dw2.gpu);
    gpu->add(dx2.gpu, dres.gpu, dx2.gpu);
    for (auto [fused, plain] : {std::pair{&out, &out2}, {&r, &r2}, {&dx, &dx2}, {&dw, &dw2}})
      EXPECT_EQ(download(*gpu, fused->gpu), download(*gpu, plain->gpu));
  }
}

// Moves of several tensors in one launch (up to three, each with its own angle; a fourth takes a
// second launch): each the bits of split_heads or merge_heads alone, one pair a thread (dk 18) and
// 16 bytes a thread (dk 64).
TEST_F(CudaVsCpu, HeadsMovedTogetherGiveTheBitsOfEachAlone) {
  for (auto [T, dk] : {std::pair<std::int64_t, std::int64_t>{37, 18}, {77, 64}}) {
    SCOPED_TRACE(dk);
    const std::int64_t B = 3, H = 5;
    const double thetas[4] = {10000.0, 10000.0, 0.0, 500.0};
    std::vector<Twin> twins;  // per move: tokens, heads alone, heads together, tokens back alone, back together
    Tensor tokens[4], together[4], heads[4], back[4];
    for (int i = 0; i < 4; ++i) {
      twins.push_back(random({B, T, H, dk}));
      twins.push_back(output({B, H, T, dk}));
      twins.push_back(output({B, H, T, dk}));
      twins.push_back(output({B, T, H, dk}));
      twins.push_back(output({B, T, H, dk}));
    }
    for (int i = 0; i < 4; ++i) {
      tokens[i] = twins[5 * i].gpu;
      together[i] = twins[5 * i + 2].gpu;
      back[i] = twins[5 * i + 4].gpu;
      gpu->split_heads(tokens[i], twins[5 * i + 1].gpu, thetas[i]);
      heads[i] = twins[5 * i + 1].gpu;
    }
    gpu->split_heads_all(tokens, together, thetas);
    gpu->merge_heads_all(heads, back, thetas);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(download_raw(together[i]), download_raw(heads[i])) << "split " << i;
      gpu->merge_heads(heads[i], twins[5 * i + 3].gpu, thetas[i]);
      EXPECT_EQ(download_raw(back[i]), download_raw(twins[5 * i + 3].gpu)) << "merge " << i;
    }
  }
}

TEST_F(CudaVsCpu, HeadsSixteenBytesAThreadGiveTheOnePairKernelsBits) {
  // Rows one pair off 16-byte alignment take the one-pair kernel; aligned rows the 16-byte one.
  const std::int64_t B = 2, T = 37, H = 3, dk = 64, n = B * T * H * dk;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto x = random({n});
    Allocation xs = gpu->allocator().allocate({n + 2}, dt, {}), ys = gpu->allocator().allocate({n + 2}, dt, {});
    std::vector<std::vector<std::uint8_t>> got;
    for (std::int64_t at : {0, 2}) {
      const Tensor in = xs.tensor().rows(at, n).view({B, T, H, dk}), out = ys.tensor().rows(at, n).view({B, H, T, dk});
      gpu->cast(x.gpu, xs.tensor().rows(at, n));
      for (bool split : {true, false}) {
        if (split)
          gpu->split_heads(in, out, 10000.0);
        else
          gpu->merge_heads(out, in, 10000.0);
        std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n) * dtype_size(dt));
        gpu->copy_to_host(bytes.data(), split ? out : in);
        got.push_back(std::move(bytes));
      }
    }
    EXPECT_EQ(got[0], got[2]) << "split";
    EXPECT_EQ(got[1], got[3]) << "merge";
  }
}

// V 1237: one element a load; 1240: four (16 bytes of fp32), and the backward's values the same bits
// as one at a time, which logits one element off alignment force (the values against the CPU's: the
// op table's cross_entropy rows).
TEST_F(CudaVsCpu, CrossEntropySameBitsWhateverAlignment) {
  for (const std::int64_t V : {1237, 1240}) {
    SCOPED_TRACE(V);
    const std::int64_t N = 33;
    auto x = random({N, V}, 2.0), lse = output({N}), loss = output({1}), dx = output({N, V});
    auto t = ids(N, V);
    const auto rows =
        launched("cross_entropy_rows_kernel", [&] { gpu->cross_entropy_forward(x.gpu, t.gpu, lse.gpu, loss.gpu); });
    EXPECT_TRUE(!rows || rows->ends_with(V % 4 == 0 ? ", 4>" : ", 1>")) << *rows;
    gpu->cross_entropy_backward(x.gpu, t.gpu, lse.gpu, dx.gpu, 1.0 / N);
    const auto [kept, unaligned] = shifted_copy(x.gpu);
    auto dx1 = output({N, V});
    const auto ones = launched("cross_entropy_backward_kernel",
                               [&] { gpu->cross_entropy_backward(unaligned, t.gpu, lse.gpu, dx1.gpu, 1.0 / N); });
    EXPECT_TRUE(!ones || ones->ends_with(", 1>")) << *ones;
    EXPECT_EQ(download_raw(dx.gpu), download_raw(dx1.gpu));
  }
}

// The fused step (the norm and AdamW over many tensors a launch) gives the per-tensor ops' bits: 30
// tensors of odd sizes, more than one launch's worth, every seventh off 16-byte alignment (its
// elements one by one), clipping on and the rate read from the device, bf16 copies written for every
// other tensor; each copy asked for before its gradient is said read. Then again with an infinite
// gradient under skip_nonfinite: parameters and moments left as they were, the copies still written.
TEST_F(CudaVsCpu, FusedAdamWGivesThePerTensorBits) {
  for (bool overflow : {false, true}) {
    SCOPED_TRACE(overflow ? "infinite gradient, skipped" : "finite");
    std::vector<Twin> p, g, m, v, p2, m2, v2;
    for (int i = 0; i < 30; ++i) {
      const std::int64_t n = 1 + (i * 7919) % 5003;
      p.push_back(random({n}));
      g.push_back(random({n}));
      m.push_back(random({n}, 0.1));
      v.push_back(random({n}, 0.1));
      std::vector<double> vv = download(*gpu, v.back().gpu);
      for (double& x : vv) x = std::fabs(x);  // a second moment is never negative
      upload(*gpu, v.back().gpu, vv);
      for (auto [from, to] : {std::pair{&p, &p2}, {&m, &m2}, {&v, &v2}}) {
        to->push_back(output({n}));
        gpu->copy_from_host(to->back().gpu, download_raw(from->back().gpu).data());
      }
    }
    std::vector<std::vector<double>> before;  // the parameters before the step
    for (const Twin& x : p) before.push_back(download(*gpu, x.gpu));
    if (overflow) {
      std::vector<double> gg = download(*gpu, g[5].gpu);
      gg[gg.size() / 2] = std::numeric_limits<double>::infinity();
      upload(*gpu, g[5].gpu, gg);
    }
    // Tensor i as the step sees it: from its second element where i % 7 == 3 (off alignment).
    auto view = [](const Tensor& t, std::size_t i) { return i % 7 != 3 || t.numel() < 2 ? t : from_second(t); };
    auto gpu_side = [&](const std::vector<Twin>& t) {
      std::vector<Tensor> out;
      for (std::size_t i = 0; i < t.size(); ++i) out.push_back(view(t[i].gpu, i));
      return out;
    };
    std::vector<Allocation> copies, copies2;
    for (std::size_t i = 0; i < p.size(); ++i)
      for (auto* c : {&copies, &copies2})
        c->push_back(i % 2 ? gpu->allocator().allocate(p[i].gpu.tensor().shape, DType::bf16, {}) : Allocation{});
    auto copy_view = [&](const std::vector<Allocation>& c, std::size_t i) {
      return c[i].tensor().data ? view(c[i].tensor(), i) : Tensor{};
    };
    auto norm = output({1}), norm2 = output({1}), scalars = output({3});
    AdamWArgs args{
        .lr = 1e-2, .step = 3, .max_norm = 1.0, .step_scalars = scalars.gpu.tensor(), .skip_nonfinite = overflow};
    const std::array<double, 3> k = adamw_step_scalars(args);
    upload(*gpu, scalars.gpu, k);
    std::vector<std::size_t> asked, read;
    gpu->adamw_all(
        gpu_side(p), gpu_side(g), gpu_side(m), gpu_side(v), args, norm.gpu,
        [&](std::size_t i) {
          asked.push_back(i);
          return copy_view(copies, i);
        },
        [&](std::size_t i) {
          EXPECT_EQ(std::count(asked.begin(), asked.end(), i), 1) << "gradient " << i << " read before its copy";
          read.push_back(i);
        });
    gpu->global_norm(gpu_side(g), norm2.gpu);
    for (std::size_t i = 0; i < p.size(); ++i)
      gpu->adamw(view(p2[i].gpu, i), view(g[i].gpu, i), view(m2[i].gpu, i), view(v2[i].gpu, i), args, norm2.gpu,
                 copy_view(copies2, i));
    EXPECT_EQ(download(*gpu, norm.gpu), download(*gpu, norm2.gpu));
    EXPECT_EQ(std::isfinite(download(*gpu, norm.gpu)[0]), !overflow);
    ASSERT_EQ(asked.size(), p.size());
    ASSERT_EQ(read.size(), p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(asked[i], i);
      EXPECT_EQ(read[i], i);
      if (i % 2) {
        EXPECT_EQ(download_bits16(copy_view(copies, i)), download_bits16(copy_view(copies2, i))) << "bf16 copy " << i;
      }
      EXPECT_EQ(download(*gpu, p[i].gpu), download(*gpu, p2[i].gpu)) << "parameter " << i;
      EXPECT_EQ(download(*gpu, m[i].gpu), download(*gpu, m2[i].gpu)) << "first moment " << i;
      EXPECT_EQ(download(*gpu, v[i].gpu), download(*gpu, v2[i].gpu)) << "second moment " << i;
    }
    for (std::size_t i = 0; overflow && i < p.size(); ++i)
      EXPECT_EQ(download(*gpu, p[i].gpu), before[i]) << "parameter " << i << " left as it was";
    if (overflow) {
      Allocation cast_back = gpu->allocator().allocate(p[1].gpu.tensor().shape, DType::bf16, {});
      gpu->cast(p[1].gpu, cast_back.tensor());
      EXPECT_EQ(download_bits16(copies[1]), download_bits16(cast_back)) << "the copy of a kept parameter";
    } else {
      EXPECT_NE(download(*gpu, p[0].gpu), before[0]) << "the step must move the parameters";
    }
  }
}

TEST_F(CudaVsCpu, TwentyTrainingStepsMatchTheCpu) {
  ModelConfig c = tiny_model();
  c.vocab = 503;  // the LM head's GEMMs and the cross-entropy's rows on partial tiles
  const std::int64_t B = 3, T = 37;
  std::vector<std::int32_t> x(B * T), y(B * T);
  for (auto* v : {&x, &y})
    for (auto& t : *v) t = static_cast<std::int32_t>(rng.below(503));
  const auto on_cpu = twenty_step_losses(*cpu, c, std::nullopt, B, T, x, y),
             on_gpu = twenty_step_losses(*gpu, c, std::nullopt, B, T, x, y);
  EXPECT_LT(on_cpu.back(), on_cpu.front() - 0.5) << "the run must train";
  for (int i = 0; i < 20; ++i) EXPECT_LT(std::fabs(on_gpu[i] - on_cpu[i]) / on_cpu[i], 1e-4) << "step " << i + 1;
}

// ---- bf16 and fp16 storage (fp32 arithmetic) against the fp32 CPU reference, within 1e-2 ----
constexpr double kLowp = 1e-2;

class LowpVsCpu : public CudaVsCpu, public ::testing::WithParamInterface<DType> {
 protected:
  // A copy of a twin's GPU side in the 16-bit type under test.
  Allocation lowp(const Twin& t) {
    Allocation a = gpu->allocator().allocate(t.gpu.tensor().shape, GetParam(), {});
    gpu->cast(t.gpu, a);
    return a;
  }
  Allocation lowp_output(const Shape& s) {
    Allocation a = gpu->allocator().allocate(s, GetParam(), {});
    gpu->fill(a, NAN);
    return a;
  }
  // Widens a 16-bit result into the twin's GPU side, then compares with the CPU side.
  void expect_close_lowp(const Allocation& result, Twin& ref, const std::string& what) {
    gpu->cast(result, ref.gpu);
    expect_close(ref, kLowp, what);
  }
};
INSTANTIATE_TEST_SUITE_P(Storage, LowpVsCpu, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The dw kernel's two columns a thread from a 16-bit gradient (4-byte loads of it): the CPU's values,
// and the bits of one column a thread (RmsNormDwSameBitsWhateverColumnsAThread).
TEST_P(LowpVsCpu, RmsNormDwFromWidePacks) {
  for (const std::int64_t d : {1280, 2562}) {
    SCOPED_TRACE(d);
    const std::int64_t N = 1001;
    auto x = random({N, d}), w = random({d}), r = output({N}), dy = random({N, d}), y = output({N, d});
    auto dx = output({N, d}), dw = output({d}), dw1 = output({d});
    cpu->rmsnorm_forward(x.cpu, w.cpu, y.cpu, r.cpu, 1e-5);
    cpu->rmsnorm_backward(dy.cpu, x.cpu, w.cpu, r.cpu, dx.cpu, dw.cpu);
    gpu->rmsnorm_forward(x.gpu, w.gpu, y.gpu, r.gpu, 1e-5);
    Allocation dyb = lowp(dy);
    const auto [kept, unaligned] = shifted_copy(dyb);
    const auto pairs = launched("rmsnorm_backward_dw_kernel",
                                [&] { gpu->rmsnorm_backward(dyb, x.gpu, w.gpu, r.gpu, dx.gpu, dw.gpu); });
    EXPECT_TRUE(!pairs || pairs->ends_with(", 2, true>")) << *pairs;
    expect_close(dw, kLowp, "rmsnorm dw from a 16-bit gradient");
    const auto ones = launched("rmsnorm_backward_dw_kernel",
                               [&] { gpu->rmsnorm_backward(unaligned, x.gpu, w.gpu, r.gpu, dx.gpu, dw1.gpu); });
    EXPECT_TRUE(!ones || ones->ends_with(", 1, true>")) << *ones;
    EXPECT_EQ(download(*gpu, dw.gpu), download(*gpu, dw1.gpu));
  }
}

// The dx kernel that also sums dw's terms (RmsNormBackwardWithDwPartials) from a 16-bit gradient
// (8-byte loads of it): the CPU's values.
TEST_P(LowpVsCpu, RmsNormBackwardWithDwPartials) {
  const std::int64_t N = 4133, d = 1280;
  auto x = random({N, d}), w = random({d}), r = output({N}), dy = random({N, d}), y = output({N, d});
  auto dx = output({N, d}), dw = output({d});
  cpu->rmsnorm_forward(x.cpu, w.cpu, y.cpu, r.cpu, 1e-5);
  cpu->rmsnorm_backward(dy.cpu, x.cpu, w.cpu, r.cpu, dx.cpu, dw.cpu);
  gpu->rmsnorm_forward(x.gpu, w.gpu, y.gpu, r.gpu, 1e-5);
  Allocation dyb = lowp(dy);
  const auto kernel = launched("rmsnorm_backward_dx_dw_kernel",
                               [&] { gpu->rmsnorm_backward(dyb, x.gpu, w.gpu, r.gpu, dx.gpu, dw.gpu); });
  EXPECT_TRUE(!kernel || kernel->ends_with(", 4>")) << *kernel;
  expect_close(dx, kLowp, "rmsnorm dx from a 16-bit gradient");
  expect_close(dw, kLowp, "rmsnorm dw from a 16-bit gradient");
}

// The residual's gradient in 16 bits from the same pass as dx (the GEMMs after read it so): the bits
// cast(dx) gives, and dx itself the bits of the call without it; from the dx kernel alone (37 rows)
// and from the one that also sums dw's partials (4133 rows), four elements a thread and one.
TEST_P(LowpVsCpu, RmsNormBackwardAddWritesDxInSixteenBits) {
  for (auto [N, d] : {std::pair<std::int64_t, std::int64_t>{37, 256}, {37, 203}, {4133, 1280}, {4133, 203}}) {
    SCOPED_TRACE(std::to_string(N) + " rows of " + std::to_string(d));
    auto x = random({N, d}), w = random({d}), r = output({N}), dy = random({N, d}), y = output({N, d});
    auto dres = random({N, d}), dx = output({N, d}), dw = output({d}), dx2 = output({N, d}), dw2 = output({d});
    gpu->rmsnorm_forward(x.gpu, w.gpu, y.gpu, r.gpu, 1e-5);
    Allocation dyb = lowp(dy), dxl = lowp_output({N, d}), cast = lowp_output({N, d});
    gpu->rmsnorm_backward_add(dyb, x.gpu, w.gpu, r.gpu, dres.gpu, dx.gpu, dw.gpu, dxl);
    gpu->rmsnorm_backward_add(dyb, x.gpu, w.gpu, r.gpu, dres.gpu, dx2.gpu, dw2.gpu, Tensor{});
    EXPECT_EQ(download_raw(dx.gpu), download_raw(dx2.gpu));
    EXPECT_EQ(download_raw(dw.gpu), download_raw(dw2.gpu));
    gpu->cast(dx.gpu, cast);
    EXPECT_EQ(download_bits16(dxl), download_bits16(cast));
  }
}

// The residual add + RMSNorm fused, a 16-bit branch into the f32 stream: the two ops' bits (their values
// against the CPU's: the op table's add_rmsnorm rows in bf16 and f16).
TEST_P(LowpVsCpu, FusedRmsNormForwardGivesTheTwoOpsBits) {
  const std::int64_t N = 37;
  for (const std::int64_t d : {203, 256}) {  // 256: four elements a thread
    SCOPED_TRACE(d);
    auto x = random({N, d}), w = random({d}), r = output({N}), part = random({N, d}), h = output({N, d}),
         h2 = output({N, d}), wide = output({N, d}), wide2 = output({N, d});
    Allocation partb = lowp(part), fused = lowp_output({N, d}), plain = lowp_output({N, d});
    gpu->add_rmsnorm_forward(x.gpu, partb, h.gpu, w.gpu, fused, r.gpu, 1e-5);
    gpu->add(x.gpu, partb, h2.gpu);
    gpu->rmsnorm_forward(h2.gpu, w.gpu, plain, r.gpu, 1e-5);
    EXPECT_EQ(download(*gpu, h.gpu), download(*gpu, h2.gpu));
    gpu->cast(fused, wide.gpu);
    gpu->cast(plain, wide2.gpu);
    EXPECT_EQ(download(*gpu, wide.gpu), download(*gpu, wide2.gpu)) << "16-bit fused rmsnorm";
  }
}

// Casts round to nearest even, in 16-byte packs and in the tail, and where a pointer is off a pack's
// alignment; widening back is exact.
TEST_P(LowpVsCpu, CastsRoundToNearestEvenAtAnyAlignment) {
  const std::int64_t n = 1027;  // 256 packs of 4 and a tail of 3
  auto x = random({n + 1}, 3.0);
  Allocation narrow = lowp_output({n + 1});
  auto wide = output({n + 1});
  const NumberFormat& format = GetParam() == DType::bf16 ? bf16_format() : fp16_format();
  const std::vector<double> in = download(*gpu, x.gpu);
  for (std::int64_t offset : {0, 1}) {
    auto at = [&](const Tensor& t) {
      return Tensor{static_cast<char*>(t.data) + offset * static_cast<std::int64_t>(dtype_size(t.dtype)), t.dtype, {n}};
    };
    gpu->fill(narrow, NAN);
    gpu->fill(wide.gpu, NAN);
    gpu->cast(at(x.gpu), at(narrow));
    gpu->cast(at(narrow), at(wide.gpu));
    const std::vector<double> widened = download(*gpu, wide.gpu);
    for (std::int64_t i = 0; i < n; ++i) {  // the fp32 value rounded on the host, widened exactly
      const double want = round_to(format, static_cast<float>(in[offset + i]));
      ASSERT_EQ(widened[offset + i], want) << "offset " << offset << ", element " << i;
    }
  }
}

// cast_all (the forward's casts of a layer's weight copies) gives cast()'s bits pair by pair: more
// pairs than one launch takes, three runs of dtypes in one call (the second changing only the output's
// type), tails, a short pair off 16-byte alignment; and nothing at all for no pairs.
TEST_P(LowpVsCpu, CastAllGivesTheBitsOfCastsOneByOne) {
  gpu->cast_all({}, {});
  std::vector<Twin> masters;
  std::vector<Allocation> keep;  // every output, alive to the end
  std::vector<Tensor> ins, outs, one_by_one;
  auto add = [&](const Tensor& in, const Tensor& all, const Tensor& one) {
    ins.push_back(in);
    outs.push_back(all);
    one_by_one.push_back(one);
    gpu->cast(in, one);
  };
  const int pairs = cuda::kTensorsPerLaunch + 3;
  for (int i = 0; i < pairs; ++i) {  // f32 to the 16-bit type; the last 3 elements long and unaligned
    const bool last = i + 1 == pairs;
    const std::int64_t n = last ? 4 : 2 + 97 * i + i % 4;
    masters.push_back(random({n}, 3.0));
    const Tensor in = masters.back().gpu, all = keep.emplace_back(lowp_output({n})),
                 one = keep.emplace_back(lowp_output({n}));
    if (last)
      add(from_second(in), from_second(all), from_second(one));
    else
      add(in, all, one);
  }
  for (int i = 0; i < 2; ++i) {  // f32 to f32
    const Tensor in = masters[static_cast<std::size_t>(i)].gpu;
    add(in, keep.emplace_back(output(in.shape).gpu), keep.emplace_back(output(in.shape).gpu));
  }
  for (int i = 0; i < 3; ++i) {  // the 16-bit type back to f32
    const Tensor in = one_by_one[static_cast<std::size_t>(i)];
    add(in, keep.emplace_back(output(in.shape).gpu), keep.emplace_back(output(in.shape).gpu));
  }
  gpu->cast_all(ins, outs);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].dtype == DType::f32)
      EXPECT_EQ(download_raw(outs[i]), download_raw(one_by_one[i])) << "pair " << i;
    else
      EXPECT_EQ(download_bits16(outs[i]), download_bits16(one_by_one[i])) << "pair " << i;
  }
}

TEST_P(LowpVsCpu, AdamWRefreshesTheLowPrecisionCopy) {
  auto p = random({999}), g = random({999}), m = random({999}, 0.0), v = random({999}, 0.0), norm = output({1});
  gpu->fill(m.gpu, 0.0);
  gpu->fill(v.gpu, 0.0);
  Allocation copy = lowp_output({999});
  gpu->global_norm(std::vector<Tensor>{g.gpu}, norm.gpu);
  gpu->adamw(p.gpu, g.gpu, m.gpu, v.gpu, AdamWArgs{.lr = 1e-2, .step = 1}, norm.gpu, copy);
  Twin widened{cpu->allocator().allocate({999}, DType::f32, {}), gpu->allocator().allocate({999}, DType::f32, {})};
  upload(*cpu, widened.cpu, download(*gpu, p.gpu));
  expect_close_lowp(copy, widened, "16-bit copy of the updated parameter");
}

// bf16's and fp16's loss curves within 2% of fp32's over 20 steps, all on the GPU (fp16 with the
// optimizer's dynamic loss scaling).
TEST_P(LowpVsCpu, TrainingFollowsFp32) {
  const ModelConfig c = gpu_model();
  const std::int64_t B = 4, T = 64;
  std::vector<std::int32_t> x(B * T), y(B * T);
  for (auto* v : {&x, &y})
    for (auto& t : *v) t = static_cast<std::int32_t>(rng.below(503));
  const auto fp32 = twenty_step_losses(*gpu, c, std::nullopt, B, T, x, y),
             low = twenty_step_losses(*gpu, c, GetParam(), B, T, x, y);
  EXPECT_LT(fp32.back(), fp32.front() - 0.5) << "the run must train";
  for (int i = 0; i < 20; ++i) EXPECT_LT(std::fabs(low[i] - fp32[i]) / fp32[i], 0.02) << "step " << i + 1;
}

TEST_F(CudaVsCpu, OutOfMemoryIsReportedAndRecovered) {
  Allocator& mem = gpu->allocator();
  const std::size_t before = mem.current_bytes();
  try {
    auto huge = mem.allocate({std::int64_t(1) << 40}, DType::f32, {MemKind::activation, "huge", 3});
    FAIL() << "4 TiB was granted";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), std::size_t(4) << 40);
    EXPECT_NE(std::string(e.what()).find("huge (activation, layer 3)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(mem.current_bytes(), before);
  auto ok = mem.allocate({1 << 20}, DType::f32, {});  // the device still works
  gpu->fill(ok, 1.0);
  gpu->synchronize();
}

TEST_F(CudaVsCpu, KernelTracerSeesEveryKernelInItsPhase) {
  Twin x = random({37, 129});
  auto steady_ns = [] {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  };
  const std::uint64_t before = steady_ns();
  auto tracer = gpu->kernel_tracer();
  ASSERT_TRUE(tracer);
  tracer->set_phase(Phase::forward);
  gpu->fill(x.gpu, 1.0);
  tracer->set_phase(Phase::optimizer);
  gpu->add(x.gpu, x.gpu, x.gpu);
  gpu->add(x.gpu, x.gpu, x.gpu);
  const DeviceActivity activity = tracer->finish();
  const std::uint64_t after = steady_ns();
  const std::vector<KernelRecord>& records = activity.work;
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].name, "fill_kernel<float>");
  EXPECT_EQ(records[0].phase, Phase::forward);
  for (int i : {1, 2}) {
    EXPECT_EQ(records[i].name, "add_kernel<float, float, float, 4>");
    EXPECT_EQ(records[i].phase, Phase::optimizer);
    EXPECT_GE(records[i].start_ns, records[i - 1].end_ns);  // one stream: in order, no overlap
  }
  for (const KernelRecord& r : records) {
    EXPECT_LT(r.start_ns, r.end_ns);
    // On the host's steady clock, within the traced stretch, after the call that launched it.
    EXPECT_GE(r.start_ns, before);
    EXPECT_LE(r.end_ns, after);
    EXPECT_EQ(r.work, DeviceWork::kernel);
    EXPECT_GT(r.grid[0] * r.block[0], 0u);
    EXPECT_EQ(r.stream, records[0].stream);
    auto launch = std::find_if(activity.launches.begin(), activity.launches.end(),
                               [&](const LaunchRecord& l) { return l.correlation == r.correlation; });
    ASSERT_NE(launch, activity.launches.end()) << r.name;
    EXPECT_EQ(launch->api, "cudaLaunchKernel");
    EXPECT_LE(launch->start_ns, r.start_ns);
  }
  EXPECT_TRUE(gpu->kernel_tracer()) << "a finished tracer frees the way for the next";
}

}  // namespace
}  // namespace lmscope::test
