// The op table (tests/common/op_cases.h) on the GPU: each row in f32, tf32 and the 16-bit types where
// CUDA has them against the CPU in f32, from the same inputs (rounded to 16 bits as the GPU stores
// them); and each row on the dry run standing for this GPU, whose allocator must record what CUDA's
// records. Skipped where no GPU is visible.
#include "../common/op_cases.h"

#include "lmscope/backend/devices.h"
#include "lmscope/backend/meta/meta_backend.h"

#include <gtest/gtest.h>

namespace lmscope::test {
namespace {

std::string row_name(const ::testing::TestParamInfo<OpRow>& info) { return op_row_name(info.param); }

const char* precision(Prec p) {  // as make_backend names it
  return p == Prec::bf16 ? "bf16" : p == Prec::f16 ? "fp16" : p == Prec::tf32 ? "tf32" : "fp32";
}

class OpTableCudaVsCpu : public ::testing::TestWithParam<OpRow> {
 protected:
  void SetUp() override {
    if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
    gpu = make_cuda_backend(GetParam().prec == Prec::tf32 ? GemmMath::tf32 : GemmMath::fp32);
  }
  std::unique_ptr<Backend> gpu;
};

TEST_P(OpTableCudaVsCpu, MatchesTheCpu) {
  const OpCase& c = *GetParam().op;
  const Prec p = GetParam().prec;
  auto cpu = make_cpu_backend();
  CaseTensors g(*gpu, c, p), h(*cpu, c, Prec::f32);
  g.upload(initial_values(c));
  h.upload(g.download_all(true));  // the inputs as the GPU holds them
  c.run(*cpu, h.args());
  c.run(*gpu, g.args());
  const Values want = h.download_all(false), got = g.download_all(false);
  for (const auto& [name, w] : want) {
    const std::vector<double>& v = got.at(name);
    ASSERT_FALSE(any_nan(v)) << name << ": NaN (an element left unwritten?)";
    EXPECT_LT(relative_difference(v, w), c.tol.cuda(p)) << name;
  }
}

TEST_P(OpTableCudaVsCpu, DryRunRecordsTheSameAllocations) {
  const OpCase& c = *GetParam().op;
  std::unique_ptr<Backend> meta = make_meta_backend(dry_run_target("cuda"), precision(GetParam().prec));
  const Values init = initial_values(c);
  for (Backend* be : {gpu.get(), meta.get()}) {
    be->allocator().record_events(true);
    CaseTensors t(*be, c, GetParam().prec);
    t.upload(init);
    c.run(*be, t.args());
  }
  expect_same_record(gpu->allocator(), meta->allocator());
}

INSTANTIATE_TEST_SUITE_P(Rows, OpTableCudaVsCpu,
                         ::testing::ValuesIn(op_rows({Prec::f32, Prec::tf32, Prec::bf16, Prec::f16})), row_name);

}  // namespace
}  // namespace lmscope::test
