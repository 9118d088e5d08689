// The op table's rows: each op of backend.h the model uses, described once. Sizes are odd where a
// kernel has packs or tiles (rows 7 and 37, widths 33 and 203, vocabularies 37 and 1237, heads of
// width 5 and 18, lengths 37 and 1029), beside the even ones that take the packed paths (d 256,
// V 1240, dk 64), and large enough where a CUDA kernel changes its plan with the rows (RMSNorm over
// 1000 rows, embeddings of 5003 rows).
#include "op_cases.h"

#include <fmt/format.h>

#include <cmath>

namespace lmscope::test {
namespace {

using enum Prec;
constexpr std::initializer_list<Prec> kAll = {f64, f32, bf16, f16};
constexpr double kEps = 1e-5;

TensorSpec in(std::string name, Shape s, Role r = Role::compute, Init init = {}) {
  return {std::move(name), std::move(s), r, Io::in, init};
}
TensorSpec out(std::string name, Shape s, Role r = Role::compute) {
  return {std::move(name), std::move(s), r, Io::out, {}};
}
TensorSpec inout(std::string name, Shape s, Role r = Role::compute, Init init = {}) {
  return {std::move(name), std::move(s), r, Io::inout, init};
}

// C[b] = alpha · op(A[b]) · op(B[b]) + beta · C[b], planned beside `held` SMs held by collectives.
OpCase gemm(bool ta, bool tb, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, Role c_role,
            int held) {
  OpCase c;
  c.name = fmt::format("gemm_{}{}_{}x{}x{}", ta ? 't' : 'n', tb ? 't' : 'n', m, n, k);
  if (batch > 1) c.name += fmt::format("_batch{}", batch);
  if (c_role == Role::master) c.name += "_into_f32";
  if (held) c.name += fmt::format("_beside{}sms", held);
  const float alpha = 0.5f, beta = 0.25f;
  c.tensors = {in("a", {batch, ta ? k : m, ta ? m : k}), in("b", {batch, tb ? n : k, tb ? k : n}),
               inout("c", {batch, m, n}, c_role)};
  c.precs = {f64, f32, tf32, bf16, f16};
  c.run = [=](Backend& be, const Args& t) {
    GemmArgs g = GemmArgs::packed(ta, tb, m, n, k, t["a"], t["b"], t["c"], beta, batch);
    g.alpha = alpha;
    be.set_collective_sms(held);
    be.gemm(g);
    be.set_collective_sms(0);
  };
  c.formula = [=](const Values& v) {
    const std::vector<double>&A = v.at("a"), &B = v.at("b");
    std::vector<double> C = v.at("c");
    for (std::int64_t z = 0; z < batch; ++z)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (std::int64_t l = 0; l < k; ++l)
            s += A[z * m * k + (ta ? l * m + i : i * k + l)] * B[z * k * n + (tb ? j * k + l : l * n + j)];
          double& cij = C[(z * m + i) * n + j];
          cij = alpha * s + beta * cij;
        }
    return Values{{"c", C}};
  };
  return c;
}

// y[n, j] = x[n, j] · r[n] · w[j], r[n] = (mean_j x[n, j]² + eps)^(-1/2), for x the sum h where given.
Values rmsnorm_formula(const std::vector<double>& x, const std::vector<double>& w, std::int64_t rows, std::int64_t d,
                       const char* y_name) {
  std::vector<double> y(x.size()), r(static_cast<std::size_t>(rows));
  for (std::int64_t n = 0; n < rows; ++n) {
    double ms = 0;
    for (std::int64_t j = 0; j < d; ++j) ms += x[n * d + j] * x[n * d + j] / static_cast<double>(d);
    r[n] = 1 / std::sqrt(ms + kEps);
    for (std::int64_t j = 0; j < d; ++j) y[n * d + j] = x[n * d + j] * r[n] * w[j];
  }
  return {{y_name, y}, {"rstd", r}};
}

OpCase rmsnorm(std::int64_t rows, std::int64_t d) {
  OpCase c;
  c.name = fmt::format("rmsnorm_{}x{}", rows, d);
  c.tensors = {in("x", {rows, d}, Role::master),
               in("w", {d}, Role::master),
               in("dy", {rows, d}),
               out("y", {rows, d}),
               out("rstd", {rows}, Role::stat),
               out("dx", {rows, d}, Role::master),
               out("dw", {d}, Role::master)};
  c.precs = kAll;
  c.forward = [](Backend& be, const Args& t) { be.rmsnorm_forward(t["x"], t["w"], t["y"], t["rstd"], kEps); };
  c.run = [fwd = c.forward](Backend& be, const Args& t) {
    fwd(be, t);
    be.rmsnorm_backward(t["dy"], t["x"], t["w"], t["rstd"], t["dx"], t["dw"]);
  };
  c.loss = {{"y", "dy"}};
  c.grads = {{"x", "dx"}, {"w", "dw"}};
  c.formula = [=](const Values& v) { return rmsnorm_formula(v.at("x"), v.at("w"), rows, d, "y"); };
  return c;
}

// The fused residual add + RMSNorm and the RMSNorm backward + residual gradient (--fusion): the loss
// ⟨out, dy⟩ + ⟨h, dres⟩ makes dx (and its compute-dtype copy) the gradient of both x and the branch y.
OpCase add_rmsnorm(std::int64_t rows, std::int64_t d) {
  OpCase c;
  c.name = fmt::format("add_rmsnorm_{}x{}", rows, d);
  c.tensors = {in("x", {rows, d}, Role::master),
               in("y", {rows, d}),
               in("w", {d}, Role::master),
               in("dy", {rows, d}),
               in("dres", {rows, d}, Role::master),
               out("h", {rows, d}, Role::master),
               out("out", {rows, d}),
               out("rstd", {rows}, Role::stat),
               out("dx", {rows, d}, Role::master),
               out("dw", {d}, Role::master),
               out("dx_lowp", {rows, d})};
  c.precs = kAll;
  c.forward = [](Backend& be, const Args& t) {
    be.add_rmsnorm_forward(t["x"], t["y"], t["h"], t["w"], t["out"], t["rstd"], kEps);
  };
  c.run = [fwd = c.forward](Backend& be, const Args& t) {
    fwd(be, t);
    be.rmsnorm_backward_add(t["dy"], t["h"], t["w"], t["rstd"], t["dres"], t["dx"], t["dw"], t["dx_lowp"]);
  };
  c.loss = {{"out", "dy"}, {"h", "dres"}};
  c.grads = {{"x", "dx"}, {"y", "dx"}, {"w", "dw"}, {"x", "dx_lowp"}};
  c.formula = [=](const Values& v) {
    std::vector<double> h = v.at("x");
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += v.at("y")[i];
    Values r = rmsnorm_formula(h, v.at("w"), rows, d, "out");
    r["h"] = h;
    return r;
  };
  return c;
}

// [B, T, h, dk] -> [B, h, T, dk] rotating pair i at position p by p·theta^(-2i/dk), and back: the
// gradient of the split is the merge.
OpCase heads(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t dk, double theta) {
  OpCase c;
  c.name = fmt::format("heads_{}x{}x{}x{}_theta{}", b, t, h, dk, theta);
  c.tensors = {in("x", {b, t, h, dk}), in("dy", {b, h, t, dk}), out("y", {b, h, t, dk}), out("dx", {b, t, h, dk})};
  c.precs = kAll;
  c.forward = [=](Backend& be, const Args& a) { be.split_heads(a["x"], a["y"], theta); };
  c.run = [=, fwd = c.forward](Backend& be, const Args& a) {
    fwd(be, a);
    be.merge_heads(a["dy"], a["dx"], theta);
  };
  c.loss = {{"y", "dy"}};
  c.grads = {{"x", "dx"}};
  c.formula = [=](const Values& v) {
    const std::vector<double>& x = v.at("x");
    std::vector<double> y(x.size());
    for (std::int64_t z = 0; z < b; ++z)
      for (std::int64_t p = 0; p < t; ++p)
        for (std::int64_t j = 0; j < h; ++j)
          for (std::int64_t i = 0; i < dk / 2; ++i) {
            const double ang =
                theta > 0 ? static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / dk) : 0.0;
            const double x0 = x[((z * t + p) * h + j) * dk + 2 * i], x1 = x[((z * t + p) * h + j) * dk + 2 * i + 1];
            y[((z * h + j) * t + p) * dk + 2 * i] = x0 * std::cos(ang) - x1 * std::sin(ang);
            y[((z * h + j) * t + p) * dk + 2 * i + 1] = x0 * std::sin(ang) + x1 * std::cos(ang);
          }
    return Values{{"y", y}};
  };
  return c;
}

