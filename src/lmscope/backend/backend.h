// The backend interface: the explicit op set the model is written against. The model never
// branches on the device; a backend (cpu now; cuda and the shape-only meta next) implements
// these ops on its own memory, which it hands out through its tagged Allocator.
//
// Conventions for every op:
// - tensors are row-major and contiguous; the shapes named in each comment are checked;
// - outputs are overwritten, never accumulated into, unless the name says "accumulate";
// - a backward op's inputs are exactly the activations its forward saved (see model/saved_activations.h);
// - statistics (rstd, lse, loss, norms) are f32, or f64 when the op computes in f64;
// - in mixed precision (bf16 compute), the residual stream, its gradient, parameters, gradients and
//   optimizer state stay f32 and GEMM operands are bf16 (docs/precision.md names each op's types);
//   with --grad-dtype bf16 the parameters' gradients are bf16 too, which the weight-gradient GEMMs
//   write, and global_norm, adamw and adamw_all read (CUDA).
#pragma once

#include "lmscope/core/allocator.h"
#include "lmscope/core/error.h"
#include "lmscope/core/ranges.h"
#include "lmscope/device/device.h"
#include "lmscope/profile/kernel_profile.h"

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lmscope {

// How the flash backward sums dq over key tiles (Backend::flash_attention_backward).
enum class FlashDq {
  fastest,        // whichever of the two below the backend runs faster for the call
  deterministic,  // in a fixed order, by its own pass: runs repeat bit for bit
  atomic,         // in the order the dK/dV pass reaches them (fp32 atomics; on Hopper, bulk reductions in
                  // L2), where the backend has such a kernel (CUDA, bf16 on tensor cores)
};

// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b < batch, op(X) = X or Xᵀ.
// op(A) is [M, K], op(B) is [K, N], C is [M, N]; lda/ldb/ldc are row strides of the stored
// matrices; stride_* step from one batch item to the next (elements).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  Tensor a, b, c;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;

  // The product of packed operands (each matrix stored whole, rows one after another, a batch's
  // matrices back to back): every stride follows from the shape.
  static GemmArgs packed(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const Tensor& a,
                         const Tensor& b, const Tensor& c, float beta = 0, std::int64_t batch = 1) {
    return {.trans_a = trans_a,
            .trans_b = trans_b,
            .m = m,
            .n = n,
            .k = k,
            .beta = beta,
            .a = a,
            .b = b,
            .c = c,
            .lda = trans_a ? m : k,
            .ldb = trans_b ? k : n,
            .ldc = n,
            .batch = batch,
            .stride_a = m * k,
            .stride_b = k * n,
            .stride_c = m * n};
  }
};

struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  std::int64_t step = 1;  // t, from 1
  double max_norm = 0;    // global-norm clipping threshold; 0 = off
  // Multiplies the gradient (and the norm clipping compares) first: 1/S undoes a loss scale S.
  double grad_scale = 1.0;
  // When not empty: [3] on the backend (f32 where read) holding this step's adamw_step_scalars, which a backend
  // that records device graphs reads in place of lr, step and grad_scale, so one recorded optimizer
  // step replays at every step's rate. Others read the fields above (the same values).
  Tensor step_scalars{};
  // Leaves the parameter and the moments as they are when the norm in grad_norm is not finite (a loss
  // scale's overflow), deciding on the device; the low-precision copy is written all the same.
  bool skip_nonfinite = false;
};
// The per-step values of an AdamW update: alpha = lr·√(1−β2ᵗ)/(1−β1ᵗ), the decay lr·weight_decay,
// and grad_scale.
std::array<double, 3> adamw_step_scalars(const AdamWArgs& a);

