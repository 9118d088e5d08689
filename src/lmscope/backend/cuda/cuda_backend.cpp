// The CUDA backend: the op set on one GPU (the Device it is made for), one stream. Every call makes
// that GPU current for its scope (cuda::DeviceGuard), so backends on two GPUs work side by side. GEMMs go to cuBLASLt,
// everything else to lmscope's own kernels (kernels.h). fp32 tensors for now; the GEMM math is IEEE fp32 or tf32.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/cuda/cuda_allocator.h"
#include "lmscope/backend/cuda/cuda_check.h"
#include "lmscope/backend/cuda/device_guard.h"
#include "lmscope/backend/cuda/gemm.h"
#include "lmscope/backend/cuda/graph_cache.h"
#include "lmscope/backend/cuda/kernel_tracer.h"
#include "lmscope/backend/cuda/kernels.h"
#include "lmscope/backend/cuda/nvtx_ranges.h"
#include "lmscope/backend/cuda/stream_pool.h"
#include "lmscope/backend/devices.h"
#include "lmscope/backend/op_scratch.h"
#include "lmscope/device/storage_elem.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lmscope {
namespace {

Elem elem(const Tensor& t) { return storage_elem(t); }
float* f32(const Tensor& t) {
  LMSCOPE_CHECK(t.dtype == DType::f32, "this CUDA op takes f32 here, got {}", dtype_name(t.dtype));
  return t.as<float>();
}
// RMSNorm backward's partial sums of dw, or none (scratch::cuda_rmsnorm_backward).
float* dw_partials(const Allocation& a) {
  static_assert(scratch::kRmsNormDwBlocks == cuda::kRmsNormDwBlocks);
  return a.empty() ? nullptr : f32(a);
}
// A tensor of the master dtype (the residual stream, a norm's weight, a parameter or its moments):
// f32, or bf16 (--master-dtype bf16).
void* master_data(const Tensor& t) {
  LMSCOPE_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, "the master dtype is f32 or bf16 here, got {}",
                dtype_name(t.dtype));
  return t.data;
}
// A gradient, or a tensor the global norm reads: f32, or bf16 (--grad-dtype bf16).
const void* grad_data(const Tensor& t) {
  LMSCOPE_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, "gradients are f32 or bf16 here, got {}",
                dtype_name(t.dtype));
  return t.data;
}
const std::int32_t* i32(const Tensor& t) {
  LMSCOPE_CHECK(t.dtype == DType::i32, "token ids must be i32, got {}", dtype_name(t.dtype));
  return t.as<std::int32_t>();
}
void same_shape(const Tensor& a, const Tensor& b, const char* what) {
  LMSCOPE_CHECK(a.shape == b.shape, "{}: {} against {}", what, shape_str(a.shape), shape_str(b.shape));
}
void same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  LMSCOPE_CHECK(a.dtype == b.dtype, "{}: {} against {}", what, dtype_name(a.dtype), dtype_name(b.dtype));
}

