#include "lmscope/io/run_log.h"

#include "lmscope/core/error.h"
#include "lmscope/io/durable_file.h"
#include "lmscope/io/regular_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace lmscope {

RunLog::RunLog(std::string path, std::optional<std::int64_t> resumed_at) : path_(std::move(path)) {
  if (resumed_at && replaceable_file_exists(path_, "--log")) {
    // Read whole by read_regular_file, whose size limit names the file: a log of terabytes (sparse, or
    // one line without an end) grew getline's buffer until the kernel killed lmscope.
    std::istringstream in(read_regular_file(path_, "the log file to go on with"));
    std::string kept, line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      // A step's line up to the resumed step, and the description of each run that began before it.
      const auto before = [&](const char* key, std::int64_t last) {
        return j.contains(key) && j[key].is_number_integer() && j[key].get<std::int64_t>() <= last;
      };
      if (before("step", *resumed_at) || (!j.contains("step") && before("from_step", *resumed_at - 1)))
        kept += line + "\n";
    }
    write_file_durably(path_, kept);
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (resumed_at ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) user_error("cannot write the log file '{}': {}", path_, std::strerror(errno));
}

RunLog::~RunLog() {
  if (fd_ >= 0) ::close(fd_);
}

void RunLog::write_line(const std::string& line) {
  const std::string text = line + "\n";
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) environment_failure("writing the log file '{}' failed: {}", path_, std::strerror(n < 0 ? errno : EIO));
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace lmscope
