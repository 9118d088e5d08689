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

// How a cell ended: ran its step; ran out of memory (on the device, or at a dry run's limit); a dry
// run that does not fit, measured by running it again without the limit; failed otherwise.
enum class MemoryOutcome { ok, out_of_memory, does_not_fit, failed };

struct MemoryRecord {
  MemorySpec spec;
  MemoryOutcome outcome = MemoryOutcome::ok;
  // As a bench row's: "ok", "OOM: ...", "unsupported: ...", "error: ..."; a dry run that would not
  // fit: "does not fit: needs X of Y", with the record of the same cell run without a limit.
  std::string status = "ok";
  std::string device_name;   // the allocator's name for it
  std::size_t capacity = 0;  // what the allocator may hand out
  std::vector<MemEvent> events;
  std::size_t step_begin = 0;  // index of the measured step's first event
  // Where the step's (first micro-batch's) backward and the optimizer begin (indices into events),
  // for modes with them.
  std::optional<std::size_t> backward_begin, optimizer_begin;
  double start_epoch_us = 0;  // wall clock when the record began (event times count from about then)
  // Measured on a real device after the step; for a dry run standing for a GPU whose overhead is
  // stored, that figure in used_at_start (and total the memory limit).
  std::optional<DeviceMemory> device;
  std::string device_source;  // where `device` comes from
  bool ok() const { return outcome == MemoryOutcome::ok; }
  // False only when memory ran out (a cell that failed for another reason is not said not to fit).
  bool fits() const { return outcome != MemoryOutcome::out_of_memory && outcome != MemoryOutcome::does_not_fit; }
  // The events hold a whole step (the one that does not fit: run without the limit).
  bool has_step() const { return outcome == MemoryOutcome::ok || outcome == MemoryOutcome::does_not_fit; }
};

// Never throws for a failing cell: its status says why, and the events up to the failure stay.
// measure_misfit: a dry run that runs out of memory runs again without the limit, so its record
// holds the whole step and its status says how much it needs; without it, the record stops at the
// failure (all a search for what fits asks).
MemoryRecord record_memory(const MemorySpec& spec, bool measure_misfit = true);

}  // namespace lmscope
