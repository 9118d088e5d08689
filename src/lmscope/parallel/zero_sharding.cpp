#include "lmscope/parallel/zero_sharding.h"

#include <algorithm>
#include <utility>

namespace lmscope::parallel {

ZeroSharding::ZeroSharding(Transformer& model, Communicator& comm, int stage, std::size_t bucket_bytes)
    : model_(model), comm_(comm), stage_(stage) {
  LMSCOPE_CHECK(stage >= 1 && stage <= 3, "ZeRO stage {} sharded as 1, 2 or 3", stage);
  const std::int64_t n = comm.size(), rank = comm.rank();
  std::vector<Parameter>& params = model.parameters();
  slice_of_.resize(params.size());
  for (Bucket& b : make_buckets(params, stage == 3 ? 0 : bucket_bytes)) {
    Slice s{std::move(b)};
    s.padded = (s.bucket.elements + n - 1) / n * n;
    s.per_rank = s.padded / n;
    s.shard_offset = shard_elements_;
    // This rank's slice [lo, hi) of the bucket's elements, cut into the parameters it crosses.
    const std::int64_t lo = rank * s.per_rank, hi = lo + s.per_rank;
    std::int64_t at = 0;
    for (std::size_t p : s.bucket.params) {
      const std::int64_t len = shape_numel(params[p].spec.shape);
      const std::int64_t from = std::max(at, lo), to = std::min(at + len, hi);
      if (from < to) pieces_.push_back({p, from - at, to - from, s.shard_offset + from - lo});
      at += len;
      slice_of_[p] = slices_.size();
    }
    shard_elements_ += s.per_rank;
    pending_.push_back(s.bucket.params.size());
    slices_.push_back(std::move(s));
  }
  if (stage != 3) return;
  // This rank's pieces of the parameters as they are (every rank's alike), then the whole ones go.
  Backend& be = model.backend();
  master_ = be.allocator().allocate({shard_elements_}, model.dtype(), {MemKind::parameter, "zero.parameter_shard", -1});
  for (const ShardPiece& piece : pieces_) be.cast(piece_of(params[piece.param].value, piece), master(piece));
  for (Parameter& p : params) {
    p.value.reset();
    p.value_lowp.reset();
  }
}

Tensor ZeroSharding::piece_of(const Tensor& whole, const ShardPiece& piece) {
  return whole.view({whole.numel()}).rows(piece.offset, piece.length);
}

ZeroSharding::~ZeroSharding() {
  // A step that threw may leave reduce-scatters reading their buffers, or a gather writing its own:
  // the backend waits for them before the buffers go back to the allocator.
  try {
    drop_prefetched();
  } catch (const std::exception&) {
    // Unwinding from a failure already; the communicator synchronises as it goes.
  }
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
  if (stage_ == 1) return;
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
    LMSCOPE_CHECK(pending_[s] == 0, "bucket {} of ZeRO-{}'s exchange was never final in the backward", s, stage_);
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

Tensor ZeroSharding::master(const ShardPiece& piece) {
  if (stage_ == 3) return master_.tensor().rows(piece.shard_offset, piece.length);
  return piece_of(model_.parameters().at(piece.param).value, piece);
}

ZeroSharding::Gathered ZeroSharding::start_gather(std::span<Parameter* const> params) {
  Backend& be = model_.backend();
  std::vector<Parameter>& all = model_.parameters();
  const bool copies = model_.compute_dtype() != model_.dtype();
  Gathered g;
  std::vector<Tensor> mine, wholes;
  for (Parameter* p : params) {
    const std::size_t index = static_cast<std::size_t>(p - all.data());
    const Slice& s = slices_.at(slice_of_.at(index));
    // Matrix weights under mixed precision travel as their copies (half the bytes): the stretch reads
    // the copy and never the master.
    const bool as_copy = copies && p->spec.matmul;
    Allocation out = be.allocator().allocate(
        {s.padded}, as_copy ? model_.compute_dtype() : model_.dtype(),
        {MemKind::parameter, p->spec.name + (as_copy ? " (gathered copy)" : " (gathered)"), p->spec.layer});
    const Tensor own = out.tensor().rows(comm_.rank() * s.per_rank, s.per_rank);
    std::int64_t filled = 0;
    for (const ShardPiece& piece : pieces_)
      if (piece.param == index) {
        be.cast(master(piece), own.rows(0, piece.length));
        filled = piece.length;
      }
    if (filled < s.per_rank) be.fill(own.rows(filled, s.per_rank - filled), 0.0);  // the padding, never read
    mine.push_back(own);
    wholes.push_back(out.tensor());
    g.params.push_back(p);
    g.buffers.push_back(std::move(out));
  }
  g.work = comm_.all_gather_async(mine, wholes);
  return g;
}

void ZeroSharding::drop_prefetched() {
  if (!prefetched_) return;
  prefetched_->work->wait();  // (on CUDA the backend's stream waits before the buffers are reused)
  prefetched_.reset();
}

void ZeroSharding::gather(std::span<Parameter* const> params, Pass pass) {
  LMSCOPE_CHECK(stage_ == 3, "parameters gathered under ZeRO-{}", stage_);
  std::vector<Parameter>& all = model_.parameters();
  const StretchKey key{static_cast<std::size_t>(params.front() - all.data()), pass};
  // The stretch that followed the last one, remembered for the next time round; not across a step's
  // end (backward to forward), where the update comes between and a prefetch would read old masters.
  if (last_ && !(last_->second == Pass::backward && pass == Pass::forward))
    next_[*last_].assign(params.begin(), params.end());
  last_ = key;
  Gathered g;
  if (prefetched_ && std::ranges::equal(prefetched_->params, params)) {
    g = std::move(*prefetched_);
    prefetched_.reset();
  } else {
    drop_prefetched();  // another stretch came than the one that followed last time
    g = start_gather(params);
  }
  g.work->wait();
  for (std::size_t k = 0; k < params.size(); ++k) {
    Parameter& p = *params[k];
    const bool as_copy = g.buffers[k].tensor().dtype != model_.dtype();
    Allocation& into = as_copy ? p.value_lowp : p.value;
    LMSCOPE_CHECK(into.empty(), "{} gathered twice", p.spec.name);
    into = std::move(g.buffers[k]);
    into.narrow(into.tensor().rows(0, shape_numel(p.spec.shape)).view(p.spec.shape));
  }
  // The handout's bound: the stretch after this one starts gathering now, beside this one's work, and
  // no other: at most two stretches whole at once. Not where they share a parameter.
  if (const auto next = next_.find(key); next != next_.end()) {
    const std::vector<Parameter*>& after = next->second;
    const bool shared = std::ranges::any_of(after, [&](Parameter* p) { return std::ranges::count(params, p) > 0; });
    if (!shared) prefetched_ = start_gather(after);
  }
}

void ZeroSharding::release(std::span<Parameter* const> params) {
  for (Parameter* p : params) {
    p->value.reset();
    p->value_lowp.reset();
  }
}

std::vector<double> ZeroSharding::parameter_values(std::size_t param) {
  return download(model_.backend(), whole(param, master_));
}

void ZeroSharding::set_parameter_values(std::size_t param, std::span<const double> values) {
  for (const ShardPiece& piece : pieces_)
    if (piece.param == param)
      upload(model_.backend(), master(piece),
             values.subspan(static_cast<std::size_t>(piece.offset), static_cast<std::size_t>(piece.length)));
}

void ZeroSharding::all_gather_parameters() {
  if (stage_ == 3) {
    drop_prefetched();  // gathered before the update (none is started across a step's end)
    return;             // the next forward's gathers read the updated pieces
  }
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
  const Shape& shape = model_.parameters().at(param).spec.shape;
  Allocation out = be.allocator().allocate(shape, shard.dtype, {MemKind::workspace, "zero.whole", -1});
  be.fill(out, 0.0);
  const Tensor flat = out.tensor().view({shape_numel(shape)});
  for (const ShardPiece& piece : pieces_)
    if (piece.param == param)
      be.cast(shard.rows(piece.shard_offset, piece.length), flat.rows(piece.offset, piece.length));
  // Each element is one rank's and zero on every other: the sum is that rank's value, exactly (up to
  // the sign of a zero).
  comm_.all_reduce(out);
  return out;
}

}  // namespace lmscope::parallel