OpCase softmax(std::int64_t rows, std::int64_t t, bool causal, double scale) {
  OpCase c;
  c.name = fmt::format("softmax_{}x{}x{}{}", rows, t, t, causal ? "_causal" : "");
  c.tensors = {in("s", {rows, t, t}, Role::compute, {Init::normal, 3.0}), in("dp", {rows, t, t}),
               out("p", {rows, t, t}), out("ds", {rows, t, t})};
  c.precs = kAll;
  c.forward = [=](Backend& be, const Args& a) { be.softmax_forward(a["s"], a["p"], scale, causal); };
  c.run = [=, fwd = c.forward](Backend& be, const Args& a) {
    fwd(be, a);
    be.softmax_backward(a["p"], a["dp"], a["ds"], scale);
  };
  c.loss = {{"p", "dp"}};
  c.grads = {{"s", "ds"}};
  c.formula = [=](const Values& v) {
    const std::vector<double>& s = v.at("s");
    std::vector<double> p(s.size(), 0.0);
    for (std::int64_t r = 0; r < rows * t; ++r) {
      const std::int64_t seen = causal ? r % t + 1 : t;
      double z = 0;
      for (std::int64_t j = 0; j < seen; ++j) z += std::exp(scale * s[r * t + j]);
      for (std::int64_t j = 0; j < seen; ++j) p[r * t + j] = std::exp(scale * s[r * t + j]) / z;
    }
    return Values{{"p", p}};
  };
  return c;
}

