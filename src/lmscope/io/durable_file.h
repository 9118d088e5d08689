// Files that are there whole or not at all: written under a temporary name, flushed to the disk
// (fsync), then renamed into place, with their size and CRC-32 (zlib's) taken on the way, so a
// reader can tell a complete file from a truncated or damaged one. The rename replaces only a
// regular file: a directory, device, FIFO or socket at the path is refused (UserError), and a
// symbolic link is followed, so the file it points to is replaced and the link stays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace lmscope {

struct FileDigest {
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;
  bool operator==(const FileDigest&) const = default;
};

class DurableFile {
 public:
  // Opens write_target(path) + ".partial" for writing; throws UserError if it cannot, or if what is
  // at the path is not a regular file.
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
// The same without throwing: nothing when it cannot be read, and `why_not` says why (strerror's).
std::optional<FileDigest> digest_of_file(const std::string& path, std::string& why_not);
// The CRC-32 of bytes in memory, as FileDigest takes it.
std::uint32_t crc32_of(const std::string& bytes);
// Flushes a directory's entries (a rename inside it) to the disk.
void sync_directory(const std::string& path);

// The file a write to `path` lands in: `path`, or where the symbolic link(s) there lead (a relative
// target taken from the link's directory), whether or not that file is there yet.
std::string write_target(const std::string& path);
// Whether DurableFile would replace a file at `path`: false when nothing is there, true for a regular
// file (a link to one included); UserError naming `what` (a flag, "--save") for anything else.
bool replaceable_file_exists(const std::string& path, const std::string& what);
// Before a long run: that DurableFile can write `path` (named `what` in the sentence of the UserError
// that says why not): what is there is replaceable, and its directory is there and takes new files.
// Leaves nothing behind.
void check_replaceable(const std::string& path, const std::string& what);
// Before a long run: that `path` can be opened for writing in place (a trace, a table): a regular
// file there is opened and closed unchanged, a device or FIFO taken as it is, a directory refused,
// and where nothing is there the file is made and removed. UserError naming `what` and why.
void check_writable(const std::string& path, const std::string& what);

}  // namespace lmscope
