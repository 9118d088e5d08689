// Data parallelism as the CS336 assignment studies it: every rank runs the whole model on its share
// of the batch, and the ranks' gradients are summed before the optimizer step, in one of four ways.
// The sum is left as it is (the optimizer divides by the world's size with its loss-scale multiply:
// AdamW::set_gradient_sum_of), so N ranks step as one process with the whole batch would.
#pragma once

#include "lmscope/model/transformer.h"
#include "lmscope/parallel/communicator.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lmscope::parallel {

// naive: each gradient all-reduced by itself after the backward; flat: all of them copied into one
// buffer, one all-reduce, copied back; overlap: each gradient's all-reduce launched (asynchronously)
// as the backward finishes it; bucketed: gradients grouped in the order the backward finishes them
// into buckets of --bucket-mb, each bucket's all-reduce launched as its last gradient is done: one
// call over the bucket's gradients where they lie (an NCCL group), so no copies in or out.
enum class DdpMode { naive, flat, overlap, bucketed };
const char* ddp_mode_name(DdpMode m);
DdpMode parse_ddp_mode(const std::string& s);  // throws UserError naming the choices

// How a bucket's gradients are summed across the ranks. all_reduce: NCCL's (or Gloo's) all-reduce,
// in place. all_gather: every rank gathers every rank's gradients (each gradient a block of the
// world's size: the hooks' GradientParts), then, after the backward, sums the parts itself in
// rank order, the same additions on every rank. It holds the world's size times the gradients, but
// on GPUs NCCL moves the parts by the copy engines from symmetric memory, holding no SMs, so the
// backward beside it keeps its speed (docs/distributed.md).
enum class GradExchange { all_reduce, all_gather };
const char* grad_exchange_name(GradExchange e);
GradExchange parse_grad_exchange(const std::string& s);  // throws UserError naming the choices

// The highest ZeRO stage built (--zero 0 to it).
constexpr int kMaxZeroStage = 3;

struct DataParallelSpec {
  DdpMode mode = DdpMode::bucketed;
  GradExchange exchange = GradExchange::all_reduce;
  double bucket_mb = 25;  // bucketed's, and ZeRO's exchange's, bucket size (MiB of gradient)
  // 1: AdamW's moments sharded across the ranks; 2: the summed gradients too, each bucket
  // reduce-scattered in the backward; 3: the parameters too, gathered per layer as the step reads
  // them (parallel/zero_sharding.h).
  int zero = 0;
  // The gradients in one region of the communicator's symmetric memory (GradientSync), so NCCL
  // all-reduces them on a few SMs and the backward beside it keeps the rest (docs/distributed.md).
  bool symmetric_memory = true;
  // overlap and bucketed on GPUs: the SMs the exchange may hold during the backward (NCCL's blocks
  // capped to it), the backward's GEMMs planned for the SMs left (cuda/gemm.h); 0: NCCL's choice and
  // the GEMMs as alone; kAutoCommSms: exchange_sms() chooses.
  static constexpr int kAutoCommSms = -1;
  int comm_sms = kAutoCommSms;
  // What comm_sms comes to: auto is 8 with symmetric memory (NCCL's symmetric all-reduce takes 7 SMs
  // on an H100 or H200, by its own cost model) and 0 without (its ring wants its 24); always 0 for
  // ZeRO, the modes whose exchange follows the backward, and the all-gather (the copy engines'
  // takes none).
  int exchange_sms() const;
  // UserError for a bad bucket size, a ZeRO stage outside 0-3, --zero without ranks, or the all-gather
  // with flat or ZeRO.
  void validate(int world_size) const;
  // UserError unless the step has a backward (the gradients exchanged) and, for ZeRO, an optimizer.
  void check_step(bool backward, bool optimizer) const;
};

// Parameter indices grouped into buckets: the backward's order (the model's order reversed), a new
// bucket once the next gradient would take one past `bucket_bytes` (a parameter larger than that
// gets a bucket of its own). bucket_bytes 0: one bucket per parameter.
struct Bucket {
  std::vector<std::size_t> params;
  std::int64_t elements = 0;
};
std::vector<Bucket> make_buckets(const std::vector<Parameter>& params, std::size_t bucket_bytes);

class GradientSync {
 public:
  // Hears each gradient become final from the model's hooks (DataParallelRun, gradient_ready). With
  // spec.symmetric_memory, every gradient (and flat's buffer) is made in a region of the
  // communicator's symmetric memory (the backend's own memory where it has none, so the dry run's
  // allocator record is the run's; NCCL's own buffers are outside it, as ever), at the same offset on
  // every rank, as NCCL's symmetric kernels require.
  // held_sms: what the backend is told collectives hold while they may run beside the backward
  // (Backend::set_collective_sms; 0: nothing said). parts: how the model lays the gradients out
  // (the all-gather's blocks of the world's size).
  GradientSync(Transformer& model, Communicator& comm, const DataParallelSpec& spec, int held_sms = 0,
               GradientParts parts = {});
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  // After each micro-batch's backward; after the step's last, every gradient holds the sum over the
  // ranks (the collectives launched during the backward are waited for).
  void after_backward(MicroBatch micro);
  // In the step's last micro-batch, as the backward finishes parameter `param`'s gradient: a bucket
  // whose gradients are all final starts its collective (overlap and bucketed).
  void gradient_ready(std::size_t param);

 private:
  void launch(std::size_t bucket);
  void finish(std::size_t bucket);
  void sum_gathered();  // the all-gather's: each gradient in unsummed_ = its parts' sum
  Transformer& model_;
  Communicator& comm_;
  DataParallelSpec spec_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::size_t> pending_;    // per bucket: gradients not yet final this step
  int held_sms_;
  bool beside_backward_ = false;  // a collective launched in this backward, the backend told
  struct InFlight {
    Allocation buffer;  // flat's: every gradient side by side
    std::unique_ptr<CollectiveWork> work;
  };
  std::vector<InFlight> in_flight_;    // per bucket
  std::vector<std::size_t> unsummed_;  // all-gather: parameters gathered, not yet summed
  // Gradients summed together: on CUDA two launches for each of the world's size - 1 additions.
  static constexpr std::size_t kSumBatch = 48;
};

}  // namespace lmscope::parallel
