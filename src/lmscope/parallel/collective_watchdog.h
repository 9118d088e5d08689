// A thread beside a communicator that sees its collectives end, and ends the rank when one does not:
// a collective that has not finished --collective-timeout after it was called, or an error the
// library reports on its own (NCCL's asynchronous errors: a peer gone, a network failure), writes the
// rank's flight record, aborts the communicator (ncclCommAbort: the GPU's waiting kernels end) and
// exits 1 after one sentence naming the rank, the collective, its sequence number, size and the time
// waited. Without it an NCCL rank whose peer stopped inside a collective waits forever. A stop signal
// (FlightRecorder::note_signal) has the record written too, for lmscope launch to compare.
#pragma once

#include "lmscope/parallel/flight_recorder.h"
#include "lmscope/parallel/world.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace lmscope::parallel {

class CollectiveWatchdog {
 public:
  struct Hooks {
    std::function<void()> thread_start;        // on the watchdog's thread first (CUDA: its device)
    std::function<std::string()> async_error;  // "" while there is none
    std::function<void()> abort;               // before the process exits
  };
  // Watches the collectives of `recorder`'s rank of `world` on `library` ("NCCL", "Gloo").
  CollectiveWatchdog(FlightRecorder& recorder, const World& world, std::string library, Hooks hooks);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Collective `seq` (the recorder's) was queued; `done` says whether it has ended, asked on the
  // watchdog's thread until it says so (NCCL: its event; Gloo: its worker's mark).
  void watch(std::uint64_t seq, std::function<bool()> done);
  // Stops watching, for a communicator going away after its collectives were given up.
  void stop();

 private:
  void run();
  [[noreturn]] void fail(const std::string& what, const std::string& reason);
  std::string prefix() const;

  FlightRecorder& recorder_;
  World world_;
  std::string library_;
  Hooks hooks_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::uint64_t, std::function<bool()>> pending_;  // under mutex_, by sequence number
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lmscope::parallel
