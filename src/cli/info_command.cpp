// lmscope info: what a model is made of: parameters in total and per tensor, FLOPs per token,
// the bytes of parameters, gradients and AdamW state (fp32), and what attention keeps for backward;
// with --dry-run, what each mode's step holds at a shape, from dry runs.
#include "commands.h"
#include "memory_flags.h"
#include "model_flags.h"

#include "lmscope/bench/report.h"
#include "lmscope/core/allocator.h"
#include "lmscope/memory/memory_report.h"
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
    app->add_flag("--dry-run", dry_run_,
                  "Also dry-run one step of every mode at --batch and --ctx: peaks per phase, what holds the train "
                  "step's peak, and whether each fits the device");
    app->add_option("--batch", batch_, "Batch size of the dry runs")->capture_default_str();
    app->add_option("--precision", precision_, "fp32, tf32, bf16 or fp16, for the dry runs")->capture_default_str();
    app->add_option("--device", device_, "cpu or cuda, the device the dry runs stand for")->capture_default_str();
    app->add_option("--recompute", recompute_, recompute_help(false) + ", for the dry runs")->capture_default_str();
    app->add_option("--weight-copies", weight_copies_, weight_copies_help(false) + ", for the dry runs")
        ->capture_default_str();
    app->add_option("--grad-dtype", grad_dtype_, grad_dtype_help(false) + ", for the dry runs")->capture_default_str();
    app->add_option("--memory-limit", memory_limit_, memory_limit_help());
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
    const double t = static_cast<double>(ctx_);  // (in doubles: --ctx 2^62 is a question too)
    const double per_layer = static_cast<double>(c.heads) * t * (attention == AttentionKind::naive ? t : 1);
    const double attention_bytes = per_layer * static_cast<double>(c.layers) * 4;
    const std::vector<MemoryRow> steps = dry_run_steps(c, attention);
    if (format_ == "json") {
      nlohmann::ordered_json j;
      j["model"] = model_json(c);
      j["model"]["d_head"] = c.d_head();
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
      if (dry_run_) j["dry_run"] = nlohmann::ordered_json::parse(format_memory(steps, ReportFormat::json));
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
    if (dry_run_) fmt::print("\n{}", markdown_steps(steps));
    return 0;
  }

 private:
  ModelFlags model_;
  std::int64_t ctx_ = 256;
  std::string format_ = "md", attention_ = "flash";
  bool dry_run_ = false;
  std::int64_t batch_ = 4;
  std::string precision_ = "fp32", device_ = "cuda", memory_limit_, recompute_ = "none", weight_copies_ = "kept",
              grad_dtype_ = "fp32";

  // One step of every mode at --batch and --ctx on the shape-only backend; none without --dry-run.
  std::vector<MemoryRow> dry_run_steps(const ModelConfig& c, AttentionKind attention) const {
    if (!dry_run_) {
      for (const char* flag :
           {"--batch", "--precision", "--device", "--recompute", "--weight-copies", "--grad-dtype", "--memory-limit"})
        if (app->count(flag) > 0) user_error("{} chooses the dry runs; add --dry-run", flag);
      return {};
    }
    if (batch_ <= 0) user_error("--batch must be positive, got {}", batch_);
    if (device_ != "cpu" && device_ != "cuda") user_error("unknown --device '{}' (use cpu or cuda)", device_);
    check_precision(precision_);
    const std::size_t limit = memory_limit_.empty() ? 0 : parse_memory_size("--memory-limit", memory_limit_);
    const RecomputePlan recompute = parse_recompute(recompute_);
    const WeightCopies weight_copies = check_weight_copies(weight_copies_, precision_);
    check_grad_dtype(grad_dtype_, precision_);
    std::vector<MemoryRow> rows;
    for (StepMode mode : {StepMode::inference, StepMode::forward, StepMode::forward_backward, StepMode::train}) {
      BenchSpec cell;
      cell.model = c;
      cell.device = device_;
      cell.precision = precision_;
      cell.attention = attention;
      cell.mode = mode;
      cell.batch = batch_;
      cell.ctx = ctx_;
      cell.warmup = 1;
      cell.steps = 1;
      cell.recompute = recompute;
      cell.weight_copies = weight_copies;
      cell.grad_dtype = cell_grad_dtype(mode, parse_grad_dtype(grad_dtype_));
      RunSpec checked = cell;  // a shape no run can have is the user's mistake, not a row that failed
      validate_run(checked);
      rows.push_back(memory_row(record_memory(MemorySpec{cell, true, limit}), 1));
    }
    return rows;
  }

  // Per mode: each phase's peak and the whole device's need against the limit; then what holds
  // the train step's peak, by kind.
  static std::string markdown_steps(const std::vector<MemoryRow>& rows) {
    const MemoryRecord& first = rows.front().record;
    const BenchSpec& c = first.spec.cell;
    const bool bf16_grads = rows.back().record.spec.cell.grad_dtype == DType::bf16;
    std::string out = fmt::format(
        "## One step at batch {}, ctx {}, {}{}, {} attention: the {}, whose whole device may hold {}\n\n"
        "| mode | peak GiB | reached in | forward peak | backward peak | optimizer peak | whole device GiB | fits |\n"
        "|---|---:|---|---:|---:|---:|---:|---|\n",
        c.batch, c.ctx, c.precision, bf16_grads ? " with bf16 gradients" : "", attention_name(c.attention),
        first.device_name, human_bytes(static_cast<double>(device_limit(first))));
    auto gib = [](std::size_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1 << 30)); };
    auto phase = [&](const MemoryAnalysis& a, Phase p) {
      const auto& v = a.phase_peak[static_cast<int>(p)];
      return v ? gib(*v) : std::string("-");
    };
    for (const MemoryRow& row : rows) {
      const MemoryRecord& r = row.record;
      const MemoryAnalysis& a = row.analysis;
      out += fmt::format("| {} | ", step_mode_name(r.spec.cell.mode));
      if (!row.recorded) {
        out += fmt::format("- | - | - | - | - | - | {} |\n", r.status);
        continue;
      }
      out += fmt::format("{} | {} | {} | {} | {} | {} | {} |\n", gib(a.peak),
                         a.peak_at_start ? "before the step" : phase_name(a.peak_phase), phase(a, Phase::forward),
                         phase(a, Phase::backward), phase(a, Phase::optimizer), gib(device_need(r, a)),
                         r.ok() ? "yes" : r.status);
    }
    const MemoryRow& train = rows.back();
    if (!train.recorded) return out;
    out += "\n| the train step's peak, by kind | GiB |\n|---|---:|\n";
    for (int k = 0; k < kMemKinds; ++k)
      out += fmt::format("| {} | {} |\n", mem_kind_name(static_cast<MemKind>(k)), gib(train.analysis.peak_by_kind[k]));
    return out;
  }
};

}  // namespace

std::unique_ptr<Command> add_info_command(CLI::App& parent) { return std::make_unique<InfoCommand>(parent); }

}  // namespace lmscope::cli
