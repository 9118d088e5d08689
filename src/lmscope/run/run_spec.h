// One description of a run: the model; what a step is (its mode, the global batch, the context,
// micro-batches); how it executes (device, precision, attention, recompute, weight copies, the
// gradients' dtype, device graphs, fusion); the optimizer and its schedule; and the data-parallel
// layout with the world it runs in. bench, memory, plan, recommend, report and train describe their
// runs with it, a Session builds one (run/session.h), and to_json/from_json write it and read it back.
#pragma once

#include "lmscope/model/attention.h"
#include "lmscope/model/config.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"
#include "lmscope/parallel/parallel_plan.h"
#include "lmscope/run/step_mode.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace lmscope {

// The gradients' dtype as tables and files name it: "fp32" (the master dtype) or "bf16".
const char* grad_dtype_name(DType grad_dtype);
// "fp32" or "bf16"; UserError naming the choices otherwise.
DType parse_grad_dtype(const std::string& name);

// The parameters' and optimizer state's dtype (--master-dtype) as tables and files name it: "fp32"
// or "bf16"; and back (UserError naming the choices otherwise).
const char* master_dtype_name(DType master_dtype);
DType parse_master_dtype(const std::string& name);

// UserError for copies other than kept under a precision whose weights have none (fp32, tf32).
void check_weight_copies(WeightCopies copies, const std::string& precision);

// The model's shape and parameter count, as every JSON file names it, and back (UserError where it
// cannot be read).
nlohmann::ordered_json model_json(const ModelConfig& m);
ModelConfig model_from_json(const nlohmann::json& j);

struct RunSpec {
  ModelConfig model;
  StepMode mode = StepMode::train;
  std::int64_t batch = 4, ctx = 256;  // the global batch: with data parallelism each rank runs its rows
  int grad_accum = 1;                 // micro-batches of `batch` sequences a step (modes with a backward)
  std::string device = "cpu";
  std::string precision = "fp32";
  AttentionKind attention = AttentionKind::flash;
  RecomputePlan recompute;
  WeightCopies weight_copies = WeightCopies::kept;  // matters under mixed precision only
  DType grad_dtype = DType::f32;                    // f32, or bf16 under bf16 precision
  // The parameters, AdamW's moments and the residual stream: f32, or bf16 (--master-dtype bf16, on
  // CUDA under bf16 precision, with bf16 gradients; the reference model of the 2026 leaderboard).
  DType master_dtype = DType::f32;
  // Each phase as one device graph, recorded once and replayed (Transformer::set_graphs), where the
  // backend has them (CUDA); never with data parallelism (its collectives are not recorded).
  bool graphs = true;
  bool fusion = true;      // the fused kernels (Transformer::set_fusion)
  std::uint64_t seed = 0;  // the weights' (and a fixed batch's tokens')
  OptimizerConfig optimizer;
  LrSchedule schedule;  // the learning rate of step i is schedule.at(i)
  // The layout over the ranks. With data parallelism (train and forward-backward) this process is
  // rank world.rank of world.size, running batch / world.size of the batch's rows; on the dry run, a
  // rank of a world of that size (nothing is exchanged, every buffer of the exchange is made).
  parallel::ParallelPlan parallel;

  int micro_batches() const { return has_backward(mode) ? grad_accum : 1; }
  // The SMs a data-parallel run's exchange holds beside its backward (--comm-sms as it comes to): 0
  // but on GPUs in a world of several.
  int exchange_sms() const;
  // The mode as tables show it: "train", with ", selective recompute" where something is recomputed,
  // ", 4 micro-batches" where gradients are accumulated, ", transient copies" or ", resident copies"
  // where the bf16 weight copies are not kept, ", bf16 masters", ", bf16 gradients" (unless the masters are), ", graphs
  // off" where a CUDA run goes without device graphs, ", fusion off", and ", DDP bucketed 25 MiB, 2 ranks" or ",
  // ZeRO-1, 2 ranks" with data parallelism (", symmetric memory off", ", exchange on 8 SMs" where so).
  std::string label() const;
  // Every field but the world's rendezvous and timeout (where a run meets is not what it is).
  nlohmann::ordered_json to_json() const;
  // The run as a result file's row names it (bench, memory and plan write it first, then their own
  // fields; report/result_files.cpp reads it back): model, device, precision, attention, mode,
  // recompute, grad_accum, weight_copies, grad_dtype, master_dtype, graphs, fusion, batch, ctx, and data_parallel
  // where there is a layout, as it runs (world_size, ddp and grad_exchange null under ZeRO, zero,
  // bucket_mb, symmetric_memory, comm_sms: the SMs the exchange holds).
  nlohmann::ordered_json row() const;
  // The inverse of to_json; UserError naming what cannot be read.
  static RunSpec from_json(const nlohmann::json& j);
};

// The rules that tie a run's settings together, in one place: UserError (one sentence) for a run
// that cannot be; what follows from the others is filled in (a mode without a backward has one
// micro-batch and fp32 gradients; bf16 masters have bf16 gradients; data parallelism runs without
// device graphs).
void validate_run(RunSpec& spec);

}  // namespace lmscope
