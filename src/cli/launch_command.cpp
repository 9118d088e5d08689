// lmscope launch: N ranks of an lmscope command on this machine, one process each, with the variables
// torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so a rank starts the same
// way under launch, torchrun or Slurm. The launcher only starts and watches: the first rank to fail
// is named in one line and the others are stopped, since the rest would wait for it until the
// rendezvous timeout.
#include "commands.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>

#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace lmscope::cli {
namespace {

using Clock = std::chrono::steady_clock;
// How long the ranks have to stop after SIGTERM before SIGKILL.
constexpr auto kGrace = std::chrono::seconds(10);

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return fmt::format("signal {}", sig);
  }
}

// A port no one listens on now: the kernel's pick for port 0. Another process could take it before
// rank 0 listens, which is then rank 0's "Address already in use".
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(fmt::format("cannot find a free port for the rendezvous: {}", std::strerror(err)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Hardware threads this process may run on (taskset and cgroup cpusets narrow them).
int hardware_threads() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

class LaunchCommand : public Command {
 public:
  explicit LaunchCommand(CLI::App& parent) {
    app = parent.add_subcommand("launch",
                                "Run an lmscope command as --nproc ranks on this machine (one process each, with "
                                "torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): lmscope launch --nproc 2 "
                                "-- train ...");
    app->add_option("--nproc", nproc_, "How many ranks to start")->required();
    app->add_option("--rendezvous", rendezvous_,
                    "file:DIR: the ranks meet in files under DIR instead of at a TCP port of this machine");
    app->add_option("--port", port_, "The rendezvous's TCP port (default: one that is free)");
    app->add_option("command", command_, "After --: the lmscope command and its flags, run by every rank");
  }

  int run() override {
    if (nproc_ < 1) user_error("--nproc must be at least 1, got {}", nproc_);
    if (command_.empty())
      user_error("launch needs the command every rank runs after --, e.g. lmscope launch --nproc 2 -- train ...");
    if (command_[0] == "launch") user_error("launch cannot run launch; give the command every rank runs after --");
    if (!rendezvous_.empty() && (!rendezvous_.starts_with("file:") || rendezvous_.size() == 5))
      user_error(
          "--rendezvous must be file:DIR (a directory every rank sees), got '{}'; the TCP rendezvous is the "
          "default, with --port",
          rendezvous_);
    if (app->count("--port") > 0 && (port_ < 1 || port_ > 65535))
      user_error("--port must be from 1 to 65535, got {}", port_);
    if (app->count("--port") > 0 && !rendezvous_.empty())
      user_error("--port is the TCP rendezvous's; leave it out with --rendezvous {}", rendezvous_);

    std::vector<std::string> env = environment();
    std::vector<std::string> argv{"lmscope"};
    argv.insert(argv.end(), command_.begin(), command_.end());
    return supervise(start_ranks(self_path(), argv, env));
  }

 private:
  int nproc_ = 0, port_ = 0;
  std::string rendezvous_;
  std::vector<std::string> command_;
  sigset_t watched_{}, before_{};  // the signals the launcher waits for, and the mask it started with

  static std::string self_path() {
    std::string path(4096, '\0');
    const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
    if (n <= 0) throw std::runtime_error(fmt::format("cannot find this program: {}", std::strerror(errno)));
    path.resize(static_cast<std::size_t>(n));
    return path;
  }

  // This process's environment less what launch decides, then the common part of each rank's
  // ("RANK" and "LOCAL_RANK" are added per rank).
  std::vector<std::string> environment() const {
    const std::vector<std::string> ours{"RANK",        "LOCAL_RANK",  "WORLD_SIZE",     "LOCAL_WORLD_SIZE",
                                        "MASTER_ADDR", "MASTER_PORT", "LMSCOPE_RUN_ID", "LMSCOPE_RENDEZVOUS"};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var = *e;
      const std::string name = var.substr(0, var.find('='));
      if (std::find(ours.begin(), ours.end(), name) == ours.end()) env.push_back(var);
    }
    env.push_back(fmt::format("WORLD_SIZE={}", nproc_));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc_));
    if (rendezvous_.empty()) {
      env.push_back("MASTER_ADDR=127.0.0.1");
      env.push_back(fmt::format("MASTER_PORT={}", port_ > 0 ? port_ : free_port()));
    } else {
      env.push_back("LMSCOPE_RENDEZVOUS=" + rendezvous_);
    }
    // Keys of this launch apart from any earlier one's in a reused rendezvous directory.
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    env.push_back(fmt::format("LMSCOPE_RUN_ID=launch-{}-{}", ::getpid(),
                              std::chrono::duration_cast<std::chrono::milliseconds>(now).count()));
    // N ranks' OpenMP threads share the cores instead of each taking all of them.
    if (std::getenv("OMP_NUM_THREADS") == nullptr)
      env.push_back(fmt::format("OMP_NUM_THREADS={}", std::max(1, hardware_threads() / nproc_)));
    return env;
  }

  // Forks the ranks with SIGINT, SIGTERM and SIGCHLD blocked here (supervise() takes them with
  // sigtimedwait) and unblocked in each rank. A rank gets SIGKILL if the launcher dies, so none
  // outlives it waiting for the rest.
  std::map<pid_t, int> start_ranks(const std::string& exe, const std::vector<std::string>& args,
                                   const std::vector<std::string>& common_env) {
    ::signal(SIGCHLD, SIG_DFL);
    sigemptyset(&watched_);
    for (int s : {SIGINT, SIGTERM, SIGCHLD}) sigaddset(&watched_, s);
    ::pthread_sigmask(SIG_BLOCK, &watched_, &before_);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::map<pid_t, int> ranks;
    const pid_t launcher = ::getpid();
    std::fflush(nullptr);
    for (int i = 0; i < nproc_; ++i) {
      std::vector<std::string> env = common_env;
      env.push_back(fmt::format("RANK={}", i));
      env.push_back(fmt::format("LOCAL_RANK={}", i));
      std::vector<char*> envp;
      for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
      envp.push_back(nullptr);
      const pid_t pid = ::fork();
      if (pid == 0) {  // only async-signal-safe calls until exec
        ::pthread_sigmask(SIG_SETMASK, &before_, nullptr);
        // A process group of its own: a terminal's Ctrl-C reaches the launcher alone, which passes it
        // on once (a rank that got it twice would stop at once, without its checkpoint).
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != launcher) ::_exit(1);
        ::execve(exe.c_str(), argv.data(), envp.data());
        ::_exit(127);
      }
      if (pid < 0) {
        const int err = errno;
        for (const auto& [p, r] : ranks) ::kill(p, SIGKILL);
        for (const auto& [p, r] : ranks) ::waitpid(p, nullptr, 0);
        throw std::runtime_error(fmt::format("cannot start rank {}: {}", i, std::strerror(err)));
      }
      // The parent sets it too (POSIX's way to close the race: whichever runs first makes it so, and
      // the other's call fails harmlessly once the child has exec'd).
      ::setpgid(pid, pid);
      ranks[pid] = i;
    }
    return ranks;
  }

  // Waits for every rank. The first to fail is named in one line and the others get SIGTERM, then
  // SIGKILL after kGrace; SIGINT and SIGTERM to the launcher go to every rank the same way.
  int supervise(std::map<pid_t, int> running) {
    int exit_code = 0, interrupted = 0;
    bool failed = false, killed = false;
    Clock::time_point kill_at = Clock::time_point::max();
    auto stop_all = [&](int sig) {
      for (const auto& [pid, rank] : running) ::kill(pid, sig);
      if (sig == SIGKILL) killed = true;
      kill_at = std::min(kill_at, Clock::now() + kGrace);
    };
    while (!running.empty()) {
      int status = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        const auto it = running.find(pid);
        if (it == running.end()) continue;
        const int rank = it->second;
        running.erase(it);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (ok || failed || interrupted) continue;
        failed = true;
        exit_code = WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1;
        const std::string how = WIFEXITED(status) ? fmt::format("exited with code {}", WEXITSTATUS(status))
                                                  : fmt::format("was killed by {}", signal_name(WTERMSIG(status)));
        fmt::print(stderr, "lmscope launch: rank {} {}{}\n", rank, how,
                   running.empty() ? "" : "; stopped the other ranks");
        stop_all(SIGTERM);
      }
      if (running.empty()) break;
      if (Clock::now() >= kill_at && !killed) stop_all(SIGKILL);
      // Wake for a signal, or at the latest when the grace period ends.
      const auto left = killed || kill_at == Clock::time_point::max()
                            ? std::chrono::milliseconds(1000)
                            : std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now());
      const auto ms = std::max<std::int64_t>(1, left.count());
      timespec wait{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
      const int sig = ::sigtimedwait(&watched_, nullptr, &wait);
      if (sig == SIGINT || sig == SIGTERM) {
        if (!interrupted && !failed)
          fmt::print(stderr, "lmscope launch: got {}; stopping the ranks\n", signal_name(sig));
        // A second interrupt means now.
        stop_all(interrupted ? SIGKILL : sig);
        if (!interrupted && !failed) interrupted = sig;
      }
    }
    return interrupted && !failed ? 128 + interrupted : exit_code;
  }
};

}  // namespace

std::unique_ptr<Command> add_launch_command(CLI::App& parent) { return std::make_unique<LaunchCommand>(parent); }

}  // namespace lmscope::cli
