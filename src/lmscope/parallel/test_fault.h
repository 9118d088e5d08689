// Test-only fault injection (docs/failures.md "Faults in tests"): LMSCOPE_TEST_FAULT=RANK:STEP:ACTION
// makes rank RANK of the first start, after step STEP (its checkpoint written, where one is due),
// exit with code 1 (exit), die of SIGKILL as the out-of-memory killer kills (die), or stop answering
// (hang); RANK:STEP:ACTION:N does it as the rank calls the N-th collective of step STEP (1: the
// first), before the collective, so the tests can see what the other ranks and lmscope launch do
// about a rank lost inside the backward's exchange. Ranks started again (lmscope launch
// --max-restarts) run without it.
#pragma once

#include <cstdint>
#include <string>

namespace lmscope::parallel {

class TestFault {
 public:
  // This process's, as rank `rank`: none where LMSCOPE_TEST_FAULT is unset, names another rank, or
  // this is a restart. UserError for a value that is not of the form above.
  static TestFault from_environment(int rank);

  void after_step(std::int64_t step) const;
  void at_collective(std::int64_t step, std::int64_t index) const;

 private:
  [[noreturn]] void act(const std::string& where) const;
  int rank_ = -1;
  std::int64_t step_ = -1, collective_ = 0;  // collective_ 0: after the step
  std::string action_;
};

}  // namespace lmscope::parallel
