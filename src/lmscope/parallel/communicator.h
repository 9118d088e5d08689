// Collectives behind one small interface: NCCL between GPUs (on its own CUDA stream), Gloo between
// CPU processes, and a shape-only one for the dry run. Every op works on backend tensors in place
// where it can; every rank calls the same ops in the same order, as NCCL and Gloo require.
#pragma once

#include "lmscope/core/allocator.h"
#include "lmscope/core/tensor.h"
#include "lmscope/parallel/flight_recorder.h"
#include "lmscope/parallel/store.h"
#include "lmscope/parallel/world.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace lmscope {
class Backend;
}

namespace lmscope::parallel {

// A collective under way. wait() orders what the backend does next after it: on the CPU it blocks
// until the collective is done; on CUDA the backend's stream waits for it (the host goes on), as
// torch.distributed's Work.wait() does.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "nccl", "gloo", "dry run"
  // The library's version as this process loaded it, where it says ("2.28.9" for NCCL: results can
  // differ between versions, docs/distributed.md "Which NCCL"); empty where it does not.
  virtual std::string version() const { return {}; }
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Each starts after the work the backend has enqueued so far (it reads what that work wrote) and
  // returns at once; the result is there after wait().
  // Each t = the sum of every rank's t (f32 or f64; bf16 on NCCL), in place, as one call: an NCCL
  // group (one launch, no copies into a flat buffer), on Gloo one after another.
  virtual std::unique_ptr<CollectiveWork> all_reduce_async(std::span<const Tensor> ts) = 0;
  std::unique_ptr<CollectiveWork> all_reduce_async(const Tensor& t) { return all_reduce_async({&t, 1}); }
  // out [n] = the sum over ranks of in's part `rank` (in [size·n]); out may be that part of in, and
  // the rest of in is left unspecified (Gloo's sums all of it in place).
  virtual std::unique_ptr<CollectiveWork> reduce_scatter_async(const Tensor& in, const Tensor& out) = 0;
  // outs[i] [size·n_i] = every rank's ins[i] [n_i], in rank order, as one call (an NCCL group); ins[i]
  // may be this rank's part of outs[i]. NCCL moves them by the copy engines, holding no SMs, where
  // the communicator was made with CommunicatorOptions::copy_engines and both lie in its symmetric
  // memory.
  virtual std::unique_ptr<CollectiveWork> all_gather_async(std::span<const Tensor> ins,
                                                           std::span<const Tensor> outs) = 0;
  std::unique_ptr<CollectiveWork> all_gather_async(const Tensor& in, const Tensor& out) {
    return all_gather_async({&in, 1}, {&out, 1});
  }
  // t = root's t on every rank.
  virtual std::unique_ptr<CollectiveWork> broadcast_async(const Tensor& t, int root) = 0;
  // Returns when every rank has called it (and, on CUDA, their work before it is done).
  virtual void barrier() = 0;

  // Memory each rank maps alike for its collectives, taken by every rank at the same point (the
  // allocator's region: Allocator::open_region). NCCL's comes from ncclMemAlloc and is registered as
  // a symmetric window, whose all-reduce runs on a few SMs (NCCL's symmetric kernels: 7 on two
  // H100s, against 24 for its ring); empty elsewhere, where the backend's own memory serves as well.
  virtual RegionMemory symmetric_memory() { return {}; }

  // Timing (bench): from start_timing(), each collective's span on the device is kept, in ms from
  // that call on the backend's clock (CUDA: events on the GPU, from one recorded on the backend's
  // stream then; CPU: the host's clock). finish_timing() returns them and stops, once the backend
  // has synchronised and every collective since has been waited for.
  struct Span {
    double start_ms = 0, end_ms = 0;
  };
  virtual void start_timing() = 0;
  virtual std::vector<Span> finish_timing() = 0;

  // This rank's last collectives (flight_recorder.h), kept by NCCL's and Gloo's; null for the dry run's.
  FlightRecorder* recorder() { return recorder_.get(); }
  // The training step the collectives called from now on belong to, for the flight record.
  void begin_step(std::int64_t step) {
    if (recorder_) recorder_->begin_step(step);
  }

  void all_reduce(const Tensor& t) { all_reduce_async(t)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out) { reduce_scatter_async(in, out)->wait(); }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }

 protected:
  std::unique_ptr<FlightRecorder> recorder_;
  // The bytes of these tensors, for the flight record.
  static std::int64_t bytes_of(std::span<const Tensor> ts);
  // all_gather_async's arguments: as many of each, each out the world's size times its in, one dtype.
  void check_all_gather(std::span<const Tensor> ins, std::span<const Tensor> outs) const;
};

// What NCCL is asked for (Gloo has no such things): max_ctas > 0 caps the blocks (so the SMs) a
// collective takes (0: NCCL's choice); copy_engines: no blocks wherever NCCL can do without (its
// zero-CTA policy, NCCL 2.28 on): all-gathers between symmetric windows then run on the copy engines.
struct CommunicatorOptions {
  int max_ctas = 0;
  bool copy_engines = false;
};
// The communicator for `backend`'s device: NCCL for CUDA (meeting through `store`), Gloo for the CPU,
// the shape-only one for the dry run (moves nothing; the world's size shapes the buffers). Throws
// Unsupported when this build lacks the library the device needs.
std::unique_ptr<Communicator> make_communicator(Backend& backend, const World& world, Store& store,
                                                const CommunicatorOptions& options = {});
// name(), and version() after it where there is one: "nccl 2.28.9", "gloo".
std::string name_and_version(const Communicator& comm);
// The dry run's: rank `rank` of `size`, every op a no-op.
std::unique_ptr<Communicator> make_shape_only_communicator(int rank, int size);
// The version code of the NCCL library this process loaded (ncclGetVersion), 0 in a build without
// NCCL.
int loaded_nccl_version();

}  // namespace lmscope::parallel
