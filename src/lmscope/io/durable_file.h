// Files that are there whole or not at all: written under a temporary name, flushed to the disk
// (fsync), then renamed into place, with their size and CRC-32 (zlib's) taken on the way, so a
// reader can tell a complete file from a truncated or damaged one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lmscope {

struct FileDigest {
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;
  bool operator==(const FileDigest&) const = default;
};

class DurableFile {
 public:
  // Opens `path` + ".partial" for writing; throws UserError if it cannot.
  explicit DurableFile(std::string path);
  ~DurableFile();  // an uncommitted file is removed
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, std::size_t bytes);
  // Flushes to the disk and renames into place; the digest of what was written.
  FileDigest commit();

 private:
  std::string path_, partial_;
  int fd_ = -1;
  FileDigest digest_;
};

// Writes `text` as a whole file the same way.
FileDigest write_file_durably(const std::string& path, const std::string& text);
// The size and CRC-32 of a file as it is on the disk; throws UserError if it cannot be read.
FileDigest digest_of_file(const std::string& path);
// Flushes a directory's entries (a rename inside it) to the disk.
void sync_directory(const std::string& path);

}  // namespace lmscope
