#include "lmscope/precision/accumulation.h"

namespace lmscope {

std::vector<AccumulationCase> accumulation_cases() {
  return {{&fp32_format(), &fp32_format()},
          {&fp16_format(), &fp16_format()},
          {&bf16_format(), &bf16_format()},
          {&fp32_format(), &fp16_format()},
          {&fp32_format(), &bf16_format()}};
}

AccumulationResult accumulate(const AccumulationCase& how, double addend, int count) {
  AccumulationResult r{how};
  r.addend_stored = round_to(*how.addend, round_to(fp32_format(), addend));
  r.exact = addend * count;
  double sum = 0;
  for (int i = 1; i <= count; ++i) {
    const double next = round_to(*how.accumulator, sum + r.addend_stored);
    if (next == sum && r.stalled_at == 0) {
      r.stalled_at = i;
      r.stalled_sum = sum;
    }
    sum = next;
  }
  r.sum = sum;
  r.spacing = spacing_at(*how.accumulator, sum);
  return r;
}

}  // namespace lmscope
