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

struct KernelRecord {
  std::string name;  // demangled, without namespaces and arguments: "rmsnorm_forward_kernel<__nv_bfloat16>"
  Phase phase = Phase::setup;
  std::uint64_t start_ns = 0, end_ns = 0;  // device clock
};

class KernelTracer {
 public:
  virtual ~KernelTracer() = default;
  // Work enqueued from now on (by this thread) belongs to phase p, until the next call.
  virtual void set_phase(Phase p) = 0;
  // Waits for the device, stops recording and returns every record since the tracer was made,
  // in start order.
  virtual std::vector<KernelRecord> finish() = 0;
};

// What a kernel is for, from its name: "GEMM", "attention", "RMSNorm", "RoPE/heads", "SwiGLU",
// "loss", "embedding", "optimizer", "elementwise", "memset/memcpy" or "other".
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
  // Sum of kernel durations per step in a phase (kernels of one stream never overlap).
  double busy_ms(Phase p) const;
};

KernelProfile summarize_kernels(const std::vector<KernelRecord>& records, int steps);

// A kernel name as CUPTI gives it (mangled or not) shortened for tables: demangled, with the
// return type, namespaces and argument list removed; template arguments kept.
std::string short_kernel_name(const char* raw);

}  // namespace lmscope
