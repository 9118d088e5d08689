// How a cell's mode reads in tables: its mode and the settings that differ from the defaults. Bench
// labels its cells with it (mode_label adds the data-parallel words), and the report words the rows
// it reads back from result files with it, so the two agree.
#pragma once

#include <string>

namespace lmscope {

// What mode_label says before the data-parallel words, from plain values (a result file's among them).
struct ModeSettings {
  std::string mode;
  std::string recompute = "none";
  long long grad_accum = 1;  // shown only above 1
  std::string weight_copies = "kept";
  std::string grad_dtype = "fp32";
  std::string master_dtype = "fp32";  // their gradients are of their dtype, which goes unsaid
  bool graphs_off_on_cuda = false;
  bool fusion = true;
};
std::string mode_words(const ModeSettings& m);

}  // namespace lmscope