// Device memory as its driver reports it (cudaMemGetInfo), beside what the allocator holds.
struct DeviceMemory {
  std::size_t total = 0, used = 0;  // now
  // In use when the backend was made, before its allocator held anything: the CUDA context and
  // cuBLASLt's handle (and anything else on the device then). cuBLASLt's workspace is the allocator's.
  std::size_t used_at_start = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Allocator& allocator() = 0;
  virtual void synchronize() {}
  // Timestamps in the backend's own order of work: mark() records one after everything already
  // enqueued (a CUDA event on the GPU, the host clock on the CPU); elapsed_ms reads two marks after
  // a synchronize(). Marks live until clear_marks().
  virtual int mark() = 0;
  virtual double elapsed_ms(int from, int to) = 0;
  virtual void clear_marks() = 0;
  // A recorder of the device's kernels from now on, or nullptr where the backend has none (CPU).
  virtual std::unique_ptr<KernelTracer> kernel_tracer() { return nullptr; }
  // Who hears the ranges (step, phase, layer, op) the code running on this backend marks: the
  // listener set here (none by default) and the backend's own for its device's tools, if any.
  void set_range_listener(RangeListener* listener) {
    ranges_ = listener;
    update_ranges();
  }
  RangeListener* range_listener() const { return active_ranges_; }
  // The CUDA stream the ops run on (a cudaStream_t), nullptr on other backends: collectives between
  // GPUs order themselves after it.
  virtual void* cuda_stream() const { return nullptr; }
  // From now on the ops run on `stream`, a cudaStream_t the caller owns (a PyTorch caller's current
  // stream; nullptr is CUDA's default stream), until run_on_own_stream. The work queued before is
  // waited for first, so memory the backend freed and hands out again stays in order. Nothing where
  // there are no streams.
  virtual void run_on_stream(void* /*stream*/) {}
  virtual void run_on_own_stream() {}
  // The device's memory as its driver reports it, after a synchronize; none where there is no such
  // report (the CPU, the dry run).
  virtual std::optional<DeviceMemory> device_memory() { return std::nullopt; }
  // How many SMs collectives may hold beside the ops from now on (data parallelism's exchange during
  // the backward; 0 when none runs): CUDA then plans its GEMMs for the SMs left (cuda/gemm.h).
  virtual void set_collective_sms(int /*sms*/) {}

  // Device graphs (CUDA graphs): what the ops enqueue between begin_graph(key) and end_graph() is
  // recorded into one graph the first time the key comes (and then run), and replayed as one launch
  // when it comes again. While a graph replays, the ops do their host side only (scratch from the
  // allocator, checks) and launch nothing; each folds its arguments into a signature that must equal
  // the recorded graph's, or end_graph throws. The key must name all the ops depend on beyond the
  // allocator's state, which GraphScope adds. Nothing may wait for the device in between. Backends
  // without graphs run the ops as always.
  virtual bool has_graphs() const { return false; }
  virtual void begin_graph(std::uint64_t /*key*/) {}
  virtual void end_graph() {}
  virtual void abort_graph() {}  // after an exception between the two: nothing recorded is kept
  struct GraphCounts {
    std::int64_t recorded = 0, replayed = 0;  // graphs recorded (each run once then), and replays
    bool given_up = false;                    // keys kept changing, so the ops run one by one from then on
  };
  virtual GraphCounts graph_counts() const { return {}; }

  // Host <-> backend memory and elementwise basics.
  virtual void copy_from_host(const Tensor& dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void fill(const Tensor& t, double value) = 0;
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;  // out = a + b (out may alias)
  virtual void cast(const Tensor& in, const Tensor& out) = 0;                 // same shape, another dtype
  // Each ins[i] cast into outs[i], the bits of cast() one by one; where the backend has a fused
  // kernel (CUDA), one launch for many (the forward's casts of a layer's weight copies). No output
  // may overlap another pair's input: the fused kernel reads every input before any pair's writes land.
  virtual void cast_all(std::span<const Tensor> ins, std::span<const Tensor> outs) {
    LMSCOPE_CHECK(ins.size() == outs.size(), "cast_all of {} tensors into {}", ins.size(), outs.size());
    for (std::size_t i = 0; i < ins.size(); ++i) cast(ins[i], outs[i]);
  }

  // outs[i] = as[i] + bs[i], the bits of add() one by one; where the backend has a fused kernel (CUDA),
  // one launch for many (data parallelism's sums of gathered gradients). outs[i] may alias as[i] or
  // bs[i], but no output may overlap another triple's inputs.
  virtual void add_all(std::span<const Tensor> as, std::span<const Tensor> bs, std::span<const Tensor> outs) {
    LMSCOPE_CHECK(as.size() == bs.size() && as.size() == outs.size(), "add_all of {}, {} and {} tensors", as.size(),
                  bs.size(), outs.size());
    for (std::size_t i = 0; i < as.size(); ++i) add(as[i], bs[i], outs[i]);
  }

  virtual void gemm(const GemmArgs& g) = 0;

  // ids [N] i32, table [V, d] -> out [N, d]
  virtual void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // dtable [V, d] = scatter-add of dout [N, d] rows at ids (dtable overwritten; added to where
  // accumulate, as gradient accumulation does)
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, bool accumulate) = 0;

