#include "lmscope/model/config.h"

#include <cmath>
#include <optional>

namespace lmscope {
namespace {

// Past these no device holds the model, and the counts below overflow 64 bits on the way (info
// --d-model 2147483648 printed negative totals) or the per-layer lists take all memory (info --layers
// 10^9 listed 9·10^9 tensors for 20 s before running out).
constexpr std::int64_t kMaxLayers = 10000;
constexpr std::int64_t kMaxParameters = std::int64_t(1) << 50;

// parameter_count() without overflowing: nothing when it does not fit 64 bits.
std::optional<std::int64_t> checked_parameter_count(const ModelConfig& c) {
  std::int64_t dd, dff, vd, layer, layers, total;
  if (__builtin_mul_overflow(c.d_model, c.d_model, &dd) || __builtin_mul_overflow(c.d_model, c.d_ff, &dff) ||
      __builtin_mul_overflow(c.vocab, c.d_model, &vd) || __builtin_mul_overflow(dd, 4, &dd) ||
      __builtin_mul_overflow(dff, 3, &dff) || __builtin_add_overflow(dd, dff, &layer) ||
      __builtin_add_overflow(layer, 2 * c.d_model, &layer) || __builtin_mul_overflow(layer, c.layers, &layers) ||
      __builtin_mul_overflow(vd, 2, &vd) || __builtin_add_overflow(vd, layers, &total) ||
      __builtin_add_overflow(total, c.d_model, &total))
    return std::nullopt;
  return total;
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](const char* what, std::int64_t v) {
    if (v <= 0) user_error("{} must be a positive integer, got {}", what, v);
  };
  positive("--vocab", vocab);
  positive("--d-model", d_model);
  positive("--d-ff", d_ff);
  positive("--layers", layers);
  positive("--heads", heads);
  if (vocab > 2147483647) user_error("--vocab {} does not fit 32-bit token ids", vocab);
  if (layers > kMaxLayers) user_error("--layers {} is more than lmscope builds (at most {})", layers, kMaxLayers);
  if (const std::optional<std::int64_t> count = checked_parameter_count(*this); !count || *count > kMaxParameters) {
    const double d = static_cast<double>(d_model), f = static_cast<double>(d_ff);
    const double about = 2 * static_cast<double>(vocab) * d + static_cast<double>(layers) * (4 * d * d + 3 * d * f);
    user_error(
        "d_model {}, d_ff {}, layers {} and vocabulary {} make about {:.2g} parameters, more than the 2^50 "
        "(about 1.1e15) lmscope counts",
        d_model, d_ff, layers, vocab, about);
  }
  if (d_model % heads != 0) user_error("--d-model {} is not divisible by --heads {}", d_model, heads);
  if (d_head() % 2 != 0) user_error("the head width d_model/heads = {} must be even for RoPE's pairs", d_head());
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) user_error("--rope-theta must be positive, got {}", rope_theta);
}

std::int64_t ModelConfig::matmul_parameter_count() const {
  return layers * (4 * d_model * d_model + 3 * d_model * d_ff) + vocab * d_model;
}

std::int64_t ModelConfig::parameter_count() const {
  return 2 * vocab * d_model + layers * (4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model) + d_model;
}

double ModelConfig::forward_flops_per_token(std::int64_t ctx) const {
  return 2.0 * static_cast<double>(matmul_parameter_count()) +
         2.0 * static_cast<double>(layers) * static_cast<double>(d_model) * static_cast<double>(ctx);
}

namespace {

struct PresetRow {
  const char* name;
  std::int64_t d, f, l, h;
  std::int64_t vocab = 10000;
};
// The 2025 table first, then the 2026 handout's and leaderboard's models.
constexpr PresetRow kPresets[] = {{"small", 768, 3072, 12, 12},
                                  {"medium", 1024, 4096, 24, 16},
                                  {"large", 1280, 5120, 36, 20},
                                  {"xl", 1600, 6400, 48, 25},
                                  {"2.7B", 2560, 10240, 32, 32},
                                  {"10B", 4608, 12288, 50, 36},
                                  {"8B-leaderboard", 4096, 11008, 34, 32, 151936}};
constexpr std::size_t kTablePresets = 5;

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names(all_preset_names().begin(), all_preset_names().begin() + kTablePresets);
  return names;
}

const std::vector<std::string>& all_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const PresetRow& r : kPresets) n.emplace_back(r.name);
    return n;
  }();
  return names;
}

std::string preset_list() {
  std::string s;
  for (const std::string& n : all_preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

ModelConfig preset(const std::string& name) {
  for (const PresetRow& r : kPresets)
    if (name == r.name) {
      ModelConfig c;
      c.name = r.name;
      c.d_model = r.d;
      c.d_ff = r.f;
      c.layers = r.l;
      c.heads = r.h;
      c.vocab = r.vocab;
      return c;
    }
  user_error("unknown model preset '{}' (known: {})", name, preset_list());
}

std::vector<ParameterSpec> parameter_specs(const ModelConfig& c) {
  auto linear_std = [](std::int64_t in, std::int64_t out) { return std::sqrt(2.0 / static_cast<double>(in + out)); };
  const std::int64_t d = c.d_model, f = c.d_ff;
  std::vector<ParameterSpec> s;
  s.push_back({"token_embeddings.weight", {c.vocab, d}, 1.0, -1, false});
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    s.push_back({p + "attn.q_proj.weight", {d, d}, linear_std(d, d), i, true});
    s.push_back({p + "attn.k_proj.weight", {d, d}, linear_std(d, d), i, true});
    s.push_back({p + "attn.v_proj.weight", {d, d}, linear_std(d, d), i, true});
    s.push_back({p + "attn.output_proj.weight", {d, d}, linear_std(d, d), i, true});
    s.push_back({p + "ln1.weight", {d}, 0.0, i, false});
    s.push_back({p + "ffn.w1.weight", {f, d}, linear_std(d, f), i, true});
    s.push_back({p + "ffn.w2.weight", {d, f}, linear_std(f, d), i, true});
    s.push_back({p + "ffn.w3.weight", {f, d}, linear_std(d, f), i, true});
    s.push_back({p + "ln2.weight", {d}, 0.0, i, false});
  }
  s.push_back({"ln_final.weight", {d}, 0.0, -1, false});
  s.push_back({"lm_head.weight", {c.vocab, d}, linear_std(d, c.vocab), -1, true});
  return s;
}

}  // namespace lmscope
