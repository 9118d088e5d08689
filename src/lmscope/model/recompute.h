// What the forward keeps for the backward (--recompute), layer by layer.
#pragma once

#include <string>

namespace lmscope {

// A layer's mode. none: every activation the backward reads. selective: not the RMSNorm outputs nor
// the SwiGLU gate, which the backward recomputes from what is kept (the residuals, the statistics,
// the w1 and w3 products; attention under flash recomputes its probabilities anyway). full: the
// layer's input only; the backward reruns the layer's forward before its own backward. The gradients
// are the same in every mode: the recomputation is the forward's own ops on the same inputs.
enum class Recompute { none, selective, full };
const char* recompute_name(Recompute r);

// The modes of a model's layers: one for all ("full"), or one for the first layers and another for the
// rest ("full:20+selective": layers 0-19 in full, the others selective; "full:20" leaves the others at
// none). It is the first layers that recompute more, since that keeps the backward's peak lowest: a layer
// rerun in full holds its activations beside what the layers before it kept, least where they kept least.
class RecomputePlan {
 public:
  RecomputePlan(Recompute all = Recompute::none) : first_(all), rest_(all) {}  // NOLINT: a mode is a plan
  // The first `first_layers` layers in mode `first`, the others in `rest` (first_layers >= 1).
  RecomputePlan(Recompute first, int first_layers, Recompute rest);
  Recompute at(int layer) const { return layer < first_layers_ ? first_ : rest_; }
  int first_layers() const { return first_layers_; }
  // Throws UserError where the plan names more layers than the model has.
  void validate(int layers) const;
  // How much the backward recomputes, in layer-modes (none 0, selective 1, full 2, summed over the
  // layers): an order from none through selective and "full:j+selective" to full.
  int work(int layers) const;
  // No layer recomputes more than under `other`.
  bool no_more_than(const RecomputePlan& other, int layers) const;
  bool operator==(const RecomputePlan&) const = default;

 private:
  Recompute first_, rest_;
  int first_layers_ = 0;  // 0 when uniform
};

// As --recompute spells it: "selective", "full:20+selective".
std::string recompute_name(const RecomputePlan& p);
// --recompute's text: none, selective, full, or MODE:N[+MODE]. Throws UserError.
RecomputePlan parse_recompute(const std::string& s);

}  // namespace lmscope
