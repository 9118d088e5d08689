// The CPU backend: the numerical reference every other backend is tested against.
// GEMMs go to OpenBLAS; everything else is a plain loop that reads like MODEL.md, parallel over
// rows with OpenMP. Every op is a template over float and double: f32 is the production type,
// f64 lets the tests check gradients against finite differences without rounding noise.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/cpu/flash_attention.h"
#include "lmscope/backend/op_scratch.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

namespace lmscope {
namespace {

template <typename F>
void dispatch(DType t, const char* op, F&& f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::f64) return f(double{});
  throw UserError(fmt::format("the CPU backend computes in f32 and f64 only, and {} was given {}", op, dtype_name(t)));
}

void expect_shape(const Tensor& t, const Shape& s, const char* what) {
  LMSCOPE_CHECK(t.shape == s, "{}: shape {} where {} was expected", what, shape_str(t.shape), shape_str(s));
}

// Pair i of a head of width dk at position p rotates by p * theta^(-2i/dk).
std::vector<double> rope_angles(std::int64_t T, std::int64_t dk, double theta) {
  std::vector<double> a(static_cast<std::size_t>(T * (dk / 2)));
  for (std::int64_t p = 0; p < T; ++p)
    for (std::int64_t i = 0; i < dk / 2; ++i)
      a[p * (dk / 2) + i] =
          static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dk));
  return a;
}

// Moves heads between [B, T, h, dk] and [B, h, T, dk], rotating pairs by sign·angle.
template <typename T>
void permute_heads(const Tensor& in, const Tensor& out, double theta, bool to_heads_major, double sign) {
  const Shape& s = to_heads_major ? in.shape : out.shape;  // [B, T, h, dk]
  LMSCOPE_CHECK(s.size() == 4, "heads permute needs [B, T, h, dk], got {}", shape_str(s));
  const std::int64_t B = s[0], Tn = s[1], H = s[2], dk = s[3];
  expect_shape(to_heads_major ? out : in, Shape{B, H, Tn, dk}, "heads-major tensor");
  LMSCOPE_CHECK(theta <= 0 || dk % 2 == 0, "RoPE needs an even head width, got {}", dk);
  std::vector<double> cs, sn;
  if (theta > 0) {
    auto ang = rope_angles(Tn, dk, theta);
    cs.resize(ang.size());
    sn.resize(ang.size());
    for (std::size_t i = 0; i < ang.size(); ++i) cs[i] = std::cos(ang[i]), sn[i] = sign * std::sin(ang[i]);
  }
  const T* src = in.as<T>();
  T* dst = out.as<T>();
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tn; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t token_major = ((b * Tn + t) * H + h) * dk, head_major = ((b * H + h) * Tn + t) * dk;
        const T* x = src + (to_heads_major ? token_major : head_major);
        T* y = dst + (to_heads_major ? head_major : token_major);
        if (theta <= 0) {
          std::memcpy(y, x, sizeof(T) * static_cast<std::size_t>(dk));
          continue;
        }
        for (std::int64_t i = 0; i < dk / 2; ++i) {
          const T c = static_cast<T>(cs[t * (dk / 2) + i]), si = static_cast<T>(sn[t * (dk / 2) + i]);
          const T x0 = x[2 * i], x1 = x[2 * i + 1];
          y[2 * i] = x0 * c - x1 * si;
          y[2 * i + 1] = x0 * si + x1 * c;
        }
      }
}

