// One memory cell: build the model on a backend (the device itself, or the dry run's shape-only
// backend standing for it), run warm-up steps of the mode, then record one step's every
// allocation and free with its tag, phase, size and time. The record holds every event since the
// backend was made, so what was live before the step is known too.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/bench/runner.h"

#include <optional>
#include <string>
#include <vector>

namespace lmscope {

struct MemorySpec {
  BenchSpec cell;  // model, device, precision, attention, mode, batch, ctx, warmup, seed
  bool dry_run = false;
  std::size_t memory_limit = 0;  // 0: the device's own (the dry run's default: dry_run_target)
};

struct MemoryRecord {
  MemorySpec spec;
  // As a bench row's: "ok", "OOM: ...", "unsupported: ...", "error: ..."; a dry run that would not
  // fit: "does not fit: needs X of Y", with the record of the same cell run without a limit.
  std::string status = "ok";
  std::string device_name;   // the allocator's name for it
  std::size_t capacity = 0;  // what the allocator may hand out
  std::vector<MemEvent> events;
  std::size_t step_begin = 0;  // index of the measured step's first event
  // Where the step's backward and optimizer phases begin (indices into events), for modes with them.
  std::optional<std::size_t> backward_begin, optimizer_begin;
  double start_epoch_us = 0;  // wall clock when the record began (event times count from about then)
  // Measured on a real device after the step; for a dry run standing for a GPU whose overhead is
  // stored, that figure in used_at_start (and total the memory limit).
  std::optional<DeviceMemory> device;
  std::string device_source;  // where `device` comes from
  bool ok() const { return status == "ok"; }
  bool fits() const { return status.rfind("does not fit", 0) != 0 && status.rfind("OOM", 0) != 0; }
  bool has_step() const { return ok() || status.rfind("does not fit", 0) == 0; }  // a whole step recorded
};

// Never throws for a failing cell: its status says why, and the events up to the failure stay.
MemoryRecord record_memory(const MemorySpec& spec);

}  // namespace lmscope