OpCase swiglu(std::int64_t rows, std::int64_t f) {
  OpCase c;
  c.name = fmt::format("swiglu_{}x{}", rows, f);
  c.tensors = {in("a", {rows, f}, Role::compute, {Init::normal, 2.0}),
               in("b", {rows, f}),
               in("dy", {rows, f}),
               out("y", {rows, f}),
               out("da", {rows, f}),
               out("db", {rows, f})};
  c.precs = kAll;
  c.forward = [](Backend& be, const Args& t) { be.swiglu_forward(t["a"], t["b"], t["y"]); };
  c.run = [fwd = c.forward](Backend& be, const Args& t) {
    fwd(be, t);
    be.swiglu_backward(t["a"], t["b"], t["dy"], t["da"], t["db"]);
  };
  c.loss = {{"y", "dy"}};
  c.grads = {{"a", "da"}, {"b", "db"}};
  c.formula = [](const Values& v) {
    const std::vector<double>&a = v.at("a"), &b = v.at("b");
    std::vector<double> y(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) y[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
    return Values{{"y", y}};
  };
  return c;
}

// The mean cross-entropy of the rows; in place: dlogits written over the logits, as the model does.
OpCase cross_entropy(std::int64_t rows, std::int64_t vocab, bool in_place) {
  OpCase c;
  c.name = fmt::format("cross_entropy_{}x{}{}", rows, vocab, in_place ? "_in_place" : "");
  const Init logits_init{Init::normal, 2.0};
  c.tensors = {in_place ? inout("logits", {rows, vocab}, Role::compute, logits_init)
                        : in("logits", {rows, vocab}, Role::compute, logits_init),
               in("targets", {rows}, Role::ids, {Init::ids, static_cast<double>(vocab)}),
               out("lse", {rows}, Role::stat), out("loss", {1}, Role::stat)};
  if (!in_place) c.tensors.push_back(out("dlogits", {rows, vocab}));
  const std::string dx = in_place ? "logits" : "dlogits";
  c.precs = kAll;
  c.forward = [](Backend& be, const Args& t) {
    be.cross_entropy_forward(t["logits"], t["targets"], t["lse"], t["loss"]);
  };
  c.run = [=, fwd = c.forward](Backend& be, const Args& t) {
    fwd(be, t);
    be.cross_entropy_backward(t["logits"], t["targets"], t["lse"], t[dx], 1.0 / static_cast<double>(rows));
  };
  c.loss = {{"loss", ""}};
  c.grads = {{"logits", dx}};
  // Over a large vocabulary a logit's gradient is of order 1/(rows·vocab), 2e-5 against a loss of 7:
  // the central differences' rounding is then some 1e-5 of it.
  if (vocab > 1000) c.tol.gradient = 1e-4;
  c.formula = [=](const Values& v) {
    const std::vector<double>&x = v.at("logits"), &y = v.at("targets");
    std::vector<double> lse(static_cast<std::size_t>(rows)), loss{0.0};
    for (std::int64_t n = 0; n < rows; ++n) {
      double z = 0;
      for (std::int64_t j = 0; j < vocab; ++j) z += std::exp(x[n * vocab + j]);
      lse[n] = std::log(z);
      loss[0] += (lse[n] - x[n * vocab + static_cast<std::int64_t>(y[n])]) / static_cast<double>(rows);
    }
    return Values{{"lse", lse}, {"loss", loss}};
  };
  return c;
}

// Rows of a table gathered by ids (repeated: more ids than rows, or few rows), and the gradient
// scattered back, then added a second time as gradient accumulation does.
OpCase embedding(std::int64_t vocab, std::int64_t d, std::int64_t n) {
  OpCase c;
  c.name = fmt::format("embedding_{}x{}_{}ids", vocab, d, n);
  c.tensors = {in("ids", {n}, Role::ids, {Init::ids, static_cast<double>(vocab)}),
               in("table", {vocab, d}, Role::master),
               in("dy", {n, d}, Role::master),
               out("y", {n, d}, Role::master),
               out("dtable", {vocab, d}, Role::master),
               out("dtable_twice", {vocab, d}, Role::master)};
  c.precs = {f64, f32};  // the table, its rows and its gradient are f32 in every precision
  c.forward = [](Backend& be, const Args& t) { be.embedding_forward(t["ids"], t["table"], t["y"]); };
  c.run = [fwd = c.forward](Backend& be, const Args& t) {
    fwd(be, t);
    be.embedding_backward(t["ids"], t["dy"], t["dtable"], false);
    be.embedding_backward(t["ids"], t["dy"], t["dtable_twice"], false);
    be.embedding_backward(t["ids"], t["dy"], t["dtable_twice"], true);
  };
  c.loss = {{"y", "dy"}};
  c.grads = {{"table", "dtable"}, {"table", "dtable_twice", 2.0}};
  c.formula = [=](const Values& v) {
    std::vector<double> y(static_cast<std::size_t>(n * d));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < d; ++j)
        y[i * d + j] = v.at("table")[static_cast<std::int64_t>(v.at("ids")[i]) * d + j];
    return Values{{"y", y}};
  };
  return c;
}

