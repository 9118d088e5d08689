#include "lmscope/backend/cuda/stream_pool.h"
#include "lmscope/backend/cuda/cuda_check.h"

#include <map>
#include <mutex>
#include <utility>

namespace lmscope::cuda {
namespace {

struct Pool {
  std::mutex mutex;
  std::map<int, std::map<int, cudaStream_t>> free;   // device -> streams given back, by when made
  std::map<cudaStream_t, std::pair<int, int>> made;  // every stream the pool made: (device, when made)
  int count = 0;
};

// Never destroyed: its streams outlive every backend, and the driver ends them with the process. One
// per process is safe beside several devices: streams are kept and handed out per device.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

cudaStream_t take_stream() {
  int device = 0;
  LMSCOPE_CUDA_CHECK(cudaGetDevice(&device));
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  std::map<int, cudaStream_t>& free = p.free[device];
  if (!free.empty()) {  // the earliest made: the process's first stream where it is free
    const cudaStream_t s = free.begin()->second;
    free.erase(free.begin());
    return s;
  }
  cudaStream_t s = nullptr;
  LMSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  p.made[s] = {device, p.count++};
  return s;
}

void give_back_stream(cudaStream_t stream) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  const auto it = p.made.find(stream);
  LMSCOPE_CHECK(it != p.made.end(), "a stream given back that the pool never made");
  p.free[it->second.first][it->second.second] = stream;
}

}  // namespace lmscope::cuda
