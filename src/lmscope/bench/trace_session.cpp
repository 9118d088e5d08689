#include "lmscope/bench/trace_session.h"

#include "lmscope/core/error.h"

namespace lmscope {

TraceSession::TraceSession(Backend& backend, TraceLabels labels)
    : backend_(backend),
      labels_(std::move(labels)),
      recorder_(backend.allocator()),
      allocated_before_(backend.allocator().current_bytes()),
      reserved_before_(backend.allocator().reserved_bytes()) {
  Allocator& mem = backend_.allocator();
  mem.clear_events();
  mem.record_events(true);
  backend_.set_range_listener(&recorder_);
}

TraceSession::~TraceSession() {
  if (!recording_) return;
  backend_.set_range_listener(nullptr);
  backend_.allocator().record_events(false);
  backend_.allocator().clear_events();
}

std::string TraceSession::finish() {
  LMSCOPE_CHECK(recording_, "a trace finished twice");
  Allocator& mem = backend_.allocator();
  backend_.set_range_listener(nullptr);
  mem.record_events(false);
  recording_ = false;
  LMSCOPE_CHECK(recorder_.all_closed(), "a traced range was never closed");
  std::string json = chrome_trace_json(recorder_.ranges(), mem.events(), allocated_before_, reserved_before_, labels_);
  mem.clear_events();
  return json;
}

}  // namespace lmscope
