// lmscope info: what a model is made of: parameters in total and per tensor, FLOPs per token,
// the bytes of parameters, gradients and AdamW state (fp32), and what attention keeps for backward.
#include "commands.h"
#include "model_flags.h"

#include "lmscope/core/allocator.h"
#include "lmscope/model/attention.h"

#include <nlohmann/json.hpp>

#include <map>

namespace lmscope::cli {
namespace {

class InfoCommand : public Command {
 public:
  explicit InfoCommand(CLI::App& parent) {
    app = parent.add_subcommand("info", "Parameter counts, FLOPs per token and memory of a model");
    model_.add_to(*app, false);
    app->add_option("--ctx", ctx_, "Context length for the attention FLOPs")->capture_default_str();
    app->add_option("--attention", attention_, "flash or naive: which attention's saved state to report")
        ->capture_default_str();
    app->add_option("--format", format_, "md or json")->capture_default_str();
  }

  int run() override {
    const ModelConfig c = model_.resolve_one();
    if (ctx_ <= 0) user_error("--ctx must be positive, got {}", ctx_);
    if (format_ != "md" && format_ != "json") user_error("unknown --format '{}' (use md or json)", format_);
    const auto specs = parameter_specs(c);
    const double params = static_cast<double>(c.parameter_count());
    const double bytes_params = params * 4, bytes_grads = params * 4, bytes_adam = params * 8;
    // Per sequence and in fp32: naive keeps the probabilities (h·T² per layer), flash the
    // log-sum-exps (h·T per layer).
    const AttentionKind attention = parse_attention(attention_);
    const double per_layer = static_cast<double>(c.heads * ctx_) * (attention == AttentionKind::naive ? ctx_ : 1);
    const double attention_bytes = per_layer * static_cast<double>(c.layers) * 4;
    if (format_ == "json") {
      nlohmann::ordered_json j;
      j["model"] = {{"name", c.name},     {"vocab", c.vocab}, {"d_model", c.d_model}, {"d_ff", c.d_ff},
                    {"layers", c.layers}, {"heads", c.heads}, {"d_head", c.d_head()}, {"rope_theta", c.rope_theta}};
      j["parameters"] = c.parameter_count();
      j["matmul_parameters"] = c.matmul_parameter_count();
      j["tensors"] = nlohmann::ordered_json::array();
      for (const auto& s : specs)
        j["tensors"].push_back({{"name", s.name}, {"shape", s.shape}, {"parameters", shape_numel(s.shape)}});
      j["ctx"] = ctx_;
      j["flops_per_token"] = {{"forward", c.forward_flops_per_token(ctx_)},
                              {"train_step", c.train_flops_per_token(ctx_)}};
      j["bytes"] = {{"parameters", bytes_params}, {"gradients", bytes_grads}, {"optimizer_state", bytes_adam}};
      j["attention"] = {{"kind", attention_name(attention)}, {"saved_bytes_per_sequence_fp32", attention_bytes}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("# {}: d_model {}, d_ff {}, layers {}, heads {} (d_head {}), vocab {}, RoPE theta {}\n\n", c.name,
               c.d_model, c.d_ff, c.layers, c.heads, c.d_head(), c.vocab, c.rope_theta);
    fmt::print("Parameters: {} ({:.3f} B); in matrix products: {}\n\n", c.parameter_count(), params / 1e9,
               c.matmul_parameter_count());
    // Each per-layer tensor once, with the number of layers that hold one.
    fmt::print("| tensor | shape | parameters | count | total |\n|---|---|---:|---:|---:|\n");
    std::map<std::string, int> seen;
    for (const auto& s : specs) {
      // "layers.7.attn.q_proj.weight" -> "layers.{i}.attn.q_proj.weight"
      const std::string key = s.layer < 0 ? s.name : "layers.{i}" + s.name.substr(s.name.find('.', 7));
      if (seen[key]++) continue;
      const std::int64_t n = shape_numel(s.shape), count = s.layer >= 0 ? c.layers : 1;
      fmt::print("| {} | {} | {} | {} | {} |\n", key, shape_str(s.shape), n, count, n * count);
    }
    fmt::print("\nFLOPs per token at ctx {} (causal attention counted once): forward {:.4g}, train step {:.4g}\n", ctx_,
               c.forward_flops_per_token(ctx_), c.train_flops_per_token(ctx_));
    fmt::print("Memory (fp32): parameters {}, gradients {}, AdamW state {}, together {}\n", human_bytes(bytes_params),
               human_bytes(bytes_grads), human_bytes(bytes_adam), human_bytes(bytes_params + bytes_grads + bytes_adam));
    fmt::print("Attention ({}) keeps {} per sequence for backward at ctx {} (fp32): {}\n", attention_name(attention),
               attention == AttentionKind::naive ? "the h·T² probabilities of every layer"
                                                 : "the h·T log-sum-exps of every layer",
               ctx_, human_bytes(attention_bytes));
    return 0;
  }

 private:
  ModelFlags model_;
  std::int64_t ctx_ = 256;
  std::string format_ = "md", attention_ = "flash";
};

}  // namespace

std::unique_ptr<Command> add_info_command(CLI::App& parent) { return std::make_unique<InfoCommand>(parent); }

}  // namespace lmscope::cli
