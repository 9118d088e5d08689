#include "lmscope/parallel/test_fault.h"

#include "lmscope/core/error.h"
#include "lmscope/parallel/world.h"

#include <fmt/format.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lmscope::parallel {

TestFault TestFault::from_environment(int rank) {
  TestFault f;
  const char* v = std::getenv("LMSCOPE_TEST_FAULT");
  if (v == nullptr || *v == '\0' || restart_count() > 0) return f;
  int r = -1, used = 0;
  long long step = -1, collective = 0;
  char action[8] = {};
  const int n = std::sscanf(v, "%d:%lld:%7[a-z]%n:%lld%n", &r, &step, action, &used, &collective, &used);
  const bool known =
      std::strcmp(action, "exit") == 0 || std::strcmp(action, "die") == 0 || std::strcmp(action, "hang") == 0;
  if (n < 3 || !known || v[used] != '\0' || step < 0 || collective < 0)
    user_error(
        "LMSCOPE_TEST_FAULT must be RANK:STEP:exit|die|hang, or RANK:STEP:ACTION:N for the N-th collective "
        "of step STEP, got '{}'",
        v);
  if (r == rank) f.rank_ = rank, f.step_ = step, f.collective_ = n == 4 ? collective : 0, f.action_ = action;
  return f;
}

void TestFault::after_step(std::int64_t step) const {
  if (collective_ == 0 && step == step_) act(fmt::format("after step {}", step));
}

void TestFault::at_collective(std::int64_t step, std::int64_t index) const {
  if (collective_ != 0 && step == step_ && index == collective_)
    act(fmt::format("at collective {} of step {}", index, step));
}

void TestFault::act(const std::string& where) const {
  fmt::print(stderr, "lmscope: rank {}: test fault: {} {}\n", rank_, action_, where);
  std::fflush(nullptr);
  if (action_ == "exit") std::_Exit(1);
  if (action_ == "die") std::raise(SIGKILL);
  for (;;) ::pause();  // hang: signals are recorded, never acted on
}

}  // namespace lmscope::parallel
