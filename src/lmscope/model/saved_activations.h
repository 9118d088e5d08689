// What the Transformer's forward keeps for its backward (transformer.cpp makes it,
// transformer_backward.cpp consumes it): private to those two files.
#pragma once

#include "lmscope/model/transformer.h"

#include <cstdint>
#include <vector>

namespace lmscope {

// What each layer's forward saves for its backward; nothing else outlives the forward.
struct Transformer::Layer {
  Allocation x;           // layer input (for ln1's backward and the residual)
  Allocation rstd1, n1;   // ln1 statistics and output (the q/k/v weight gradients read n1)
  Allocation q, k, v;     // [B, h, T, dk], q and k after RoPE
  AttentionSaved attn;    // naive: the [B·h, T, T] probabilities; flash: the [B·h, T] log-sum-exp
  Allocation o;           // [N, d] merged heads (output_proj's weight gradient and flash's backward read it)
  Allocation h;           // residual after attention (for ln2's backward)
  Allocation rstd2, n2;   // ln2 statistics and output
  Allocation a, b, gate;  // w1·x, w3·x and silu(a)∘b
};

// Which of a layer's activations a forward keeps (the layer's input is kept whenever a backward
// follows), and whether it keeps the low-precision weight copies it used. Set by the recompute mode
// and the copies' mode; an inference forward keeps no activations, and the backward's rerun of a
// layer under full recompute keeps everything (its backward comes next and frees the copies unless
// they are resident).
struct Transformer::Keep {
  bool input = true, statistics = true, norm_outputs = true, attention = true, residual = true, ffn_products = true,
       gate = true, weight_copies = true;
  static Keep for_forward(bool for_backward, Recompute r, WeightCopies c) {
    Keep k;
    if (!for_backward || r == Recompute::full) {
      k = Keep{false, false, false, false, false, false, false, true};
      k.input = for_backward;
    } else if (r == Recompute::selective) {
      k.norm_outputs = k.gate = false;
    }
    k.weight_copies = c != WeightCopies::transient;
    return k;
  }
};

// The last forward's activations and statistics, as its backward consumes them.
struct Transformer::Saved {
  std::vector<Layer> layers;
  Allocation x_final, rstd_final, n_final;
  Allocation logits, lse;       // logits (unless made in chunks) become their own gradient in backward
  bool for_backward = true;     // false: an inference forward kept only the logits
  std::uint64_t graph_key = 0;  // the forward's device graph's, which says where all of the above are
};

}  // namespace lmscope
