// train's --log: one JSON object per step, a line each, written to the file as it comes (no buffer
// of our own), so a run killed at any moment leaves every finished step's line. A write that fails
// (a full disk, /dev/full) ends the run with an EnvironmentFailure naming the file and the reason.
// Besides the steps' lines, train writes a line describing the run (no "step"; "from_step", "run",
// "train") as each run or resumption begins. A resumed run's log keeps the lines up to the step it
// resumes from, and the descriptions of runs begun before it, and drops the later ones the stopped run
// wrote; that rewrite replaces the file as DurableFile does, so there the path must be a
// regular file (or a symbolic link to one, which is followed) or not be there yet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace lmscope {

class RunLog {
 public:
  // Opens `path` (UserError if it cannot be): emptied for a new run, or, resumed at step
  // `resumed_at`, cut back to that step's lines and appended to.
  RunLog(std::string path, std::optional<std::int64_t> resumed_at);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // Writes `line` and a newline; EnvironmentFailure if the system does not take all of it.
  void write_line(const std::string& line);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace lmscope
