#include "model_flags.h"

#include "lmscope/backend/backend.h"
#include "lmscope/core/error.h"
#include "lmscope/model/transformer.h"
#include "lmscope/run/run_spec.h"

#include <algorithm>
#include <charconv>
#include <tuple>

namespace lmscope::cli {

void ModelFlags::add_to(CLI::App& app, bool allow_list) {
  app.add_option("--model", model_,
                 (allow_list ? "Preset(s): " : "Preset: ") + preset_list() +
                     " (8B-leaderboard: the 2026 leaderboard's, vocabulary 151,936)" +
                     (allow_list ? "; comma list sweeps" : ""))
      ->capture_default_str();
  app.add_option("--d-model", d_model_, "Model width d (overrides the preset)");
  app.add_option("--d-ff", d_ff_, "Feed-forward width");
  app.add_option("--layers", layers_, "Number of Transformer layers");
  app.add_option("--heads", heads_, "Number of attention heads");
  app.add_option("--vocab", vocab_, "Vocabulary size (default: the preset's, 10000 but for 8B-leaderboard)");
  app.add_option("--rope-theta", rope_theta_, "RoPE theta (default 10000)");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<std::int64_t> parse_positive_list(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> out;
  for (const std::string& item : split_list(text)) {
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || end != item.data() + item.size() || item.empty())
      user_error("{} takes positive integers, and '{}' is not one", flag, item);
    if (v <= 0) user_error("{} must be positive, got {}", flag, v);
    out.push_back(v);
  }
  return out;
}

std::size_t parse_memory_size(const std::string& flag, const std::string& text) {
  static const std::pair<const char*, double> units[] = {{"TiB", 1099511627776.0},
                                                         {"GiB", 1073741824.0},
                                                         {"MiB", 1048576.0},
                                                         {"KiB", 1024.0},
                                                         {"TB", 1e12},
                                                         {"GB", 1e9},
                                                         {"MB", 1e6},
                                                         {"KB", 1e3},
                                                         {"B", 1.0},
                                                         {"", 1.0}};
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  std::string unit(end, text.data() + text.size());
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (ec == std::errc() && value > 0 && value < 1e18)
    for (const auto& [name, scale] : units)
      if (unit == name) return static_cast<std::size_t>(value * scale);
  user_error("{} takes a size such as 80GiB, 81920MiB or 85899345920 (bytes), and '{}' is not one", flag, text);
}

std::vector<ModelConfig> ModelFlags::resolve(const std::optional<ModelConfig>& base) const {
  std::vector<ModelConfig> out;
  for (const std::string& name : split_list(model_)) {
    ModelConfig c = base ? *base : preset(name);
    const bool reshaped = d_model_ || d_ff_ || layers_ || heads_;
    if (d_model_) c.d_model = *d_model_;
    if (d_ff_) c.d_ff = *d_ff_;
    if (layers_) c.layers = *layers_;
    if (heads_) c.heads = *heads_;
    if (vocab_) c.vocab = *vocab_;
    if (rope_theta_) c.rope_theta = *rope_theta_;
    if (reshaped) c.name = fmt::format("custom(d{},ff{},L{},h{})", c.d_model, c.d_ff, c.layers, c.heads);
    c.validate();
    // Every preset of a sweep (plan's default is all five) reshaped alike is one model, swept once.
    const auto same = [&](const ModelConfig& o) {
      return std::tie(o.d_model, o.d_ff, o.layers, o.heads, o.vocab, o.rope_theta) ==
             std::tie(c.d_model, c.d_ff, c.layers, c.heads, c.vocab, c.rope_theta);
    };
    if (std::none_of(out.begin(), out.end(), same)) out.push_back(c);
  }
  return out;
}

ModelConfig ModelFlags::resolve_one(const std::optional<ModelConfig>& base) const {
  auto all = resolve(base);
  if (all.size() != 1) user_error("--model takes one preset here, got '{}'", model_);
  return all[0];
}

std::string recompute_help(bool list) {
  return std::string(
             "What the forward keeps for the backward: none; selective (the RMSNorm outputs and the SwiGLU gate "
             "are recomputed in the backward); full (each layer's forward runs again in its backward); or MODE:N+MODE, "
             "the first N layers in one mode and the rest in another (full:20+selective; full:20 leaves the rest at "
             "none)") +
         (list ? " (comma list sweeps)" : "");
}

std::string weight_copies_help(bool list) {
  return std::string(
             "Under bf16 or fp16, where the 16-bit copies of the matmul weights live: kept (AdamW writes them, or "
             "with device graphs on the forward casts them, and the backward frees each after its last use), "
             "resident (held for the whole run and refreshed in place by AdamW, so no forward casts them, graphs or "
             "not: up to 2 bytes a weight more at the step's peak) or transient (cast where each layer uses them and "
             "freed at once, in the forward and again in the backward: the copies' memory saved for two casts of "
             "every weight)") +
         (list ? " (comma list sweeps)" : "");
}

WeightCopies check_weight_copies(const std::string& weight_copies, const std::string& precision) {
  const WeightCopies parsed = parse_weight_copies(weight_copies);
  check_weight_copies(parsed, precision);
  return parsed;
}

std::string grad_dtype_help(bool list) {
  return std::string(
             "The gradients' type: fp32, or bf16 under --precision bf16 (the weight-gradient GEMMs write bf16, data "
             "parallelism exchanges half the bytes, AdamW reads them as they are; its state stays fp32)") +
         (list ? " (comma list sweeps)" : "");
}

std::string master_dtype_help(bool list) {
  return std::string(
             "The parameters' and AdamW state's type: fp32 (the default), or bf16 under --precision bf16 on CUDA, "
             "one process: a bf16 model as PyTorch's torch_dtype=bfloat16 makes it, its residual stream, gradients "
             "and moments in bf16 too, for half the static memory (docs/precision.md says what it costs in loss)") +
         (list ? " (comma list sweeps)" : "");
}

std::string grad_accum_help(bool list) {
  return std::string(
             "Micro-batches of --batch sequences per optimizer step, their gradients summed (the step's batch is "
             "K times --batch, in the memory of one)") +
         (list ? " (comma list sweeps)" : "");
}

}  // namespace lmscope::cli
