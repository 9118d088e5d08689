// The data-parallel flags train and bench share (--ddp, --grad-exchange, --bucket-mb, --zero,
// --symmetric-memory, --comm-sms, --collective-timeout, --rendezvous), and the
// run they ask for in the world this process finds itself in (parallel/world.h).
#pragma once

#include "lmscope/parallel/parallel_plan.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace lmscope::cli {

struct ParallelFlags {
  std::string ddp, rendezvous, symmetric_memory = "on", grad_exchange = "all-reduce";
  double bucket_mb = 25;
  int zero = 0;
  std::string comm_sms = "auto";
  std::int64_t collective_timeout = 600;  // seconds (World::collective_timeout)
  int world_size = 0;                     // --world-size: the world a dry run stands for (0: the environment's)
  int tp = 1;                             // --tp: tensor parallelism's degree

  // with_world_size: add --world-size (commands with a dry run).
  void add_to(CLI::App& app, bool with_world_size = false);
  // The world from the environment and --rendezvous, and the data-parallel spec: none for a world
  // of one that asked for nothing (the plain path), else the flags' (bucketed by default). UserError,
  // one sentence, for a bad value, flags that do not go together (--ddp beside --zero), or a layout
  // ParallelPlan::validate refuses for a step with a backward and an optimizer (the run's own step is
  // checked again by validate_run). dry_run: --world-size may set the world (rank 0 of it).
  // A real run on GPUs keeps its gradients out of NCCL's symmetric memory (said once, by rank 0) where
  // the NCCL it loaded is older than the first seen to sum right there (parallel/nccl_version.h).
  parallel::ParallelPlan resolve(std::int64_t global_batch, const std::string& device, bool dry_run = false) const;
  // A resumed run's layout, before resolve: in a world of several ranks each flag not given takes the
  // checkpoint's run's value (`theirs`); a world of one runs as one process (ZeRO needs ranks). The
  // side given chooses: --zero given, DDP's exchange flags are not taken; DDP's given, --zero is not.
  void take_from_checkpoint(const parallel::ParallelPlan& theirs);
  // What a resumed run does otherwise than the checkpoint's run, `theirs`, in sentences: the world's
  // size, the layout.
  static std::vector<std::string> changes(const parallel::ParallelPlan& theirs, const parallel::ParallelPlan& now);

 private:
  const CLI::App* app_ = nullptr;
  bool taken_ = false;  // take_from_checkpoint took a layout: data parallelism was asked for
};

// Before the ranks' first collective (every rank at the same point): UserError on every rank, one
// sentence naming the flag that differs and both values, when a rank's description of its run differs
// from rank 0's (ranks started with different flags). Nothing in a world of one.
void check_ranks_agree(const parallel::World& world, const nlohmann::ordered_json& description);

}  // namespace lmscope::cli
