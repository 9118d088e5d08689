// Which rank of how many this process is, and where the ranks meet: read from the environment the
// way torchrun and Slurm set it (or `lmscope launch`, which sets torchrun's variables), so one
// process per device starts the same way on one machine or many.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace lmscope::parallel {

struct World {
  int rank = 0, size = 1, local_rank = 0;
  // Where the ranks meet: "file:DIR" (a directory every rank sees) or "tcp:HOST:PORT" (rank 0 serves
  // a key-value store there); empty for a world of one started without either.
  std::string rendezvous;
  // A rank that waits longer than this for the others (rendezvous, a collective) gives up with an
  // error naming what it waited for. LMSCOPE_DIST_TIMEOUT (seconds), 300 by default.
  std::chrono::seconds timeout{300};
  // A collective that has not finished this long after it was called ends the rank, with its flight
  // record (collective_watchdog.h): --collective-timeout, 600 s by default (PyTorch's for NCCL), long
  // enough for rank 0 to write a large checkpoint while the others wait in the next step.
  std::chrono::seconds collective_timeout{600};
  // Names this run's keys in a store other runs may have used (a file store's directory): the
  // launcher's LMSCOPE_RUN_ID, else Slurm's job and step ids ("slurm-JOB.STEP"), else torchrun's
  // TORCHELASTIC_RUN_ID ("torchrun-ID"), else empty.
  std::string run_id;
};

// From --rendezvous (empty when not given) and the environment. torchrun's variables first: RANK,
// WORLD_SIZE, LOCAL_RANK (RANK when unset), MASTER_ADDR, MASTER_PORT; else Slurm's: SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID (with MASTER_ADDR and MASTER_PORT, or --rendezvous file:DIR). Neither:
// a world of one. The rendezvous is --rendezvous, else LMSCOPE_RENDEZVOUS (which `lmscope launch
// --rendezvous file:DIR` sets), else tcp:MASTER_ADDR:MASTER_PORT (PORT + 1 when torchrun's agent
// serves its own store on MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True). Throws UserError, one sentence
// naming the variable and its value, for a value that is not a whole number, a rank outside
// [0, size), a world size below 1, RANK without WORLD_SIZE (or WORLD_SIZE above 1 without RANK), a
// world of several without MASTER_ADDR and without a rendezvous, MASTER_ADDR without MASTER_PORT, a
// port outside 1-65535, a rendezvous that is neither file:DIR nor tcp:HOST:PORT, an
// LMSCOPE_DIST_TIMEOUT below 1 and an LMSCOPE_RUN_ID with a '/'.
World world_from_environment(const std::string& rendezvous_flag = "");
// The same from any lookup of variables (nullptr: unset), for tests.
World world_from(const std::function<const char*(const char*)>& getenv, const std::string& rendezvous_flag);

// How many times the ranks were started again after a failure: lmscope launch --max-restarts's
// LMSCOPE_RESTART_COUNT, else torchrun's TORCHELASTIC_RESTART_COUNT; 0 on the first start.
int restart_count();

}  // namespace lmscope::parallel
