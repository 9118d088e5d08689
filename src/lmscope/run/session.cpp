#include "lmscope/run/session.h"

#include "lmscope/io/safetensors.h"

namespace lmscope {

Session::Session(const RunSpec& spec, SessionOptions options) : spec_(spec) {
  validate_run(spec_);
  try {
    build(options);
  } catch (...) {
    if (options.on_failure) options.on_failure();
    throw;
  }
}

Session::~Session() = default;

void Session::build(SessionOptions& options) {
  const RunSpec& s = spec_;
  if (options.shared_backend) {
    backend_ = options.shared_backend;
  } else {
    if (options.backend) {
      own_backend_ = std::move(options.backend);
    } else {
      if (s.parallel.data || s.parallel.tp > 1) parallel::use_rank_gpu(s.parallel.world, s.device);
      own_backend_ = make_backend(s.device, s.precision);
    }
    backend_ = own_backend_.get();
  }
  if (s.parallel.tp > 1) tensor_parallel_ = std::make_unique<parallel::TensorParallelRun>(s.parallel.world, *backend_);
  model_.emplace(s.model, *backend_, s.master_dtype, compute_dtype(s.precision), s.attention, tensor_parallel_.get());
  Transformer& model = *model_;
  model.set_recompute(s.recompute);
  model.set_weight_copies(s.weight_copies);
  model.set_grad_dtype(s.grad_dtype);
  model.set_graphs(s.graphs && !options.op_by_op);
  model.set_fusion(s.fusion);
  switch (options.weights) {
    case InitialWeights::seeded:
      model.init_parameters(s.seed, options.kept);
      break;
    case InitialWeights::constant:
      for (Parameter& p : model.parameters()) backend_->fill(p.value, 0.02);
      model.refresh_lowp_copies();
      break;
    case InitialWeights::file:
      load_parameters(model, options.weights_file);
      break;
    case InitialWeights::none:
      break;
  }
  if (s.parallel.data) {
    // A rank: its share of the batch, and the exchange's buffers (ZeRO-1: its shard). Every rank
    // takes rank 0's starting weights, as DDP's constructor does, unless the caller sets them later
    // (a resumed run's ranks each load the same checkpoint).
    data_parallel_ = std::make_unique<parallel::DataParallelRun>(s.parallel.world, *backend_, *s.parallel.data);
    data_parallel_->attach(model, options.weights != InitialWeights::none);
  }
  if (options.first_batch) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(s.batch * s.ctx)), targets(ids.size());
    if (options.first_batch->next(ids.data(), targets.data())) set_batch(ids.data(), targets.data());
  }
  if (s.mode == StepMode::train) {
    optimizer_ = std::make_unique<AdamW>(model, s.optimizer, data_parallel_ ? data_parallel_->sharding() : nullptr);
    if (data_parallel_) data_parallel_->configure(*optimizer_);
  }
}

void Session::set_batch(const std::int32_t* ids, const std::int32_t* targets) {
  const std::size_t first = static_cast<std::size_t>(first_row() * spec_.ctx);
  model_->set_batch(local_batch(), spec_.ctx, ids + first, targets + first);
}

double Session::mean_over_ranks(double x) { return data_parallel_ ? data_parallel_->mean_over_ranks(x) : x; }

}  // namespace lmscope
