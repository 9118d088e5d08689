#include "launch_ranks.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

namespace lmscope::cli {
namespace {

using Clock = std::chrono::steady_clock;
// How long the other ranks have to stop after a rank failed before SIGKILL: they cannot checkpoint
// without it, and one waiting inside a collective with it would wait on. Ranks stopped by a signal to
// the launcher get as long as their checkpoint takes (a second signal: SIGKILL).
constexpr auto kGrace = std::chrono::seconds(10);

}  // namespace

RankGroup::RankGroup() {
  ::signal(SIGCHLD, SIG_DFL);
  sigemptyset(&watched_);
  for (int s : kStopSignals) sigaddset(&watched_, s);
  sigaddset(&watched_, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &watched_, &before_);
}

RankGroup::~RankGroup() { ::pthread_sigmask(SIG_SETMASK, &before_, nullptr); }

RanksOutcome RankGroup::run(const std::string& exe, const std::vector<std::string>& args,
                            const std::vector<std::string>& common_env, int nproc, int first_rank) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  std::map<pid_t, int> running;
  RanksOutcome out;
  int next = 0;  // the next rank to start
  bool killed = false;
  Clock::time_point kill_at = Clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (const auto& [pid, rank] : running) ::kill(pid, sig);
    if (sig == SIGKILL) killed = true;
    if (out.failed) kill_at = std::min(kill_at, Clock::now() + kGrace);
  };
  auto stopping = [&] { return out.failed || out.interrupted != 0 || out.stopped_on != 0; };
  // A rank has ended: the first to fail is named, and the others are stopped.
  auto ended = [&](int rank, int status) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 0 || out.failed || out.interrupted) return;
    const std::string others = running.empty() ? (next < nproc ? "; started no further rank" : "")
                               : next < nproc  ? "; stopped the other ranks and started no further one"
                                               : "; stopped the other ranks";
    if (is_stop_code(code)) {
      // train's ranks agree on the step to stop after, each saving its part: no need to stop them. The
      // other commands' ranks would wait for this one in their next collective: they are stopped.
      const bool agreed = args.size() > 1 && args[1] == "train";
      if (!out.stopped_on)
        fmt::print(stderr, "lmscope launch: rank {} stopped on {}{}\n", first_rank + rank, signal_name(code - 128),
                   running.empty() ? ""
                   : agreed        ? "; the other ranks stop after the same step"
                                   : "; stopped the other ranks");
      if (!out.stopped_on && !agreed) stop_all(code - 128);
      out.stopped_on = out.stopped_on ? out.stopped_on : code - 128;
      return;
    }
    out.failed = true;
    out.exit_code = code == 2 ? 2 : 1;
    std::string how = WIFEXITED(status) ? fmt::format("exited with code {}", code)
                                        : fmt::format("was killed by {}", signal_name(WTERMSIG(status)));
    // The kernel's out-of-memory killer leaves no other trace the launcher can read.
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      how += " (perhaps by the kernel's out-of-memory killer: see dmesg or journalctl -k, where readable)";
    fmt::print(stderr, "lmscope launch: rank {} {}{}\n", first_rank + rank, how, others);
    stop_all(SIGTERM);
  };
  auto start = [&](int rank) {
    std::vector<std::string> env = common_env;
    env.push_back(fmt::format("RANK={}", first_rank + rank));
    env.push_back(fmt::format("LOCAL_RANK={}", rank));
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {  // only async-signal-safe calls until exec
      ::sigprocmask(SIG_SETMASK, &before_, nullptr);
      ::sigprocmask(SIG_UNBLOCK, &watched_, nullptr);  // open even where the launcher was started with them blocked
      // A process group of its own: a terminal's Ctrl-C reaches the launcher alone, which passes it on
      // once (a rank that got it twice would stop at once, without its checkpoint).
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // none outlives the launcher, waiting for the rest
      if (::getppid() != launcher) ::_exit(1);
      ::execve(exe.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      for (const auto& [p, r] : running) ::kill(p, SIGKILL);
      for (const auto& [p, r] : running) ::waitpid(p, nullptr, 0);
      environment_failure("cannot start rank {}: {}", first_rank + rank, std::strerror(err));
    }
    // The parent sets it too (POSIX's way to close the race: whichever runs first makes it so, and the
    // other's call fails harmlessly once the child has exec'd).
    ::setpgid(pid, pid);
    running[pid] = rank;
  };

  for (;;) {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      const auto it = running.find(pid);
      if (it == running.end()) continue;
      const int rank = it->second;
      running.erase(it);
      ended(rank, status);
    }
    if (stopping()) next = nproc;  // no further rank once one has failed or stopped, or a signal came
    if (next == nproc && running.empty()) break;
    if (Clock::now() >= kill_at && !killed) stop_all(SIGKILL);
    // While starting, only a look at what came; then a wait for a signal, or the end of the grace period.
    const auto left = next < nproc ? std::chrono::milliseconds(0)
                      : killed || kill_at == Clock::time_point::max()
                          ? std::chrono::milliseconds(1000)
                          : std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now());
    const auto ms = std::max<std::int64_t>(next < nproc ? 0 : 1, left.count());
    timespec wait{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    const int sig = ::sigtimedwait(&watched_, nullptr, &wait);
    if (is_stop_signal(sig)) {
      if (!out.interrupted && !out.failed)
        fmt::print(stderr, "lmscope launch: got {}; stopping the ranks\n", signal_name(sig));
      // A second interrupt means now.
      stop_all(out.interrupted ? SIGKILL : sig);
      if (!out.interrupted) out.interrupted = sig;
      continue;
    }
    if (sig == SIGCHLD) continue;  // what ended is seen before another rank starts
    if (next < nproc && !stopping()) start(next++);
  }
  if (!out.failed) out.exit_code = out.interrupted ? 128 + out.interrupted : out.stopped_on ? 128 + out.stopped_on : 0;
  return out;
}

}  // namespace lmscope::cli
