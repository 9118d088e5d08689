// A stretch of steps recorded for a Chrome trace (bench --trace, train --trace): from construction,
// the ranges the code on `backend` marks and every allocation; finish() stops both and gives the
// trace-event JSON (profile/chrome_trace.h). The destructor stops recording if finish() never ran.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/profile/chrome_trace.h"

#include <string>

namespace lmscope {

class TraceSession {
 public:
  TraceSession(Backend& backend, TraceLabels labels);
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  std::string finish();

 private:
  Backend& backend_;
  TraceLabels labels_;
  TraceRecorder recorder_;
  std::size_t allocated_before_, reserved_before_;
  bool recording_ = true;
};

}  // namespace lmscope
