#include "lmscope/parallel/data_parallel.h"

#include "lmscope/core/error.h"

#include <cmath>
#include <limits>

namespace lmscope::parallel {

const char* ddp_mode_name(DdpMode m) {
  switch (m) {
    case DdpMode::naive:
      return "naive";
    case DdpMode::flat:
      return "flat";
    case DdpMode::overlap:
      return "overlap";
    case DdpMode::bucketed:
      return "bucketed";
  }
  return "?";
}

DdpMode parse_ddp_mode(const std::string& s) {
  for (DdpMode m : {DdpMode::naive, DdpMode::flat, DdpMode::overlap, DdpMode::bucketed})
    if (s == ddp_mode_name(m)) return m;
  user_error("unknown --ddp '{}' (use naive, flat, overlap or bucketed)", s);
}

const char* grad_exchange_name(GradExchange e) { return e == GradExchange::all_gather ? "all-gather" : "all-reduce"; }

GradExchange parse_grad_exchange(const std::string& s) {
  for (GradExchange e : {GradExchange::all_reduce, GradExchange::all_gather})
    if (s == grad_exchange_name(e)) return e;
  user_error("unknown --grad-exchange '{}' (use all-reduce or all-gather)", s);
}

void DataParallelSpec::validate(int world_size) const {
  if (!(bucket_mb > 0 && std::isfinite(bucket_mb))) user_error("--bucket-mb must be positive, got {}", bucket_mb);
  static_assert(kMaxZeroStage == 3, "the words below name the stages built");
  if (zero < 0 || zero > kMaxZeroStage)
    user_error("--zero takes 0, 1, 2 or 3 (the stage of ZeRO's sharding), got {}", zero);
  if (comm_sms != kAutoCommSms && (comm_sms < 0 || comm_sms > 64))
    user_error("--comm-sms takes auto, or 0 (NCCL's choice) to 64, got {}", comm_sms);
  if (exchange == GradExchange::all_gather && zero != 0)
    user_error("--grad-exchange all-gather is --ddp's; --zero {} reduce-scatters the gradients its own way", zero);
  if (exchange == GradExchange::all_gather && mode == DdpMode::flat)
    user_error(
        "--grad-exchange all-gather gathers each gradient where it lies, and --ddp flat copies them into one "
        "buffer: use it with naive, overlap or bucketed");
  if (zero != 0 && world_size < 2)
    user_error(
        "--zero {} shards {} across ranks, and this is a world of {} (start several with lmscope launch --nproc "
        "N, torchrun or Slurm)",
        zero,
        zero == 1   ? "the optimizer's state"
        : zero == 2 ? "the gradients and the optimizer's state"
                    : "the parameters, gradients and optimizer's state",
        world_size);
}

int DataParallelSpec::exchange_sms() const {
  if (zero != 0 || exchange == GradExchange::all_gather || (mode != DdpMode::overlap && mode != DdpMode::bucketed))
    return 0;
  if (comm_sms != kAutoCommSms) return comm_sms;
  return symmetric_memory ? 8 : 0;
}

void DataParallelSpec::check_step(bool backward, bool optimizer) const {
  if (!backward)
    user_error("data parallelism exchanges gradients: --ddp and --zero take --mode train or forward-backward");
  if (zero != 0 && !optimizer) user_error("--zero {} shards the optimizer's state: it takes --mode train", zero);
}

std::vector<Bucket> make_buckets(const std::vector<Parameter>& params, std::size_t bucket_bytes) {
  std::vector<Bucket> buckets;
  std::size_t bytes = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    const Tensor& v = params[k].value;
    if (buckets.empty() || bucket_bytes == 0 || (bytes > 0 && bytes + v.bytes() > bucket_bytes)) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().params.push_back(k);
    buckets.back().elements += v.numel();
    bytes += v.bytes();
  }
  return buckets;
}

namespace {
std::size_t bucket_bytes_for(const DataParallelSpec& spec) {
  switch (spec.mode) {
    case DdpMode::naive:
    case DdpMode::overlap:
      return 0;  // each gradient by itself
    case DdpMode::flat:
      return std::numeric_limits<std::size_t>::max();
    case DdpMode::bucketed:
      break;
  }
  return static_cast<std::size_t>(spec.bucket_mb * 1024 * 1024);
}
}  // namespace

GradientSync::GradientSync(Transformer& model, Communicator& comm, const DataParallelSpec& spec, int held_sms,
                           GradientParts parts)
    : model_(model), comm_(comm), spec_(spec), held_sms_(held_sms) {
  LMSCOPE_CHECK(parts.parts == (spec.exchange == GradExchange::all_gather ? comm.size() : 1),
                "gradients in {} parts for {} over {} ranks", parts.parts, grad_exchange_name(spec.exchange),
                comm.size());
  buckets_ = make_buckets(model.parameters(), bucket_bytes_for(spec));
  bucket_of_.resize(model.parameters().size());
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t p : buckets_[b].params) bucket_of_[p] = b;
  pending_.resize(buckets_.size());
  in_flight_.resize(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].params.size();
  if (spec.symmetric_memory) {
    // Room for every gradient at once (they all live from the backward to the optimizer), and for
    // flat's buffer of them all beside.
    std::size_t bytes = 0;
    for (const Parameter& p : model.parameters())
      bytes +=
          Allocator::rounded_bytes(static_cast<std::size_t>(p.value.tensor().numel()) * dtype_size(model.grad_dtype()));
    if (spec.mode == DdpMode::flat) bytes *= 2;
    if (spec.exchange == GradExchange::all_gather) bytes *= static_cast<std::size_t>(comm.size());
    model.backend().allocator().open_region(MemKind::gradient, bytes, {MemKind::gradient, "ddp.symmetric_memory", -1},
                                            comm.symmetric_memory());
  }
}

