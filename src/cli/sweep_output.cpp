#include "sweep_output.h"

#include "lmscope/core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace lmscope::cli {

void write_file(const std::string& path, const std::string& text) {
  // By hand, so that the sentence says why ("cannot write 'X'" did not).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) user_error("cannot write '{}': {}", path, std::strerror(errno));
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      environment_failure("writing '{}' failed: {}", path, std::strerror(err));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) environment_failure("writing '{}' failed: {}", path, std::strerror(errno));
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
