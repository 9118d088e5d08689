#include "lmscope/parallel/communicator.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/meta/meta_backend.h"

namespace lmscope::parallel {

// Defined where the library is there (gloo_communicator.cpp, nccl_communicator.cpp).
std::unique_ptr<Communicator> make_gloo_communicator(const World& world, Store& store);
std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const World& world, Store& store,
                                                     const CommunicatorOptions& options);
int nccl_library_version();

namespace {

class Done final : public CollectiveWork {
 public:
  void wait() override {}
};

// The dry run's: the buffers around each collective are the model's and the optimizer's own
// allocations, made either way; the collective itself moves nothing.
class ShapeOnlyCommunicator final : public Communicator {
 public:
  ShapeOnlyCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  std::string name() const override { return "dry run"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  using Communicator::all_reduce_async;
  std::unique_ptr<CollectiveWork> all_reduce_async(std::span<const Tensor>) override {
    return std::make_unique<Done>();
  }
  std::unique_ptr<CollectiveWork> reduce_scatter_async(const Tensor& in, const Tensor& out) override {
    LMSCOPE_CHECK(in.numel() == out.numel() * size_, "reduce-scatter of {} into {}", in.numel(), out.numel());
    return std::make_unique<Done>();
  }
  using Communicator::all_gather_async;
  std::unique_ptr<CollectiveWork> all_gather_async(std::span<const Tensor> ins, std::span<const Tensor> outs) override {
    check_all_gather(ins, outs);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CollectiveWork> broadcast_async(const Tensor&, int) override { return std::make_unique<Done>(); }
  void barrier() override {}
  void start_timing() override {}
  std::vector<Span> finish_timing() override { return {}; }

 private:
  int rank_, size_;
};

}  // namespace

std::int64_t Communicator::bytes_of(std::span<const Tensor> ts) {
  std::int64_t n = 0;
  for (const Tensor& t : ts) n += static_cast<std::int64_t>(t.bytes());
  return n;
}

void Communicator::check_all_gather(std::span<const Tensor> ins, std::span<const Tensor> outs) const {
  LMSCOPE_CHECK(ins.size() == outs.size(), "all-gather of {} tensors into {}", ins.size(), outs.size());
  for (std::size_t i = 0; i < ins.size(); ++i)
    LMSCOPE_CHECK(ins[i].dtype == outs[i].dtype && outs[i].numel() == ins[i].numel() * size(),
                  "all-gather of {} into {}", ins[i].numel(), outs[i].numel());
}

std::unique_ptr<Communicator> make_shape_only_communicator(int rank, int size) {
  return std::make_unique<ShapeOnlyCommunicator>(rank, size);
}

std::string name_and_version(const Communicator& comm) {
  const std::string v = comm.version();
  return v.empty() ? comm.name() : comm.name() + " " + v;
}

int loaded_nccl_version() {
#if LMSCOPE_HAVE_NCCL
  return nccl_library_version();
#else
  return 0;
#endif
}

std::unique_ptr<Communicator> make_communicator(Backend& backend, const World& world, [[maybe_unused]] Store& store,
                                                [[maybe_unused]] const CommunicatorOptions& options) {
  if (is_dry_run(backend)) return make_shape_only_communicator(world.rank, world.size);
  if (backend.cuda_stream()) {
#if LMSCOPE_HAVE_NCCL
    return make_nccl_communicator(backend, world, store, options);
#else
    throw Unsupported(
        "this build has no NCCL, which carries the collectives between GPUs (give CMake "
        "-DLMSCOPE_NCCL_ROOT=DIR where DIR holds NCCL's include/ and lib/)");
#endif
  }
#if LMSCOPE_HAVE_GLOO
  return make_gloo_communicator(world, store);
#else
  throw Unsupported(
      "this build has no Gloo, which carries the collectives between CPU processes (Debian: "
      "libgloo-dev, then build again)");
#endif
}

}  // namespace lmscope::parallel