  // x [N, d], weight [d] -> out [N, d]; rstd [N] = 1/sqrt(mean(x²)+eps) saved for backward.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& out, const Tensor& rstd,
                               double eps) = 0;
  virtual void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                const Tensor& dx, const Tensor& dweight) = 0;
  // Fused (--fusion): the residual add and the RMSNorm after it, h = x + y then rmsnorm_forward(h)
  // (y may have the compute dtype, x and h the residual stream's); and the RMSNorm's backward with the
  // residual's gradient added, dx = rmsnorm_backward(...) + dresidual. One pass each where the backend
  // has it (CPU, CUDA: the same values as the two ops); these defaults are the two ops. h may alias x;
  // dx aliases neither x nor dresidual. dx_lowp, unless empty, also gets dx in its own (the compute)
  // dtype, the bits cast(dx, dx_lowp) gives, for the GEMMs that read the residual's gradient: on
  // CUDA from the same pass, where the cast would read dx again.
  virtual void add_rmsnorm_forward(const Tensor& x, const Tensor& y, const Tensor& h, const Tensor& weight,
                                   const Tensor& out, const Tensor& rstd, double eps) {
    add(x, y, h);
    rmsnorm_forward(h, weight, out, rstd, eps);
  }
  virtual void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                    const Tensor& dresidual, const Tensor& dx, const Tensor& dweight,
                                    const Tensor& dx_lowp) {
    rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
    add(dx, dresidual, dx);
    if (!dx_lowp.empty()) cast(dx, dx_lowp);
  }

  // in [B, T, h, dk] -> out [B, h, T, dk]; with rope_theta > 0 also rotates interleaved pairs
  // by angle p·theta^(-2i/dk) (p = position). merge_heads is its exact adjoint: out [B, T, h, dk]
  // from in [B, h, T, dk], rotating by the negative angle. So the backward of one is the other.
  virtual void split_heads(const Tensor& in, const Tensor& out, double rope_theta) = 0;
  virtual void merge_heads(const Tensor& in, const Tensor& out, double rope_theta) = 0;
  // Several moves one way at once (a layer's q, k and v; o and dO): ins[i] to outs[i] with
  // rope_thetas[i], each the values split_heads or merge_heads makes (these defaults; CUDA moves up
  // to three of one shape and dtype in a launch).
  virtual void split_heads_all(std::span<const Tensor> ins, std::span<const Tensor> outs,
                               std::span<const double> rope_thetas) {
    check_heads_all(ins, outs, rope_thetas);
    for (std::size_t i = 0; i < ins.size(); ++i) split_heads(ins[i], outs[i], rope_thetas[i]);
  }
  virtual void merge_heads_all(std::span<const Tensor> ins, std::span<const Tensor> outs,
                               std::span<const double> rope_thetas) {
    check_heads_all(ins, outs, rope_thetas);
    for (std::size_t i = 0; i < ins.size(); ++i) merge_heads(ins[i], outs[i], rope_thetas[i]);
  }
  static void check_heads_all(std::span<const Tensor> ins, std::span<const Tensor> outs,
                              std::span<const double> rope_thetas) {
    LMSCOPE_CHECK(ins.size() == outs.size() && ins.size() == rope_thetas.size(),
                  "heads moves of {} tensors into {} with {} angles", ins.size(), outs.size(), rope_thetas.size());
  }

  // scores [N, Tq, Tk] -> probs = softmax(scale · scores) over the last dim, keys j > i masked
  // when causal (query i sits at position i).
  virtual void softmax_forward(const Tensor& scores, const Tensor& probs, double scale, bool causal) = 0;
  // dscores = scale · probs ∘ (dprobs − rowsum(probs ∘ dprobs)); dscores may alias dprobs.
  virtual void softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores, double scale) = 0;

  // FlashAttention-2 (MODEL.md): q [n, tq, dk], k and v [n, tk, dk] -> out [n, tq, dk] and
  // lse [n, tq] = log Σ_j exp(scale·q·k_j) (natural log), tiled with an online softmax so the scores
  // never reach memory; causal masks key j > query i. lse is f32 (f64 when the op computes in f64).
  virtual void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                       const Tensor& lse, double scale, bool causal) = 0;
  // dq, dk, dv from dout, recomputing the probabilities from lse: D = rowsum(dout ∘ out),
  // P = exp(scale·q·kᵀ − lse), dS = P ∘ (dout·vᵀ − D), dq summed as `dq` asks. Returns how it was
  // summed (deterministic or atomic; the CPU backend's is always deterministic).
  virtual FlashDq flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                           const Tensor& dv, double scale, bool causal, FlashDq dq_sum) = 0;

  // out = silu(a) ∘ b; all [N, f].
  virtual void swiglu_forward(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& dout, const Tensor& da,
                               const Tensor& db) = 0;

  // logits [N, V], targets [N] i32 -> loss [1] = scale · the rows' summed cross-entropy, added to
  // what loss holds when accumulate (a loss over row chunks); lse [N] saved.
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& loss,
                                     double scale, bool accumulate) = 0;
  // The mean over the rows.
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& loss) {
    cross_entropy_forward(logits, targets, lse, loss, 1.0 / static_cast<double>(logits.numel() / logits.dim(-1)),
                          false);
  }
  // dlogits = (softmax(logits) − onehot(targets)) · scale; dlogits may alias logits.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                      const Tensor& dlogits, double scale) = 0;

  // out [1] = sqrt(sum of squares over every tensor): the global gradient norm.
  // (The tensors, and adamw's gradients, are of the master dtype, or bf16 where the backend has
  // kernels for bf16 gradients: CUDA.)
  virtual void global_norm(std::span<const Tensor> tensors, const Tensor& out) = 0;
  // The assignment's AdamW on one parameter (MODEL.md), with its gradient multiplied by grad_scale
  // and then by min(1, max_norm/(grad_scale·norm+1e-6)) when max_norm > 0 (norm read from
  // grad_norm [1]).
  // lowp_copy, when not empty, receives the updated parameter in its own (lower) precision.
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWArgs& args,
                     const Tensor& grad_norm, const Tensor& lowp_copy) = 0;
  // Fused (--fusion): the whole step in a few launches where the backend has them (CUDA: the same
  // bits as the ops one by one): global_norm of every gradient into grad_norm, then adamw on every
  // parameter, a group at a time. Just before a group's updates copy(i) gives each one's
  // low-precision copy to write (an empty tensor for none), and after them read(i) says its gradient
  // has been read and may go. A group takes parameters, up to adamw_group(), while the copies made
  // so far take no more than the gradients read before it: the step never holds more than every
  // gradient and one copy, as when each copy is made once its own gradient has gone.
  using CopyFor = std::function<Tensor(std::size_t)>;
  using GradientRead = std::function<void(std::size_t)>;
  virtual void adamw_all(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> m,
                         std::span<const Tensor> v, const AdamWArgs& args, const Tensor& grad_norm, const CopyFor& copy,
                         const GradientRead& read) {
    global_norm(grads, grad_norm);
    for_each_adamw_group(grads, copy, read, [&](std::size_t first, std::size_t last, std::span<const Tensor> copies) {
      for (std::size_t i = first; i < last; ++i)
        adamw(params[i], grads[i], m[i], v[i], args, grad_norm, copies[i - first]);
    });
  }
  // The most parameters adamw_all updates in one launch (1: one by one).
  virtual std::size_t adamw_group() const { return 1; }

 protected:
  // adamw_all's order: per group [first, last), every copy(i), then update(first, last, those
  // copies), then every read(i).
  template <typename Update>
  void for_each_adamw_group(std::span<const Tensor> grads, const CopyFor& copy, const GradientRead& read,
                            Update&& update) {
    std::vector<Tensor> copies;
    std::size_t read_bytes = 0, copy_bytes = 0;
    for (std::size_t first = 0, last = 0; first < grads.size(); first = last) {
      copies.clear();
      do {
        // What the copy took from the allocator: nothing where it already exists (resident copies,
        // refreshed in place), so those never narrow a group.
        const std::size_t before = allocator().current_bytes();
        copies.push_back(copy(last++));
        copy_bytes += std::max(allocator().current_bytes(), before) - before;
      } while (last < grads.size() && last - first < adamw_group() && copy_bytes <= read_bytes);
      update(first, last, copies);
      for (std::size_t i = first; i < last; ++i) {
        read(i);
        read_bytes += grads[i].bytes();
      }
    }
  }

  // Ranges the backend reports to its device's profilers (NVTX on CUDA), heard beside the listener
  // set with set_range_listener.
  void set_device_ranges(std::unique_ptr<RangeListener> listener) {
    device_ranges_ = std::move(listener);
    update_ranges();
  }

 private:
  void update_ranges() {
    tee_ = RangeTee(ranges_, device_ranges_.get());
    active_ranges_ = ranges_ && device_ranges_ ? &tee_ : ranges_ ? ranges_ : device_ranges_.get();
  }
  RangeListener* ranges_ = nullptr;
  std::unique_ptr<RangeListener> device_ranges_;
  RangeTee tee_{nullptr, nullptr};
  RangeListener* active_ranges_ = nullptr;
};

