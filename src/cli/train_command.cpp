// lmscope train: the assignment's training loop: batches from a token file, forward, backward,
// gradient clipping and AdamW under a constant or cosine schedule; JSON-lines log; safetensors out;
// full checkpoints (io/checkpoint.h) every --save-every steps, at the end and on SIGINT, SIGTERM or
// SIGHUP, --resume from the newest complete one (and, started again after a failure, from
// --checkpoint-dir's), and held-out loss every --eval-every steps.
#include "commands.h"
#include "model_flags.h"
#include "parallel_flags.h"
#include "stop_signals.h"
#include "sweep_output.h"
#include "train_settings.h"

#include "lmscope/backend/backend.h"
#include "lmscope/bench/trace_session.h"
#include "lmscope/io/checkpoint.h"
#include "lmscope/io/run_log.h"
#include "lmscope/io/safetensors.h"
#include "lmscope/io/token_data.h"
#include "lmscope/parallel/flight_recorder.h"
#include "lmscope/parallel/test_fault.h"
#include "lmscope/run/session.h"
#include "lmscope/run/step_driver.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>

#include <unistd.h>

namespace lmscope::cli {
namespace {

// The signal that asked the run to stop, 0 while none has. The handler only records it; the loop
// saves at the step's end. A second signal stops the process at once (exit 128 + it, no checkpoint:
// the last complete one stays).
std::atomic<int> stop_signal{0};
extern "C" void stop_at_once(int sig) {
  const char line[] = "lmscope: a second signal: stopped at once, without a checkpoint of this step\n";
  if (::write(STDERR_FILENO, line, sizeof line - 1) < 0) ::_exit(128 + sig);
  ::_exit(128 + sig);
}
extern "C" void record_stop_signal(int sig) {
  stop_signal.store(sig);
  parallel::FlightRecorder::note_signal(sig);  // the ranks' flight records are written then
  for (int s : kStopSignals) std::signal(s, stop_at_once);
}

// The signal the ranks stop on: the one every rank that had one had (SIGTERM where they had different
// ones), so every rank says and exits with the signal a user sent to any one of them.
int agreed_stop_signal(Session& session, int own, double share_signalled) {
  const double n = session.spec().parallel.data ? session.spec().parallel.world.size : 1;
  const long count = std::lround(share_signalled * n);
  const long sum = std::lround(session.mean_over_ranks(static_cast<double>(own)) * n);
  for (int sig : kStopSignals)
    if (sum == count * sig) return sig;
  return SIGTERM;
}

// Mean loss over the first `batches` windows of the held-out data (the same each time), from
// forwards that keep nothing for a backward. With data parallelism each rank runs its rows of each
// batch, as in training, and the ranks' means are averaged.
double held_out_loss(Session& session, const TokenData& data, std::int64_t batches) {
  const RunSpec& s = session.spec();
  Transformer& model = session.model();
  BatchSampler sampler(data, s.batch, s.ctx, true, 0);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(s.batch * s.ctx)), targets(ids.size());
  double sum = 0;
  for (std::int64_t b = 0; b < batches; ++b) {
    sampler.next(ids.data(), targets.data());
    session.set_batch(ids.data(), targets.data());
    model.forward(false);
    sum += model.read_loss();
    model.discard_activations();
  }
  return session.mean_over_ranks(sum / static_cast<double>(batches));
}

// What the loop says of a step: a line of the JSON-lines log, and one on the console.
struct StepReport {
  std::int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  std::int64_t tokens_per_step = 0;
  double elapsed_s = 0;         // since the run (or its resumption) began
  std::int64_t steps_done = 0;  // in that time
  std::optional<double> val_loss;
  std::optional<double> loss_scale;  // fp16's, when a scaler runs
  bool applied = true;               // false: the step was skipped, its gradients not finite
  std::int64_t skipped_in_all = 0;

