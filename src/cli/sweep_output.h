// What every sweeping command (bench, attention) does with its output: progress on stderr, one
// line per cell (rewritten in place on a terminal), and the results file rewritten after every
// cell so an interrupted sweep keeps every row it finished.
#pragma once

#include <string>

namespace lmscope::cli {

// Writes `text` as the whole file at `path`: UserError when it cannot be opened, EnvironmentFailure
// when a write fails (a full disk); each says why.
void write_file(const std::string& path, const std::string& text);

class SweepProgress {
 public:
  SweepProgress();
  void start(const std::string& label);
  void step(int done, int total, const char* note = "");
  void finish(const std::string& status);

 private:
  bool tty_;
  std::string label_;
};

}  // namespace lmscope::cli
