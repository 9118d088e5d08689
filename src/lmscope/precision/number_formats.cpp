#include "lmscope/precision/number_formats.h"

#include "lmscope/core/error.h"

#include <cfenv>
#include <cmath>

namespace lmscope {

const NumberFormat& fp32_format() {
  static const NumberFormat f{"fp32", 23, -126, 3.4028234663852886e38};
  return f;
}
const NumberFormat& bf16_format() {
  static const NumberFormat f{"bf16", 7, -126, 3.3895313892515355e38};
  return f;
}
const NumberFormat& fp16_format() {
  static const NumberFormat f{"fp16", 10, -14, 65504.0};
  return f;
}
const std::vector<NumberFormat>& number_formats() {
  static const std::vector<NumberFormat> all{fp32_format(), bf16_format(), fp16_format()};
  return all;
}
const NumberFormat& number_format(const std::string& name) {
  for (const NumberFormat& f : number_formats())
    if (f.name == name) return f;
  user_error("unknown number format '{}' (use fp32, bf16 or fp16)", name);
}

namespace {
// The format's quantum (the value of its last mantissa bit) for numbers of magnitude |x|.
double quantum(const NumberFormat& f, double x) {
  int e = 0;
  std::frexp(x, &e);  // |x| = m · 2^e, m in [0.5, 1): the leading bit is worth 2^(e − 1)
  return std::ldexp(1.0, std::max(e - 1, f.min_exponent) - f.mantissa_bits);
}
}  // namespace

double round_to(const NumberFormat& f, double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  const double q = quantum(f, x);
  // x / q is exact (q is a power of two), and nearbyint rounds half to even in the default mode.
  LMSCOPE_CHECK(std::fegetround() == FE_TONEAREST, "the rounding mode is not to-nearest");
  const double r = std::nearbyint(x / q) * q;
  if (std::fabs(r) > f.max_finite) return std::copysign(INFINITY, x);
  return r;
}

double spacing_at(const NumberFormat& f, double x) {
  if (!std::isfinite(x)) return INFINITY;
  return quantum(f, x == 0 ? std::ldexp(1.0, f.min_exponent) : x);
}

}  // namespace lmscope