template <typename T>
void expect_dtype(const Tensor& t, const char* what) {
  LMSCOPE_CHECK(t.dtype == (std::is_same_v<T, float> ? DType::f32 : DType::f64), "{}: operands of mixed types", what);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::size_t capacity) : alloc_(capacity) {}
  std::string name() const override { return "cpu"; }
  Allocator& allocator() override { return alloc_; }
  // Every op has finished when it returns, so the host clock is the device clock.
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double elapsed_ms(int from, int to) override {
    return std::chrono::duration<double, std::milli>(marks_.at(to) - marks_.at(from)).count();
  }
  void clear_marks() override { marks_.clear(); }

  void copy_from_host(const Tensor& dst, const void* src) override { std::memcpy(dst.data, src, dst.bytes()); }
  void copy_to_host(void* dst, const Tensor& src) override { std::memcpy(dst, src.data, src.bytes()); }

  void fill(const Tensor& t, double value) override {
    dispatch(t.dtype, "fill", [&](auto z) {
      using T = decltype(z);
      std::fill_n(t.as<T>(), t.numel(), static_cast<T>(value));
    });
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    expect_shape(b, a.shape, "add b");
    expect_shape(out, a.shape, "add out");
    dispatch(a.dtype, "add", [&](auto z) {
      using T = decltype(z);
      const T *x = a.as<T>(), *y = b.as<T>();
      T* o = out.as<T>();
      const std::int64_t n = a.numel();
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
    });
  }

  void cast(const Tensor& in, const Tensor& out) override {
    expect_shape(out, in.shape, "cast out");
    dispatch(in.dtype, "cast", [&](auto zi) {
      dispatch(out.dtype, "cast", [&](auto zo) {
        using TI = decltype(zi);
        using TO = decltype(zo);
        const std::int64_t n = in.numel();
        for (std::int64_t i = 0; i < n; ++i) out.as<TO>()[i] = static_cast<TO>(in.as<TI>()[i]);
      });
    });
  }

  void gemm(const GemmArgs& g) override {
    LMSCOPE_CHECK(g.a.dtype == g.b.dtype && g.b.dtype == g.c.dtype, "gemm operands of mixed types");
    const auto ta = g.trans_a ? CblasTrans : CblasNoTrans, tb = g.trans_b ? CblasTrans : CblasNoTrans;
    const auto M = static_cast<blasint>(g.m), N = static_cast<blasint>(g.n), K = static_cast<blasint>(g.k);
    const auto lda = static_cast<blasint>(g.lda), ldb = static_cast<blasint>(g.ldb), ldc = static_cast<blasint>(g.ldc);
    dispatch(g.a.dtype, "gemm", [&](auto z) {
      using T = decltype(z);
      for (std::int64_t i = 0; i < g.batch; ++i) {
        const T* A = g.a.as<T>() + i * g.stride_a;
        const T* Bm = g.b.as<T>() + i * g.stride_b;
        T* C = g.c.as<T>() + i * g.stride_c;
        if constexpr (std::is_same_v<T, float>)
          cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, g.alpha, A, lda, Bm, ldb, g.beta, C, ldc);
        else
          cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, g.alpha, A, lda, Bm, ldb, g.beta, C, ldc);
      }
    });
  }

  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    const std::int64_t N = ids.numel(), V = table.dim(0), d = table.dim(1);
    expect_shape(out, Shape{N, d}, "embedding out");
    const std::int32_t* id = ids.as<std::int32_t>();
    for (std::int64_t n = 0; n < N; ++n)
      LMSCOPE_CHECK(id[n] >= 0 && id[n] < V, "token id {} outside the vocabulary", id[n]);
    dispatch(table.dtype, "embedding_forward", [&](auto z) {
      using T = decltype(z);
#pragma omp parallel for schedule(static)
      for (std::int64_t n = 0; n < N; ++n) {
        std::memcpy(out.as<T>() + n * d, table.as<T>() + std::int64_t{id[n]} * d,
                    sizeof(T) * static_cast<std::size_t>(d));
      }
    });
  }

  void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, bool accumulate) override {
    const std::int64_t N = ids.numel(), d = dtable.dim(1);
    expect_shape(dout, Shape{N, d}, "embedding dout");
    const std::int32_t* id = ids.as<std::int32_t>();
    if (!accumulate) fill(dtable, 0.0);
    dispatch(dtable.dtype, "embedding_backward", [&](auto z) {
      using T = decltype(z);
      // Parallel over columns: rows of repeated ids never race.
#pragma omp parallel for schedule(static)
      for (std::int64_t j = 0; j < d; ++j)
        for (std::int64_t n = 0; n < N; ++n) dtable.as<T>()[std::int64_t{id[n]} * d + j] += dout.as<T>()[n * d + j];
    });
  }

  void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& out, const Tensor& rstd, double eps) override {
    rmsnorm_rows(x, nullptr, x, w, out, rstd, eps);
  }
  // The residual's sum is made a row at a time, then normalised while the row is in cache.
  void add_rmsnorm_forward(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& w, const Tensor& out,
                           const Tensor& rstd, double eps) override {
    expect_shape(y, x.shape, "add_rmsnorm y");
    expect_shape(h, x.shape, "add_rmsnorm h");
    rmsnorm_rows(x, &y, h, w, out, rstd, eps);
  }

  void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override {
    rmsnorm_backward_rows(dout, x, w, rstd, nullptr, dx, dw);
  }
  void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                            const Tensor& dresidual, const Tensor& dx, const Tensor& dw,
                            const Tensor& dx_lowp) override {
    expect_shape(dresidual, x.shape, "rmsnorm_backward_add dresidual");
    rmsnorm_backward_rows(dout, x, w, rstd, &dresidual, dx, dw);
    if (!dx_lowp.empty()) cast(dx, dx_lowp);  // the CPU computes in its master dtype: the model never asks
  }

  void split_heads(const Tensor& in, const Tensor& out, double theta) override {
    dispatch(in.dtype, "split_heads", [&](auto z) { permute_heads<decltype(z)>(in, out, theta, true, 1.0); });
  }
  void merge_heads(const Tensor& in, const Tensor& out, double theta) override {
    dispatch(in.dtype, "merge_heads", [&](auto z) { permute_heads<decltype(z)>(in, out, theta, false, -1.0); });
  }

  void softmax_forward(const Tensor& scores, const Tensor& probs, double scale, bool causal) override {
    const std::int64_t Tk = scores.dim(-1), rows = scores.numel() / Tk, Tq = scores.dim(-2);
    expect_shape(probs, scores.shape, "softmax probs");
    dispatch(scores.dtype, "softmax_forward", [&](auto z) {
      using T = decltype(z);
#pragma omp parallel for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* s = scores.as<T>() + r * Tk;
        T* p = probs.as<T>() + r * Tk;
        const std::int64_t valid = causal ? std::min(Tk, r % Tq + 1) : Tk;
        T mx = -INFINITY;
        for (std::int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
        T sum = 0;
        for (std::int64_t j = 0; j < valid; ++j) sum += (p[j] = std::exp(static_cast<T>(scale) * (s[j] - mx)));
        const T inv = T(1) / sum;
        for (std::int64_t j = 0; j < valid; ++j) p[j] *= inv;
        for (std::int64_t j = valid; j < Tk; ++j) p[j] = 0;
      }
    });
  }

  void softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, double scale) override {
    const std::int64_t Tk = probs.dim(-1), rows = probs.numel() / Tk;
    dispatch(probs.dtype, "softmax_backward", [&](auto z) {
      using T = decltype(z);
#pragma omp parallel for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* p = probs.as<T>() + r * Tk;
        const T* dp = dprobs.as<T>() + r * Tk;
        T* ds = dscores.as<T>() + r * Tk;
        T dot = 0;
        for (std::int64_t j = 0; j < Tk; ++j) dot += p[j] * dp[j];
        for (std::int64_t j = 0; j < Tk; ++j) ds[j] = static_cast<T>(scale) * p[j] * (dp[j] - dot);
      }
    });
  }

  void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                               double scale, bool causal) override {
    const AttentionShape s = attention_shape(q, k, v, out, lse);
    dispatch(q.dtype, "flash_attention_forward", [&](auto z) {
      using T = decltype(z);
      for (const Tensor* t : {&k, &v, &out, &lse}) expect_dtype<T>(*t, "flash attention");
      cpu::flash_attention_forward<T>(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<T>(), s.n, s.tq, s.tk, s.d,
                                      static_cast<T>(scale), causal);
    });
  }

  FlashDq flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, double scale, bool causal,
                                   FlashDq /*always deterministic*/) override {
    const AttentionShape s = attention_shape(q, k, v, out, lse);
    expect_shape(dout, out.shape, "flash attention dout");
    expect_shape(dq, q.shape, "flash attention dq");
    expect_shape(dk, k.shape, "flash attention dk");
    expect_shape(dv, v.shape, "flash attention dv");
    Allocation delta = scratch::cpu_flash_backward(alloc_, s, q.dtype);
    dispatch(q.dtype, "flash_attention_backward", [&](auto z) {
      using T = decltype(z);
      for (const Tensor* t : {&k, &v, &out, &lse, &dout, &dq, &dk, &dv}) expect_dtype<T>(*t, "flash attention");
      cpu::flash_attention_backward<T>(q.as<T>(), k.as<T>(), v.as<T>(), out.as<T>(), lse.as<T>(), dout.as<T>(),
                                       dq.as<T>(), dk.as<T>(), dv.as<T>(), delta.tensor().as<T>(), s.n, s.tq, s.tk, s.d,
                                       static_cast<T>(scale), causal);
    });
    return FlashDq::deterministic;
  }

  void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& out) override {
    dispatch(a.dtype, "swiglu_forward", [&](auto z) {
      using T = decltype(z);
      const T *A = a.as<T>(), *Bv = b.as<T>();
      T* O = out.as<T>();
      const std::int64_t n = a.numel();
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < n; ++i) O[i] = A[i] / (T(1) + std::exp(-A[i])) * Bv[i];
    });
  }

  // out = a·σ(a)·b: da = dout·b·σ(a)·(1 + a·(1−σ(a))), db = dout·a·σ(a).
  void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& dout, const Tensor& da,
                       const Tensor& db) override {
    dispatch(a.dtype, "swiglu_backward", [&](auto z) {
      using T = decltype(z);
      const T *A = a.as<T>(), *Bv = b.as<T>(), *DO = dout.as<T>();
      T *DA = da.as<T>(), *DB = db.as<T>();
      const std::int64_t n = a.numel();
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        const T s = T(1) / (T(1) + std::exp(-A[i])), g = DO[i];
        const T silu = A[i] * s;
        DA[i] = g * Bv[i] * s * (T(1) + A[i] * (T(1) - s));
        DB[i] = g * silu;
      }
    });
  }

  using Backend::cross_entropy_forward;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& loss,
                             double scale, bool accumulate) override {
    const std::int64_t V = logits.dim(-1), N = logits.numel() / V;
    expect_shape(targets, Shape{N}, "cross-entropy targets");
    dispatch(logits.dtype, "cross_entropy_forward", [&](auto z) {
      using T = decltype(z);
      const std::int32_t* tg = targets.as<std::int32_t>();
      double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
      for (std::int64_t n = 0; n < N; ++n) {
        const T* x = logits.as<T>() + n * V;
        T mx = -INFINITY;
        for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j]);
        T sum = 0;
        for (std::int64_t j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
        const T l = mx + std::log(sum);
        lse.as<T>()[n] = l;
        total += static_cast<double>(l - x[tg[n]]);
      }
      const double before = accumulate ? static_cast<double>(loss.as<T>()[0]) : 0.0;
      loss.as<T>()[0] = static_cast<T>(before + total * scale);
    });
  }

  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogits,
                              double scale) override {
    const std::int64_t V = logits.dim(-1), N = logits.numel() / V;
    dispatch(logits.dtype, "cross_entropy_backward", [&](auto z) {
      using T = decltype(z);
      const std::int32_t* tg = targets.as<std::int32_t>();
#pragma omp parallel for schedule(static)
      for (std::int64_t n = 0; n < N; ++n) {
        const T* x = logits.as<T>() + n * V;
        T* dx = dlogits.as<T>() + n * V;
        const T l = lse.as<T>()[n], s = static_cast<T>(scale);
        for (std::int64_t j = 0; j < V; ++j) dx[j] = std::exp(x[j] - l) * s;
        dx[tg[n]] -= s;
      }
    });
  }

  void global_norm(std::span<const Tensor> tensors, const Tensor& out) override {
    double total = 0;
    for (const Tensor& t : tensors)
      dispatch(t.dtype, "global_norm", [&](auto z) {
        using T = decltype(z);
        const T* x = t.as<T>();
        const std::int64_t n = t.numel();
        double ss = 0;
#pragma omp parallel for reduction(+ : ss) schedule(static)
        for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        total += ss;
      });
    dispatch(out.dtype, "global_norm",
             [&](auto z) { out.as<decltype(z)>()[0] = static_cast<decltype(z)>(std::sqrt(total)); });
  }

  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWArgs& a,
             const Tensor& grad_norm, const Tensor& lowp_copy) override {
    if (!lowp_copy.empty()) throw Unsupported("the CPU backend keeps no low-precision weight copies");
    const auto [alpha, lr_decay, grad_scale] = adamw_step_scalars(a);
    double clip = 1.0, norm = 0;
    if (a.max_norm > 0 || a.skip_nonfinite)
      dispatch(grad_norm.dtype, "adamw", [&](auto z) { norm = static_cast<double>(grad_norm.as<decltype(z)>()[0]); });
    if (a.skip_nonfinite && !std::isfinite(norm)) return;
    if (a.max_norm > 0) clip = std::min(1.0, a.max_norm / (norm * grad_scale + 1e-6));
    clip *= grad_scale;
    dispatch(param.dtype, "adamw", [&](auto z) {
      using T = decltype(z);
      T *P = param.as<T>(), *M = m.as<T>(), *Vv = v.as<T>();
      const T* G = grad.as<T>();
      const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2), eps = static_cast<T>(a.eps);
      const T al = static_cast<T>(alpha), decay = static_cast<T>(lr_decay), c = static_cast<T>(clip);
      const std::int64_t n = param.numel();
#pragma omp parallel for simd schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        const T g = G[i] * c;
        M[i] = b1 * M[i] + (T(1) - b1) * g;
        Vv[i] = b2 * Vv[i] + (T(1) - b2) * g * g;
        T p = P[i] - al * M[i] / (std::sqrt(Vv[i]) + eps);
        P[i] = p - decay * p;
      }
    });
  }

 private:
  // y = x·r·w with r = (mean(x²)+eps)^(-1/2), over rows of x, or of h = x + y when y is given (written
  // to h; the sum as add makes it).
  void rmsnorm_rows(const Tensor& x, const Tensor* y, const Tensor& h, const Tensor& w, const Tensor& out,
                    const Tensor& rstd, double eps) {
    const std::int64_t d = x.dim(-1), N = x.numel() / d;
    expect_shape(rstd, Shape{N}, "rmsnorm rstd");
    dispatch(x.dtype, "rmsnorm_forward", [&](auto z) {
      using T = decltype(z);
#pragma omp parallel for schedule(static)
      for (std::int64_t n = 0; n < N; ++n) {
        const T* xi = x.as<T>() + n * d;
        T* hi = h.as<T>() + n * d;
        if (y)
          for (std::int64_t j = 0; j < d; ++j) hi[j] = xi[j] + y->as<T>()[n * d + j];
        T* yi = out.as<T>() + n * d;
        T ss = 0;
        for (std::int64_t j = 0; j < d; ++j) ss += hi[j] * hi[j];
        const T r = T(1) / std::sqrt(ss / static_cast<T>(d) + static_cast<T>(eps));
        rstd.as<T>()[n] = r;
        for (std::int64_t j = 0; j < d; ++j) yi[j] = hi[j] * r * w.as<T>()[j];
      }
    });
  }

  // dx = r·(w∘dy) − x·r³·mean(x∘w∘dy) (+ dresidual when given, added as add adds it), dw = Σ_rows dy∘x·r.
  void rmsnorm_backward_rows(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                             const Tensor* dresidual, const Tensor& dx, const Tensor& dw) {
    const std::int64_t d = x.dim(-1), N = x.numel() / d;
    dispatch(x.dtype, "rmsnorm_backward", [&](auto z) {
      using T = decltype(z);
      const T *X = x.as<T>(), *DY = dout.as<T>(), *W = w.as<T>(), *R = rstd.as<T>();
      const T* DR = dresidual ? dresidual->as<T>() : nullptr;
#pragma omp parallel for schedule(static)
      for (std::int64_t n = 0; n < N; ++n) {
        const T* xi = X + n * d;
        const T* dyi = DY + n * d;
        T dot = 0;
        for (std::int64_t j = 0; j < d; ++j) dot += xi[j] * W[j] * dyi[j];
        const T r = R[n], c = r * r * r * dot / static_cast<T>(d);
        T* dxi = dx.as<T>() + n * d;
        for (std::int64_t j = 0; j < d; ++j) dxi[j] = r * W[j] * dyi[j] - xi[j] * c;
        if (DR)
          for (std::int64_t j = 0; j < d; ++j) dxi[j] += DR[n * d + j];
      }
      T* DW = dw.as<T>();
#pragma omp parallel for schedule(static)
      for (std::int64_t j = 0; j < d; ++j) {
        T acc = 0;
        for (std::int64_t n = 0; n < N; ++n) acc += DY[n * d + j] * X[n * d + j] * R[n];
        DW[j] = acc;
      }
    });
  }

  HostAllocator alloc_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::size_t memory_capacity) {
  return std::make_unique<CpuBackend>(memory_capacity);
}

}  // namespace lmscope
