// One start of lmscope launch's ranks: N processes forked and exec'd, watched until every one has
// ended. The first to fail is named in one line and the others are stopped, since the rest would wait
// for it until the rendezvous timeout; SIGINT, SIGTERM and SIGHUP to the launcher reach every rank,
// also while they are being started.
#pragma once

#include "stop_signals.h"

#include <signal.h>

#include <string>
#include <vector>

namespace lmscope::cli {

// How a start of the ranks ended.
struct RanksOutcome {
  // A rank failed: exited with a code other than 0 (and other than a stop on a signal, below) or was
  // killed.
  bool failed = false;
  // The launcher got `interrupted` (passed on to the ranks), or a rank stopped cleanly on a signal of
  // its own (`lmscope train` exits 128 + the signal after its checkpoint) and the others with it.
  int interrupted = 0, stopped_on = 0;
  // What the launcher exits with if it goes no further: the failure's (2 for a user error, which
  // starting again cannot mend, else 1), else 128 + the launcher's signal, else 128 + the signal the
  // ranks stopped on, else 0.
  int exit_code = 0;
  bool restartable() const { return failed && exit_code == 1 && interrupted == 0; }
};

class RankGroup {
 public:
  // From here on SIGINT, SIGTERM, SIGHUP and SIGCHLD are blocked in this process and taken with
  // sigtimedwait (one that came before the first start is seen by it); ranks start with them open.
  RankGroup();
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  // Starts local ranks 0 to nproc - 1 of `exe argv` with `env`, LOCAL_RANK and RANK (first_rank + the
  // local rank: this node's part of a world of several nodes), each in a process group of its own, and
  // waits until all have ended. No further rank is started once one has ended or the launcher got a
  // signal. Ranks are named by RANK.
  RanksOutcome run(const std::string& exe, const std::vector<std::string>& argv, const std::vector<std::string>& env,
                   int nproc, int first_rank = 0);

 private:
  sigset_t watched_{}, before_{};  // the signals taken here, and the mask the process had
};

}  // namespace lmscope::cli