  std::string log_line() const {
    nlohmann::ordered_json j{{"step", step},
                             {"loss", loss},
                             {"lr", lr},
                             {"grad_norm", grad_norm},
                             {"tokens", tokens_per_step * step},
                             {"elapsed_s", elapsed_s}};
    if (val_loss) {
      j["val_loss"] = *val_loss;
      j["val_perplexity"] = std::exp(*val_loss);
    }
    if (loss_scale) {
      j["loss_scale"] = *loss_scale;
      j["skipped"] = !applied;
    } else if (!applied) {
      j["skipped"] = true;  // its gradients were not finite
    }
    return j.dump();
  }
  std::string console_line() const {
    const double done = static_cast<double>(steps_done);
    return fmt::format(
        "step {:>6}/{}  loss {:.4f}{}  lr {:.3e}  grad norm {:.3f}{}  {:.2f} s/step  {:.0f} tokens/s", step, steps,
        loss, val_loss ? fmt::format("  val loss {:.4f} (perplexity {:.2f})", *val_loss, std::exp(*val_loss)) : "", lr,
        grad_norm,
        loss_scale ? fmt::format("  loss scale {:g}{} ({} skipped in all)", *loss_scale,
                                 applied ? "" : ", overflow: step skipped", skipped_in_all)
                   : "",
        elapsed_s / done, static_cast<double>(tokens_per_step) * done / elapsed_s);
  }
};

// What a training step is followed by, inside its range: the loss checked, the held-out loss when
// due, the log's line and the console's, and a checkpoint when due.
class TrainProgress : public StepObserver {
 public:
  using SaveCheckpoint = std::function<void(std::int64_t step)>;
  TrainProgress(const TrainSettings& s, Session& session, const TokenData* val, RunLog* log, std::int64_t start,
                SaveCheckpoint save)
      : s_(s),
        session_(session),
        val_(val),
        log_(log),
        start_(start),
        save_(std::move(save)),
        non_finite_(s.optimizer.clip) {}

  std::int64_t last_saved = -1;

  void step_end(const StepResult& result) override {
    const std::int64_t step = result.iteration + 1;
    RangeListener* ranges = session_.backend().range_listener();
    std::optional<double> val_loss;
    if (val_ && ((s_.eval_every > 0 && step % s_.eval_every == 0) || step == s_.steps)) {
      ScopedRange r(ranges, RangeLevel::phase, "held-out loss");
      val_loss = held_out_loss(session_, *val_, s_.eval_batches);
    }
    AdamW& opt = *session_.optimizer();
    StepReport report{.step = step,
                      .steps = s_.steps,
                      .loss = result.loss,
                      .lr = result.lr,
                      .grad_norm = opt.last_grad_norm(),
                      .tokens_per_step = s_.batch * s_.ctx * s_.grad_accum,
                      .elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(),
                      .steps_done = step - start_,
                      .val_loss = val_loss,
                      .loss_scale = std::nullopt,
                      .applied = result.applied,
                      .skipped_in_all = opt.loss_scaler().skipped()};
    if (opt.loss_scaler().on()) report.loss_scale = opt.last_loss_scale();
    if (log_) log_->write_line(report.log_line());
    if (const std::string said = non_finite_.after_step(step, result.applied, result.loss, opt);
        !said.empty() && session_.main_rank())
      fmt::print("{}\n", said);
    if (session_.main_rank() &&
        (step % s_.print_every == 0 || result.iteration == start_ || step == s_.steps || val_loss))
      fmt::print("{}\n", report.console_line());
    if (!s_.checkpoint_dir.empty() && ((s_.save_every > 0 && step % s_.save_every == 0) || step == s_.steps)) {
      ScopedRange r(ranges, RangeLevel::phase, "checkpoint");
      save_(step);
      last_saved = step;
    }
  }

 private:
  const TrainSettings& s_;
  Session& session_;
  const TokenData* val_;
  RunLog* log_;  // rank 0's, when --log is given
  std::int64_t start_;
  SaveCheckpoint save_;
  NonFiniteSteps non_finite_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

class TrainCommand : public Command {
 public:
  explicit TrainCommand(CLI::App& parent) {
    app = parent.add_subcommand("train", "Train the model on a token file");
    model_.add_to(*app, false);
    s_.add_to(*app);
    parallel_.add_to(*app);
  }

