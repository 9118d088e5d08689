// The Transformer LM of MODEL.md, written once against the Backend interface.
// Forward allocates the activations each op saves (tagged with op and layer); backward
// consumes and frees them, so the allocator's record is the model's exact memory story.
#pragma once

#include "lmscope/backend/backend.h"
#include "lmscope/model/attention.h"
#include "lmscope/model/config.h"
#include "lmscope/model/recompute.h"
#include "lmscope/model/step_hooks.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace lmscope {

// Where the low-precision (bf16 or fp16) copies of the matmul weights live under mixed precision
// (--weight-copies), in the order of the memory they hold, most first. resident: allocated once
// beside the fp32 masters and never freed; AdamW refreshes each in place as it updates the master,
// so the forward casts nothing, with device graphs too (their addresses never move), for 2 bytes a
// weight beside every gradient at the step's end. kept: beside the fp32 masters from step to step;
// AdamW writes each anew as it updates the master (with device graphs the forward casts a layer's at
// the layer's start instead, since copies AdamW makes land elsewhere every step), and the backward
// frees each after its last use so they never sit beside every gradient. transient: cast from the
// master where a layer uses it and freed right after, in the forward and again in the backward, so
// at most one layer's copies exist at a time: less memory (the copies are 2 bytes a weight, 6.3 GiB
// at 2.7B) for two casts of every weight a micro-batch. The copies are the same values every way,
// so are the gradients and the step.
enum class WeightCopies { resident, kept, transient };
const char* weight_copies_name(WeightCopies c);
WeightCopies parse_weight_copies(const std::string& s);  // throws UserError

// Initial values kept on the host between builds of the same model in one process (bench's cells):
// drawing a truncated normal costs 25 to 32 ns a value on one core, seconds a build at 2.7B even on
// 16, where copying kept values runs at memory speed. Holds one model's fp32 values at a time (4
// bytes a parameter of host memory); a build with another seed or other tensors draws anew.
struct KeptInitialValues {
  struct Drawn {
    std::int64_t numel = 0;
    double init_std = 0;
    std::unique_ptr<float[]> values;  // numel values, allocated without zeroing: every one is drawn
  };
  std::uint64_t seed = 0;
  std::unordered_map<std::string, Drawn> tensors;  // by parameter name
};

// Micro-batch `index` of the `count` whose gradients one optimizer step sums (--grad-accum).
struct MicroBatch {
  int index = 0, count = 1;
};

struct Parameter {
  ParameterSpec spec;
  Allocation value;       // the master copy (f32, or f64 in gradient checks)
  Allocation value_lowp;  // 16-bit copy of a matmul weight under mixed precision (Transformer::lowp_copy)
  Allocation grad;        // made by the backward, freed by AdamW once it has been read
};

