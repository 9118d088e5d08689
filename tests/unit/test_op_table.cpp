// The op table (tests/common/op_cases.h) on the CPU: each row in f64 against its formula and its
// gradients against central finite differences; and each row on the dry run's shape-only backend
// standing for the CPU, whose allocator must record what the CPU's records, event for event.
#include "../common/op_cases.h"

#include "lmscope/backend/meta/meta_backend.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lmscope::test {
namespace {

std::string row_name(const ::testing::TestParamInfo<OpRow>& info) { return op_row_name(info.param); }

// At most this many elements of each input are perturbed (evenly spread): the larger rows are there
// for the GPU's kernels, and a sample of their elements checks a gradient as well as all of them.
constexpr std::int64_t kMostPerturbed = 160;

class OpTableCpuF64 : public ::testing::TestWithParam<OpRow> {};

// analytic ≈ (L(x+h) − L(x−h)) / 2h over a sample of x's elements, L recomputed by loss() from the
// current contents of x (f64 on the CPU).
void expect_gradient(const std::string& what, const Tensor& x, const std::vector<double>& analytic,
                     const std::function<double()>& loss, double tol) {
  ASSERT_EQ(x.numel(), static_cast<std::int64_t>(analytic.size())) << what;
  const std::int64_t n = x.numel(), stride = std::max<std::int64_t>(1, n / kMostPerturbed);
  const double h = 1e-6;
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = n % stride; i < n; i += stride) {
    double& xi = x.as<double>()[i];
    const double saved = xi;
    xi = saved + h;
    const double lp = loss();
    xi = saved - h;
    const double lm = loss();
    xi = saved;
    const double numeric = (lp - lm) / (2 * h);
    err2 += (numeric - analytic[i]) * (numeric - analytic[i]);
    ref2 += numeric * numeric;
  }
  ASSERT_GT(ref2, 0.0) << what << ": the numeric gradient is all zero, the check would prove nothing";
  EXPECT_LT(std::sqrt(err2 / ref2), tol) << what << ": relative error of the analytic gradient";
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.as<double>()[i] * (b.empty() ? 1.0 : b.as<double>()[i]);
  return s;
}

TEST_P(OpTableCpuF64, FormulaAndFiniteDifferences) {
  const OpCase& c = *GetParam().op;
  ASSERT_TRUE(c.formula || !c.grads.empty()) << c.name << ": a row must check something";
  auto be = make_cpu_backend();
  CaseTensors t(*be, c, Prec::f64);
  const Values init = initial_values(c);
  t.upload(init);
  c.run(*be, t.args());
  const Values got = t.download_all(false);
  for (const auto& [name, v] : got) EXPECT_FALSE(any_nan(v)) << name << ": NaN (an element left unwritten?)";
  if (c.formula) {
    for (const auto& [name, want] : c.formula(init))
      EXPECT_LT(relative_difference(got.at(name), want), c.tol.formula) << name << " against the formula";
  }
  if (c.grads.empty()) return;
  t.upload(init);  // the inputs as they were (an inout tensor now holds its gradient)
  auto loss = [&] {
    c.forward(*be, t.args());
    double s = 0;
    for (const OpCase::LossTerm& term : c.loss) s += dot(t[term.out], term.weight.empty() ? Tensor{} : t[term.weight]);
    return s;
  };
  for (const OpCase::Grad& g : c.grads) {
    std::vector<double> analytic = got.at(g.dx);
    for (double& x : analytic) x /= g.factor;
    expect_gradient(g.dx + " as the gradient of " + g.x, t[g.x], analytic, loss, c.tol.gradient);
  }
}
INSTANTIATE_TEST_SUITE_P(Rows, OpTableCpuF64, ::testing::ValuesIn(op_rows({Prec::f64})), row_name);

class OpTableMetaVsCpu : public ::testing::TestWithParam<OpRow> {};

TEST_P(OpTableMetaVsCpu, SameAllocations) {
  const OpCase& c = *GetParam().op;
  const std::size_t memory = std::size_t(4) << 30;
  std::unique_ptr<Backend> cpu = make_cpu_backend(memory),
                           meta = make_meta_backend(dry_run_target("cpu", memory), "fp32");
  ASSERT_TRUE(is_dry_run(*meta));
  const Values init = initial_values(c);
  for (Backend* be : {cpu.get(), meta.get()}) {
    be->allocator().record_events(true);
    CaseTensors t(*be, c, GetParam().prec);
    t.upload(init);
    c.run(*be, t.args());
  }  // the case's tensors freed: their frees recorded too
  EXPECT_GT(cpu->allocator().events().size(), 2 * c.tensors.size()) << "each tensor allocated and freed, in a segment";
  expect_same_record(cpu->allocator(), meta->allocator());
}
INSTANTIATE_TEST_SUITE_P(Rows, OpTableMetaVsCpu, ::testing::ValuesIn(op_rows({Prec::f64, Prec::f32})), row_name);

}  // namespace
}  // namespace lmscope::test
