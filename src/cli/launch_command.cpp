// lmscope launch: N ranks of an lmscope command on this machine, one process each, with the variables
// torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so a rank starts the same
// way under launch, torchrun or Slurm. With --nnodes, one launch a machine starts that node's ranks of
// one world, meeting at --master-addr:--port. The launcher only starts and watches (launch_ranks.h),
// and with --max-restarts starts them again after a failure.
#include "commands.h"
#include "launch_ranks.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/core/error.h"
#include "lmscope/parallel/flight_recorder.h"
#include "lmscope/parallel/world.h"

#include <fmt/format.h>

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace lmscope::cli {
namespace {

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
    environment_failure("cannot find a free port for the rendezvous: {}", std::strerror(err));
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

// How many ranks a CPU rank's core may hold with --oversubscribe.
constexpr int kRanksPerCoreOversubscribed = 8;

// Whether the command's ranks run on GPUs: its --device (any cuda in a list), allreduce's --backend
// nccl, else the default device (cuda where a GPU is visible).
bool ranks_on_gpus(const std::vector<std::string>& command) {
  for (std::size_t i = 0; i < command.size(); ++i) {
    for (const char* flag : {"--device", "--backend"}) {
      const std::string f = flag, arg = command[i];
      std::string value;
      if (arg == f && i + 1 < command.size())
        value = command[i + 1];
      else if (arg.starts_with(f + "="))
        value = arg.substr(f.size() + 1);
      else
        continue;
      return value.find("cuda") != std::string::npos || value.find("nccl") != std::string::npos;
    }
  }
  return default_device() == "cuda";
}

class LaunchCommand : public Command {
 public:
  explicit LaunchCommand(CLI::App& parent) {
    app = parent.add_subcommand("launch",
                                "Run an lmscope command as --nproc ranks on this machine (one process each, with "
                                "torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT): lmscope launch --nproc 2 "
                                "-- train ...");
    app->add_option("--nproc", nproc_,
                    "How many ranks to start: at most one per visible GPU (GPU ranks) or per core (CPU ranks)")
        ->required();
    app->add_flag("--oversubscribe", oversubscribe_,
                  fmt::format("CPU ranks: allow more ranks than cores, up to {} a core (tests of many ranks on a "
                              "small machine)",
                              kRanksPerCoreOversubscribed));
    app->add_option("--rendezvous", rendezvous_,
                    "Where the ranks meet: file:DIR (files under a directory every rank sees) or tcp:HOST:PORT "
                    "(rank 0 serves a store at PORT of this machine, the ranks reach it at HOST:PORT); default: "
                    "tcp:127.0.0.1 at --port");
    app->add_option("--port", port_,
                    "The rendezvous's TCP port, served by rank 0 (default: one that is free; with --nnodes, required)");
    app->add_option("--nnodes", nnodes_,
                    "Machines (nodes) the run spans: each runs lmscope launch with the same flags and its own "
                    "--node-rank; ranks are numbered node by node")
        ->capture_default_str();
    app->add_option("--node-rank", node_rank_, "This machine's place among --nnodes, from 0 (node 0 holds rank 0)")
        ->capture_default_str();
    app->add_option("--master-addr", master_addr_,
                    "The address of node 0, where rank 0 serves the rendezvous at --port (torchrun's --master-addr)")
        ->capture_default_str();
    app->add_option("--max-restarts", max_restarts_,
                    "Start every rank again after a rank fails (not after a user error or a signal), up to this "
                    "many times; train with --checkpoint-dir goes on from its newest complete checkpoint")
        ->capture_default_str();
    app->add_option("command", command_, "After --: the lmscope command and its flags, run by every rank");
  }

  int run() override {
    // Signals taken from here on: one that comes while the ranks are being started is not lost.
    RankGroup ranks;
    if (nproc_ < 1) user_error("--nproc must be at least 1, got {}", nproc_);
    if (command_.empty())
      user_error("launch needs the command every rank runs after --, e.g. lmscope launch --nproc 2 -- train ...");
    if (command_[0] == "launch") user_error("launch cannot run launch; give the command every rank runs after --");
    if (!rendezvous_.empty())  // the ranks' own check: file:DIR or tcp:HOST:PORT
      parallel::world_from([](const char*) -> const char* { return nullptr; }, rendezvous_);
    if (app->count("--port") > 0 && (port_ < 1 || port_ > 65535))
      user_error("--port must be from 1 to 65535, got {}", port_);
    if (app->count("--port") > 0 && !rendezvous_.empty())
      user_error("--port is the default rendezvous's (tcp:127.0.0.1); leave it out with --rendezvous {}", rendezvous_);
    if (max_restarts_ < 0) user_error("--max-restarts must be non-negative, got {}", max_restarts_);
    check_nodes();
    check_rank_count();

    std::vector<std::string> argv{"lmscope"};
    argv.insert(argv.end(), command_.begin(), command_.end());
    const std::string exe = self_path();
    for (int restart = 0;; ++restart) {
      const std::string records = flight_record_dir(restart);
      const RanksOutcome outcome = ranks.run(exe, argv, environment(restart, records), nproc_, first_rank());
      report_flight_records(records, outcome.failed);
      if (!outcome.restartable() || restart == max_restarts_) return outcome.exit_code;
      fmt::print(stderr, "lmscope launch: starting the ranks again (restart {} of {})\n", restart + 1, max_restarts_);
    }
  }

 private:
  int nproc_ = 0, port_ = 0, max_restarts_ = 0, nnodes_ = 1, node_rank_ = 0;
  bool oversubscribe_ = false;
  std::string rendezvous_, master_addr_ = "127.0.0.1";
  std::vector<std::string> command_;

  int first_rank() const { return node_rank_ * nproc_; }

  // Several nodes meet at node 0's TCP store, at a port every node is told (a free one cannot be
  // agreed on); each node's launcher starts and watches its own ranks only.
  void check_nodes() const {
    if (nnodes_ < 1) user_error("--nnodes must be at least 1, got {}", nnodes_);
    constexpr long long kMaxWorld = 1 << 20;
    if (static_cast<long long>(nnodes_) * nproc_ > kMaxWorld)
      user_error("--nnodes {} of --nproc {} is more than {} ranks", nnodes_, nproc_, kMaxWorld);
    if (node_rank_ < 0 || node_rank_ >= nnodes_)
      user_error("--node-rank must be from 0 to {} (--nnodes {}), got {}", nnodes_ - 1, nnodes_, node_rank_);
    if (master_addr_.empty() || master_addr_.find_first_of(" /") != std::string::npos)
      user_error("--master-addr takes a host name or address, got '{}'", master_addr_);
    if (app->count("--master-addr") > 0 && !rendezvous_.empty())
      user_error("--master-addr is the default rendezvous's host; leave it out with --rendezvous {}", rendezvous_);
    if (nnodes_ == 1) return;
    if (!rendezvous_.empty())
      user_error(
          "--nnodes {} meets at --master-addr and --port (node 0's rank 0 serves the rendezvous there); "
          "leave out --rendezvous",
          nnodes_);
    if (app->count("--master-addr") == 0 || app->count("--port") == 0)
      user_error(
          "--nnodes {} needs --master-addr and --port, the same on every node (node 0's address, a port "
          "free there)",
          nnodes_);
    if (max_restarts_ > 0)
      user_error(
          "--max-restarts is for one node: several nodes' launchers cannot agree on starting again (a "
          "restart of several nodes is not built)");
  }

  // One rank a GPU (a rank takes the GPU of its LOCAL_RANK), one a core for CPU ranks unless
  // --oversubscribe: beyond that the ranks only wait on each other, and an unbounded --nproc would
  // fork until the machine gives out.
  void check_rank_count() const {
    if (ranks_on_gpus(command_)) {
      const int gpus = static_cast<int>(list_gpus().size());
      if (nproc_ > gpus)
        user_error("--nproc {} asks for more ranks than the {} GPU{} visible here (one rank a GPU)", nproc_, gpus,
                   gpus == 1 ? "" : "s");
      return;
    }
    const int cores = hardware_threads();
    if (!oversubscribe_ && nproc_ > cores)
      user_error(
          "--nproc {} asks for more CPU ranks than the {} core{} this process may run on; --oversubscribe allows up "
          "to {} a core",
          nproc_, cores, cores == 1 ? "" : "s", kRanksPerCoreOversubscribed);
    if (nproc_ > cores * kRanksPerCoreOversubscribed)
      user_error("--nproc {} asks for more than {} CPU ranks a core ({} cores here)", nproc_,
                 kRanksPerCoreOversubscribed, cores);
  }

  static std::string self_path() {
    std::string path(4096, '\0');
    const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
    if (n <= 0) environment_failure("cannot find this program: {}", std::strerror(errno));
    path.resize(static_cast<std::size_t>(n));
    return path;
  }

  // Where the ranks of the `restart`-th start write their flight records: a directory of its own,
  // under LMSCOPE_FLIGHT_RECORD_DIR where the user gave one, else a new one under $TMPDIR.
  static std::string flight_record_dir(int restart) {
    std::error_code ec;
    if (const char* d = std::getenv("LMSCOPE_FLIGHT_RECORD_DIR"); d != nullptr && *d != '\0') {
      const std::string dir = fmt::format("{}/launch-{}-start-{}", d, ::getpid(), restart);
      std::filesystem::create_directories(dir, ec);
      if (ec) user_error("cannot make the flight records' directory '{}': {}", dir, ec.message());
      return dir;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        (std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "lmscope-launch-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr)
      environment_failure("cannot make a directory for the ranks' flight records under '{}': {}",
                          tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", std::strerror(errno));
    return pattern;
  }

  // After a failure, what the ranks' flight records say (a rank that never entered the collective the
  // others waited in); the records are kept where they say something, else removed with their directory.
  void report_flight_records(const std::string& dir, bool failed) const {
    const std::vector<std::string> said =
        failed ? parallel::compare_flight_records(dir, nproc_, first_rank()) : std::vector<std::string>{};
    for (const std::string& line : said) fmt::print(stderr, "lmscope launch: {}\n", line);
    std::error_code ec;
    if (!said.empty())
      fmt::print(stderr, "lmscope launch: the ranks' flight records are in '{}'{}\n", dir,
                 nnodes_ > 1 ? fmt::format(" (node {}'s ranks, {} to {}; the others' are on their nodes)", node_rank_,
                                           first_rank(), first_rank() + nproc_ - 1)
                             : "");
    else
      std::filesystem::remove_all(dir, ec);
  }

  // This process's environment less what launch decides, then the common part of each rank's for
  // its `restart`-th start ("RANK" and "LOCAL_RANK" are added per rank), whose flight records go to
  // `records`.
  std::vector<std::string> environment(int restart, const std::string& records) const {
    const std::vector<std::string> ours{
        "RANK",        "LOCAL_RANK",     "WORLD_SIZE",         "LOCAL_WORLD_SIZE",      "MASTER_ADDR",
        "MASTER_PORT", "LMSCOPE_RUN_ID", "LMSCOPE_RENDEZVOUS", "LMSCOPE_RESTART_COUNT", "LMSCOPE_FLIGHT_RECORD_DIR"};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var = *e;
      const std::string name = var.substr(0, var.find('='));
      if (std::find(ours.begin(), ours.end(), name) == ours.end()) env.push_back(var);
    }
    env.push_back(fmt::format("WORLD_SIZE={}", nnodes_ * nproc_));
    env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc_));
    if (rendezvous_.empty()) {
      env.push_back("MASTER_ADDR=" + master_addr_);
      env.push_back(fmt::format("MASTER_PORT={}", port_ > 0 ? port_ : free_port()));
    } else {
      env.push_back("LMSCOPE_RENDEZVOUS=" + rendezvous_);
    }
    // Keys of this start apart from any earlier one's in a reused rendezvous directory. Several nodes'
    // ranks share one store, fresh in rank 0's process: their id is the same on every node.
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    env.push_back(nnodes_ > 1
                      ? fmt::format("LMSCOPE_RUN_ID=launch-{}-nodes", nnodes_)
                      : fmt::format("LMSCOPE_RUN_ID=launch-{}-{}-{}", ::getpid(),
                                    std::chrono::duration_cast<std::chrono::milliseconds>(now).count(), restart));
    env.push_back(fmt::format("LMSCOPE_RESTART_COUNT={}", restart));
    env.push_back("LMSCOPE_FLIGHT_RECORD_DIR=" + records);
    // N ranks' OpenMP threads share the cores instead of each taking all of them.
    if (std::getenv("OMP_NUM_THREADS") == nullptr)
      env.push_back(fmt::format("OMP_NUM_THREADS={}", std::max(1, hardware_threads() / nproc_)));
    return env;
  }
};

}  // namespace

std::unique_ptr<Command> add_launch_command(CLI::App& parent) { return std::make_unique<LaunchCommand>(parent); }

}  // namespace lmscope::cli