class Transformer {
 public:
  // dtype: parameters, gradients (unless set_grad_dtype says otherwise), optimizer state and the
  // residual stream (f32; f64 on the CPU for gradient checks; bf16 with compute bf16 for
  // --master-dtype bf16, on CUDA). compute: GEMM operands and the activations between GEMMs: the same
  // as dtype, or bf16 or f16 for mixed precision (docs/precision.md); none means the same as dtype.
  // attention: flash (FlashAttention-2, the default) or naive (scores and probabilities in memory).
  // hooks: a parallelism that gives the parameters their local shapes (StepHooks::local_shape); one that
  // keeps the shapes may come later (set_hooks).
  Transformer(const ModelConfig& config, Backend& backend, DType dtype = DType::f32,
              std::optional<DType> compute = std::nullopt, AttentionKind attention = AttentionKind::flash,
              StepHooks* hooks = nullptr);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }
  // The row statistics' dtype (RMSNorm's rstd, attention's and the loss's log-sum-exps, the loss, the
  // gradient norm): f32, or f64 where the model computes in f64; never bf16, whatever the masters.
  DType stats_dtype() const { return dtype_ == DType::f64 ? DType::f64 : DType::f32; }
  DType compute_dtype() const { return compute_; }
  AttentionKind attention() const { return attention_; }
  const RecomputePlan& recompute() const { return recompute_; }
  void set_recompute(const RecomputePlan& r);  // throws UserError where r names more layers than there are
  WeightCopies weight_copies() const { return weight_copies_; }
  // Device graphs (--graphs): forward, backward and AdamW's step each run as one recorded graph where
  // the backend records them (CUDA), replayed while the allocator is in the state it was recorded in
  // (Backend::begin_graph). Off by default, and whenever the hooks do not allow them; the results are
  // the same bits either way.
  bool graphs() const { return graphs_ && hooks_->allows_graphs(); }
  void set_graphs(bool on) { graphs_ = on; }
  // Fused kernels (--fusion): each residual add and the RMSNorm after it (ln2, the next layer's ln1,
  // ln_final) run as one op, forward and backward (Backend::add_rmsnorm_forward,
  // rmsnorm_backward_add), and AdamW's step, the copies it writes included, as one op
  // (Backend::adamw_all). Off by default; the values are the unfused ops' (the same bits on the CPU
  // and CUDA backends).
  bool fusion() const { return fusion_; }
  void set_fusion(bool on) { fusion_ = on; }
  // What a phase's graph key names of this model beyond the allocator's state: the model itself, the
  // settings its ops depend on (shape, recompute and copies' modes, chunking, fusion), and where
  // the tensors that outlive a phase are (the allocator's state says which blocks are taken, not by
  // whom).
  std::uint64_t graph_key(const char* phase) const;
  // Before the weights are initialised or loaded (refresh_lowp_copies makes the copies AdamW keeps).
  void set_weight_copies(WeightCopies c);
  // The parameters' gradients (--grad-dtype): the master dtype (the default), or bf16 under bf16
  // compute, so the weight-gradient GEMMs write them in bf16 (fp32 accumulation inside each GEMM),
  // data parallelism exchanges half the bytes and AdamW reads them as they are (each bf16 value is
  // exact in fp32). Ops that write the master dtype (RMSNorm weights, the embedding) go through fp32
  // scratch and one cast; micro-batches add into bf16 (each addition rounded: docs/precision.md).
  // Before the first backward and before data parallelism hooks in (it sizes its buffers by it);
  // throws UserError for any other dtype.
  DType grad_dtype() const { return grad_dtype_; }
  void set_grad_dtype(DType t);
  // A forward for a backward whose logits would take more than 8 chunks makes them in chunks of at
  // most this many bytes (rows rounded down to a multiple of 128 where there are that many), keeping
  // only their log-sum-exps; the backward makes each chunk again, one more LM-head GEMM. 32 MiB by
  // default: below 256 MiB of logits the GEMM costs more than the memory is worth (small, ctx 1024,
  // bf16: +0.3 ms of 13.7 for 40 MiB on the H100), above it a chunk's GEMM still fills the GPU.
  static constexpr std::size_t kLogitChunkBytes = std::size_t(32) << 20;
  static constexpr int kLogitChunksBeforeChunking = 8;
  void set_logit_chunk_bytes(std::size_t bytes) { logit_chunk_bytes_ = bytes; }
  // Casts every master matmul weight into the low-precision copy AdamW would write (lowp_copy),
  // allocating it if missing (after loading or initialising): resident copies, kept ones without
  // graphs.
  void refresh_lowp_copies();
  // p's low-precision copy as AdamW writes it, allocated (not filled) if missing; an empty allocation
  // when p has none to keep (not a matmul weight, no mixed precision, or transient copies), or when
  // kept copies meet graphs and the backward has freed it: the next forward casts it at the start of
  // the layer that uses it, so every step's copies land where the last step's did and its recorded graphs
  // replay. (Copies AdamW wrote would take the places the gradients left, a little elsewhere each
  // step; resident copies never move, for up to 12% more at the step's peak: docs/speed.md.) A
  // copy a forward made since the backward is returned to be written afresh.
  Allocation& lowp_copy(Parameter& p);
  // p's gradient, allocated (not filled) if the backward has not made it yet.
  const Tensor& gradient(Parameter& p);
  // Where a parallelism meets the step (model/step_hooks.h); none: the default, which does nothing.
  // With the shapes the parameters have, and no gradient held where the hooks lay the gradients out
  // otherwise; the caller keeps the hooks alive until it sets others (or none).
  void set_hooks(StepHooks* hooks);
  StepHooks& hooks() { return *hooks_; }
  Backend& backend() { return backend_; }
  std::vector<Parameter>& parameters() { return params_; }
  // Parameter i's whole shape, and whether this rank holds only a block of it (tensor parallelism:
  // StepHooks::local_shape); local_values: the block of whole values (row-major in the whole shape).
  const Shape& whole_shape(std::size_t i) const { return whole_shapes_.at(i); }
  bool split(std::size_t i) const;
  std::vector<double> local_values(std::size_t i, std::span<const double> whole) const;
  // Parameter i's whole values on the host: where split, from every rank's block (a collective);
  // likewise a tensor of its local shape (AdamW's moments of it).
  std::vector<double> whole_values(std::size_t i);
  std::vector<double> whole_values(std::size_t i, const Tensor& local);
  Parameter& parameter(const std::string& name);  // throws UserError if unknown

  // Seeded truncated-normal initialisation (MODEL.md); each tensor draws from its own streams
  // named after it (one per chunk of 65536 values, filled in parallel), so a tensor's values
  // depend on the seed and its name alone. With `kept` (fp32 masters), values drawn by an earlier
  // build of the same tensors are copied instead of drawn again, and a new draw is kept there.
  void init_parameters(std::uint64_t seed, KeptInitialValues* kept = nullptr);

  // ids and targets: batch × ctx row-major token ids, already checked against the vocabulary.
  void set_batch(std::int64_t batch, std::int64_t ctx, const std::int32_t* ids, const std::int32_t* targets);
  // Forward to the mean loss, saving what backward needs (for_backward), or, for inference, freeing
  // each activation once read and keeping only the logits. The loss stays on the backend until read.
  void forward(bool for_backward = true);
  double read_loss();
  // Backward from the loss into every parameter's grad, freeing saved activations, each gradient
  // allocated when first written. With gradient accumulation (--grad-accum K), micro-batch
  // {k, K} scales the loss's gradient by 1/K (so the sum is the gradient of the whole batch's mean
  // loss) and, for k > 0, adds into the gradients instead of overwriting them. The low-precision
  // weight copies go with each layer's backward in the last micro-batch (AdamW writes them anew,
  // a forward without a step before it casts them again), so they never sit beside every gradient.
  void backward(MicroBatch micro = {});
  // The loss scale S of mixed-precision training in fp16: backward starts from S times the loss's
  // gradient, so small gradients stay above fp16's smallest numbers; the optimizer divides by S.
  void set_loss_scale(double scale) { loss_scale_ = scale; }
  double loss_scale() const { return loss_scale_; }
  // Drops what forward saved, for forward-only runs.
  void discard_activations();
  // Logits of the last forward [batch·ctx, vocab]; valid until backward or discard. A forward for a
  // backward whose logits exceed the chunk bytes makes them in chunks and keeps none (throws).
  const Tensor& logits() const;

 private:
  struct Layer;
  struct Saved;
  struct Keep;
  double loss_scale_ = 1.0;
  // An RMSNorm's output and row statistics.
  struct Normed {
    Allocation out, rstd;
  };
  // One layer's forward from its input x (moved into L.x), filling L with what `keep` keeps; returns
  // the layer's output. With `ln1` its first norm is already made (the previous layer's fused add);
  // with `next` (fusion) the final residual add also makes the norm that reads the output, the next
  // layer's ln1 or, after the last layer, ln_final, into *next.
  Allocation layer_forward(int l, Allocation x, Layer& L, const Keep& keep, Normed* ln1 = nullptr,
                           Normed* next = nullptr);
  template <typename T>
  void fill_initial_values(std::uint64_t seed);
  template <typename T>
  void local_part(std::size_t i, const T* whole, T* local) const;
  // Parameter i set from its whole values (its block of them where split; scratch holds the block).
  template <typename T>
  void upload_whole(std::size_t i, const T* whole, std::vector<T>& scratch);
  void fill_kept_initial_values(std::uint64_t seed, KeptInitialValues& kept);
  // act: compute dtype (GEMM operands and what lies between GEMMs); wide: the master dtype (the
  // residual stream and its gradient); stat: stats_dtype (row statistics, the loss).
  // Each passes its caller's line on to the allocation's tag.
  Allocation act(const char* what, int layer, Shape shape,
                 std::source_location where = std::source_location::current());
  Allocation wide(const char* what, int layer, Shape shape, MemKind kind = MemKind::activation,
                  std::source_location where = std::source_location::current());
  Allocation stat(const char* what, int layer, Shape shape, MemKind kind = MemKind::activation,
                  std::source_location where = std::source_location::current());
  // t itself when it already has the compute dtype, else a cast of it into scratch.
  const Tensor& as_compute(const Tensor& t, Allocation& scratch, const char* what, int layer,
                           std::source_location where = std::source_location::current());
  // The matmul operand of a weight: its low-precision copy, cast from the master when missing.
  const Tensor& weight(Parameter* p);
  // p's low-precision copy, allocated (not filled) if missing, whatever the copies' mode.
  Allocation& make_lowp_copy(Parameter& p);
  // The missing low-precision copies of these weights, made and cast in one cast_all under an op
  // range of their own: a layer that keeps its copies casts them at once (docs/speed.md).
  void cast_missing_lowp_copies(std::initializer_list<Parameter*> weights, OpRanges& op);
  // Frees the low-precision copies of weights whose last use in this backward is behind (each right
  // after its input-gradient GEMM): in the step's last micro-batch, or in every one when transient;
  // never when resident.
  void drop_lowp_copies(std::initializer_list<Parameter*> done);
  // Tells the hooks (in the last micro-batch) that these parameters' gradients are final.
  void gradients_done(std::initializer_list<Parameter*> done);
  // The same in a forward whose copies are transient (keep_copies false).
  void drop_lowp_copies_after_forward(bool keep_copies, std::initializer_list<Parameter*> done);
  void linear(const Tensor& x, const Tensor& w, const Tensor& y);
  void linear_backward_input(const Tensor& dy, const Tensor& w, const Tensor& dx, float beta);
  // add: into dw (gradient accumulation, or the LM head's chunks after the first).
  void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw, bool add);
  void linear_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& dw) {
    linear_backward_weight(dy, x, dw, accumulating_);
  }
  // Rows of logits per chunk in a forward for a backward: all of them while they take at most
  // kLogitChunksBeforeChunking chunks.
  std::int64_t logit_chunk_rows() const;
  // A parameter gradient from an op that overwrites its output (in f32 or f64: the norms' and the
  // embedding's): into the gradient itself, or, when accumulating or when gradients have another dtype
  // (bf16, under bf16 gradients or bf16 masters), into scratch of stats_dtype that is then added to it
  // or cast into it.
  template <typename Op>
  void parameter_gradient(Parameter* p, Op&& op);
  AttentionCall attention_call(int layer) const;
  // An RMSNorm's backward from dn, its input x and statistics, with the residual's gradient
  // dresidual added: dx = the norm's input gradient + dresidual (fused or not, as fusion_ says).
  // Fused under mixed precision, the same pass also makes dx in the compute dtype for the GEMMs of
  // layer `reader`, returned as that layer's "lowp_name" (what as_compute would cast there); with no
  // name, or otherwise, nothing is returned.
  Allocation norm_backward_add(Parameter* norm, const Tensor& dn, const Tensor& x, const Tensor& rstd,
                               const Tensor& dresidual, const Tensor& dx, const char* lowp_name, int reader,
                               std::source_location where = std::source_location::current());

  ModelConfig config_;
  Backend& backend_;
  DType dtype_, compute_, grad_dtype_;
  AttentionKind attention_;
  RecomputePlan recompute_;
  WeightCopies weight_copies_ = WeightCopies::kept;
  std::size_t logit_chunk_bytes_ = kLogitChunkBytes;
  bool graphs_ = false;
  bool fusion_ = false;
  std::vector<Parameter> params_;
  std::vector<Shape> whole_shapes_;       // per parameter: its shape in the whole model
  std::vector<StepHooks::Block> blocks_;  // per parameter: where this rank's block of it starts
  struct LayerParams {
    Parameter *wq, *wk, *wv, *wo, *ln1, *w1, *w2, *w3, *ln2;
  };
  // A stretch of a pass that reads these parameters: the hooks acquire them when it begins and release
  // them when it ends (on failure too).
  class HookedStretch {
   public:
    HookedStretch(StepHooks& hooks, std::span<Parameter* const> params, Pass pass)
        : hooks_(hooks), params_(params), pass_(pass) {
      hooks_.acquire(params_, pass_);
    }
    ~HookedStretch() { hooks_.release(params_, pass_); }
    HookedStretch(const HookedStretch&) = delete;
    HookedStretch& operator=(const HookedStretch&) = delete;

   private:
    StepHooks& hooks_;
    std::span<Parameter* const> params_;
    Pass pass_;
  };
  // Layer l's parameters, and with `next_norm` the norm after it (the fused residual add's): listed
  // once at construction, as are the embedding's and the head's, so no step builds the lists.
  const std::vector<Parameter*>& layer_parameters(int l, bool next_norm) const {
    return layer_stretches_[next_norm][static_cast<std::size_t>(l)];
  }
  std::vector<std::vector<Parameter*>> layer_stretches_[2];
  std::vector<Parameter*> embedding_stretch_, head_stretch_;
  std::vector<LayerParams> layer_params_;
  Parameter *embedding_, *ln_final_, *lm_head_;
  std::int64_t batch_ = 0, ctx_ = 0;
  Allocation ids_, targets_, loss_;
  std::vector<Saved> saved_;   // empty or one element: the last forward's activations
  bool accumulating_ = false;  // the backward under way adds into the gradients
  bool last_micro_batch_ = true;
  StepHooks* hooks_;  // never null: the default hooks when none are set
  // The hooks the model was made with (the default, or tensor parallelism's shapes); those set later
  // (data parallelism) size their buffers by the gradients' dtype.
  StepHooks* construction_hooks_;
};

}  // namespace lmscope