GradientSync::~GradientSync() {
  if (spec_.exchange == GradExchange::all_gather) {
    // The next gradients are blocks of one again; ones still held (a step that threw) go first, after
    // the collectives that may still write into them (the backend's stream waits for them).
    for (InFlight& f : in_flight_) {
      try {
        if (f.work) f.work->wait();
      } catch (const std::exception&) {
        // Unwinding from a failure already; the communicator synchronises as it goes.
      }
    }
    for (Parameter& p : model_.parameters()) p.grad.reset();
  }
  if (spec_.symmetric_memory) model_.backend().allocator().close_region();
  try {
    if (beside_backward_) model_.backend().set_collective_sms(0);  // a backward that threw
  } catch (const std::exception&) {
    // Unwinding from that failure already; the backend's plans for held SMs just stay chosen.
  }
}

void GradientSync::gradient_ready(std::size_t param) {
  // Naive and flat exchange after the backward (after_backward launches every bucket).
  if (spec_.mode != DdpMode::overlap && spec_.mode != DdpMode::bucketed) return;
  const std::size_t b = bucket_of_.at(param);
  LMSCOPE_CHECK(pending_[b] > 0, "gradient {} reported final twice in one step", param);
  if (--pending_[b] != 0) return;
  if (held_sms_ > 0 && !beside_backward_) {
    model_.backend().set_collective_sms(held_sms_);  // from here to the backward's end
    beside_backward_ = true;
  }
  launch(b);
}

void GradientSync::launch(std::size_t b) {
  InFlight& f = in_flight_[b];
  LMSCOPE_CHECK(!f.work, "bucket {} launched twice in one step", b);
  std::vector<Parameter>& params = model_.parameters();
  const Bucket& bucket = buckets_[b];
  if (spec_.mode != DdpMode::flat) {
    std::vector<Tensor> grads, blocks;
    for (std::size_t p : bucket.params) {
      grads.push_back(params[p].grad.tensor());
      blocks.push_back(params[p].grad.block());
    }
    f.work = spec_.exchange == GradExchange::all_gather ? comm_.all_gather_async(grads, blocks)
                                                        : comm_.all_reduce_async(grads);
    return;
  }
  // The assignment's flat variant: flatten, one all-reduce, unflatten (finish).
  Backend& be = model_.backend();
  f.buffer = be.allocator().allocate({bucket.elements}, model_.grad_dtype(), {MemKind::gradient, "ddp.flat", -1});
  std::int64_t at = 0;
  for (std::size_t p : bucket.params) {
    const Tensor& g = params[p].grad;
    be.cast(g, f.buffer.tensor().rows(at, g.numel()).view(g.shape));
    at += g.numel();
  }
  f.work = comm_.all_reduce_async(f.buffer);
}

void GradientSync::finish(std::size_t b) {
  InFlight& f = in_flight_[b];
  LMSCOPE_CHECK(f.work != nullptr, "bucket {} was never launched", b);
  f.work->wait();
  f.work.reset();
  if (spec_.exchange == GradExchange::all_gather)
    unsummed_.insert(unsummed_.end(), buckets_[b].params.begin(), buckets_[b].params.end());
  if (!f.buffer.empty()) {
    std::vector<Parameter>& params = model_.parameters();
    std::int64_t at = 0;
    for (std::size_t p : buckets_[b].params) {
      const Tensor& g = params[p].grad;
      model_.backend().cast(f.buffer.tensor().rows(at, g.numel()).view(g.shape), g);
      at += g.numel();
    }
    f.buffer.reset();
  }
  pending_[b] = buckets_[b].params.size();
}

void GradientSync::sum_gathered() {
  // parts[0] + parts[1] + ... in rank order, each addition rounded to the gradient's dtype, into
  // parts[0] until the last, which writes this rank's part: every rank makes the same additions, so
  // every rank's sum has the same bits. Each addition reads a part before any later one writes it
  // (parts[0] is overwritten only as the running sum; this rank's is read before it is written).
  const std::int64_t parts = comm_.size();
  std::vector<Tensor> firsts, owns;
  for (std::size_t p : unsummed_) {
    const Allocation& g = model_.parameters()[p].grad;
    const std::int64_t n = g.tensor().numel();
    firsts.push_back(g.block().view({parts, n}).rows(0, 1).view({n}));
    owns.push_back(g.tensor().view({n}));
  }
  for (std::int64_t r = 1; r < parts; ++r) {
    std::vector<Tensor> nexts;
    for (const Tensor& first : firsts)
      nexts.push_back(Tensor{first.as<char>() + r * first.bytes(), first.dtype, first.shape});
    model_.backend().add_all(firsts, nexts, r == parts - 1 ? owns : firsts);
  }
  unsummed_.clear();
}

void GradientSync::after_backward(MicroBatch micro) {
  if (micro.index != micro.count - 1) return;
  const bool launched = spec_.mode == DdpMode::overlap || spec_.mode == DdpMode::bucketed;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (!launched) launch(b);
    finish(b);  // naive and flat: each collective waited for before the next starts
    // The all-gather's sums go a few dozen gradients a launch, each batch once its buckets are in.
    if (!unsummed_.empty() && (unsummed_.size() >= kSumBatch || b + 1 == buckets_.size())) sum_gathered();
  }
  if (beside_backward_) model_.backend().set_collective_sms(0);
  beside_backward_ = false;
}

}  // namespace lmscope::parallel
