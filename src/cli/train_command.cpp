// lmscope train: the assignment's training loop: batches from a token file, forward, backward,
// gradient clipping and AdamW under a constant or cosine schedule; JSON-lines log; safetensors out.
#include "commands.h"
#include "model_flags.h"

#include "lmscope/backend/backend.h"
#include "lmscope/io/safetensors.h"
#include "lmscope/io/token_data.h"
#include "lmscope/model/optimizer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <fstream>

namespace lmscope::cli {
namespace {

class TrainCommand : public Command {
 public:
  explicit TrainCommand(CLI::App& parent) {
    app = parent.add_subcommand("train", "Train the model on a token file");
    model_.add_to(*app, false);
    app->add_option("--data", data_, "Token file: raw uint16 (.bin) or .npy (uint16/int32/int64)")->required();
    app->add_option("--init", init_, "Start from these weights (safetensors, PyTorch names)");
    app->add_option("--save", save_, "Write the trained weights here (safetensors)");
    app->add_option("--steps", steps_, "Optimizer steps")->required();
    app->add_option("--batch", batch_, "Sequences per step")->capture_default_str();
    app->add_option("--ctx", ctx_, "Tokens per sequence")->capture_default_str();
    app->add_option("--lr", opt_.lr, "Learning rate (the maximum, with cosine)")->capture_default_str();
    app->add_option("--lr-schedule", schedule_, "constant or cosine")->capture_default_str();
    app->add_option("--warmup-iters", sched_.warmup_iters, "Cosine schedule: linear warm-up iterations")
        ->capture_default_str();
    app->add_option("--cosine-iters", sched_.cosine_iters, "Cosine schedule: iteration where lr reaches --min-lr");
    app->add_option("--min-lr", sched_.lr_min, "Cosine schedule: final learning rate")->capture_default_str();
    app->add_option("--beta1", opt_.beta1)->capture_default_str();
    app->add_option("--beta2", opt_.beta2)->capture_default_str();
    app->add_option("--eps", opt_.eps)->capture_default_str();
    app->add_option("--weight-decay", opt_.weight_decay)->capture_default_str();
    app->add_option("--clip", opt_.clip, "Global gradient-norm limit, 0 = off")->capture_default_str();
    app->add_option("--seed", seed_, "Seed for initialisation and random batches")->capture_default_str();
    app->add_option("--sample", sample_, "random (seeded offsets) or sequential (row b of step s at (s·B+b)·ctx)")
        ->capture_default_str();
    app->add_option("--log", log_, "Write one JSON object per step here");
    app->add_option("--print-every", print_every_, "Print a progress line every N steps")->capture_default_str();
    app->add_option("--device", device_, "cpu or cuda (default: cuda when a GPU is visible)");
    app->add_option("--precision", precision_,
                    "fp32, or on CUDA tf32 or bf16 (mixed: fp32 master weights and optimizer state)")
        ->capture_default_str();
    app->add_option("--attention", attention_, "flash (FlashAttention-2) or naive (scores kept in memory)")
        ->capture_default_str();
    app->add_option("--recompute", recompute_, recompute_help(false))->capture_default_str();
    app->add_option("--grad-accum", grad_accum_, grad_accum_help(false))->capture_default_str();
    app->add_option("--weight-copies", weight_copies_, weight_copies_help(false))->capture_default_str();
  }

