// A rank's last collectives, kept as they happen and written out when something goes wrong: a
// collective that timed out or failed, or a signal that stops the rank. Each record is one collective
// as this rank saw it: its sequence number (the same collective has the same number on every rank,
// which call them in the same order), kind, bytes, the training step it belongs to, and when it was
// queued, started and ended. Put side by side, the ranks' records say which rank never entered the
// collective the others wait in (compare_flight_records; lmscope launch prints it after a failure), as
// PyTorch's NCCL flight recorder does.
#pragma once

#include "lmscope/parallel/test_fault.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace lmscope::parallel {

struct World;

struct CollectiveRecord {
  enum class State { queued, started, completed, failed };
  std::uint64_t seq = 0;   // from 1, in the order this rank called them
  const char* kind = "";   // "all-reduce", "reduce-scatter", "all-gather", "broadcast", "barrier"
  std::int64_t bytes = 0;  // what this rank gives to it
  int tensors = 0;         // tensors in the call (a group of them is one collective)
  std::int64_t step = 0;   // the training step under way when it was called (0: before the first)
  State state = State::queued;
  std::int64_t queued_us = 0, started_us = 0, ended_us = 0;  // since the epoch (comparable across ranks); 0: not yet
};

const char* state_name(CollectiveRecord::State s);
// A collective's size as the messages say it: "4 B", "471.25 KiB in 21 tensors".
std::string size_words(std::int64_t bytes, int tensors);

class FlightRecorder {
 public:
  // Keeps the last `capacity` collectives of rank `world.rank`, written (write) under
  // flight_record_dir(world).
  FlightRecorder(const World& world, std::string backend, std::size_t capacity = 2048);

  // A collective called: its sequence number, recorded as queued. (A test fault for the collective
  // acts first: a rank lost there never entered it.)
  std::uint64_t enter(const char* kind, std::int64_t bytes, int tensors);
  void started(std::uint64_t seq);
  void ended(std::uint64_t seq, bool ok);
  // The step the collectives called from now on belong to.
  void begin_step(std::int64_t step) {
    step_.store(step);
    in_step_.store(0);
  }
  std::int64_t step() const { return step_.load(); }
  // The collectives within the last `capacity`, oldest first.
  std::vector<CollectiveRecord> records() const;
  CollectiveRecord record(std::uint64_t seq) const;  // seq within the last `capacity`

  // Writes the records and `reason` to path(); returns the path, or "" (with why in *failure) where
  // it could not be written. Only the first call writes; later ones return the path written.
  std::string write(const std::string& reason, std::string* failure = nullptr);
  const std::string& path() const { return path_; }

  // A stop signal came (async-signal-safe: the handler calls it); a watchdog writes the record then.
  static void note_signal(int sig) { signal_.store(sig); }
  static int signal_noted() { return signal_.load(); }

 private:
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> ring_;
  std::uint64_t next_ = 1;
  std::atomic<std::int64_t> step_{0}, in_step_{0};  // in_step_: collectives called in this step
  TestFault fault_;
  int rank_, size_;
  std::string backend_, path_;
  bool written_ = false;
  static std::atomic<int> signal_;
};

// Where the ranks of `world` write their records: LMSCOPE_FLIGHT_RECORD_DIR (lmscope launch sets a
// directory of its own), else $TMPDIR (/tmp) /lmscope-flight-records/RUN_ID (or "run"). Rank R's is
// rank-R.json there.
std::string flight_record_dir(const World& world);

// What the records under `dir` of ranks `first` to `first + size - 1` say (a node's of several: the
// others' records are on their nodes), in sentences: a rank that never entered the collective another
// waits in, ranks that called different collectives under one sequence number, a rank that left no
// record. Empty where the directory holds no record.
std::vector<std::string> compare_flight_records(const std::string& dir, int size, int first = 0);

}  // namespace lmscope::parallel
