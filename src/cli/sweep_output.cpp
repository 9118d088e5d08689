#include "sweep_output.h"

#include "lmscope/core/error.h"

#include <unistd.h>

#include <fstream>

namespace lmscope::cli {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  if (!(f << text) || !f.flush()) user_error("cannot write '{}'", path);
}

SweepProgress::SweepProgress() : tty_(isatty(STDERR_FILENO)) {}

void SweepProgress::start(const std::string& label) {
  label_ = label;
  if (!tty_) fmt::print(stderr, "{}\n", label_);
}

void SweepProgress::step(int done, int total, const char* note) {
  if (tty_) fmt::print(stderr, "\r\033[K{}: {}/{}{}", label_, done, total, note);
}

void SweepProgress::finish(const std::string& status) {
  if (tty_) fmt::print(stderr, "\r\033[K{}: {}\n", label_, status);
}

}  // namespace lmscope::cli
