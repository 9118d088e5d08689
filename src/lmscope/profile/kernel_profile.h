// Where the GPU's time goes: every kernel (and memset, memcpy) a run launched, with the phase it
// was launched in and its device start and end. A backend that can see its device's work hands out
// a KernelTracer (the CUDA backend, through CUPTI); summarize_kernels turns the records of the
// measured steps into per-step totals by phase, category and kernel.
#pragma once

#include "lmscope/core/allocator.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lmscope {

enum class DeviceWork { kernel, memset, memcpy };

// Times of records are nanoseconds on the host's steady clock (std::chrono::steady_clock's epoch),
// the clock the allocator stamps its events with, so device work and host ranges line up.
struct KernelRecord {
  std::string name;  // demangled, without namespaces and arguments: "rmsnorm_forward_kernel<__nv_bfloat16>"
  Phase phase = Phase::setup;
  std::uint64_t start_ns = 0, end_ns = 0;
  DeviceWork work = DeviceWork::kernel;
  std::uint32_t device = 0, stream = 0;
  std::uint32_t correlation = 0;      // the launching call's (LaunchRecord::correlation)
  std::uint32_t grid[3] = {0, 0, 0};  // kernels only
  std::uint32_t block[3] = {0, 0, 0};
  std::uint32_t registers = 0, shared_bytes = 0;  // per thread; static + dynamic per block
  std::uint64_t bytes = 0;                        // memset and memcpy
  std::string copy;                               // memcpy: "HtoD", "DtoH", "DtoD", ...
};

// A host call into the CUDA runtime or driver (cudaLaunchKernel, cuLaunchKernel, cudaMemsetAsync,
// cudaEventRecord, ...) made while a tracer ran.
struct LaunchRecord {
  std::string api;  // "cudaLaunchKernel"
  std::uint64_t start_ns = 0, end_ns = 0;
  std::uint32_t correlation = 0;  // shared with the device work it enqueued, if any
  bool driver = false;            // a driver call (cuLaunchKernel), else the runtime's
};

struct DeviceActivity {
  std::vector<KernelRecord> work;      // in start order
  std::vector<LaunchRecord> launches;  // in start order
};

class KernelTracer {
 public:
  virtual ~KernelTracer() = default;
  // Work enqueued from now on (by this thread) belongs to phase p, until the next call.
  virtual void set_phase(Phase p) = 0;
  // Waits for the device, stops recording and returns every record since the tracer was made.
  virtual DeviceActivity finish() = 0;
};

// What a kernel is for, from its name: "GEMM", "attention", "RMSNorm", "RoPE/heads", "SwiGLU",
// "loss", "embedding", "optimizer", "elementwise", "memset/memcpy", "collective" or "other".
const char* kernel_category(std::string_view name);

struct KernelSummary {
  Phase phase = Phase::setup;
  std::string category, name;
  double calls_per_step = 0, ms_per_step = 0;
};

struct KernelProfile {
  int steps = 0;                          // 0: no profile was taken
  std::vector<KernelSummary> kernels;     // one per (phase, name), longest first
  std::vector<KernelSummary> categories;  // one per (phase, category) with name empty, in phase order, longest first
  // Sum of kernel durations per step in a phase, collectives aside (they run on a stream of their
  // own, beside the others; the others, on one stream, never overlap).
  double busy_ms(Phase p) const;
  // Collective kernels (NCCL's) per step: their time (the "collective" categories'), and how much of
  // it other kernels ran beside, the communication hidden behind computation as the device saw it.
  double collective_ms() const;
  double collective_overlapped_ms = 0;
};

KernelProfile summarize_kernels(const std::vector<KernelRecord>& records, int steps);

// A kernel name as CUPTI gives it (mangled or not) shortened for tables: demangled, with the
// return type, namespaces and argument list removed; template arguments kept.
std::string short_kernel_name(const char* raw);

}  // namespace lmscope
