// A run built and checked once: this rank's device and backend (or the dry run's, given), the model
// with the run's execution settings, its starting weights, the data-parallel rank hooked into the
// model and the optimizer, and AdamW for a run that steps. train, bench, memory and the tests build
// their runs here; the rules that tie the settings together are validate_run's (run/run_spec.h).
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"
#include "lmscope/parallel/data_parallel_run.h"
#include "lmscope/parallel/tensor_parallel.h"
#include "lmscope/run/batch_source.h"
#include "lmscope/run/run_spec.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace lmscope {

// Where the starting weights come from. seeded: Transformer::init_parameters(spec.seed) (with
// `kept`, values an earlier build drew). constant: every value 0.02, for runs whose values do not
// matter (the memory record: the draw costs the host tens of seconds at 2.7B). file: a safetensors
// file (PyTorch names). none: the caller sets them after the session is made (a resumed checkpoint).
enum class InitialWeights { seeded, constant, file, none };

struct SessionOptions {
  // The backend to run on, given to the session (the dry run's shape-only one), or the caller's,
  // which outlives it (tests that build several runs on one backend); neither: made for spec.device,
  // on this rank's GPU in a world of several.
  std::unique_ptr<Backend> backend;
  Backend* shared_backend = nullptr;
  InitialWeights weights = InitialWeights::seeded;
  std::string weights_file;           // with InitialWeights::file
  KeptInitialValues* kept = nullptr;  // with InitialWeights::seeded
  // The record of memory steps op by op whatever spec.graphs says: kept bf16 copies made by the
  // forward under graphs are held no longer, so the op-by-op record is the upper bound.
  bool op_by_op = false;
  // A batch uploaded before AdamW's state is made (bench's and memory's fixed batch, whose record
  // has always had the token buffers first); null: the step driver uploads each batch in its step.
  BatchSource* first_batch = nullptr;
  // Called when building fails, before anything built is torn down (the memory record ends there).
  std::function<void()> on_failure;
};

class Session {
 public:
  // UserError for a run that cannot be (validate_run); the failure of whatever is built otherwise
  // (OutOfMemory, Unsupported).
  explicit Session(const RunSpec& spec, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // As validated: what follows from the settings filled in (validate_run).
  const RunSpec& spec() const { return spec_; }
  Backend& backend() { return *backend_; }
  Transformer& model() { return *model_; }
  // The optimizer of a train-mode run; null otherwise.
  AdamW* optimizer() { return optimizer_.get(); }
  // This rank's data parallelism; null without it.
  parallel::DataParallelRun* data_parallel() { return data_parallel_.get(); }
  bool main_rank() const { return spec_.parallel.world.rank == 0; }
  // The rows of the global batch this rank runs, and the first of them.
  std::int64_t local_batch() const {
    return spec_.parallel.data ? spec_.batch / spec_.parallel.world.size : spec_.batch;
  }
  std::int64_t first_row() const { return spec_.parallel.data ? local_batch() * spec_.parallel.world.rank : 0; }
  // The rank's rows of a global batch's tokens, uploaded to the model.
  void set_batch(const std::int32_t* ids, const std::int32_t* targets);
  // The mean of every rank's x (one small all-reduce); x itself without data parallelism.
  double mean_over_ranks(double x);

 private:
  void build(SessionOptions& options);
  RunSpec spec_;
  // Declared in the order they are built: torn down the other way.
  std::unique_ptr<Backend> own_backend_;
  Backend* backend_ = nullptr;
  std::unique_ptr<parallel::TensorParallelRun> tensor_parallel_;  // before the model, whose shapes it gives
  std::optional<Transformer> model_;
  std::unique_ptr<parallel::DataParallelRun> data_parallel_;  // after the model it hooks into
  std::unique_ptr<AdamW> optimizer_;                          // after the sharding it asks
};

}  // namespace lmscope
