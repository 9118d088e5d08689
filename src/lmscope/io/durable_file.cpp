#include "lmscope/io/durable_file.h"

#include "lmscope/core/error.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace lmscope {
namespace {

std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t bytes) {
  return static_cast<std::uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), bytes));
}

}  // namespace

DurableFile::DurableFile(std::string path) : path_(std::move(path)), partial_(path_ + ".partial") {
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

FileDigest digest_of_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) user_error("cannot read '{}': {}", path, std::strerror(errno));
  FileDigest d;
  d.crc32 = crc_update(0, nullptr, 0);
  std::vector<unsigned char> buf(std::size_t(4) << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      user_error("reading '{}' failed: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    d.crc32 = crc_update(d.crc32, buf.data(), static_cast<std::size_t>(n));
    d.bytes += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return d;
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
