#include "lmscope/backend/cuda/graph_cache.h"
#include "lmscope/backend/cuda/cuda_check.h"

#include <stdexcept>

namespace lmscope::cuda {

GraphCache::~GraphCache() {
  abort();
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.exec);
}

void GraphCache::begin(std::uint64_t key) {
  LMSCOPE_CHECK(mode_ == Mode::idle, "a device graph begun inside another");
  if (counts_.given_up) return;
  key_ = key;
  signature_ = 0;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    // Launched now, so the device runs the phase while the host walks its ops (checking them) instead
    // of waiting for the walk: a phase that opens a step would otherwise start idle.
    LMSCOPE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
    mode_ = Mode::replaying;
    memory_.hold_segments(true);
    it->second.last_use = ++uses_;
    ++counts_.replayed;
    recordings_in_a_row_ = 0;
    return;
  }
  if (recordings_in_a_row_ == kMaxRecordingsWithoutReplay) {
    counts_.given_up = true;
    return;
  }
  // Relaxed: the allocator may take a new segment (cudaMalloc) while the phase is recorded.
  LMSCOPE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  mode_ = Mode::recording;
  memory_.hold_segments(true);
}

void GraphCache::end() {
  if (mode_ == Mode::idle && counts_.given_up) return;
  LMSCOPE_CHECK(mode_ != Mode::idle, "a device graph ended without a beginning");
  memory_.hold_segments(false);
  if (mode_ == Mode::recording) {
    mode_ = Mode::idle;
    cudaGraph_t graph = nullptr;
    LMSCOPE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    LMSCOPE_CUDA_CHECK(made);
    if (graphs_.size() >= kMaxGraphs) evict_oldest();
    graphs_[key_] = Entry{exec, signature_, ++uses_};
    ++counts_.recorded;
    ++recordings_in_a_row_;
    LMSCOPE_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    return;
  }
  mode_ = Mode::idle;
  if (graphs_.at(key_).signature != signature_)
    throw std::logic_error(
        "the ops of a replayed device graph differ from those it recorded: its key misses something they depend "
        "on, and the step ran the wrong work (run with --graphs off, and report this)");
}

void GraphCache::abort() {
  memory_.hold_segments(false);
  if (mode_ == Mode::recording) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);  // ends the capture whatever went wrong inside it
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  mode_ = Mode::idle;
}

void GraphCache::drop_all() {
  if (graphs_.empty()) return;
  LMSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.exec);
  graphs_.clear();
}

void GraphCache::evict_oldest() {
  auto oldest = graphs_.begin();
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  // The evicted graph may still run: destroying an executable graph waits for none of its launches,
  // so wait here (rare: only when keys keep changing).
  LMSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  cudaGraphExecDestroy(oldest->second.exec);
  graphs_.erase(oldest);
}

}  // namespace lmscope::cuda
