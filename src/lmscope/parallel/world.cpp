// The rank environment: torchrun's variables, else Slurm's, else a world of one. Every mistake is one
// sentence naming the variable and its value, since a rank that starts wrong otherwise waits out the
// rendezvous timeout before anyone sees why.
#include "lmscope/parallel/world.h"

#include "lmscope/core/error.h"

#include <charconv>
#include <cstdlib>
#include <optional>

namespace lmscope::parallel {
namespace {

using Getenv = std::function<const char*(const char*)>;

std::optional<std::string> lookup(const Getenv& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// A whole number, sign allowed (a negative rank is then out of range, not "not a number").
long long whole(const char* name, const std::string& value) {
  long long n = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, n);
  if (value.empty() || ec != std::errc() || p != end) user_error("{} must be a whole number, got '{}'", name, value);
  return n;
}

int port_number(const char* name, const std::string& value) {
  const long long p = whole(name, value);
  if (p < 1 || p > 65535) user_error("{} must be a port from 1 to 65535, got {}", name, value);
  return static_cast<int>(p);
}

// "file:DIR" or "tcp:HOST:PORT", as given; anything else is the user's mistake.
void check_rendezvous(const char* name, const std::string& r) {
  if (r.starts_with("file:") && r.size() > 5) return;
  if (r.starts_with("tcp:")) {
    const std::string rest = r.substr(4);
    const auto colon = rest.rfind(':');
    if (colon != std::string::npos && colon > 0) {
      port_number(name, rest.substr(colon + 1));
      return;
    }
  }
  user_error("{} must be file:DIR or tcp:HOST:PORT, got '{}'", name, r);
}

}  // namespace

World world_from(const Getenv& getenv, const std::string& rendezvous_flag) {
  World w;
  // Which variables name the ranks: torchrun's (lmscope launch sets these too), else Slurm's.
  const char *rank_var = "RANK", *size_var = "WORLD_SIZE", *local_var = "LOCAL_RANK";
  if (!lookup(getenv, "RANK") && lookup(getenv, "SLURM_PROCID"))
    rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS", local_var = "SLURM_LOCALID";
  const auto rank = lookup(getenv, rank_var), size = lookup(getenv, size_var), local = lookup(getenv, local_var);
  if (rank) {
    if (!size) user_error("{} is set ({}) but {} is not: set it to the number of ranks", rank_var, *rank, size_var);
    const long long n = whole(size_var, *size), r = whole(rank_var, *rank);
    if (n < 1) user_error("{} must be at least 1, got {}", size_var, *size);
    if (r < 0 || r >= n)
      user_error("{} must be from 0 to {} - 1, got {} (with {} {})", rank_var, size_var, *rank, size_var, n);
    w.size = static_cast<int>(n), w.rank = static_cast<int>(r), w.local_rank = w.rank;
    if (local) {
      const long long l = whole(local_var, *local);
      if (l < 0 || l >= n) user_error("{} must be from 0 to {} - 1, got {}", local_var, size_var, *local);
      w.local_rank = static_cast<int>(l);
    }
  } else if (size && whole(size_var, *size) != 1) {
    user_error("{} is set ({}) but {} is not: set it to this process's rank", size_var, *size, rank_var);
  }

  // Where the ranks meet: --rendezvous, else the launcher's LMSCOPE_RENDEZVOUS, else MASTER_ADDR:MASTER_PORT.
  const auto env_rendezvous = lookup(getenv, "LMSCOPE_RENDEZVOUS");
  if (!rendezvous_flag.empty()) {
    check_rendezvous("--rendezvous", rendezvous_flag);
    w.rendezvous = rendezvous_flag;
  } else if (env_rendezvous && !env_rendezvous->empty()) {
    check_rendezvous("LMSCOPE_RENDEZVOUS", *env_rendezvous);
    w.rendezvous = *env_rendezvous;
  } else if (const auto addr = lookup(getenv, "MASTER_ADDR"); addr && !addr->empty()) {
    const auto port = lookup(getenv, "MASTER_PORT");
    if (!port) user_error("MASTER_ADDR is set ({}) but MASTER_PORT is not: set it to a free port on that host", *addr);
    int p = port_number("MASTER_PORT", *port);
    // torchrun's agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE): ours takes
    // the next port, every rank alike.
    if (const auto agent = lookup(getenv, "TORCHELASTIC_USE_AGENT_STORE"); agent && *agent == "True") {
      if (p == 65535) user_error("MASTER_PORT is 65535, and under torchrun lmscope's store needs the port after it");
      ++p;
    }
    w.rendezvous = "tcp:" + *addr + ":" + std::to_string(p);
  } else if (w.size > 1) {
    user_error("{} is set ({}) but MASTER_ADDR is not: set MASTER_ADDR and MASTER_PORT, or give --rendezvous file:DIR",
               rank_var, *rank);
  }

  if (const auto t = lookup(getenv, "LMSCOPE_DIST_TIMEOUT")) {
    const long long s = whole("LMSCOPE_DIST_TIMEOUT", *t);
    if (s < 1) user_error("LMSCOPE_DIST_TIMEOUT must be a positive number of seconds, got {}", *t);
    w.timeout = std::chrono::seconds(s);
  }

  if (const auto id = lookup(getenv, "LMSCOPE_RUN_ID"); id && !id->empty()) {
    // It names files in a file: rendezvous's directory.
    if (id->find('/') != std::string::npos) user_error("LMSCOPE_RUN_ID must not contain '/', got '{}'", *id);
    w.run_id = *id;
  } else if (const auto job = lookup(getenv, "SLURM_JOB_ID")) {
    const auto step = lookup(getenv, "SLURM_STEP_ID");
    w.run_id = "slurm-" + *job + (step ? "." + *step : "");
  } else if (const auto torchrun = lookup(getenv, "TORCHELASTIC_RUN_ID");
             torchrun && !torchrun->empty() && *torchrun != "none" && torchrun->find('/') == std::string::npos) {
    w.run_id = "torchrun-" + *torchrun;
  }
  return w;
}

int restart_count() {
  for (const char* var : {"LMSCOPE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return 0;
}

World world_from_environment(const std::string& rendezvous_flag) {
  return world_from([](const char* name) { return static_cast<const char*>(std::getenv(name)); }, rendezvous_flag);
}

}  // namespace lmscope::parallel
