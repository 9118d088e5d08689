#include "lmscope/io/durable_file.h"

#include "lmscope/core/error.h"
#include "lmscope/io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

namespace lmscope {
namespace {

namespace fs = std::filesystem;

std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t bytes) {
  return static_cast<std::uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

// The directory a file at `path` goes in.
std::string directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

std::string write_target(const std::string& path) {
  fs::path p(path);
  for (int links = 0; links < 40; ++links) {  // as many as the kernel follows
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p.string();
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) return p.string();
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  user_error("'{}' is a symbolic link in a loop of links", path);
}

bool replaceable_file_exists(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;  // a dangling link: its target is made
  if (S_ISREG(st.st_mode)) return true;
  user_error(
      "{} '{}' is {}, not a regular file, and lmscope replaces only regular files (a symbolic link is "
      "followed to its file)",
      what, path, file_kind(st.st_mode));
}

void check_replaceable(const std::string& path, const std::string& what) {
  const std::string target = write_target(path);
  replaceable_file_exists(target, what);
  const std::string dir = directory_of(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    user_error("{} '{}' cannot be written: its directory '{}' does not exist", what, path, dir);
  if (!S_ISDIR(st.st_mode)) user_error("{} '{}' cannot be written: '{}' is not a directory", what, path, dir);
  // The temporary name DurableFile writes first, made and removed: the directory takes new files.
  const std::string probe = target + ".partial";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    return;
  }
  const int err = errno;
  if (err == EEXIST && ::access(dir.c_str(), W_OK) == 0) return;  // a killed run's; DurableFile empties it
  user_error("{} '{}' cannot be written: {}", what, path, std::strerror(err));
}

void check_writable(const std::string& path_given, const std::string& what) {
  // The links followed first: the probe below made with O_EXCL on a link (dangling, or in a loop)
  // failed with "File exists".
  const std::string path = write_target(path_given);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) user_error("{} '{}' is a directory, not a file", what, path);
    if (!S_ISREG(st.st_mode)) return;  // a device or FIFO is written as it is (opening a FIFO would wait)
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: nothing changes yet
    if (fd < 0) user_error("{} '{}' cannot be written: {}", what, path_given, std::strerror(errno));
    ::close(fd);
    return;
  }
  const std::string dir = directory_of(path);
  if (::stat(dir.c_str(), &st) != 0)
    user_error("{} '{}' cannot be written: its directory '{}' does not exist", what, path_given, dir);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) user_error("{} '{}' cannot be written: {}", what, path_given, std::strerror(errno));
  ::close(fd);
  ::unlink(path.c_str());
}

DurableFile::DurableFile(std::string path) : path_(write_target(path)), partial_(path_ + ".partial") {
  replaceable_file_exists(path_, "the output");
  fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) user_error("cannot write '{}': {}", path_, std::strerror(errno));
  digest_.crc32 = crc_update(0, nullptr, 0);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::remove(partial_.c_str());
  }
}

void DurableFile::write(const void* data, std::size_t bytes) {
  LMSCOPE_CHECK(fd_ >= 0, "write to '{}' after commit", path_);
  digest_.crc32 = crc_update(digest_.crc32, data, bytes);
  digest_.bytes += bytes;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) user_error("writing '{}' failed: {}", path_, std::strerror(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

FileDigest DurableFile::commit() {
  LMSCOPE_CHECK(fd_ >= 0, "'{}' committed twice", path_);
  if (::fsync(fd_) != 0) user_error("flushing '{}' to the disk failed: {}", path_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) user_error("closing '{}' failed: {}", path_, std::strerror(errno));
  if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(partial_.c_str());
    user_error("cannot move '{}' into place: {}", path_, std::strerror(err));
  }
  return digest_;
}

FileDigest write_file_durably(const std::string& path, const std::string& text) {
  DurableFile f(path);
  f.write(text.data(), text.size());
  return f.commit();
}

std::optional<FileDigest> digest_of_file(const std::string& path, std::string& why_not) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why_not = std::strerror(errno);
    return std::nullopt;
  }
  FileDigest d;
  d.crc32 = crc_update(0, nullptr, 0);
  std::vector<unsigned char> buf(std::size_t(4) << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why_not = std::strerror(errno);
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    d.crc32 = crc_update(d.crc32, buf.data(), static_cast<std::size_t>(n));
    d.bytes += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return d;
}

FileDigest digest_of_file(const std::string& path) {
  std::string why;
  const std::optional<FileDigest> d = digest_of_file(path, why);
  if (!d) user_error("cannot read '{}': {}", path, why);
  return *d;
}

std::uint32_t crc32_of(const std::string& bytes) {
  return crc_update(crc_update(0, nullptr, 0), bytes.data(), bytes.size());
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) user_error("cannot open the directory '{}': {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) user_error("flushing the directory '{}' failed: {}", path, std::strerror(err));
}

}  // namespace lmscope
