// The result files lmscope report reads: what bench, memory and attention write with --format json
// and what train writes with --log, each row reduced to what the report shows. A file of another kind, or not such JSON
// at all, is a UserError that names it and says which command writes the kind expected.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lmscope::report {

// Median and sample standard deviation of a phase, in ms.
struct Timing {
  double median = 0, std = 0;
};

// What bench and memory rows both say of their cell.
struct ModelCellRow {
  std::string model, device, precision, attention, mode, status;
  long long batch = 0, ctx = 0;
  bool dry_run = false;
  double peak_bytes = 0;
  bool ok() const { return status == "ok"; }
  std::string cell() const;  // "small ctx 256 b4 bf16 flash train"
};

struct BenchRow : ModelCellRow {
  std::string device_name;
  long long parameters = 0;
  std::map<std::string, Timing> ms;  // forward, backward, optimizer, step (those measured)
  double tokens_per_s = 0, mfu = 0;
  // With --profile: per phase, kernel time by category (ms per step).
  std::map<std::string, std::map<std::string, double>> kernel_ms;
};

struct MemoryRow : ModelCellRow {
  std::map<std::string, double> peak_by_kind;  // parameter, gradient, ... -> bytes at the peak
};

struct AttentionRow {
  std::string attention, device, precision, status;
  long long batch = 0, heads = 1, seq = 0, d = 0;
  bool causal = true, deterministic = true;  // deterministic: how dQ was summed
  std::map<std::string, Timing> ms;          // forward, backward, forward_backward
  double saved_bytes = 0, peak_bytes = 0;
  bool ok() const { return status == "ok"; }
  bool out_of_memory() const { return status.rfind("OOM", 0) == 0; }
};

// One line of a training log (train --log: JSON Lines).
struct TrainStep {
  long long step = 0;
  double loss = 0;
  std::optional<double> val_loss, grad_norm;  // grad_norm: none where it was not finite (a skipped step)
  std::optional<double> loss_scale;           // fp16 runs
  bool skipped = false;
  double tokens = 0, elapsed_s = 0;
};

std::vector<BenchRow> read_bench_file(const std::string& path);
std::vector<MemoryRow> read_memory_file(const std::string& path);
std::vector<AttentionRow> read_attention_file(const std::string& path);
std::vector<TrainStep> read_train_log(const std::string& path);

}  // namespace lmscope::report