// One phase's ops as one device graph when `on` (Backend::begin_graph), keyed by the caller's key
// (which phase, with which flags) and the allocator's state; ended by end(), abandoned by an exception.
class GraphScope {
 public:
  GraphScope(Backend& backend, bool on, std::uint64_t key);
  ~GraphScope();
  GraphScope(const GraphScope&) = delete;
  GraphScope& operator=(const GraphScope&) = delete;
  void end();
  std::uint64_t key() const { return key_; }  // the whole key; 0 when off

 private:
  Backend* backend_ = nullptr;  // null when off or ended
  std::uint64_t key_ = 0;
};

// The sizes of a flash attention call, checked (UserError naming the first mismatch):
// q and out [n, tq, d], k and v [n, tk, d], lse [n, tq], tq and tk at least 1.
struct AttentionShape {
  std::int64_t n = 0, tq = 0, tk = 0, d = 0;
};
AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

// Host values to and from an f32, f64 or bf16 tensor, converting to and from double (into bf16
// rounded to nearest even).
void upload(Backend& backend, const Tensor& t, std::span<const double> values);
std::vector<double> download(Backend& backend, const Tensor& t);
// t.numel() floats into an f32 tensor, or rounded (to nearest even) into a bf16 one.
void upload_host(Backend& backend, const Tensor& t, const float* values);
// Element 0 of an f32 or f64 tensor, read to the host (synchronises with the backend).
double read_scalar(Backend& backend, const Tensor& t);

