// The model's shape (MODEL.md): presets, validation, parameter inventory and FLOP counts.
// Everything here is arithmetic on the shape, so `info` and the meta backend share it.
#pragma once

#include "lmscope/core/tensor.h"

#include <string>
#include <vector>

namespace lmscope {

struct ModelConfig {
  std::string name = "custom";
  std::int64_t vocab = 10000;
  std::int64_t d_model = 768;
  std::int64_t d_ff = 3072;
  std::int64_t layers = 12;
  std::int64_t heads = 12;
  double rope_theta = 10000.0;

  std::int64_t d_head() const { return d_model / heads; }
  // Throws UserError naming the first impossible field.
  void validate() const;

  std::int64_t parameter_count() const;
  // Parameters that take part in matrix products: every linear layer and the LM head
  // (the embedding is a lookup, the norms elementwise).
  std::int64_t matmul_parameter_count() const;
  // Model FLOPs per token at context T, causal attention counted once (ANCHORS.md):
  // forward 2·N_matmul + 2·L·d·T; a train step (forward + backward) three times that.
  double forward_flops_per_token(std::int64_t ctx) const;
  double train_flops_per_token(std::int64_t ctx) const { return 3.0 * forward_flops_per_token(ctx); }
};

// The assignment's 2025 table (small, medium, large, xl, 2.7B: the seeds' grid and plan's default
// sweep), and beyond it the 2026 handout's 10B (d 4608, d_ff 12288, 50 layers, 36 heads) and the 2026
// leaderboard's 8B-leaderboard (d 4096, d_ff 11008, 34 layers, 32 heads, vocabulary 151,936). The
// 2026 handout renamed its table: its "xl" is our 2.7B. Throws UserError for other names.
ModelConfig preset(const std::string& name);
const std::vector<std::string>& preset_names();      // the 2025 table
const std::vector<std::string>& all_preset_names();  // every name preset() takes
std::string preset_list();                           // "small, medium, large, xl, 2.7B, 10B, 8B-leaderboard"

struct ParameterSpec {
  std::string name;  // PyTorch module name, as in safetensors files
  Shape shape;
  double init_std;  // truncated normal std (cut at ±3 std); 0 means initialised to ones
  int layer;        // -1 outside the layers
  bool matmul;      // a GEMM operand (linear weights, LM head): kept in low precision too under bf16 and fp16
};

// Every parameter in the order of the PyTorch module's state_dict.
std::vector<ParameterSpec> parameter_specs(const ModelConfig& c);

}  // namespace lmscope
