// A device that backends are made for (ggml's device interface in small): which one it is (its kind
// and index), what it is (its facts), apart from the stream and the ops a backend runs on it. A
// backend made for a device makes its allocator for that device (cuda: CudaAllocator(index), whose
// segments are that GPU's) and keeps its work there, so two backends on two devices in one process
// need nothing special. Each backend has an allocator of its own, so its memory record is its own.
#pragma once

#include "lmscope/device/device_facts.h"

#include <string>

namespace lmscope {

enum class DeviceKind { cpu, cuda };

class Device {
 public:
  Device(DeviceKind kind, int index, DeviceFacts facts) : kind_(kind), index_(index), facts_(std::move(facts)) {}
  DeviceKind kind() const { return kind_; }
  // The CUDA device ordinal (cudaSetDevice's); 0 for the host.
  int index() const { return index_; }
  const DeviceFacts& facts() const { return facts_; }
  // "cpu", or "cuda:1 (NVIDIA H100 80GB HBM3)": as a backend's allocator on it names itself.
  std::string name() const;

 private:
  DeviceKind kind_;
  int index_;
  DeviceFacts facts_;
};

// The host.
Device cpu_device();
// CUDA device `index`, its facts asked of the driver (the flash facts with that device current, the
// one current before made current again): UserError where there is no such GPU, Unsupported in a
// build without CUDA.
Device cuda_device(int index);
// The CUDA device this thread's work goes to now (a rank's once use_gpu made it so); Unsupported in a
// build without CUDA.
int current_cuda_device();

}  // namespace lmscope
