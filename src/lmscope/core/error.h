// Two kinds of failure, told apart all the way to the exit code:
// a UserError is the user's input being wrong (exit 2, one sentence naming the problem);
// an EnvironmentFailure or RankFailure is the machine failing a valid run (exit 1, one sentence);
// anything else escaping is an internal failure (exit 1).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace lmscope {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A valid request this build or device cannot serve (a precision or device not implemented).
// A sweep turns it into an "unsupported" row; a single command exits 2 with its sentence.
class Unsupported : public UserError {
 public:
  using UserError::UserError;
};

// The ranks of a distributed run could not work together (a port taken, a rank gone, a rendezvous
// that never came): not a bug and not the input's fault; exit 1 with its sentence.
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The machine refused what a valid request needs (a disk full, a file that cannot be written any
// more): not a bug and not the input's fault; exit 1 with its sentence, which names the file and why.
class EnvironmentFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request for memory the device (or host) cannot give. Sweeps turn it into an OOM row.
class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(std::size_t requested, std::size_t in_use, std::size_t capacity, const std::string& what)
      : std::runtime_error(what), requested_(requested), in_use_(in_use), capacity_(capacity) {}
  std::size_t requested() const { return requested_; }
  std::size_t in_use() const { return in_use_; }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t requested_, in_use_, capacity_;
};

template <typename... Args>
[[noreturn]] void user_error(fmt::format_string<Args...> f, Args&&... args) {
  throw UserError(fmt::format(f, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void environment_failure(fmt::format_string<Args...> f, Args&&... args) {
  throw EnvironmentFailure(fmt::format(f, std::forward<Args>(args)...));
}

// Internal invariant: a broken one is a bug in lmscope, not the user's fault.
#define LMSCOPE_CHECK(cond, ...)                                                                               \
  do {                                                                                                         \
    if (!(cond))                                                                                               \
      throw std::logic_error(fmt::format("internal check failed at {}:{}: {} ({})", __FILE__, __LINE__, #cond, \
                                         fmt::format(__VA_ARGS__)));                                           \
  } while (0)

}  // namespace lmscope
