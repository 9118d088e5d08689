// How a run is laid out over its ranks: the world it is one rank of, and data parallelism's layout
// (DDP's mode and exchange, the buckets, ZeRO's stage), none for a run of one process that asked for
// nothing. validate() holds the rules of the layout, once: the flag readers, validate_run and the
// data-parallel rank all ask it.
#pragma once

#include "lmscope/model/config.h"
#include "lmscope/parallel/data_parallel.h"
#include "lmscope/parallel/world.h"

#include <cstdint>
#include <optional>
#include <string>

namespace lmscope::parallel {

struct ParallelPlan {
  World world;
  std::optional<DataParallelSpec> data;
  // Tensor parallelism's degree (--tp): each projection split over this many ranks (Megatron's
  // columns and rows: parallel/tensor_parallel.h); 1: none. For now the whole world, without data
  // parallelism beside it.
  int tp = 1;

  bool data_parallel() const { return data.has_value(); }
  // UserError, one sentence, for a layout that cannot run: a bad bucket size or --comm-sms, a ZeRO
  // stage other than 0 to 2, ZeRO in a world of one, the all-gather exchange with flat or ZeRO, a step
  // without a backward (nothing to exchange) or, for ZeRO, without an optimizer, or a global batch the
  // world's size does not split evenly.
  // With tensor parallelism: a degree below 1, one other than the world's size, one beside data
  // parallelism, or one that does not divide the model's heads and feed-forward width (checked by
  // check_model).
  void validate(std::int64_t global_batch, bool backward, bool optimizer) const;
  void check_model(const ModelConfig& model) const;
  // The layout as tables and notes name it: "ZeRO-2 (25 MiB buckets)", "ZeRO-3", "DDP bucketed 25 MiB", "DDP
  // naive", with ", gradients all-gathered" and ", symmetric memory off" where so; "TP 2" for tensor
  // parallelism; "" for neither. The world's size is the caller's to add.
  std::string words() const;
};

}  // namespace lmscope::parallel
