#include "lmscope/bench/trace_session.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

namespace lmscope {

TraceSession::TraceSession(Backend& backend, TraceLabels labels)
    : backend_(backend),
      labels_(std::move(labels)),
      recorder_(backend.allocator()),
      allocated_before_(backend.allocator().current_bytes()),
      reserved_before_(backend.allocator().reserved_bytes()) {
  try {
    kernels_ = backend.kernel_tracer();
  } catch (const Unsupported& e) {
    fmt::print(stderr, "lmscope: warning: the trace holds the host's ranges and memory only: {}\n", e.what());
  }
  Allocator& mem = backend_.allocator();
  mem.clear_events();
  mem.record_events(true);
  backend_.set_range_listener(this);
}

void TraceSession::begin(RangeLevel level, const char* name, int index) {
  recorder_.begin(level, name, index);
  const bool phase = level == RangeLevel::phase;
  phase_open_.push_back(phase);
  if (!phase || !kernels_) return;
  for (Phase p : {Phase::forward, Phase::backward, Phase::optimizer})
    if (std::strcmp(name, phase_name(p)) == 0) kernels_->set_phase(p);
}

void TraceSession::end() {
  recorder_.end();
  LMSCOPE_CHECK(!phase_open_.empty(), "a range ended that never began");
  if (phase_open_.back() && kernels_) kernels_->set_phase(Phase::setup);
  phase_open_.pop_back();
}

TraceSession::~TraceSession() {
  if (!recording_) return;
  backend_.set_range_listener(nullptr);
  backend_.allocator().record_events(false);
  backend_.allocator().clear_events();
}

TraceSession::Result TraceSession::finish() {
  LMSCOPE_CHECK(recording_, "a trace finished twice");
  Allocator& mem = backend_.allocator();
  backend_.set_range_listener(nullptr);
  mem.record_events(false);
  recording_ = false;
  LMSCOPE_CHECK(recorder_.all_closed(), "a traced range was never closed");
  TraceContents t;
  if (kernels_) t.device = kernels_->finish();
  t.ranges = recorder_.ranges();
  t.events = mem.events();
  t.allocated_before = allocated_before_;
  t.reserved_before = reserved_before_;
  t.clock_origin_ns = mem.clock_origin_ns();
  t.labels = labels_;
  mem.clear_events();
  Result r{chrome_trace_json(t), {}};
  r.device = std::move(t.device);
  return r;
}

}  // namespace lmscope
