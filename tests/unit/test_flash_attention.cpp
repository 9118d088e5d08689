// FlashAttention-2 on the CPU backend: against attention evaluated from its definition, on the
// assignment's own cases, and on bad shapes (its finite differences: the op table's flash rows).
#include "../common/attention_reference.h"
#include "gradcheck.h"

#include "lmscope/model/attention.h"

namespace lmscope::test {
namespace {

// The problem's tensors on the CPU backend in f32 or f64, run through flash forward and backward.
struct FlashRun {
  std::vector<double> o, lse, dq, dk, dv;
  FlashRun(Backend& be, const AttentionProblem& p, DType dtype) {
    auto tensor = [&](Shape s, const std::vector<double>* values) {
      Allocation a = be.allocator().allocate(std::move(s), dtype, {MemKind::workspace, "test", -1});
      if (values) upload(be, a, *values);
      return a;
    };
    Allocation q = tensor({p.n, p.tq, p.d}, &p.q), k = tensor({p.n, p.tk, p.d}, &p.k),
               v = tensor({p.n, p.tk, p.d}, &p.v), g = tensor({p.n, p.tq, p.d}, &p.dout);
    Allocation out = tensor({p.n, p.tq, p.d}, nullptr), l = tensor({p.n, p.tq}, nullptr);
    Allocation gq = tensor({p.n, p.tq, p.d}, nullptr), gk = tensor({p.n, p.tk, p.d}, nullptr),
               gv = tensor({p.n, p.tk, p.d}, nullptr);
    be.flash_attention_forward(q, k, v, out, l, p.scale(), p.causal);
    be.flash_attention_backward(q, k, v, out, l, g, gq, gk, gv, p.scale(), p.causal, FlashDq::fastest);
    o = download(be, out), lse = download(be, l), dq = download(be, gq), dk = download(be, gk), dv = download(be, gv);
  }
};

class Flash : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend();
};

// Odd lengths (1, tile ± 1, several partial tiles), every head dim the GPU kernels specialise,
// tq ≠ tk, both masks.
TEST_F(Flash, MatchesTheDefinitionOnOddShapes) {
  struct Case {
    std::int64_t n, tq, tk, d;
  };
  const Case cases[] = {{1, 1, 1, 16},    {2, 63, 63, 32},   {1, 65, 65, 64}, {3, 130, 130, 80},
                        {1, 200, 77, 96}, {2, 64, 129, 128}, {2, 37, 37, 5},  {1, 129, 129, 4}};
  std::uint64_t seed = 1;
  for (const Case& c : cases)
    for (bool causal : {true, false})
      for (DType dtype : {DType::f64, DType::f32}) {
        const AttentionProblem p(c.n, c.tq, c.tk, c.d, causal, seed++);
        const FlashRun r(*be, p, dtype);
        const double tol = dtype == DType::f64 ? 1e-12 : 2e-6;
        const std::string what =
            fmt::format("n {} tq {} tk {} d {} causal {} {}", c.n, c.tq, c.tk, c.d, causal, dtype_name(dtype));
        EXPECT_LT(relative_error(r.o, p.o), tol) << what << ": o";
        EXPECT_LT(relative_error(r.lse, p.lse), tol) << what << ": lse";
        EXPECT_LT(relative_error(r.dq, p.dq), tol) << what << ": dq";
        EXPECT_LT(relative_error(r.dk, p.dk), tol) << what << ": dk";
        EXPECT_LT(relative_error(r.dv, p.dv), tol) << what << ": dv";
      }
}

// The assignment's tests: q, k, v of shape (4, 128, 64) in fp32, causal and not; O and L within
// 1e-2 of the reference, dq, dk, dv within 1e-2 of autograd on it (here: the exact gradient).
TEST_F(Flash, TheAssignmentsCases) {
  for (bool causal : {false, true}) {
    const AttentionProblem p(4, 128, 128, 64, causal, 2026);
    const FlashRun r(*be, p, DType::f32);
    EXPECT_LT(max_abs_error(r.o, p.o), 1e-2);
    EXPECT_LT(max_abs_error(r.lse, p.lse), 1e-2);
    EXPECT_LT(max_abs_error(r.dq, p.dq), 1e-2);
    EXPECT_LT(max_abs_error(r.dk, p.dk), 1e-2);
    EXPECT_LT(max_abs_error(r.dv, p.dv), 1e-2);
  }
}

// The model's two attention forms agree through the shared entry points.
TEST_F(Flash, NaiveAndFlashAgreeThroughTheAttentionModule) {
  const AttentionProblem p(3, 70, 70, 16, true, 11);
  std::vector<double> results[2][4];
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
    auto t = [&](const std::vector<double>* x) {
      Allocation a = be->allocator().allocate({p.n, p.tq, p.d}, DType::f64, {MemKind::workspace, "test", -1});
      if (x) upload(*be, a, *x);
      return a;
    };
    Allocation q = t(&p.q), k = t(&p.k), v = t(&p.v), g = t(&p.dout), o = t(nullptr), dq = t(nullptr), dk = t(nullptr),
               dv = t(nullptr);
    const AttentionCall call{
        .kind = kind, .causal = true, .dq = FlashDq::deterministic, .stats = DType::f64, .layer = 0};
    AttentionSaved saved;
    attention_forward(*be, call, q, k, v, o, saved);
    attention_backward(*be, call, q, k, v, o, g, dq, dk, dv, saved);
    EXPECT_TRUE(saved.probs.empty() && saved.lse.empty()) << "backward frees what forward saved";
    const int i = kind == AttentionKind::flash;
    results[i][0] = download(*be, o), results[i][1] = download(*be, dq), results[i][2] = download(*be, dk),
    results[i][3] = download(*be, dv);
  }
  for (int j = 0; j < 4; ++j) EXPECT_LT(relative_error(results[1][j], results[0][j]), 1e-12) << j;
}

TEST_F(Flash, MismatchedShapesAreRefused) {
  auto q = zeros(*be, {2, 8, 16}), k = zeros(*be, {2, 9, 16}), v = zeros(*be, {2, 9, 8}), o = zeros(*be, {2, 8, 16});
  auto lse = zeros(*be, {2, 8}), bad_lse = zeros(*be, {2, 9});
  EXPECT_THROW(be->flash_attention_forward(q, k, v, o, lse, 1.0, false), std::logic_error);  // v's width
  EXPECT_THROW(be->flash_attention_forward(q, k, k, o, bad_lse, 1.0, false), std::logic_error);
  EXPECT_NO_THROW(be->flash_attention_forward(q, k, k, o, lse, 1.0, false));
}

}  // namespace
}  // namespace lmscope::test