std::unique_ptr<Backend> make_cpu_backend(std::size_t memory_capacity = 0);
// GEMM arithmetic of a CUDA backend: IEEE fp32 (tensor cores off) or tf32 tensor cores.
enum class GemmMath { fp32, tf32 };
// A CUDA backend on `device` (cuda_device(index)); throws Unsupported without CUDA.
std::unique_ptr<Backend> make_cuda_backend(const Device& device, GemmMath math);
// On the current CUDA device (a rank's once use_gpu made it so); throws Unsupported without CUDA or a GPU.
std::unique_ptr<Backend> make_cuda_backend(GemmMath math);
// Throws UserError naming the choices unless precision is "fp32", "tf32", "bf16" or "fp16".
void check_precision(const std::string& precision);
// device "cpu" or "cuda", precision as check_precision takes it; throws UserError for an unknown
// name, Unsupported for a combination this build cannot run.
// "cuda" is the current CUDA device (a rank's once use_gpu made it so).
std::unique_ptr<Backend> make_backend(const std::string& device, const std::string& precision = "fp32");
// A backend made for `device` (cpu_device(), cuda_device(index)), precision as above.
std::unique_ptr<Backend> make_backend(const Device& device, const std::string& precision = "fp32");
// The model's compute dtype for a precision name: bf16 for "bf16", f16 for "fp16", else f32.
DType compute_dtype(const std::string& precision);
// --grad-dtype: "fp32" (the master dtype) or "bf16", which takes precision "bf16".
// grad_dtype_fits: whether the pair goes together (a known name assumed); check_grad_dtype: UserError
// for an unknown name, or one that does not fit; gradient_dtype: a checked value's dtype.
bool grad_dtype_fits(const std::string& grad_dtype, const std::string& precision);
void check_grad_dtype(const std::string& grad_dtype, const std::string& precision);
DType gradient_dtype(const std::string& grad_dtype);
// The device a command uses when none is named.
std::string default_device();

}  // namespace lmscope