AttentionShape flash_shape(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const AttentionShape s = attention_shape(q, k, v, out, lse);
  for (const Tensor* t : {&k, &v, &out}) same_dtype(q, *t, "flash attention");
  scratch::cuda_flash_limits(s);
  return s;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Device& device, GemmMath math) : device_(device), alloc_(device.index()) {
    const auto on = here();
    stream_ = own_stream_ = cuda::take_stream();
    gemm_ = std::make_unique<cuda::Gemm>(math, stream_, alloc_);
    graphs_ = std::make_unique<cuda::GraphCache>(stream_, alloc_);
    alloc_.on_segment_free([this] { graphs_->drop_all(); });
    // Nothing comes from the allocator here (cuBLASLt's workspace comes at the first GEMM): a record
    // begun now holds everything.
    std::size_t free = 0, total = 0;
    LMSCOPE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    used_at_start_ = total - free;
    if (cuda::nvtx_tool_attached()) set_device_ranges(cuda::make_nvtx_ranges());
  }
  ~CudaBackend() override {
    const auto on = here();
    graphs_->abort();  // a capture left open by an exception ends first: the wait below then waits
    cudaStreamSynchronize(stream_);
    alloc_.on_segment_free(nullptr);  // the allocator outlives the graphs and the stream
    graphs_.reset();
    gemm_.reset();
    norm_sum_.reset();
    rope_tables_ = {};
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cuda::give_back_stream(own_stream_);
  }

  std::string name() const override { return alloc_.device_name(); }
  Allocator& allocator() override { return alloc_; }
  void* cuda_stream() const override { return stream_; }
  void run_on_stream(void* stream) override { switch_stream(static_cast<cudaStream_t>(stream)); }
  void run_on_own_stream() override { switch_stream(own_stream_); }
  void synchronize() override {
    const auto on = here();
    LMSCOPE_CHECK(!graphs_->active(), "a wait for the device inside a device graph");
    LMSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool has_graphs() const override { return true; }
  void begin_graph(std::uint64_t key) override {
    const auto on = here();
    graphs_->begin(key);
  }
  void end_graph() override {
    const auto on = here();
    graphs_->end();
  }
  void abort_graph() override {
    const auto on = here();
    graphs_->abort();
  }
  GraphCounts graph_counts() const override { return graphs_->counts(); }
  int mark() override {
    const auto on = here();
    LMSCOPE_CHECK(!graphs_->active(), "a timing mark inside a device graph");
    if (used_events_ == events_.size()) {
      cudaEvent_t e;
      LMSCOPE_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    LMSCOPE_CUDA_CHECK(cudaEventRecord(events_[used_events_], stream_));
    return static_cast<int>(used_events_++);
  }
  std::unique_ptr<KernelTracer> kernel_tracer() override { return cuda::make_kernel_tracer(); }
  std::optional<DeviceMemory> device_memory() override {
    const auto on = here();
    synchronize();
    std::size_t free = 0, total = 0;
    LMSCOPE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return DeviceMemory{total, total - free, used_at_start_};
  }
  double elapsed_ms(int from, int to) override {
    const auto on = here();
    float ms = 0;
    LMSCOPE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(from), events_.at(to)));
    return ms;
  }
  void clear_marks() override { used_events_ = 0; }  // events are reused

  void copy_from_host(const Tensor& dst, const void* src) override {
    const auto on = here();
    LMSCOPE_CHECK(!graphs_->active(), "a copy from the host inside a device graph");
    LMSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, stream_));
    synchronize();  // the host buffer may go away when this returns
  }
  void copy_to_host(void* dst, const Tensor& src) override {
    const auto on = here();
    LMSCOPE_CHECK(!graphs_->active(), "a copy to the host inside a device graph");
    LMSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void fill(const Tensor& t, double value) override {
    const auto on = here();
    if (graphs_->skip("fill", t, value)) return;
    if (t.dtype == DType::f64 && value == 0.0) {
      LMSCOPE_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.bytes(), stream_));
      return;
    }
    cuda::fill(t.data, elem(t), t.numel(), static_cast<float>(value), stream_);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    const auto on = here();
    same_shape(a, b, "add");
    same_shape(a, out, "add out");
    if (graphs_->skip("add", a, b, out)) return;
    cuda::add(a.data, elem(a), b.data, elem(b), out.data, elem(out), a.numel(), stream_);
  }
  void cast(const Tensor& in, const Tensor& out) override {
    const auto on = here();
    same_shape(in, out, "cast");
    if (graphs_->skip("cast", in, out)) return;
    cuda::cast(in.data, elem(in), out.data, elem(out), in.numel(), stream_);
  }
  void cast_all(std::span<const Tensor> ins, std::span<const Tensor> outs) override {
    const auto on = here();
    LMSCOPE_CHECK(ins.size() == outs.size(), "cast_all of {} tensors into {}", ins.size(), outs.size());
    graphs_->note("cast_all", ins.size());
    for (std::size_t i = 0; i < ins.size(); ++i) {
      same_shape(ins[i], outs[i], "cast_all");
      graphs_->note("cast_all pair", ins[i], outs[i]);
    }
    if (graphs_->replaying()) return;
    // A launch for each run of pairs with the same two dtypes.
    std::vector<cuda::CastPair> run;
    for (std::size_t i = 0; i < ins.size(); ++i) {
      run.push_back({ins[i].data, outs[i].data, ins[i].numel()});
      if (i + 1 == ins.size() || ins[i + 1].dtype != ins[i].dtype || outs[i + 1].dtype != outs[i].dtype) {
        cuda::cast_many(run.data(), static_cast<std::int64_t>(run.size()), elem(ins[i]), elem(outs[i]), stream_);
        run.clear();
      }
    }
  }

  void add_all(std::span<const Tensor> as, std::span<const Tensor> bs, std::span<const Tensor> outs) override {
    const auto on = here();
    LMSCOPE_CHECK(as.size() == bs.size() && as.size() == outs.size(), "add_all of {}, {} and {} tensors", as.size(),
                  bs.size(), outs.size());
    graphs_->note("add_all", as.size());
    for (std::size_t i = 0; i < as.size(); ++i) {
      same_shape(as[i], bs[i], "add_all");
      same_shape(as[i], outs[i], "add_all out");
      graphs_->note("add_all triple", as[i], bs[i], outs[i]);
    }
    if (graphs_->replaying()) return;
    // One launch for each run of triples of one dtype throughout; a triple of mixed dtypes by itself.
    std::vector<cuda::AddTriple> run;
    auto one_dtype = [&](std::size_t i) { return as[i].dtype == bs[i].dtype && as[i].dtype == outs[i].dtype; };
    for (std::size_t i = 0; i < as.size(); ++i) {
      if (!one_dtype(i)) {
        cuda::add(as[i].data, elem(as[i]), bs[i].data, elem(bs[i]), outs[i].data, elem(outs[i]), as[i].numel(),
                  stream_);
        continue;
      }
      run.push_back({as[i].data, bs[i].data, outs[i].data, as[i].numel()});
      if (i + 1 == as.size() || !one_dtype(i + 1) || as[i + 1].dtype != as[i].dtype) {
        cuda::add_many(run.data(), static_cast<std::int64_t>(run.size()), elem(as[i]), stream_);
        run.clear();
      }
    }
  }

  void set_collective_sms(int sms) override {
    const auto on = here();
    LMSCOPE_CHECK(!graphs_->active(), "collectives beside a device graph");
    gemm_->set_held_sms(sms);
  }

  void gemm(const GemmArgs& g) override {
    const auto on = here();
    gemm_->take_workspace();  // the host side: a replayed GEMM holds it too
    if (graphs_->skip("gemm", g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.beta, g.a, g.b, g.c, g.lda, g.ldb, g.ldc,
                      g.batch, g.stride_a, g.stride_b, g.stride_c))
      return;
    gemm_->run(g);
  }

  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    const auto on = here();
    if (graphs_->skip("embedding_forward", ids, table, out)) return;
    same_dtype(table, out, "embedding_forward out");
    cuda::embedding_forward(i32(ids), master_data(table), master_data(out), elem(table), ids.numel(), table.dim(1),
                            stream_);
  }
  void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, bool accumulate) override {
    const auto on = here();
    if (graphs_->skip("embedding_backward", ids, dout, dtable, accumulate)) return;
    cuda::embedding_backward(i32(ids), master_data(dout), elem(dout), f32(dtable), ids.numel(), dtable.dim(0),
                             dtable.dim(1), accumulate, stream_);
  }

  void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& out, const Tensor& rstd, double eps) override {
    const auto on = here();
    if (graphs_->skip("rmsnorm_forward", x, w, out, rstd, eps)) return;
    const std::int64_t d = x.dim(-1);
    same_dtype(x, w, "rmsnorm_forward weight");
    cuda::rmsnorm_forward(master_data(x), master_data(w), elem(x), out.data, elem(out), f32(rstd), x.numel() / d, d,
                          static_cast<float>(eps), stream_);
  }
  void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dw) override {
    const auto on = here();
    const std::int64_t d = x.dim(-1), n = x.numel() / d;
    const Allocation partials = scratch::cuda_rmsnorm_backward(alloc_, n, d);
    if (graphs_->skip("rmsnorm_backward", dout, x, w, rstd, dx, dw, partials.tensor())) return;
    same_dtype(x, w, "rmsnorm_backward weight");
    same_dtype(x, dx, "rmsnorm_backward dx");
    cuda::rmsnorm_backward(dout.data, elem(dout), master_data(x), master_data(w), elem(x), f32(rstd), nullptr,
                           master_data(dx), nullptr, f32(dw), dw_partials(partials), n, d, stream_);
  }
  void add_rmsnorm_forward(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& w, const Tensor& out,
                           const Tensor& rstd, double eps) override {
    const auto on = here();
    same_shape(x, y, "add_rmsnorm y");
    same_shape(x, h, "add_rmsnorm h");
    if (graphs_->skip("add_rmsnorm_forward", x, y, h, w, out, rstd, eps)) return;
    const std::int64_t d = x.dim(-1);
    same_dtype(x, h, "add_rmsnorm h");
    same_dtype(x, w, "add_rmsnorm weight");
    cuda::add_rmsnorm_forward(master_data(x), y.data, elem(y), master_data(h), master_data(w), elem(x), out.data,
                              elem(out), f32(rstd), x.numel() / d, d, static_cast<float>(eps), stream_);
  }
  void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                            const Tensor& dresidual, const Tensor& dx, const Tensor& dw,
                            const Tensor& dx_lowp) override {
    const auto on = here();
    same_shape(x, dresidual, "rmsnorm_backward_add dresidual");
    if (!dx_lowp.empty()) {
      same_shape(x, dx_lowp, "rmsnorm_backward_add dx_lowp");
      same_dtype(dout, dx_lowp, "rmsnorm_backward_add dx_lowp");  // the kernel writes it in dy's type
    }
    const std::int64_t d = x.dim(-1), n = x.numel() / d;
    const Allocation partials = scratch::cuda_rmsnorm_backward(alloc_, n, d);
    if (graphs_->skip("rmsnorm_backward_add", dout, x, w, rstd, dresidual, dx, dw, partials.tensor(), dx_lowp)) return;
    for (const Tensor* t : {&w, &dresidual, &dx}) same_dtype(x, *t, "rmsnorm_backward_add weight or residual");
    cuda::rmsnorm_backward(dout.data, elem(dout), master_data(x), master_data(w), elem(x), f32(rstd),
                           master_data(dresidual), master_data(dx), dx_lowp.data, f32(dw), dw_partials(partials), n, d,
                           stream_);
  }

  void split_heads(const Tensor& in, const Tensor& out, double theta) override {
    move_heads({&in, 1}, {&out, 1}, {&theta, 1}, true);
  }
  void merge_heads(const Tensor& in, const Tensor& out, double theta) override {
    move_heads({&in, 1}, {&out, 1}, {&theta, 1}, false);
  }
  void split_heads_all(std::span<const Tensor> ins, std::span<const Tensor> outs,
                       std::span<const double> thetas) override {
    move_heads(ins, outs, thetas, true);
  }
  void merge_heads_all(std::span<const Tensor> ins, std::span<const Tensor> outs,
                       std::span<const double> thetas) override {
    move_heads(ins, outs, thetas, false);
  }

  void softmax_forward(const Tensor& scores, const Tensor& probs, double scale, bool causal) override {
    const auto on = here();
    same_shape(scores, probs, "softmax");
    same_dtype(scores, probs, "softmax");
    if (graphs_->skip("softmax_forward", scores, probs, scores.dim(-2), scale, causal)) return;
    const std::int64_t tk = scores.dim(-1);
    cuda::softmax_forward(scores.data, probs.data, elem(scores), scores.numel() / tk, scores.dim(-2), tk,
                          static_cast<float>(scale), causal, stream_);
  }
  void softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, double scale) override {
    const auto on = here();
    same_dtype(probs, dprobs, "softmax backward");
    same_dtype(probs, dscores, "softmax backward");
    if (graphs_->skip("softmax_backward", probs, dprobs, dscores, scale)) return;
    const std::int64_t tk = probs.dim(-1);
    cuda::softmax_backward(probs.data, dprobs.data, dscores.data, elem(probs), probs.numel() / tk, tk,
                           static_cast<float>(scale), stream_);
  }

  void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                               double scale, bool causal) override {
    const auto on = here();
    const AttentionShape s = flash_shape(q, k, v, out, lse);
    const int d = static_cast<int>(s.d);
    const FlashAttentionPlan plan = flash_attention_plan(flash_facts(), elem(q), d, s.n, s.tq, s.tk, causal, true);
    Allocation parts = scratch::cuda_flash_forward(alloc_, plan);
    if (graphs_->skip("flash_attention_forward", q, k, v, out, lse, parts.tensor(), s.n, s.tq, s.tk, scale, causal))
      return;
    cuda::flash_attention_forward(q.data, k.data, v.data, out.data, f32(lse), elem(q), s.n, s.tq, s.tk, d,
                                  static_cast<float>(scale), causal, plan, parts.empty() ? nullptr : f32(parts),
                                  stream_);
  }
  FlashDq flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv, double scale, bool causal, FlashDq dq_sum) override {
    const auto on = here();
    const AttentionShape s = flash_shape(q, k, v, out, lse);
    for (const Tensor* t : {&dout, &dq, &dk, &dv}) same_dtype(q, *t, "flash attention backward");
    same_shape(dout, out, "flash attention dout");
    same_shape(dq, q, "flash attention dq");
    same_shape(dk, k, "flash attention dk");
    same_shape(dv, v, "flash attention dv");
    const int d = static_cast<int>(s.d);
    const FlashAttentionPlan plan = scratch::cuda_flash_backward_plan(flash_facts(), elem(q), s, causal, dq_sum);
    const scratch::CudaFlashBackward w = scratch::cuda_flash_backward(alloc_, plan, s);
    const FlashDq summed = plan.atomic_dq() ? FlashDq::atomic : FlashDq::deterministic;  // fp32: never atomic
    if (graphs_->skip("flash_attention_backward", q, k, v, out, lse, dout, dq, dk, dv, w.delta.tensor(),
                      w.row_stats.tensor(), w.dq_accum.tensor(), w.parts.tensor(), s.n, s.tq, s.tk, scale, causal,
                      summed))
      return summed;
    cuda::flash_attention_backward(
        q.data, k.data, v.data, out.data, f32(lse), dout.data, dq.data, dk.data, dv.data, elem(q), s.n, s.tq, s.tk, d,
        static_cast<float>(scale), causal, plan, f32(w.delta), w.row_stats.empty() ? nullptr : f32(w.row_stats),
        w.dq_accum.empty() ? nullptr : f32(w.dq_accum), w.parts.empty() ? nullptr : f32(w.parts), stream_);
    return summed;
  }

  void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& out) override {
    const auto on = here();
    same_dtype(a, b, "swiglu");
    same_dtype(a, out, "swiglu");
    if (graphs_->skip("swiglu_forward", a, b, out)) return;
    cuda::swiglu_forward(a.data, b.data, out.data, elem(a), a.numel(), stream_);
  }
  void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& dout, const Tensor& da,
                       const Tensor& db) override {
    const auto on = here();
    for (const Tensor* t : {&b, &dout, &da, &db}) same_dtype(a, *t, "swiglu backward");
    if (graphs_->skip("swiglu_backward", a, b, dout, da, db)) return;
    cuda::swiglu_backward(a.data, b.data, dout.data, da.data, db.data, elem(a), a.numel(), stream_);
  }

  using Backend::cross_entropy_forward;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& loss,
                             double scale, bool accumulate) override {
    const auto on = here();
    const std::int64_t v = logits.dim(-1), n = logits.numel() / v;
    Allocation row_loss = scratch::cuda_cross_entropy(alloc_, n);
    if (graphs_->skip("cross_entropy_forward", logits, targets, lse, loss, row_loss.tensor(), scale, accumulate))
      return;
    cuda::cross_entropy_forward(logits.data, elem(logits), i32(targets), f32(lse), f32(row_loss), f32(loss), n, v,
                                static_cast<float>(scale), accumulate, stream_);
  }
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogits,
                              double scale) override {
    const auto on = here();
    same_dtype(logits, dlogits, "cross-entropy backward");
    if (graphs_->skip("cross_entropy_backward", logits, targets, lse, dlogits, scale)) return;
    const std::int64_t v = logits.dim(-1), n = logits.numel() / v;
    cuda::cross_entropy_backward(logits.data, i32(targets), f32(lse), dlogits.data, elem(logits), n, v,
                                 static_cast<float>(scale), stream_);
  }

  // The global norm's partial sums for `count` tensors: made again (from the allocator, so the dry run
  // follows) when the count changes.
  const Tensor& norm_partials(std::size_t count) {
    static_assert(scratch::kGlobalNormBlocks == cuda::kNormBlocks);
    if (norm_sum_.empty() ||
        norm_sum_.tensor().numel() != static_cast<std::int64_t>(count) * scratch::kGlobalNormBlocks) {
      norm_sum_.reset();
      norm_sum_ = scratch::cuda_global_norm(alloc_, count);
    }
    return norm_sum_;
  }

  void global_norm(std::span<const Tensor> tensors, const Tensor& out) override {
    const auto on = here();
    double* partials = norm_partials(tensors.size()).as<double>();
    graphs_->note("global_norm", norm_sum_.tensor(), out, tensors.size());
    for (const Tensor& t : tensors) graphs_->note("global_norm input", t);
    if (graphs_->replaying()) return;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      cuda::sum_squares(grad_data(tensors[i]), elem(tensors[i]), tensors[i].numel(), partials + i * cuda::kNormBlocks,
                        stream_);
    cuda::sum_partials_sqrt(partials, static_cast<std::int64_t>(tensors.size()) * cuda::kNormBlocks, f32(out), stream_);
  }

  void adamw_all(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> m,
                 std::span<const Tensor> v, const AdamWArgs& a, const Tensor& grad_norm, const CopyFor& copy,
                 const GradientRead& read) override {
    const auto on = here();
    LMSCOPE_CHECK(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
                  "adamw_all of {} parameters with {} gradients and {} and {} moments", params.size(), grads.size(),
                  m.size(), v.size());
    const cuda::AdamWConsts consts = adamw_consts(a);
    const Tensor& partials = norm_partials(params.size());
    graphs_->note("adamw_all", partials, grad_norm, a.beta1, a.beta2, a.eps, a.max_norm, a.step_scalars,
                  a.skip_nonfinite);
    std::vector<const void*> xs;
    std::vector<std::int64_t> ns;
    const Elem eg = grads.empty() ? Elem::f32 : elem(grads[0]);
    for (std::size_t i = 0; i < params.size(); ++i) {
      for (const Tensor* t : {&grads[i], &m[i], &v[i]}) same_shape(params[i], *t, "adamw_all gradient or moment");
      same_dtype(grads[0], grads[i], "adamw_all gradients");
      graphs_->note("adamw_all tensor", params[i], grads[i], m[i], v[i]);
      xs.push_back(grad_data(grads[i]));
      ns.push_back(grads[i].numel());
    }
    if (!graphs_->replaying()) {
      cuda::sum_squares_many(xs.data(), eg, ns.data(), static_cast<std::int64_t>(xs.size()), partials.as<double>(),
                             stream_);
      cuda::sum_partials_sqrt(partials.as<double>(), partials.numel(), f32(grad_norm), stream_);
    }
    for_each_adamw_group(grads, copy, read, [&](std::size_t first, std::size_t last, std::span<const Tensor> copies) {
      std::vector<cuda::AdamWTensor> ts;
      for (std::size_t i = first; i < last; ++i) {
        const Tensor& c = copies[i - first];
        check_lowp_copy(c, params[i]);
        graphs_->note("adamw_all copy", c);
        same_dtype(params[0], params[i], "adamw_all parameters");
        same_dtype(params[i], m[i], "adamw_all moment");
        same_dtype(params[i], v[i], "adamw_all moment");
        ts.push_back({master_data(params[i]), grad_data(grads[i]), master_data(m[i]), master_data(v[i]),
                      params[i].numel(), c.data, c.empty() ? Elem::bf16 : elem(c), eg, elem(params[i])});
      }
      if (!graphs_->replaying())
        cuda::adamw_many(ts.data(), static_cast<std::int64_t>(ts.size()), consts,
                         a.step_scalars.empty() ? nullptr : f32(a.step_scalars), f32(grad_norm), stream_);
    });
  }
  std::size_t adamw_group() const override {
    static_assert(scratch::kCudaAdamWGroup == cuda::kTensorsPerLaunch);
    return cuda::kTensorsPerLaunch;
  }

  void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWArgs& a,
             const Tensor& grad_norm, const Tensor& lowp_copy) override {
    const auto on = here();
    check_lowp_copy(lowp_copy, p);
    const cuda::AdamWConsts consts = adamw_consts(a);
    const bool read_norm = a.max_norm > 0 || a.skip_nonfinite;
    if (graphs_->skip("adamw", p, g, m, v, lowp_copy, a.beta1, a.beta2, a.eps, a.max_norm, a.step_scalars,
                      a.skip_nonfinite, read_norm ? grad_norm.data : nullptr))
      return;
    same_shape(p, g, "adamw gradient");
    same_dtype(p, m, "adamw moment");
    same_dtype(p, v, "adamw moment");
    cuda::adamw(master_data(p), elem(p), grad_data(g), elem(g), master_data(m), master_data(v), p.numel(), consts,
                a.step_scalars.empty() ? nullptr : f32(a.step_scalars), read_norm ? f32(grad_norm) : nullptr,
                lowp_copy.data, lowp_copy.empty() ? Elem::bf16 : elem(lowp_copy), stream_);
  }

 private:
  static void check_lowp_copy(const Tensor& copy, const Tensor& p) {
    if (copy.empty()) return;
    LMSCOPE_CHECK(copy.dtype == DType::bf16 || copy.dtype == DType::f16, "low-precision copies are bf16 or f16");
    LMSCOPE_CHECK(copy.numel() == p.numel(), "a low-precision copy of {} elements for a parameter of {}", copy.numel(),
                  p.numel());
  }
  // The kernels' constants, checked: the step scalars, when given, are read from the device in place of
  // the host's (a graph replays them); inside a graph they must be given, or the host's would be baked in.
  cuda::AdamWConsts adamw_consts(const AdamWArgs& a) const {
    LMSCOPE_CHECK(a.step_scalars.empty() || (a.step_scalars.dtype == DType::f32 && a.step_scalars.numel() == 3),
                  "AdamW's step scalars are f32 [3]");
    LMSCOPE_CHECK(!a.step_scalars.empty() || !graphs_->active(),
                  "AdamW in a device graph takes its step scalars on the device");
    const std::array<double, 3> k = adamw_step_scalars(a);
    return {static_cast<float>(a.beta1),    static_cast<float>(a.beta2),
            static_cast<float>(a.eps),      static_cast<float>(k[0]),
            static_cast<float>(k[1]),       static_cast<float>(k[2]),
            static_cast<float>(a.max_norm), a.skip_nonfinite};
  }
  // This backend's GPU made current for the scope of a call (and the caller's current again after).
  cuda::DeviceGuard here() const { return cuda::DeviceGuard(device_.index()); }
  const FlashKernelFacts& flash_facts() const { return device_.facts().flash; }
  Device device_;
  CudaAllocator alloc_;
  void switch_stream(cudaStream_t next) {
    const auto on = here();
    if (next == stream_) return;
    LMSCOPE_CHECK(!graphs_->active(), "a change of stream inside a device graph");
    LMSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    stream_ = next;
    gemm_->set_stream(next);
    graphs_->set_stream(next);
  }

  cudaStream_t stream_ = nullptr;      // where the ops run: own_stream_, or a caller's (run_on_stream)
  cudaStream_t own_stream_ = nullptr;  // the backend's, from the pool
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::GraphCache> graphs_;
  Allocation norm_sum_;
  std::vector<cudaEvent_t> events_;
  scratch::RopeTables rope_tables_;
  // split_heads (to heads-major) or merge_heads of each pair, up to cuda::kMaxHeadMoves of one shape
  // and dtype a launch (runs are cut where the inputs' shape or dtype changes; the [B, T, h, dk]
  // side's dims size the launch).
  void move_heads(std::span<const Tensor> ins, std::span<const Tensor> outs, std::span<const double> thetas,
                  bool to_heads_major) {
    const auto on = here();
    check_heads_all(ins, outs, thetas);
    const char* op = to_heads_major ? "split_heads" : "merge_heads";
    std::vector<cuda::HeadMove> run;
    for (std::size_t i = 0; i < ins.size(); ++i) {
      same_dtype(ins[i], outs[i], op);
      const Tensor& tokens = to_heads_major ? ins[i] : outs[i];  // [B, T, h, dk]
      const float* rope = rope_table(tokens.dim(1), tokens.dim(3), thetas[i]);
      graphs_->note(op, ins[i], outs[i], tokens.dim(0), tokens.dim(1), tokens.dim(2), rope);
      run.push_back({ins[i].data, outs[i].data, rope});
      const bool last = i + 1 == ins.size() || run.size() == cuda::kMaxHeadMoves || ins[i + 1].shape != ins[i].shape ||
                        ins[i + 1].dtype != ins[i].dtype;
      if (!last) continue;
      if (!graphs_->replaying())
        cuda::permute_heads(run.data(), static_cast<int>(run.size()), elem(ins[i]), tokens.dim(0), tokens.dim(1),
                            tokens.dim(2), tokens.dim(3), to_heads_major, stream_);
      run.clear();
    }
  }
  const float* rope_table(std::int64_t t, std::int64_t dk, double theta) {
    auto [table, made] = rope_tables_.get(alloc_, t, dk, theta);
    if (made && !graphs_->skip("rope_table", *table, theta))
      cuda::rope_table(table->as<float>(), t, dk, theta, stream_);
    return table ? table->as<float>() : nullptr;
  }
  std::size_t used_events_ = 0;
  std::size_t used_at_start_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Device& device, GemmMath math) {
  LMSCOPE_CHECK(device.kind() == DeviceKind::cuda, "a CUDA backend for {}", device.name());
  return std::make_unique<CudaBackend>(device, math);
}

std::unique_ptr<Backend> make_cuda_backend(GemmMath math) {
  if (list_gpus().empty()) throw Unsupported("no CUDA GPU is visible to this process");
  return make_cuda_backend(cuda_device(current_cuda_device()), math);
}

}  // namespace lmscope
