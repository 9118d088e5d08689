// Flags that choose a model: a preset (--model) with any field overridden by shape flags.
#pragma once

#include "lmscope/model/config.h"
#include "lmscope/model/transformer.h"

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace lmscope::cli {

class ModelFlags {
 public:
  // allow_list: --model takes a comma-separated list (bench sweeps).
  void add_to(CLI::App& app, bool allow_list);
  // One config per name in --model (default small), overrides applied, each validated. With a
  // base, the overrides apply to it instead of the preset (a resumed run's model).
  std::vector<ModelConfig> resolve(const std::optional<ModelConfig>& base = std::nullopt) const;
  ModelConfig resolve_one(const std::optional<ModelConfig>& base = std::nullopt) const;
  // Before add_to: what --model is when not given (a comma list where add_to allows one).
  void set_default(std::string models) { model_ = std::move(models); }

 private:
  std::string model_ = "small";
  std::optional<std::int64_t> d_model_, d_ff_, layers_, heads_, vocab_;
  std::optional<double> rope_theta_;
};

// "128,256" -> {128, 256}; every value must be a positive integer.
std::vector<std::int64_t> parse_positive_list(const std::string& flag, const std::string& text);
std::vector<std::string> split_list(const std::string& text);
// --recompute's help (a comma list sweeps where `list`).
std::string recompute_help(bool list);
// --weight-copies' help (a comma list sweeps where `list`).
std::string weight_copies_help(bool list);
// --weight-copies parsed; refuses other than kept under a precision whose weights have no copies
// (fp32, tf32).
WeightCopies check_weight_copies(const std::string& weight_copies, const std::string& precision);
// --grad-dtype's help (a comma list sweeps where `list`).
std::string grad_dtype_help(bool list);
// --master-dtype's help (a comma list sweeps where `list`).
std::string master_dtype_help(bool list);
// --grad-accum's help (a comma list sweeps where `list`).
std::string grad_accum_help(bool list);
// "80GiB", "81920MiB", "80GB" (10^9), "85899345920" (bytes) -> bytes; UserError otherwise.
std::size_t parse_memory_size(const std::string& flag, const std::string& text);

}  // namespace lmscope::cli
