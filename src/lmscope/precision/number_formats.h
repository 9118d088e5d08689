// The floating-point formats mixed precision stores numbers in (fp32, bf16, fp16), emulated on the
// host: a value rounded to the nearest number of the format, ties to even, as the GPU's conversions
// and additions round. For experiments about precision that need no GPU (lmscope precision).
#pragma once

#include <string>
#include <vector>

namespace lmscope {

struct NumberFormat {
  std::string name;   // "fp32", "bf16", "fp16"
  int mantissa_bits;  // stored fraction bits (23, 7, 10)
  int min_exponent;   // of the smallest normal number (−126, −126, −14)
  double max_finite;  // the largest finite number
};

const NumberFormat& fp32_format();
const NumberFormat& bf16_format();
const NumberFormat& fp16_format();
const std::vector<NumberFormat>& number_formats();  // fp32, bf16, fp16
// UserError naming the formats there are.
const NumberFormat& number_format(const std::string& name);

// x rounded to the nearest number of `f` (ties to even; subnormals kept; ±inf past the largest).
double round_to(const NumberFormat& f, double x);

// The distance from |x| to the next larger number of `f` (x itself a number of f): the spacing an
// addition into an accumulator holding x rounds to.
double spacing_at(const NumberFormat& f, double x);

}  // namespace lmscope
