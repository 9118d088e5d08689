#include "lmscope/parallel/parallel_plan.h"

#include "lmscope/core/error.h"

namespace lmscope::parallel {

void ParallelPlan::validate(std::int64_t global_batch, bool backward, bool optimizer) const {
  if (!data) return;
  data->validate(world.size);
  data->check_step(backward, optimizer);
  if (global_batch % world.size != 0)
    user_error("--batch {} is the global batch and must split evenly across the {} ranks", global_batch, world.size);
}

}  // namespace lmscope::parallel
