#include "lmscope/parallel/parallel_plan.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>

namespace lmscope::parallel {

void ParallelPlan::validate(std::int64_t global_batch, bool backward, bool optimizer) const {
  if (tp < 1) user_error("--tp must be at least 1, got {}", tp);
  if (tp > 1 && data)
    user_error("--tp {} runs over the whole world for now: data parallelism or ZeRO beside it is not built yet", tp);
  if (tp > 1 && tp != world.size)
    user_error("--tp {} splits each projection over {} ranks, and the world has {}: start {} ranks", tp, tp, world.size,
               tp);
  if (!data) return;
  data->validate(world.size);
  data->check_step(backward, optimizer);
  if (global_batch % world.size != 0)
    user_error("--batch {} is the global batch and must split evenly across the {} ranks", global_batch, world.size);
}

void ParallelPlan::check_model(const ModelConfig& model) const {
  if (tp <= 1) return;
  if (model.heads % tp != 0)
    user_error("--tp {} must divide the model's {} heads (each rank takes whole heads)", tp, model.heads);
  if (model.d_ff % tp != 0)
    user_error("--tp {} must divide the model's feed-forward width d_ff {} (each rank takes an equal slice)", tp,
               model.d_ff);
}

std::string ParallelPlan::words() const {
  if (tp > 1) return fmt::format("TP {}", tp);
  if (!data) return "";
  const DataParallelSpec& p = *data;
  std::string words = p.zero == 3                   ? std::string("ZeRO-3")  // each parameter by itself
                      : p.zero != 0                 ? fmt::format("ZeRO-{} ({:g} MiB buckets)", p.zero, p.bucket_mb)
                      : p.mode == DdpMode::bucketed ? fmt::format("DDP bucketed {:g} MiB", p.bucket_mb)
                                                    : fmt::format("DDP {}", ddp_mode_name(p.mode));
  if (p.zero == 0 && p.exchange == GradExchange::all_gather) words += ", gradients all-gathered";
  if (p.zero == 0 && !p.symmetric_memory) words += ", symmetric memory off";
  return words;
}

}  // namespace lmscope::parallel
