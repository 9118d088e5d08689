// The shape-only backend of the dry run (--dry-run): the model's own code runs on it unchanged and
// nothing is computed. Every buffer comes from the same caching allocator (core/allocator.h) with
// the same sizes and rounding, and every op takes the same scratch in the same order
// (backend/op_scratch.h) as on the device it stands for, so its record of allocations is that
// device's record, event for event, in a fraction of a second and on any machine.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/device/flash_plan.h"

#include <memory>
#include <string>

namespace lmscope {

struct DryRunTarget {
  std::string device = "cuda";  // the backend it stands for: cpu or cuda
  std::string device_name;      // as that backend's allocator names itself
  std::size_t memory = 0;       // the memory limit: what the device has, or --memory-limit
  // What the device holds beyond the allocator (CUDA context, cuBLASLt workspace), as measured on
  // it (0 where not known); the allocator may hand out memory minus this.
  std::size_t overhead = 0;
  std::string overhead_source;  // where that figure comes from
  FlashKernelFacts flash;       // cuda: what the flash-attention plan reads of the GPU
};

// The device a dry run stands for: the host for cpu; for cuda, the visible GPU when there is one,
// else an H100 80GB HBM3 (its facts are stored: device/device_facts.cpp). memory_limit 0: the device's
// memory (the host's available memory; the GPU's, or the stored H100's with none).
DryRunTarget dry_run_target(const std::string& device, std::size_t memory_limit = 0);

// precision as make_backend takes it; the same combinations are refused (Unsupported).
std::unique_ptr<Backend> make_meta_backend(const DryRunTarget& target, const std::string& precision);

// True for a backend that computes nothing (the dry run's): its values are not to be read.
bool is_dry_run(const Backend& backend);

}  // namespace lmscope