  int run() override {
    // Started again after a failure: on from the newest complete checkpoint the first start wrote
    // (newer than any --resume gave it). None yet: a fresh start, in place of what it left half-made.
    if (parallel::restart_count() > 0 && !s_.checkpoint_dir.empty()) {
      try {
        find_checkpoint(s_.checkpoint_dir);
        s_.resume = s_.checkpoint_dir, s_.init.clear(), s_.overwrite = false;
      } catch (const UserError&) {  // none complete: whatever is there is this run's (else it had refused)
        if (s_.resume.empty()) s_.overwrite = true;
      }
    }
    std::optional<FoundCheckpoint> resumed;
    std::optional<RunSpec> saved_run;  // the checkpoint's, when it keeps its description
    std::vector<std::string> changes;  // what the checkpoint's run did otherwise: rank 0 says them
    if (!s_.resume.empty()) {
      resumed = find_checkpoint(s_.resume);
      // Shape flags apply to the checkpoint's model unless --model names a preset to start from.
      const ModelConfig theirs = checkpoint_model(resumed->state.config, s_.resume);
      s_.model = model_.resolve_one(app->count("--model") > 0 ? std::nullopt : std::optional(theirs));
      changes = s_.take_from_checkpoint(*app, resumed->state.config, model_given());
      saved_run = checkpoint_run(resumed->state.config, s_.resume);
      if (saved_run) parallel_.take_from_checkpoint(saved_run->parallel);
    } else {
      s_.model = model_.resolve_one();
    }
    s_.validate(*app);
    // Data parallelism: this process is one rank of the world the environment names; --batch is the
    // global batch, each rank running its share of the rows one process would.
    const parallel::ParallelPlan parallel = parallel_.resolve(s_.batch, s_.device);
    RunSpec checked = s_.run_spec(parallel);  // the run's rules before its files are read (the session's again)
    validate_run(checked);
    const bool main_rank = parallel.world.rank == 0;
    if (saved_run)
      for (std::string& change : ParallelFlags::changes(saved_run->parallel, parallel))
        changes.push_back(std::move(change));
    if (main_rank) {
      if (resumed)
        for (const std::string& w : resumed->warnings()) fmt::print(stderr, "lmscope: warning: {}\n", w);
      for (const std::string& change : changes) fmt::print("note: {}\n", change);
    }
    if (parallel.data && s_.graphs == "on" && s_.device == "cuda") {
      if (app->count("--graphs") > 0 && main_rank)
        fmt::print("note: data parallelism runs without device graphs (its collectives are not recorded)\n");
      s_.graphs = "off";
    }
    if (!main_rank) s_.trace.clear();                        // what only one process writes: rank 0's
    if (main_rank) s_.prepare_outputs(resumed.has_value());  // fail now, not after the first steps
    const ModelConfig& c = s_.model;

    TokenData data(s_.data);
    data.check_vocabulary(c.vocab);
    std::optional<TokenData> val;
    if (!s_.val_data.empty()) {
      val.emplace(s_.val_data);
      val->check_vocabulary(c.vocab);
      s_.fit_eval_batches(*app, *val, main_rank);
    }
    TokenFileBatches batches(data, s_.batch, s_.ctx, s_.sample == "sequential", s_.seed);
    // The log before the ranks meet: rank 0 failing to open it must not leave the others waiting.
    std::unique_ptr<RunLog> log;
    if (!s_.log.empty() && main_rank)
      log = std::make_unique<RunLog>(s_.log, resumed ? std::optional(resumed->state.step) : std::nullopt);
    // Ranks started with different flags would abort inside a collective, or train on inconsistently
    // (another batch, another seed): each rank's run is compared with rank 0's first. The data by its
    // size, not its path: a node's own copy may lie elsewhere.
    if (parallel.world.size > 1) {
      nlohmann::ordered_json settings = s_.to_json(s_.run_spec(parallel));
      nlohmann::ordered_json& train = settings["train"];
      train.erase("data");
      train.erase("val_data");
      train["data_tokens"] = data.size();
      train["val_data_tokens"] = val ? nlohmann::ordered_json(val->size()) : nullptr;
      settings["resumed_step"] = resumed ? nlohmann::ordered_json(resumed->state.step) : nullptr;
      check_ranks_agree(parallel.world, settings);
    }
    // The starting weights: made or loaded alike on every rank, which take rank 0's all the same, as
    // DDP does; a resumed run's ranks each load the checkpoint once AdamW (whose moments a sharded run
    // keeps for its part only) is made.
    SessionOptions options;
    options.weights = resumed ? InitialWeights::none : s_.init.empty() ? InitialWeights::seeded : InitialWeights::file;
    options.weights_file = s_.init;
    Session session(s_.run_spec(parallel), std::move(options));
    Backend& backend = session.backend();
    Transformer& model = session.model();
    AdamW& opt = *session.optimizer();
    parallel::DataParallelRun* dp = session.data_parallel();
    std::int64_t start = 0;
    if (app->count("--loss-scale") + app->count("--loss-scale-interval") > 0 && !opt.loss_scaler().on())
      fmt::print("note: --loss-scale and --loss-scale-interval apply to fp16, and this run is {}\n", s_.precision);
    if (resumed) {
      load_checkpoint(*resumed, model, opt);
      if (app->count("--loss-scale") > 0 && resumed->state.loss_scaler)
        fmt::print("note: the loss scale goes on from the checkpoint's, {:g}; --loss-scale sets a new run's first\n",
                   resumed->state.loss_scaler->scale);
      batches.sampler().restore(resumed->state.sampler);
      start = resumed->state.step;
    }
    // From the first step on, a checkpointed run (and every rank of several, which stop after the same
    // step) stops cleanly on a signal, after the step under way. Until then main()'s handler ends the
    // process at once: there is nothing to save, and a rank still meeting the others must not wait for
    // them in the rendezvous.
    if (!s_.checkpoint_dir.empty() || dp)
      for (int sig : kStopSignals) std::signal(sig, record_stop_signal);
    // The log's first line (and a resumed run's first) describes the run as state.json does: what ran,
    // read back by RunSpec::from_json. It has no "step", so readers of steps pass over it.
    if (log) {
      nlohmann::ordered_json header{{"from_step", start}};
      header.update(s_.to_json(session.spec()));
      log->write_line(header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    }

    if (main_rank)
      fmt::print("training {} ({} parameters) on {}: {} tokens in '{}', {} steps of {}{}x{} tokens{}{}\n", c.name,
                 c.parameter_count(), backend.name(), data.size(), s_.data, s_.steps,
                 s_.grad_accum > 1 ? fmt::format("{} micro-batches of ", s_.grad_accum) : "", s_.batch, s_.ctx,
                 dp                ? fmt::format(" over {} ranks ({} rows each, {} over {})", parallel.world.size,
                                                 session.local_batch(), parallel.words(), dp->communicator().name())
                 : parallel.tp > 1 ? fmt::format(" over {} ranks ({}: every row, a part of each layer)",
                                                 parallel.world.size, parallel.words())
                                   : "",
                 resumed ? fmt::format(", resumed at step {} from '{}'", start, resumed->path) : "");
    auto save_checkpoint = [&](std::int64_t step) {
      if (!main_rank) {  // rank 0 writes every weight and moment whole; the others send it their parts
        join_checkpoint_write(model, opt);  // (ZeRO's pieces, tensor parallelism's blocks; nothing under DDP)
        return;
      }
      const std::string path = write_checkpoint(
          s_.checkpoint_dir, model, opt,
          CheckpointState{step, opt.steps_taken(), batches.sampler().position(), s_.to_json(session.spec()),
                          opt.loss_scaler().on() ? std::optional(opt.loss_scaler().state()) : std::nullopt},
          s_.keep);
      fmt::print("saved checkpoint '{}'\n", path);
    };

    StepDriver driver(session, batches, true);
    TrainProgress progress(s_, session, val ? &*val : nullptr, log.get(), start, save_checkpoint);
    progress.last_saved = resumed ? start : -1;
    driver.add_observer(progress);
    // --trace: the first --trace-steps steps of this run, written as soon as they are done.
    std::unique_ptr<TraceSession> trace;
    if (!s_.trace.empty())
      trace = std::make_unique<TraceSession>(
          backend, TraceLabels{fmt::format("lmscope train: {} {} {} batch {} ctx {}", c.name, backend.name(),
                                           s_.precision, s_.batch, s_.ctx)});
    const parallel::TestFault fault = parallel::TestFault::from_environment(parallel.world.rank);
    for (std::int64_t it = start; it < s_.steps; ++it) {
      const std::int64_t step = it + 1;
      driver.step(it, step);
      fault.after_step(step);
      if (trace && (step - start == s_.trace_steps || step == s_.steps || stop_signal.load())) {
        // The weights and checkpoints are what the run is for: a trace that cannot be written is said, no more.
        try {
          write_file(s_.trace, trace->finish().json);
          fmt::print("wrote the trace of steps {} to {} to '{}'\n", start + 1, step, s_.trace);
        } catch (const UserError& e) {
          fmt::print(stderr, "lmscope: warning: {}; the trace is not written, and training goes on\n", e.what());
        } catch (const EnvironmentFailure& e) {
          fmt::print(stderr, "lmscope: warning: {}; the trace is not written, and training goes on\n", e.what());
        }
        trace.reset();
      }
      // Every rank stops after the same step: a signal any of them had stops them all.
      const int own = stop_signal.load();
      if (const double signalled = session.mean_over_ranks(own != 0 ? 1.0 : 0.0); signalled > 0) {
        const int sig = agreed_stop_signal(session, own, signalled);
        if (!s_.checkpoint_dir.empty() && progress.last_saved != step) save_checkpoint(step);
        if (main_rank)
          fmt::print("stopped by {} after step {}{}\n", signal_name(sig), step,
                     s_.checkpoint_dir.empty() ? "" : fmt::format("; resume with --resume {}", s_.checkpoint_dir));
        return 128 + sig;
      }
    }
    if (start >= s_.steps && main_rank)
      fmt::print("the checkpoint is at step {}, --steps is {}: nothing to train\n", start, s_.steps);
    if (const Backend::GraphCounts g = backend.graph_counts(); g.given_up && main_rank)
      fmt::print(
          "note: device graphs stopped ({} recorded, {} replayed): the phases' memory kept changing, so the run "
          "went on op by op (--graphs off does so from the start)\n",
          g.recorded, g.replayed);
    if (!s_.save.empty() && main_rank) {
      save_parameters(model, s_.save, [&opt](std::size_t i) { return opt.parameter_values(i); });
      fmt::print("saved weights to '{}'\n", s_.save);
    } else if (!s_.save.empty()) {  // (ZeRO-3 and tensor parallelism: each rank's pieces sent to rank 0)
      for (std::size_t i = 0; i < model.parameters().size(); ++i) opt.join_parameter_values(i);
    }
    return 0;
  }

 private:
  // Whether any flag choosing the model's shape was given.
  bool model_given() const {
    for (const char* f : {"--model", "--d-model", "--d-ff", "--layers", "--heads", "--vocab", "--rope-theta"})
      if (app->count(f) > 0) return true;
    return false;
  }

  ModelFlags model_;
  TrainSettings s_;
  ParallelFlags parallel_;
};

}  // namespace

std::unique_ptr<Command> add_train_command(CLI::App& parent) { return std::make_unique<TrainCommand>(parent); }

}  // namespace lmscope::cli