// FlashAttention-2 forward and backward (deterministic dq); its values against attention's
// definition are tests/unit/test_flash_attention.cpp's.
OpCase flash(std::int64_t n, std::int64_t tq, std::int64_t tk, std::int64_t d, bool causal) {
  OpCase c;
  c.name = fmt::format("flash_attention_{}x{}x{}x{}{}", n, tq, tk, d, causal ? "_causal" : "");
  c.tensors = {in("q", {n, tq, d}),    in("k", {n, tk, d}),   in("v", {n, tk, d}),
               in("dout", {n, tq, d}), out("o", {n, tq, d}),  out("lse", {n, tq}, Role::stat),
               out("dq", {n, tq, d}),  out("dk", {n, tk, d}), out("dv", {n, tk, d})};
  c.precs = kAll;
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  c.forward = [=](Backend& be, const Args& t) {
    be.flash_attention_forward(t["q"], t["k"], t["v"], t["o"], t["lse"], scale, causal);
  };
  c.run = [=, fwd = c.forward](Backend& be, const Args& t) {
    fwd(be, t);
    be.flash_attention_backward(t["q"], t["k"], t["v"], t["o"], t["lse"], t["dout"], t["dq"], t["dk"], t["dv"], scale,
                                causal, FlashDq::deterministic);
  };
  c.loss = {{"o", "dout"}};
  c.grads = {{"q", "dq"}, {"k", "dk"}, {"v", "dv"}};
  return c;
}

OpCase global_norm() {
  OpCase c;
  c.name = "global_norm_1000_77";
  c.tensors = {in("g1", {1000}, Role::grad), in("g2", {77}, Role::grad), out("norm", {1}, Role::stat)};
  c.precs = {f64, f32, bf16};  // bf16: --grad-dtype bf16's gradients
  c.run = [](Backend& be, const Args& t) { be.global_norm(std::vector<Tensor>{t["g1"], t["g2"]}, t["norm"]); };
  c.formula = [](const Values& v) {
    double s = 0;
    for (const char* g : {"g1", "g2"})
      for (double x : v.at(g)) s += x * x;
    return Values{{"norm", {std::sqrt(s)}}};
  };
  return c;
}

// The assignment's AdamW at step 3, the gradient clipped (norm 3 > max_norm 1).
OpCase adamw() {
  OpCase c;
  c.name = "adamw_1000";
  const std::int64_t n = 1000;
  c.tensors = {inout("p", {n}, Role::master), in("g", {n}, Role::grad),
               inout("m", {n}, Role::master, {Init::normal, 0.1}),
               inout("v", {n}, Role::master, {Init::abs_normal, 0.1}),  // a second moment is never negative
               in("norm", {1}, Role::stat, {Init::constant, 3.0})};
  c.precs = {f64, f32, bf16};  // bf16: gradients in bf16
  const AdamWArgs args{.lr = 1e-2, .step = 3, .max_norm = 1.0};
  c.run = [=](Backend& be, const Args& t) { be.adamw(t["p"], t["g"], t["m"], t["v"], args, t["norm"], Tensor{}); };
  c.formula = [=](const Values& v) {
    std::vector<double> p = v.at("p"), m = v.at("m"), s = v.at("v");
    const double clip = std::min(1.0, args.max_norm / (v.at("norm")[0] + 1e-6)), b1 = args.beta1, b2 = args.beta2;
    const double alpha = args.lr * std::sqrt(1 - std::pow(b2, 3)) / (1 - std::pow(b1, 3));
    for (std::int64_t i = 0; i < n; ++i) {
      const double g = v.at("g")[i] * clip;
      m[i] = b1 * m[i] + (1 - b1) * g;
      s[i] = b2 * s[i] + (1 - b2) * g * g;
      p[i] -= alpha * m[i] / (std::sqrt(s[i]) + args.eps);
      p[i] -= args.lr * args.weight_decay * p[i];
    }
    return Values{{"p", p}, {"m", m}, {"v", s}};
  };
  return c;
}

