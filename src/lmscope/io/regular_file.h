// Files lmscope reads must be regular ones: a FIFO given as a token file or a result file waited for
// a writer forever, /dev/zero filled the memory until the kernel killed the process, and a directory
// is read as nothing. One check for every reader, before it reads.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace lmscope {

// What a file of this mode is, in words: "a directory", "a FIFO", "a character device", ...
const char* file_kind(mode_t mode);

// `path` opened to read, and its size; UserError "cannot open {what} '{path}': {why}", or "{what}
// '{path}' is a FIFO, not a regular file" (opening does not wait for a FIFO's writer).
int open_regular_file(const std::string& path, const std::string& what, std::size_t& size);

// The most bytes read_regular_file reads: a result file, log or timeline is megabytes, and a larger
// one (a sparse file of terabytes) was allocated and zeroed whole before it was parsed, which ended in
// "the host's memory cannot hold what this run asked for" without the file's name, or in the kernel
// killing the process.
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30;

// The whole of `path`, opened by open_regular_file; UserError when it cannot be read or holds more
// than kMaxTextFileBytes.
std::string read_regular_file(const std::string& path, const std::string& what);

}  // namespace lmscope