  int run() override {
    const ModelConfig c = model_.resolve_one();
    if (batch_ <= 0) user_error("--batch must be positive, got {}", batch_);
    if (ctx_ <= 0) user_error("--ctx must be positive, got {}", ctx_);
    if (steps_ < 0) user_error("--steps must be non-negative, got {}", steps_);
    const AttentionKind attention = parse_attention(attention_);
    const Recompute recompute = parse_recompute(recompute_);
    const WeightCopies weight_copies = parse_weight_copies(weight_copies_);
    if (weight_copies == WeightCopies::transient && compute_dtype(precision_) == DType::f32)
      user_error("{}", kTransientNeedsBf16);
    if (grad_accum_ <= 0) user_error("--grad-accum must be positive, got {}", grad_accum_);
    if (print_every_ <= 0) user_error("--print-every must be positive, got {}", print_every_);
    if (sample_ != "random" && sample_ != "sequential")
      user_error("unknown --sample '{}' (use random or sequential)", sample_);
    if (schedule_ != "constant" && schedule_ != "cosine")
      user_error("unknown --lr-schedule '{}' (use constant or cosine)", schedule_);
    sched_.cosine = schedule_ == "cosine";
    sched_.lr_max = opt_.lr;
    if (sched_.cosine && sched_.cosine_iters == 0) sched_.cosine_iters = steps_;
    sched_.validate();
    opt_.validate();

    TokenData data(data_);
    data.check_vocabulary(c.vocab);
    BatchSampler sampler(data, batch_, ctx_, sample_ == "sequential", seed_);
    std::ofstream log;
    if (!log_.empty()) {
      log.open(log_);
      if (!log) user_error("cannot write the log file '{}'", log_);
    }

    std::unique_ptr<Backend> backend = make_backend(device_.empty() ? default_device() : device_, precision_);
    Transformer model(c, *backend, DType::f32, compute_dtype(precision_), attention);
    model.set_recompute(recompute);
    model.set_weight_copies(weight_copies);
    if (init_.empty())
      model.init_parameters(seed_);
    else
      load_parameters(model, init_);
    AdamW opt(model, opt_);
    fmt::print("training {} ({} parameters) on {}: {} tokens in '{}', {} steps of {}{}x{} tokens\n", c.name,
               c.parameter_count(), backend->name(), data.size(), data_, steps_,
               grad_accum_ > 1 ? fmt::format("{} micro-batches of ", grad_accum_) : "", batch_, ctx_);

    const std::size_t micro = static_cast<std::size_t>(batch_ * ctx_), n = micro * grad_accum_;  // tokens
    std::vector<std::int32_t> ids(micro), targets(micro);
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t it = 0; it < steps_; ++it) {
      // The step's loss is the mean of its micro-batches' (each the mean over its tokens).
      double loss = 0;
      for (int k = 0; k < grad_accum_; ++k) {
        sampler.next(ids.data(), targets.data());
        model.set_batch(batch_, ctx_, ids.data(), targets.data());
        model.forward();
        model.backward({k, grad_accum_});
        loss += model.read_loss() / grad_accum_;
      }
      const double lr = sched_.at(it);
      opt.step(lr);
      const double norm = opt.last_grad_norm();
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!std::isfinite(loss)) user_error("the loss became {} at step {}; lower --lr or enable --clip", loss, it + 1);
      if (log.is_open()) {
        nlohmann::ordered_json j{{"step", it + 1},
                                 {"loss", loss},
                                 {"lr", lr},
                                 {"grad_norm", norm},
                                 {"tokens", static_cast<std::int64_t>(n) * (it + 1)},
                                 {"elapsed_s", elapsed}};
        log << j.dump() << "\n" << std::flush;
      }
      if ((it + 1) % print_every_ == 0 || it == 0 || it + 1 == steps_)
        fmt::print("step {:>6}/{}  loss {:.4f}  lr {:.3e}  grad norm {:.3f}  {:.2f} s/step  {:.0f} tokens/s\n", it + 1,
                   steps_, loss, lr, norm, elapsed / static_cast<double>(it + 1),
                   static_cast<double>(n) * static_cast<double>(it + 1) / elapsed);
    }
    if (!save_.empty()) {
      save_parameters(model, save_);
      fmt::print("saved weights to '{}'\n", save_);
    }
    return 0;
  }

 private:
  ModelFlags model_;
  std::string data_, init_, save_, log_, device_, precision_ = "fp32", schedule_ = "constant", sample_ = "random",
                                                  attention_ = "flash", recompute_ = "none", weight_copies_ = "kept";
  std::int64_t steps_ = 0, batch_ = 4, ctx_ = 256, print_every_ = 10;
  int grad_accum_ = 1;
  std::uint64_t seed_ = 0;
  OptimizerConfig opt_;
  LrSchedule sched_;
};

}  // namespace

std::unique_ptr<Command> add_train_command(CLI::App& parent) { return std::make_unique<TrainCommand>(parent); }

}  // namespace lmscope::cli
