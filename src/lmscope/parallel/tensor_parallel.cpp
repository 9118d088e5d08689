#include "lmscope/parallel/tensor_parallel.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/meta/meta_backend.h"
#include "lmscope/core/error.h"

#include <algorithm>
#include <string>

namespace lmscope::parallel {

TensorParallelRun::TensorParallelRun(const World& world, Backend& backend) : world_(world), backend_(backend) {
  if (is_dry_run(backend)) {
    comm_ = make_shape_only_communicator(world.rank, world.size);
  } else {
    store_ = next_group_store(world);
    comm_ = make_communicator(backend, world, *store_, {});
  }
}

TensorParallelRun::~TensorParallelRun() = default;

TensorParallelRun::Split TensorParallelRun::split_of(const ParameterSpec& spec) {
  const std::string& n = spec.name;
  if (spec.layer < 0 || spec.shape.size() != 2) return Split::none;
  for (const char* suffix : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".w1.weight", ".w3.weight"})
    if (n.ends_with(suffix)) return Split::rows;
  for (const char* suffix : {".output_proj.weight", ".w2.weight"})
    if (n.ends_with(suffix)) return Split::cols;
  return Split::none;
}

Shape TensorParallelRun::local_shape(const ParameterSpec& spec) const {
  const std::int64_t n = world_.size;
  switch (split_of(spec)) {
    case Split::rows:
      return {spec.shape[0] / n, spec.shape[1]};
    case Split::cols:
      return {spec.shape[0], spec.shape[1] / n};
    case Split::none:
      break;
  }
  return spec.shape;
}

StepHooks::Block TensorParallelRun::local_block(const ParameterSpec& spec) const {
  const std::int64_t n = world_.size, r = world_.rank;
  switch (split_of(spec)) {
    case Split::rows:
      return {.row = r * (spec.shape[0] / n)};
    case Split::cols:
      return {.col = r * (spec.shape[1] / n)};
    case Split::none:
      break;
  }
  return {};
}

void TensorParallelRun::partial_sum(const Tensor& t, PartialSum /*where*/, int /*layer*/) { comm_->all_reduce(t); }

void TensorParallelRun::norm_over_ranks(const Tensor& norm) {
  Allocation all = backend_.allocator().allocate({comm_->size()}, norm.dtype, {MemKind::workspace, "tp.norms", -1});
  comm_->all_gather(norm, all);
  const Tensor t = all.tensor();
  backend_.global_norm(std::span(&t, 1), norm);  // √(Σ normᵢ²)
}

std::vector<double> TensorParallelRun::whole_values(const ParameterSpec& whole, const Tensor& local) {
  const std::int64_t n = comm_->size(), count = local.numel();
  Allocation all = backend_.allocator().allocate({n * count}, local.dtype, {MemKind::workspace, "tp.whole", -1});
  comm_->all_gather(local, all);
  const std::vector<double> blocks = download(backend_, all);  // rank r's block at r·count
  if (split_of(whole) != Split::cols) return blocks;           // blocks of rows lie in order
  const std::int64_t rows = whole.shape[0], cols = whole.shape[1] / n;
  std::vector<double> out(blocks.size());
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t i = 0; i < rows; ++i)
      std::copy_n(blocks.begin() + r * count + i * cols, cols, out.begin() + i * whole.shape[1] + r * cols);
  return out;
}

}  // namespace lmscope::parallel
