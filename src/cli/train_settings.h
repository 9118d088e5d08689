// Everything `lmscope train` is told: its flags, their checks, the configuration a checkpoint keeps
// (to_json: the run's RunSpec and train's own settings), and how a resumed run takes that
// configuration back: a flag not given takes the checkpoint's value; one given with another value
// goes on and is reported, except the model's shape, vocabulary, precision and master dtype, which a
// checkpoint cannot change (UserError). The data-parallel layout is taken back by ParallelFlags.
#pragma once

#include "lmscope/io/token_data.h"
#include "lmscope/model/config.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/run/run_spec.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lmscope::cli {

// The optimizer's and its schedule's flags (--lr, --lr-schedule, --warmup-iters, --cosine-iters,
// --min-lr, --beta1, --beta2, --eps, --weight-decay, --clip, --loss-scale, --loss-scale-interval):
// train's, and the Python package's RunSpec's.
void add_optimizer_flags(CLI::App& app, OptimizerConfig& optimizer, LrSchedule& schedule, std::string& lr_schedule);
// What follows from them, checked (UserError): the schedule from --lr-schedule, a cosine one without
// --cosine-iters reaching --min-lr at the run's last step; and a step whose gradients are not finite
// is skipped, not applied.
void settle_optimizer(OptimizerConfig& optimizer, LrSchedule& schedule, const std::string& lr_schedule,
                      std::int64_t steps);

struct TrainSettings {
  ModelConfig model;  // set by the command from its model flags (or the checkpoint)
  std::string data, val_data, init, save, log, checkpoint_dir, resume;
  std::int64_t steps = 0, batch = 4, ctx = 256, print_every = 10;
  std::int64_t save_every = 0;  // 0: at the end and on SIGINT, SIGTERM or SIGHUP only
  std::int64_t keep = 0;        // 0: keep every checkpoint
  std::int64_t eval_every = 0;  // 0: after the last step only
  std::int64_t eval_batches = 10;
  std::string trace;             // --trace: a Chrome trace of this process's first steps (not a run setting)
  std::int64_t trace_steps = 3;  // how many
  bool overwrite = false;        // --overwrite: a new run removes the checkpoints in --checkpoint-dir (not kept)
  int grad_accum = 1;
  std::uint64_t seed = 0;
  std::string sample = "random", device, precision = "fp32", attention = "flash", recompute = "none",
              weight_copies = "kept", grad_dtype = "fp32", master_dtype = "fp32", lr_schedule = "constant",
              graphs = "on", fusion = "on";
  OptimizerConfig optimizer;
  LrSchedule schedule;

  void add_to(CLI::App& app);
  // Checks every value (UserError naming the first bad one) and fills in what follows from the
  // others: the device when none was named, the schedule from --lr-schedule and --steps.
  void validate(const CLI::App& app);
  // Before the first step, on the rank that writes: checks that --save and --trace can be written,
  // and that --checkpoint-dir holds no other run's checkpoints (another directory than --resume's):
  // UserError, or under --overwrite, those checkpoints removed (said on the console). Leaves no file
  // behind.
  void prepare_outputs(bool resumed) const;
  // With --val-data: the held-out loss reads the file's windows in order, each once, so --eval-batches
  // is at most the batches of --batch distinct windows it holds (past them they came round again, and
  // 10^12 batches never ended): UserError when given above that, or when the file holds less than one
  // batch; when not given, the default is lowered to it and the console says so.
  void fit_eval_batches(const CLI::App& app, const TokenData& val, bool main_rank);
  // The configuration a checkpoint keeps: {"run": the run's description (RunSpec::to_json, its
  // parallel layout included), "train": what only train has (its files, steps, sampling, checkpoints
  // and evaluation)}.
  nlohmann::ordered_json to_json(const RunSpec& run) const;
  // The run these settings describe, laid out over the ranks as `parallel` says (after validate).
  RunSpec run_spec(const parallel::ParallelPlan& parallel) const;
  // Takes a checkpoint's configuration: values of flags not given on `app`. Returns what differs,
  // in sentences. model_given: whether any model flag was given (then `model` must match).
  std::vector<std::string> take_from_checkpoint(const CLI::App& app, const nlohmann::json& saved, bool model_given);
};

// Steps whose gradients are not finite. AdamW skips them (validate turns
// OptimizerConfig::skip_nonfinite on), leaving the weights and moments as they were; each is said on
// the console. After kLimit of them in a row the run ends (UserError) saying what to lower: weights
// whose gradients stay non-finite that long do not recover. Under fp16's loss scaling such a step
// counts only once the scale its gradients carried was at most 1: above, the overflow is the scale's,
// which halves at each (and the progress line says so).
class NonFiniteSteps {
 public:
  static constexpr int kLimit = 20;
  explicit NonFiniteSteps(double clip) : clip_(clip) {}
  // After step `step`, with its loss and whether AdamW applied it: the console's sentence for a
  // skipped step ("" for an applied one or an fp16 overflow). UserError after kLimit in a row, or for
  // a loss that is not finite in a step applied.
  std::string after_step(std::int64_t step, bool applied, double loss, AdamW& opt);

 private:
  double clip_;
  std::int64_t first_ = 0;  // of the steps in a row
  int in_a_row_ = 0;
};

// The model a checkpoint's configuration names; UserError if it cannot be read.
ModelConfig checkpoint_model(const nlohmann::json& saved, const std::string& dir);
// The run a checkpoint's configuration describes; nullopt for one written before state.json held a
// RunSpec (one flat object, without the parallel layout). UserError if it cannot be read.
std::optional<RunSpec> checkpoint_run(const nlohmann::json& saved, const std::string& dir);

}  // namespace lmscope::cli
