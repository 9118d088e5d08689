#include "train_settings.h"

#include "model_flags.h"

#include "lmscope/backend/backend.h"
#include "lmscope/bench/report.h"
#include "lmscope/core/error.h"
#include "lmscope/core/json_kind.h"
#include "lmscope/io/checkpoint.h"
#include "lmscope/io/durable_file.h"
#include "lmscope/model/attention.h"
#include "lmscope/model/transformer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <type_traits>

namespace lmscope::cli {
namespace {

// A flag's value from the checkpoint's configuration (under the flag's name without dashes, '-'
// as '_') when the flag was not given; when given with another value, a sentence saying so. A value of
// another kind than the flag's is a UserError naming it (the JSON library's sentence was the message,
// and -1 for --seed wrapped round).
template <typename T>
void take(const CLI::App& app, const nlohmann::json& saved, const std::string& dir, const char* flag, T& value,
          std::vector<std::string>& changes) {
  std::string key(flag + 2);
  for (char& c : key)
    if (c == '-') c = '_';
  if (!saved.contains(key)) return;
  const nlohmann::json& v = saved.at(key);
  if (!json_holds<T>(v)) {
    const std::string text = v.dump();
    user_error("the checkpoint in '{}' gives {} the value {} in its configuration, which {} cannot take", dir, flag,
               text.size() > 40 ? text.substr(0, 40) + "..." : text, flag);
  }
  const T old = v.get<T>();
  if (app.count(flag) == 0)
    value = old;
  else if (value != old)
    changes.push_back(
        fmt::format("{} is {} here and was {} in the checkpoint's run; going on with {}", flag, value, old, value));
}

// Whether JSON can hold `text` as it is: nlohmann's dump refuses bytes that are not UTF-8.
bool json_holds(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::string shape_words(const ModelConfig& c) {
  return fmt::format("d_model {}, d_ff {}, {} layers, {} heads, vocabulary {}, RoPE theta {}", c.d_model, c.d_ff,
                     c.layers, c.heads, c.vocab, c.rope_theta);
}

// A checkpoint's configuration as one flat object under the flags' names, as state.json held it
// before it kept a RunSpec: what take() reads, whichever the checkpoint's age.
nlohmann::json flat_config(const nlohmann::json& saved, const std::string& dir) {
  const std::optional<RunSpec> run = checkpoint_run(saved, dir);
  if (!run) return saved;
  nlohmann::json flat = saved.at("train");
  const RunSpec& r = *run;
  auto on_off = [](bool on) { return on ? "on" : "off"; };
  flat.update({{"model", model_json(r.model)},
               {"precision", r.precision},
               {"device", r.device},
               {"attention", attention_name(r.attention)},
               {"recompute", recompute_name(r.recompute)},
               {"weight_copies", weight_copies_name(r.weight_copies)},
               {"grad_dtype", grad_dtype_name(r.grad_dtype)},
               {"master_dtype", master_dtype_name(r.master_dtype)},
               {"graphs", on_off(r.graphs)},
               {"fusion", on_off(r.fusion)},
               {"batch", r.batch},
               {"ctx", r.ctx},
               {"grad_accum", r.grad_accum},
               {"seed", r.seed},
               {"lr", r.optimizer.lr},
               {"lr_schedule", r.schedule.cosine ? "cosine" : "constant"},
               {"warmup_iters", r.schedule.warmup_iters},
               {"cosine_iters", r.schedule.cosine_iters},
               {"min_lr", r.schedule.lr_min},
               {"beta1", r.optimizer.beta1},
               {"beta2", r.optimizer.beta2},
               {"eps", r.optimizer.eps},
               {"weight_decay", r.optimizer.weight_decay},
               {"clip", r.optimizer.clip},
               {"loss_scale", r.optimizer.loss_scaling.initial},
               {"loss_scale_interval", r.optimizer.loss_scaling.interval}});
  return flat;
}

}  // namespace

std::optional<RunSpec> checkpoint_run(const nlohmann::json& saved, const std::string& dir) {
  if (!saved.is_object() || !saved.contains("run")) return std::nullopt;
  if (!saved.contains("train") || !saved.at("train").is_object())
    user_error("the configuration in the checkpoint in '{}' holds no object \"train\" beside its run", dir);
  try {
    return RunSpec::from_json(saved.at("run"));
  } catch (const UserError& e) {
    user_error("the configuration in the checkpoint in '{}' cannot be read: {}", dir, e.what());
  }
}

ModelConfig checkpoint_model(const nlohmann::json& saved, const std::string& dir) {
  if (const std::optional<RunSpec> run = checkpoint_run(saved, dir)) return run->model;
  try {
    return model_from_json(saved.at("model"));
  } catch (const nlohmann::json::exception&) {
    user_error(
        "the configuration in the checkpoint in '{}' names no model: its \"model\" lacks a field or holds one of "
        "another kind",
        dir);
  }
}

void add_optimizer_flags(CLI::App& app, OptimizerConfig& optimizer, LrSchedule& schedule, std::string& lr_schedule) {
  app.add_option("--lr", optimizer.lr, "Learning rate (the maximum, with cosine)")->capture_default_str();
  app.add_option("--lr-schedule", lr_schedule, "constant or cosine")->capture_default_str();
  app.add_option("--warmup-iters", schedule.warmup_iters, "Cosine schedule: linear warm-up iterations")
      ->capture_default_str();
  app.add_option("--cosine-iters", schedule.cosine_iters, "Cosine schedule: iteration where lr reaches --min-lr");
  app.add_option("--min-lr", schedule.lr_min, "Cosine schedule: final learning rate")->capture_default_str();
  app.add_option("--beta1", optimizer.beta1)->capture_default_str();
  app.add_option("--beta2", optimizer.beta2)->capture_default_str();
  app.add_option("--eps", optimizer.eps)->capture_default_str();
  app.add_option("--weight-decay", optimizer.weight_decay)->capture_default_str();
  app.add_option("--clip", optimizer.clip, "Global gradient-norm limit, 0 = off")->capture_default_str();
  app.add_option("--loss-scale", optimizer.loss_scaling.initial,
                 "fp16: the first loss scale (a power of two), halved at every step whose gradients overflow")
      ->capture_default_str();
  app.add_option("--loss-scale-interval", optimizer.loss_scaling.interval,
                 "fp16: steps in a row without overflow before the loss scale doubles")
      ->capture_default_str();
}

void settle_optimizer(OptimizerConfig& optimizer, LrSchedule& schedule, const std::string& lr_schedule,
                      std::int64_t steps) {
  if (lr_schedule != "constant" && lr_schedule != "cosine")
    user_error("unknown --lr-schedule '{}' (use constant or cosine)", lr_schedule);
  schedule.cosine = lr_schedule == "cosine";
  schedule.lr_max = optimizer.lr;
  if (schedule.cosine && schedule.cosine_iters == 0) schedule.cosine_iters = steps;
  schedule.validate();
  optimizer.validate();
  optimizer.skip_nonfinite = true;
}

void TrainSettings::add_to(CLI::App& app) {
  app.add_option("--data", data, "Token file: raw uint16 (.bin) or .npy (uint16/int32/int64)");
  app.add_option("--init", init, "Start from these weights (safetensors, PyTorch names)");
  app.add_option("--save", save, "Write the trained weights here (safetensors)");
  app.add_option("--steps", steps, "Optimizer steps (in all, counting those before a --resume)");
  app.add_option("--batch", batch, "Sequences per micro-batch")->capture_default_str();
  app.add_option("--ctx", ctx, "Tokens per sequence")->capture_default_str();
  add_optimizer_flags(app, optimizer, schedule, lr_schedule);
  app.add_option("--seed", seed, "Seed for initialisation and random batches")->capture_default_str();
  app.add_option("--sample", sample, "random (seeded offsets) or sequential (row b of step s at (s·B+b)·ctx)")
      ->capture_default_str();
  app.add_option("--log", log, "Write one JSON object per step here (a resumed run keeps the lines up to its step)");
  app.add_option("--print-every", print_every, "Print a progress line every N steps")->capture_default_str();
  app.add_option("--trace", trace,
                 "Write this run's first --trace-steps steps as a Chrome trace (ui.perfetto.dev): each step, phase, "
                 "layer and op, and the allocator's bytes");
  app.add_option("--trace-steps", trace_steps, "With --trace: how many steps")->capture_default_str();
  app.add_option("--device", device, "cpu or cuda (default: cuda when a GPU is visible)");
  app.add_option("--precision", precision,
                 "fp32, or on CUDA tf32, bf16 or fp16 (mixed: fp32 master weights and optimizer state; fp16 with "
                 "dynamic loss scaling)")
      ->capture_default_str();
  app.add_option("--attention", attention, "flash (FlashAttention-2) or naive (scores kept in memory)")
      ->capture_default_str();
  app.add_option("--recompute", recompute, recompute_help(false))->capture_default_str();
  app.add_option("--grad-accum", grad_accum, grad_accum_help(false))->capture_default_str();
  app.add_option("--weight-copies", weight_copies, weight_copies_help(false))->capture_default_str();
  app.add_option("--grad-dtype", grad_dtype, grad_dtype_help(false))->capture_default_str();
  app.add_option("--master-dtype", master_dtype, master_dtype_help(false))->capture_default_str();
  app.add_option("--graphs", graphs,
                 "on: forward, backward and optimizer each run as one CUDA graph, recorded once and replayed (the "
                 "same bits as off, fewer launches); off: op by op (no effect on the CPU)")
      ->capture_default_str();
  app.add_option("--fusion", fusion,
                 "on: the fused kernels (the residual add with the RMSNorm after it, forward and backward; the "
                 "optimizer step in a few launches); off: the unfused ops")
      ->capture_default_str();
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "Write full checkpoints here (weights, AdamW state, step, sampling position, configuration): every "
                 "--save-every steps, at the end, and on SIGINT, SIGTERM or SIGHUP");
  app.add_option("--save-every", save_every, "With --checkpoint-dir: a checkpoint every N steps");
  app.add_option("--keep", keep, "With --checkpoint-dir: keep the newest K checkpoints (default: all)");
  app.add_option("--resume", resume,
                 "Go on from the newest complete checkpoint in this directory (flags not given take its values)");
  app.add_flag("--overwrite", overwrite,
               "Start a new run in a --checkpoint-dir that holds another run's checkpoints, removing them (its "
               "step-* directories) before the first step");
  app.add_option("--val-data", val_data, "Held-out token file: log its mean loss and perplexity");
  app.add_option("--eval-every", eval_every, "With --val-data: every N steps (default: after the last step)");
  app.add_option("--eval-batches", eval_batches,
                 "With --val-data: batches of --batch sequences evaluated, each of other windows (at most as many "
                 "as the file holds)")
      ->capture_default_str();
}

void TrainSettings::validate(const CLI::App& app) {
  if (data.empty()) user_error("--data is required (the token file to train on)");
  if (resume.empty() && app.count("--steps") == 0) user_error("--steps is required");
  if (!resume.empty() && !init.empty()) user_error("--init and --resume both choose the starting weights; give one");
  if (batch <= 0) user_error("--batch must be positive, got {}", batch);
  if (ctx <= 0) user_error("--ctx must be positive, got {}", ctx);
  if (steps < 0) user_error("--steps must be non-negative, got {}", steps);
  if (grad_accum <= 0) user_error("--grad-accum must be positive, got {}", grad_accum);
  if (print_every <= 0) user_error("--print-every must be positive, got {}", print_every);
  if (app.count("--trace-steps") > 0 && trace.empty()) user_error("--trace-steps needs --trace");
  if (trace_steps <= 0) user_error("--trace-steps must be positive, got {}", trace_steps);
  if (sample != "random" && sample != "sequential")
    user_error("unknown --sample '{}' (use random or sequential)", sample);
  check_precision(precision);
  parse_attention(attention);
  parse_recompute(recompute);
  for (const auto& [flag, value] : {std::pair{"--graphs", &graphs}, std::pair{"--fusion", &fusion}})
    if (*value != "on" && *value != "off") user_error("unknown {} '{}' (use on or off)", flag, *value);
  check_weight_copies(weight_copies, precision);
  check_grad_dtype(grad_dtype, precision);
  parse_master_dtype(master_dtype);  // how it fits the rest: validate_run
  if (checkpoint_dir.empty() && (app.count("--save-every") > 0 || app.count("--keep") > 0))
    user_error("--save-every and --keep need --checkpoint-dir");
  if (app.count("--save-every") > 0 && save_every <= 0)
    user_error("--save-every must be positive, got {} (leave it out to save only at the end)", save_every);
  if (app.count("--keep") > 0 && keep <= 0) user_error("--keep must be positive, got {}", keep);
  if (overwrite && checkpoint_dir.empty()) user_error("--overwrite needs --checkpoint-dir");
  // A checkpoint's state.json records these paths (JSON dumping one failed after the first step, leaving a
  // .partial directory), and a resumed run reads them back, so they must be text as they are.
  const char* dir_flag = app.count("--checkpoint-dir") == 0 && !resume.empty() ? "--resume" : "--checkpoint-dir";
  if (!checkpoint_dir.empty())
    for (auto [flag, path] :
         {std::pair{"--data", &data}, std::pair{"--val-data", &val_data}, std::pair{dir_flag, &checkpoint_dir}})
      if (!json_holds(*path))
        user_error(
            "{} names a path that is not UTF-8 text, and a checkpoint records it in JSON, which holds only UTF-8; "
            "rename it, or train without --checkpoint-dir",
            flag);
  if (val_data.empty() && (app.count("--eval-every") > 0 || app.count("--eval-batches") > 0))
    user_error("--eval-every and --eval-batches need --val-data");
  if (app.count("--eval-every") > 0 && eval_every <= 0) user_error("--eval-every must be positive, got {}", eval_every);
  if (eval_batches <= 0) user_error("--eval-batches must be positive, got {}", eval_batches);
  if (device.empty()) device = default_device();
  settle_optimizer(optimizer, schedule, lr_schedule, steps);
}

void TrainSettings::prepare_outputs(bool resumed) const {
  if (!save.empty()) check_replaceable(save, "--save");
  if (!trace.empty()) check_writable(trace, "--trace");
  if (checkpoint_dir.empty()) return;
  std::error_code ec;
  const bool resumes_there = resumed && std::filesystem::equivalent(checkpoint_dir, resume, ec);
  if (resumes_there) {
    if (overwrite)
      user_error("--overwrite would remove the checkpoints of '{}' that --resume goes on from; leave it out", resume);
    return;
  }
  const std::vector<std::string> theirs = checkpoint_paths(checkpoint_dir);
  if (theirs.empty()) return;
  if (!overwrite)
    user_error(
        "--checkpoint-dir '{}' holds another run's checkpoints (the newest '{}'); go on from them with "
        "--resume {}, or give --overwrite to remove them and start this run there",
        checkpoint_dir, theirs.front(), checkpoint_dir);
  remove_checkpoints(checkpoint_dir);
  fmt::print("removed {} checkpoint{} from '{}' (--overwrite)\n", theirs.size(), theirs.size() == 1 ? "" : "s",
             checkpoint_dir);
}

void TrainSettings::fit_eval_batches(const CLI::App& app, const TokenData& val, bool main_rank) {
  const std::int64_t windows = (val.size() - 1) / ctx, most = windows / batch;
  if (most == 0)
    user_error("--val-data '{}' holds {} windows of --ctx {} tokens, fewer than one batch of --batch {}", val_data,
               windows, ctx, batch);
  if (eval_batches <= most) return;
  if (app.count("--eval-batches") > 0)
    user_error(
        "--eval-batches {} of --batch {} would go past the {} windows of --ctx {} tokens in '{}', which the held-out "
        "loss reads once each: give at most {}",
        eval_batches, batch, windows, ctx, val_data, most);
  if (main_rank)
    fmt::print("note: '{}' holds {} batches of {} windows of {} tokens: the held-out loss is over those, not {}\n",
               val_data, most, batch, ctx, eval_batches);
  eval_batches = most;
}

std::string NonFiniteSteps::after_step(std::int64_t step, bool applied, double loss, AdamW& opt) {
  const char* advice = clip_ > 0 ? "lower --lr" : "lower --lr or turn on --clip";
  if (applied) {
    in_a_row_ = 0;
    if (!std::isfinite(loss)) user_error("the loss became {} at step {}; {}", loss, step, advice);
    return "";
  }
  const bool scaled = opt.loss_scaler().on();
  if (!scaled || opt.last_loss_scale() <= 1) {
    if (in_a_row_++ == 0) first_ = step;
    if (in_a_row_ == kLimit)
      user_error("the gradients were not finite for {} steps in a row (steps {} to {}), each skipped; {}", kLimit,
                 first_, step, advice);
  }
  if (scaled) return "";
  return fmt::format(
      "step {}: the gradients are not finite (norm {}); the step is skipped, the weights left as they were", step,
      opt.last_grad_norm());
}

nlohmann::ordered_json TrainSettings::to_json(const RunSpec& run) const {
  return {{"run", run.to_json()},
          {"train",
           {{"data", data},
            {"val_data", val_data},
            {"steps", steps},
            {"sample", sample},
            {"checkpoint_dir", checkpoint_dir},
            {"save_every", save_every},
            {"keep", keep},
            {"eval_every", eval_every},
            {"eval_batches", eval_batches},
            {"print_every", print_every}}}};
}

RunSpec TrainSettings::run_spec(const parallel::ParallelPlan& parallel) const {
  RunSpec r;
  r.model = model;
  r.mode = StepMode::train;
  r.batch = batch;
  r.ctx = ctx;
  r.grad_accum = grad_accum;
  r.device = device;
  r.precision = precision;
  r.attention = parse_attention(attention);
  r.recompute = parse_recompute(recompute);
  r.weight_copies = parse_weight_copies(weight_copies);
  r.grad_dtype = parse_grad_dtype(grad_dtype);
  r.master_dtype = parse_master_dtype(master_dtype);
  r.graphs = graphs == "on";
  r.fusion = fusion == "on";
  r.seed = seed;
  r.optimizer = optimizer;
  r.schedule = schedule;
  r.parallel = parallel;
  return r;
}

std::vector<std::string> TrainSettings::take_from_checkpoint(const CLI::App& app, const nlohmann::json& config,
                                                             bool model_given) {
  const ModelConfig theirs = checkpoint_model(config, resume);
  const nlohmann::json saved = flat_config(config, resume);
  try {
    if (!model_given) {
      model = theirs;
    } else if (model.d_model != theirs.d_model || model.d_ff != theirs.d_ff || model.layers != theirs.layers ||
               model.heads != theirs.heads || model.vocab != theirs.vocab || model.rope_theta != theirs.rope_theta) {
      user_error("the checkpoint in '{}' is of another model ({}) than the one asked for ({})", resume,
                 shape_words(theirs), shape_words(model));
    }
    if (!saved.contains("precision") || !saved["precision"].is_string())
      user_error("the configuration in the checkpoint in '{}' names no precision", resume);
    const std::string their_precision = saved["precision"].get<std::string>();
    if (app.count("--precision") > 0 && precision != their_precision)
      user_error("the checkpoint in '{}' was trained in {}, and a run cannot go on from it in {}", resume,
                 their_precision, precision);
    precision = their_precision;
    // A checkpoint of fp32 masters holds values bf16 cannot keep, and one of bf16 masters was trained
    // as a bf16 model: neither goes on as the other. Those written before the choice were fp32.
    const std::string their_masters = saved.contains("master_dtype") && saved["master_dtype"].is_string()
                                          ? saved["master_dtype"].get<std::string>()
                                          : "fp32";
    if (app.count("--master-dtype") > 0 && master_dtype != their_masters)
      user_error("the checkpoint in '{}' was trained with {} masters, and a run cannot go on from it with {}", resume,
                 their_masters, master_dtype);
    master_dtype = their_masters;
    std::vector<std::string> changes;
    take(app, saved, resume, "--device", device, changes);
    take(app, saved, resume, "--attention", attention, changes);
    take(app, saved, resume, "--recompute", recompute, changes);
    take(app, saved, resume, "--weight-copies", weight_copies, changes);
    take(app, saved, resume, "--grad-dtype", grad_dtype, changes);
    take(app, saved, resume, "--graphs", graphs, changes);
    take(app, saved, resume, "--fusion", fusion, changes);
    take(app, saved, resume, "--data", data, changes);
    take(app, saved, resume, "--val-data", val_data, changes);
    take(app, saved, resume, "--steps", steps, changes);
    take(app, saved, resume, "--batch", batch, changes);
    take(app, saved, resume, "--ctx", ctx, changes);
    take(app, saved, resume, "--grad-accum", grad_accum, changes);
    take(app, saved, resume, "--sample", sample, changes);
    take(app, saved, resume, "--seed", seed, changes);
    take(app, saved, resume, "--lr", optimizer.lr, changes);
    take(app, saved, resume, "--lr-schedule", lr_schedule, changes);
    take(app, saved, resume, "--warmup-iters", schedule.warmup_iters, changes);
    take(app, saved, resume, "--cosine-iters", schedule.cosine_iters, changes);
    take(app, saved, resume, "--min-lr", schedule.lr_min, changes);
    take(app, saved, resume, "--beta1", optimizer.beta1, changes);
    take(app, saved, resume, "--beta2", optimizer.beta2, changes);
    take(app, saved, resume, "--eps", optimizer.eps, changes);
    take(app, saved, resume, "--weight-decay", optimizer.weight_decay, changes);
    take(app, saved, resume, "--clip", optimizer.clip, changes);
    // (--loss-scale is a new run's first scale: a resumed one goes on from the checkpoint's scale.)
    take(app, saved, resume, "--loss-scale-interval", optimizer.loss_scaling.interval, changes);
    take(app, saved, resume, "--save-every", save_every, changes);
    take(app, saved, resume, "--keep", keep, changes);
    take(app, saved, resume, "--eval-every", eval_every, changes);
    take(app, saved, resume, "--eval-batches", eval_batches, changes);
    take(app, saved, resume, "--print-every", print_every, changes);
    // The run goes on writing checkpoints where it resumed from, unless told otherwise.
    if (app.count("--checkpoint-dir") == 0) checkpoint_dir = resume;
    return changes;
  } catch (const nlohmann::json::exception&) {
    user_error("the configuration in the checkpoint in '{}' cannot be read: a field is missing or of another kind",
               resume);
  }
}

}  // namespace lmscope::cli
