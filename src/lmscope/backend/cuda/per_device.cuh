// What the driver says of a device, asked once per device: the launchers' caches (SM counts, which
// code a GPU runs, kernels' occupancy) are keyed by the device current when asked, never by the
// process alone, so backends on two GPUs of one process each read their own. Host code only; free of
// fmt and lmscope's C++20 headers, as launch_check.cuh.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace lmscope::cuda {

// The device this thread's CUDA work goes to now.
inline int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("no current CUDA device");
  return device;
}

// A value per device and key, read(device) the first time (device, key) is asked; thread-safe.
template <typename Key, typename T>
class PerDevice {
 public:
  template <typename Read>
  T get(const Key& key, Read&& read) {
    const int device = current_device();
    const std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = known_.find({device, key}); it != known_.end()) return it->second;
    T value = read(device);  // nothing kept if it throws
    known_.emplace(std::make_pair(device, key), value);
    return value;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, Key>, T> known_;
};

}  // namespace lmscope::cuda
