// Named stretches of host time: a step, its phases, each layer and each op within one. The model and
// the bench runner mark them; whoever listens (the Chrome trace recorder of --trace, NVTX on CUDA when a
// profiler is attached) sees them.
// With no listener a mark costs one pointer test.
#pragma once

namespace lmscope {

enum class RangeLevel { step, phase, layer, op };
inline const char* range_level_name(RangeLevel level) {
  const char* const names[] = {"step", "phase", "layer", "op"};
  return names[static_cast<int>(level)];
}

class RangeListener {
 public:
  virtual ~RangeListener() = default;
  // A range opens inside the ones open; index ≥ 0 numbers it ("layer" 3, "step" 12).
  virtual void begin(RangeLevel level, const char* name, int index) = 0;
  virtual void end() = 0;
};

// Two listeners hearing the same ranges (a trace recorder and the device's profiler ranges).
class RangeTee final : public RangeListener {
 public:
  RangeTee(RangeListener* first, RangeListener* second) : first_(first), second_(second) {}
  void begin(RangeLevel level, const char* name, int index) override {
    first_->begin(level, name, index);
    second_->begin(level, name, index);
  }
  void end() override {
    second_->end();
    first_->end();
  }

 private:
  RangeListener* first_;
  RangeListener* second_;
};

// One range for the life of the object.
class ScopedRange {
 public:
  ScopedRange(RangeListener* listener, RangeLevel level, const char* name, int index = -1) : listener_(listener) {
    if (listener_) listener_->begin(level, name, index);
  }
  ~ScopedRange() {
    if (listener_) listener_->end();
  }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  RangeListener* listener_;
};

// Ops one after another: next() ends the op before and begins the named one; the last ends with the
// object. So code that runs ops in sequence marks each with one line and no new scopes.
class OpRanges {
 public:
  explicit OpRanges(RangeListener* listener) : listener_(listener) {}
  void next(const char* name) {
    if (!listener_) return;
    done();
    listener_->begin(RangeLevel::op, name, -1);
    open_ = true;
  }
  // Ends the op under way, if any.
  void done() {
    if (listener_ && open_) listener_->end();
    open_ = false;
  }
  ~OpRanges() { done(); }
  OpRanges(const OpRanges&) = delete;
  OpRanges& operator=(const OpRanges&) = delete;

 private:
  RangeListener* listener_;
  bool open_ = false;
};

}  // namespace lmscope
