// A stretch of steps recorded for a Chrome trace (bench --trace, train --trace): from construction,
// the ranges the code on `backend` marks, every allocation and, where the backend has a kernel
// tracer (CUDA), every runtime call and every kernel, memset and memcpy; finish() stops them all and
// gives the trace-event JSON (profile/chrome_trace.h). The destructor stops recording if finish()
// never ran.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/profile/chrome_trace.h"

#include <memory>
#include <string>

namespace lmscope {

class TraceSession {
 public:
  // Throws Unsupported where the backend has a tracer that cannot run (CUPTI held by another tool).
  TraceSession(Backend& backend, TraceLabels labels);
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // The session's kernel tracer, for phase tags and a kernel profile of the same steps; null on a
  // backend without one.
  KernelTracer* kernel_tracer() { return kernels_.get(); }

  struct Result {
    std::string json;
    DeviceActivity device;  // what the kernel tracer saw, for a profile of the same steps
  };
  Result finish();

 private:
  Backend& backend_;
  TraceLabels labels_;
  TraceRecorder recorder_;
  std::size_t allocated_before_, reserved_before_;
  std::unique_ptr<KernelTracer> kernels_;
  bool recording_ = true;
};

}  // namespace lmscope
