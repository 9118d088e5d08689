#include "lmscope/parallel/data_parallel_run.h"

#include "lmscope/backend/devices.h"
#include "lmscope/backend/meta/meta_backend.h"

namespace lmscope::parallel {

DataParallelRun::DataParallelRun(const World& world, Backend& backend, const DataParallelSpec& spec)
    : world_(world), backend_(backend), spec_(spec) {
  spec_.validate(world.size);
  if (is_dry_run(backend)) {
    comm_ = make_shape_only_communicator(world.rank, world.size);
  } else {
    store_ = next_group_store(world);
    CommunicatorOptions options;
    options.max_ctas = held_sms();
    options.copy_engines = spec_.exchange == GradExchange::all_gather && spec_.symmetric_memory;
    comm_ = make_communicator(backend, world, *store_, options);
  }
}

DataParallelRun::~DataParallelRun() {
  // The exchange first (it lets go of the gradients it laid out), then the model's hooks.
  sync_.reset();
  zero_.reset();
  if (model_) model_->set_hooks(nullptr);
}

void use_rank_gpu(const World& world, const std::string& device) {
  if (world.size > 1 && device == "cuda") use_gpu(world.local_rank);
}

void DataParallelRun::attach(Transformer& model, bool take_rank0_parameters) {
  if (take_rank0_parameters) {
    for (Parameter& p : model.parameters()) comm_->broadcast(p.value, 0);
    model.refresh_lowp_copies();  // the copies of what rank 0 sent
  }
  if (spec_.zero != 0)
    zero_ = std::make_unique<ZeroSharding>(model, *comm_, spec_.zero,
                                           static_cast<std::size_t>(spec_.bucket_mb * 1024 * 1024));
  else
    sync_ = std::make_unique<GradientSync>(model, *comm_, spec_, held_sms(), gradient_parts());
  model.set_hooks(this);  // last: nothing after it can throw and leave the model hooked to a half-made run
  model_ = &model;
}

void DataParallelRun::acquire(std::span<Parameter* const> params, Pass pass) {
  if (zero_ && zero_->shards_parameters()) zero_->gather(params, pass);
}

void DataParallelRun::release(std::span<Parameter* const> params, Pass /*pass*/) {
  if (zero_ && zero_->shards_parameters()) zero_->release(params);
}

void DataParallelRun::gradient_ready(std::size_t param) {
  if (sync_) sync_->gradient_ready(param);
  if (zero_) zero_->gradient_ready(param);
}

GradientParts DataParallelRun::gradient_parts() const {
  if (spec_.zero == 0 && spec_.exchange == GradExchange::all_gather) return {world_.size, world_.rank};
  return {};
}

int DataParallelRun::held_sms() const { return world_.size > 1 ? spec_.exchange_sms() : 0; }

void DataParallelRun::after_backward(MicroBatch micro) {
  if (sync_) sync_->after_backward(micro);
}

double DataParallelRun::mean_over_ranks(double x) {
  Allocation t = backend_.allocator().allocate({1}, DType::f32, {MemKind::workspace, "ddp.mean", -1});
  upload(backend_, t, std::span(&x, 1));
  comm_->all_reduce(t);
  return read_scalar(backend_, t) / static_cast<double>(world_.size);
}

}  // namespace lmscope::parallel
