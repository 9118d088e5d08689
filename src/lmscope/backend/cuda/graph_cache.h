// The CUDA backend's device graphs (Backend::begin_graph): one executable graph per key, recorded
// from the backend's stream the first time its key comes (and launched at its end) and replayed after
// (launched at its beginning). Each op asks skip() right before it launches: false while recording
// (the launch goes into the graph) or with no graph under way, true while a graph replays (the op
// launches nothing). Either way the op's arguments are folded into a signature, and a replay whose
// ops differ from the recording's throws: a key that misses something is found, not left to give
// wrong results quietly.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/core/hash.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <unordered_map>

namespace lmscope::cuda {

class GraphCache {
 public:
  // Holds the allocator's segments while a graph is recorded or replayed (Allocator::hold_segments).
  GraphCache(cudaStream_t stream, Allocator& memory) : stream_(stream), memory_(memory) {}
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  void begin(std::uint64_t key);
  void end();    // launches a graph just recorded; after a replay, throws on a signature mismatch
  void abort();  // an exception came between begin and end: what was recorded is dropped
  bool active() const { return mode_ != Mode::idle; }
  // Every recorded graph goes (after the stream has run them): called before device memory they may
  // point into goes back to the driver.
  void drop_all();
  Backend::GraphCounts counts() const { return counts_; }
  // Where recordings and replays run from now on (not inside one).
  void set_stream(cudaStream_t stream) { stream_ = stream; }

  // `op` names the op (a string literal: its address is stable); the rest are its arguments:
  // tensors (address, size and type), pointers, numbers.
  template <typename... Args>
  bool skip(const char* op, const Args&... args) {
    note(op, args...);
    return replaying();
  }
  // The same fold without the answer, for an op whose arguments come in several parts.
  template <typename... Args>
  void note(const char* op, const Args&... args) {
    if (mode_ == Mode::idle) return;
    signature_ = hash_mix(signature_, reinterpret_cast<std::uintptr_t>(op));
    (fold(args), ...);
  }
  bool replaying() const { return mode_ == Mode::replaying; }

  // Graphs kept at once; the least recently used goes when a new one would pass it (keys that never
  // come back, such as the first steps' before the allocator settles, should not pile up).
  static constexpr std::size_t kMaxGraphs = 32;
  // Recording costs more than running op by op (the instantiation): after this many recordings in a
  // row with no replay the keys are taken to keep changing, and graphs stop for the backend's life.
  static constexpr int kMaxRecordingsWithoutReplay = 24;

 private:
  enum class Mode { idle, recording, replaying };
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    std::uint64_t signature = 0;
    std::uint64_t last_use = 0;
  };
  void fold(const Tensor& t) {
    signature_ = hash_mix(
        hash_mix(hash_mix(signature_, reinterpret_cast<std::uintptr_t>(t.data)), static_cast<std::uint64_t>(t.numel())),
        static_cast<std::uint64_t>(t.dtype));
  }
  void fold(const void* p) { signature_ = hash_mix(signature_, reinterpret_cast<std::uintptr_t>(p)); }
  template <typename T>
  requires std::is_arithmetic_v<T> || std::is_enum_v<T>
  void fold(T v) {
    if constexpr (std::is_floating_point_v<T>)
      signature_ = hash_mix(signature_, static_cast<double>(v));
    else
      signature_ = hash_mix(signature_, static_cast<std::uint64_t>(v));
  }
  void evict_oldest();

  cudaStream_t stream_;
  Allocator& memory_;
  std::unordered_map<std::uint64_t, Entry> graphs_;
  Mode mode_ = Mode::idle;
  std::uint64_t key_ = 0, signature_ = 0, uses_ = 0;
  int recordings_in_a_row_ = 0;
  Backend::GraphCounts counts_;
};

}  // namespace lmscope::cuda
