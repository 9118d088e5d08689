#include "lmscope/parallel/parallel_plan.h"

#include "lmscope/core/error.h"

#include <fmt/format.h>

namespace lmscope::parallel {

void ParallelPlan::validate(std::int64_t global_batch, bool backward, bool optimizer) const {
  if (!data) return;
  data->validate(world.size);
  data->check_step(backward, optimizer);
  if (global_batch % world.size != 0)
    user_error("--batch {} is the global batch and must split evenly across the {} ranks", global_batch, world.size);
}

std::string ParallelPlan::words() const {
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
