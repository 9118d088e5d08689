#include "lmscope/parallel/zero_sharding.h"

#include <algorithm>
#include <utility>

namespace lmscope::parallel {

ZeroSharding::ZeroSharding(Transformer& model, Communicator& comm, int stage, std::size_t bucket_bytes)
    : model_(model), comm_(comm), stage_(stage) {
  LMSCOPE_CHECK(stage == 1 || stage == 2, "ZeRO stage {} sharded as 1 or 2", stage);
  const std::int64_t n = comm.size(), rank = comm.rank();
  const std::vector<Parameter>& params = model.parameters();
  slice_of_.resize(params.size());
  for (Bucket& b : make_buckets(params, bucket_bytes)) {
    Slice s{std::move(b)};
    s.padded = (s.bucket.elements + n - 1) / n * n;
    s.per_rank = s.padded / n;
    s.shard_offset = shard_elements_;
    // This rank's slice [lo, hi) of the bucket's elements, cut into the parameters it crosses.
    const std::int64_t lo = rank * s.per_rank, hi = lo + s.per_rank;
    std::int64_t at = 0;
    for (std::size_t p : s.bucket.params) {
      const std::int64_t len = params[p].value.tensor().numel();
      const std::int64_t from = std::max(at, lo), to = std::min(at + len, hi);
      if (from < to) pieces_.push_back({p, from - at, to - from, s.shard_offset + from - lo});
      at += len;
      slice_of_[p] = slices_.size();
    }
    shard_elements_ += s.per_rank;
    pending_.push_back(s.bucket.params.size());
    slices_.push_back(std::move(s));
  }
}

ZeroSharding::~ZeroSharding() {
  // A step that threw may leave reduce-scatters reading their buffers: the backend waits for them
  // before the buffers go back to the allocator.
  for (InFlight& f : in_flight_) {
    try {
      f.work->wait();
    } catch (const std::exception&) {
      // Unwinding from a failure already; the communicator synchronises as it goes.
    }
  }
}

Allocation ZeroSharding::bucket_buffer(const Slice& s, DType dtype, const char* what) {
  Backend& be = model_.backend();
  Allocation buffer = be.allocator().allocate({s.padded}, dtype, {MemKind::workspace, what, -1});
  if (s.padded > s.bucket.elements)  // the padding takes part in the sums: zeros
    be.fill(buffer.tensor().rows(s.bucket.elements, s.padded - s.bucket.elements), 0.0);
  return buffer;
}

ZeroSharding::InFlight ZeroSharding::launch(std::size_t index, GradientShard& shard) {
  Backend& be = model_.backend();
  std::vector<Parameter>& params = model_.parameters();
  const Slice& s = slices_[index];
  InFlight f{index, {}, nullptr};
  for (std::size_t p : s.bucket.params)
    LMSCOPE_CHECK(!params[p].grad.empty(), "optimizer step before the backward made {}'s gradient", p);
  if (s.bucket.params.size() == 1 && s.padded == s.bucket.elements) {
    // A bucket of one gradient that needs no padding is reduce-scattered where it lies: no copy, and
    // no second copy of the largest gradients (the embedding's and the head's) beside the first.
    f.buffer = std::move(params[s.bucket.params.front()].grad);  // held until the reduce-scatter is waited for
  } else {
    f.buffer = bucket_buffer(s, model_.grad_dtype(), "zero.gradient_bucket");
    std::int64_t at = 0;
    for (std::size_t p : s.bucket.params) {
      Allocation& g = params[p].grad;
      be.cast(g, f.buffer.tensor().rows(at, g.tensor().numel()).view(g.tensor().shape));
      at += g.tensor().numel();
      g.reset();  // read: its memory serves what comes next
    }
  }
  Allocation sums =
      be.allocator().allocate({s.per_rank}, model_.grad_dtype(), {MemKind::gradient, "zero.gradient_shard", -1});
  f.work = comm_.reduce_scatter_async(f.buffer.tensor().view({s.padded}), sums);
  shard.add(s.shard_offset, std::move(sums));
  return f;
}

void ZeroSharding::wait_oldest() {
  in_flight_.front().work->wait();
  in_flight_.erase(in_flight_.begin());  // its buffer back to the allocator, after the wait
}

void ZeroSharding::gradient_ready(std::size_t param) {
  if (stage_ != 2) return;
  const std::size_t s = slice_of_.at(param);
  LMSCOPE_CHECK(pending_[s] > 0, "gradient {} reported final twice in one step", param);
  if (--pending_[s] != 0) return;
  while (in_flight_.size() >= kMaxInFlight) wait_oldest();
  in_flight_.push_back(launch(s, gradient_shard_));
}

GradientShard ZeroSharding::summed_gradients() {
  if (stage_ == 1) {
    GradientShard shard;
    for (std::size_t s = 0; s < slices_.size(); ++s) launch(s, shard).work->wait();
    return shard;
  }
  while (!in_flight_.empty()) wait_oldest();
  for (std::size_t s = 0; s < slices_.size(); ++s) {
    LMSCOPE_CHECK(pending_[s] == 0, "bucket {} of ZeRO-2's exchange was never final in the backward", s);
    pending_[s] = slices_[s].bucket.params.size();
  }
  return std::exchange(gradient_shard_, {});
}

void ZeroSharding::combine_norms(const Tensor& partial, const Tensor& norm) {
  Backend& be = model_.backend();
  Allocation all = be.allocator().allocate({comm_.size()}, partial.dtype, {MemKind::workspace, "zero.norms", -1});
  comm_.all_gather(partial, all);
  const Tensor t = all.tensor();
  be.global_norm(std::span(&t, 1), norm);  // √(Σ partialᵢ²): the norm of every gradient
}

void ZeroSharding::all_gather_parameters() {
  Backend& be = model_.backend();
  std::vector<Parameter>& params = model_.parameters();
  for (const Slice& s : slices_) {
    Allocation buffer = bucket_buffer(s, model_.dtype(), "zero.parameter_bucket");
    const Tensor whole = buffer.tensor();
    const Tensor mine = whole.rows(comm_.rank() * s.per_rank, s.per_rank);
    for (const ShardPiece& piece : pieces_) {
      if (piece.shard_offset < s.shard_offset || piece.shard_offset >= s.shard_offset + s.per_rank) continue;
      const Tensor value = params[piece.param].value.tensor();
      be.cast(value.view({value.numel()}).rows(piece.offset, piece.length),
              mine.rows(piece.shard_offset - s.shard_offset, piece.length));
    }
    comm_.all_gather(mine, whole);
    std::int64_t at = 0;
    for (std::size_t p : s.bucket.params) {
      Parameter& param = params[p];
      const Tensor value = param.value.tensor();
      be.cast(whole.rows(at, value.numel()).view(value.shape), value);
      at += value.numel();
      if (const Allocation& copy = model_.lowp_copy(param); !copy.empty()) be.cast(value, copy);
    }
  }
}

Allocation ZeroSharding::whole(std::size_t param, const Tensor& shard) {
  Backend& be = model_.backend();
  const Tensor value = model_.parameters().at(param).value.tensor();
  Allocation out = be.allocator().allocate(value.shape, shard.dtype, {MemKind::workspace, "zero.whole", -1});
  be.fill(out, 0.0);
  const Tensor flat = out.tensor().view({value.numel()});
  for (const ShardPiece& piece : pieces_)
    if (piece.param == param)
      be.cast(shard.rows(piece.shard_offset, piece.length), flat.rows(piece.offset, piece.length));
  // Each element is one rank's and zero on every other: the sum is that rank's value, exactly (up to
  // the sign of a zero).
  comm_.all_reduce(out);
  return out;
}

}  // namespace lmscope::parallel
