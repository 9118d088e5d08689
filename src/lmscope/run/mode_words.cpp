#include "lmscope/run/mode_words.h"

#include <fmt/format.h>

namespace lmscope {

std::string mode_words(const ModeSettings& m) {
  std::string words = m.mode;
  if (m.recompute != "none") words += fmt::format(", {} recompute", m.recompute);
  if (m.grad_accum > 1) words += fmt::format(", {} micro-batches", m.grad_accum);
  if (m.weight_copies != "kept") words += fmt::format(", {} copies", m.weight_copies);
  if (m.master_dtype != "fp32") words += fmt::format(", {} masters", m.master_dtype);
  if (m.grad_dtype != "fp32" && m.grad_dtype != m.master_dtype) words += fmt::format(", {} gradients", m.grad_dtype);
  if (m.graphs_off_on_cuda) words += ", graphs off";
  if (!m.fusion) words += ", fusion off";
  return words;
}

}  // namespace lmscope
