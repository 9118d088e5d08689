#include "lmscope/io/regular_file.h"

#include "lmscope/core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace lmscope {

const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

int open_regular_file(const std::string& path, const std::string& what, std::size_t& size) {
  // O_NONBLOCK: opening a FIFO to read would otherwise wait for a writer before the check below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) user_error("cannot open {} '{}': {}", what, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    user_error("cannot open {} '{}': {}", what, path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    user_error("{} '{}' is {}, not a regular file", what, path, file_kind(st.st_mode));
  }
  size = static_cast<std::size_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  std::size_t size = 0;
  const int fd = open_regular_file(path, what, size);
  if (size > kMaxTextFileBytes) {
    ::close(fd);
    user_error("{} '{}' holds {} bytes, more than the 1 GiB such a file can be; is it the right file?", what, path,
               size);
  }
  std::string text(size, '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      user_error("cannot read {} '{}': {}", what, path, std::strerror(err));
    }
    if (n == 0) break;  // (shorter than it was a moment ago)
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

}  // namespace lmscope
