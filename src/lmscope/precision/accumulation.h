// The seeds' accumulation experiment: add one small number (0.01) a thousand times into a sum held
// in fp32, fp16 or bf16, and with the addend stored in a narrower format than the sum. It shows why
// mixed precision keeps sums (softmax, norms, loss, gradients, optimizer state) in fp32.
#pragma once

#include "lmscope/precision/number_formats.h"

#include <string>
#include <vector>

namespace lmscope {

struct AccumulationCase {
  const NumberFormat* accumulator;  // the format the running sum is held in
  const NumberFormat* addend;       // the format the addend is stored in (then converted exactly)
};

struct AccumulationResult {
  AccumulationCase how;
  double addend_stored = 0;  // the addend as its format holds it
  double sum = 0;            // after every addition
  double exact = 0;          // count · addend, in decimal
  double spacing = 0;        // between the accumulator's numbers at the sum
  int stalled_at = 0;        // the first addition that left the sum unchanged, 0 if none did
  double stalled_sum = 0;    // the sum it stopped at
};

// The seeds' cases (fp32, fp16, fp32 += fp16) and their bf16 counterparts.
std::vector<AccumulationCase> accumulation_cases();

// Adds `addend` `count` times, each addition rounded to the accumulator's format. The addend is
// stored as PyTorch stores a Python float in a tensor of the format: rounded to fp32, then to the
// format. Each addition is done in double and rounded once to the format: for formats of at most
// 24 significant bits that equals the format's own correctly rounded addition (53 ≥ 2·24 + 2).
AccumulationResult accumulate(const AccumulationCase& how, double addend, int count);

}  // namespace lmscope
