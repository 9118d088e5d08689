// A stretch of steps recorded for a Chrome trace (bench --trace, train --trace): from construction,
// the ranges the code on `backend` marks, every allocation and, where the backend has a kernel
// tracer (CUDA), every runtime call and every kernel, memset and memcpy, each tagged with the phase
// whose range it was launched in; finish() stops them all and gives the trace-event JSON
// (profile/chrome_trace.h). Where the tracer cannot start (CUPTI held by another tool), the trace
// has the host's ranges and memory only, and says so on stderr. The destructor stops recording if
// finish() never ran.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/profile/chrome_trace.h"

#include <memory>
#include <string>

namespace lmscope {

class TraceSession final : private RangeListener {
 public:
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
  // Ranges go to the recorder; a phase range named forward, backward or optimizer also tags the
  // device work launched in it (the bench runner tags its phases itself too), and its end goes
  // back to setup.
  void begin(RangeLevel level, const char* name, int index) override;
  void end() override;
  std::vector<bool> phase_open_;  // per open range: whether it is a phase range

  Backend& backend_;
  TraceLabels labels_;
  TraceRecorder recorder_;
  std::size_t allocated_before_, reserved_before_;
  std::unique_ptr<KernelTracer> kernels_;
  bool recording_ = true;
};

}  // namespace lmscope