// A master tensor to the compute dtype and back (the forward's weight copies; exact in f32 and f64).
OpCase casts() {
  OpCase c;
  c.name = "cast_1027";
  c.tensors = {in("x", {1027}, Role::master, {Init::normal, 3.0}), out("y", {1027}), out("z", {1027}, Role::master)};
  c.precs = kAll;
  c.run = [](Backend& be, const Args& t) {
    be.cast(t["x"], t["y"]);
    be.cast(t["y"], t["z"]);
  };
  c.formula = [](const Values& v) { return Values{{"y", v.at("x")}, {"z", v.at("x")}}; };
  return c;
}

// The residual add: the stream (master) plus a branch (compute dtype).
OpCase add() {
  OpCase c;
  c.name = "add_1027";
  c.tensors = {in("a", {1027}, Role::master), in("b", {1027}), out("sum", {1027}, Role::master)};
  c.precs = kAll;
  c.run = [](Backend& be, const Args& t) { be.add(t["a"], t["b"], t["sum"]); };
  c.formula = [](const Values& v) {
    std::vector<double> s = v.at("a");
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += v.at("b")[i];
    return Values{{"sum", s}};
  };
  return c;
}

std::vector<OpCase> make_table() {
  std::vector<OpCase> t;
  for (int held : {0, 8})  // also planned beside SMs held by data parallelism's exchange
    for (bool ta : {false, true})
      for (bool tb : {false, true}) t.push_back(gemm(ta, tb, 3, 37, 45, 29, Role::compute, held));
  for (int held : {0, 8})
    for (Role c : {Role::compute, Role::master}) t.push_back(gemm(false, true, 1, 67, 45, 129, c, held));
  // 1000 rows: rows for every block of a cluster; d 256: the kernels' four elements at a time.
  for (auto [rows, d] : {std::pair<std::int64_t, std::int64_t>{7, 33}, {37, 203}, {1000, 203}, {37, 256}})
    t.push_back(rmsnorm(rows, d));
  for (std::int64_t d : {203, 256}) t.push_back(add_rmsnorm(37, d));
  // dk 18: one pair a thread; dk 64: 16 bytes a thread.
  for (double theta : {0.0, 10000.0}) {
    t.push_back(heads(3, 1029, 5, 18, theta));
    t.push_back(heads(3, 77, 5, 64, theta));
  }
  t.push_back(heads(2, 5, 3, 6, 100.0));
  // T 64: rows of whole 16-byte packs; T 37 element by element.
  for (std::int64_t len : {37, 64})
    for (bool causal : {true, false}) t.push_back(softmax(6, len, causal, 0.125));
  t.push_back(swiglu(7, 143));
  t.push_back(swiglu(37, 203));
  // V 1237: one element a load; 1240: 16 bytes of f32 a load.
  t.push_back(cross_entropy(7, 37, false));
  t.push_back(cross_entropy(33, 1237, false));
  t.push_back(cross_entropy(33, 1240, false));
  t.push_back(cross_entropy(33, 1240, true));
  // Few rows with many repeated ids (a block a row); then more rows than blocks, several tiles of ids.
  t.push_back(embedding(17, 45, 301));
  t.push_back(embedding(5003, 64, 2000));
  // Lengths of tiles ± a few, tq ≠ tk both ways, a head width no tensor-core kernel takes.
  t.push_back(flash(2, 37, 37, 16, true));
  t.push_back(flash(1, 65, 33, 32, false));
  t.push_back(flash(1, 33, 65, 32, true));
  t.push_back(flash(2, 9, 9, 5, false));
  t.push_back(global_norm());
  t.push_back(adamw());
  t.push_back(casts());
  t.push_back(add());
  return t;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> table = make_table();
  return table;
}

}  // namespace lmscope::test
