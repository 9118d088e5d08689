#include "lmscope/model/transformer.h"
#include "lmscope/model/saved_activations.h"

#include "lmscope/core/hash.h"
#include "lmscope/core/rng.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <unordered_map>

namespace lmscope {

const char* weight_copies_name(WeightCopies c) {
  switch (c) {
    case WeightCopies::resident:
      return "resident";
    case WeightCopies::kept:
      return "kept";
    case WeightCopies::transient:
      return "transient";
  }
  return "?";
}

WeightCopies parse_weight_copies(const std::string& s) {
  for (WeightCopies c : {WeightCopies::resident, WeightCopies::kept, WeightCopies::transient})
    if (s == weight_copies_name(c)) return c;
  user_error("unknown --weight-copies '{}' (use kept, resident or transient)", s);
}

namespace {

// The hooks of a model no parallelism has hooked into: every call does nothing (no state).
StepHooks& no_hooks() {
  static StepHooks none;
  return none;
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, Backend& backend, DType dtype, std::optional<DType> compute,
                         AttentionKind attention, StepHooks* hooks)
    : config_(config),
      backend_(backend),
      dtype_(dtype),
      compute_(compute.value_or(dtype)),
      grad_dtype_(dtype),
      attention_(attention),
      hooks_(hooks ? hooks : &no_hooks()),
      construction_hooks_(hooks_) {
  config_.validate();
  LMSCOPE_CHECK(dtype_ != DType::bf16 || compute_ == DType::bf16, "bf16 masters compute in bf16, not {}",
                dtype_name(compute_));
  LMSCOPE_CHECK(dtype_ != DType::f16, "f16 masters");
  std::unordered_map<std::string, Parameter*> by_name;
  for (ParameterSpec& s : parameter_specs(config_)) {
    whole_shapes_.push_back(s.shape);
    blocks_.push_back(hooks_->local_block(s));
    s.shape = hooks_->local_shape(s);
    params_.push_back(Parameter{std::move(s), {}, {}, {}});
  }
  for (Parameter& p : params_) {
    p.value = backend_.allocator().allocate(p.spec.shape, dtype_, {MemKind::parameter, p.spec.name, p.spec.layer});
    by_name[p.spec.name] = &p;
  }
  for (int i = 0; i < config_.layers; ++i) {
    auto at = [&](const char* s) { return by_name.at("layers." + std::to_string(i) + "." + s); };
    layer_params_.push_back({at("attn.q_proj.weight"), at("attn.k_proj.weight"), at("attn.v_proj.weight"),
                             at("attn.output_proj.weight"), at("ln1.weight"), at("ffn.w1.weight"), at("ffn.w2.weight"),
                             at("ffn.w3.weight"), at("ln2.weight")});
  }
  embedding_ = by_name.at("token_embeddings.weight");
  ln_final_ = by_name.at("ln_final.weight");
  lm_head_ = by_name.at("lm_head.weight");
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParams& P = layer_params_[l];
    std::vector<Parameter*> ps{P.ln1, P.wq, P.wk, P.wv, P.wo, P.ln2, P.w1, P.w3, P.w2};
    layer_stretches_[0].push_back(ps);
    ps.push_back(l + 1 == config_.layers ? ln_final_ : layer_params_[l + 1].ln1);
    layer_stretches_[1].push_back(std::move(ps));
  }
  embedding_stretch_ = {embedding_};
  head_stretch_ = {ln_final_, lm_head_};
  loss_ = stat("loss", -1, {1}, MemKind::workspace);
}

Transformer::~Transformer() = default;

Parameter& Transformer::parameter(const std::string& name) {
  for (Parameter& p : params_)
    if (p.spec.name == name) return p;
  user_error("the model has no parameter named '{}'", name);
}

void Transformer::init_parameters(std::uint64_t seed, KeptInitialValues* kept) {
  if (dtype_ == DType::f64)
    fill_initial_values<double>(seed);
  else if (kept)
    fill_kept_initial_values(seed, *kept);
  else
    fill_initial_values<float>(seed);
  refresh_lowp_copies();
}

void Transformer::set_recompute(const RecomputePlan& r) {
  r.validate(config_.layers);
  recompute_ = r;
}

void Transformer::set_weight_copies(WeightCopies c) {
  weight_copies_ = c;
  if (c == WeightCopies::transient)
    for (Parameter& p : params_) p.value_lowp.reset();
}

// Kept and resident copies are made here, after the masters and side by side (initialising or
// loading comes right after construction): kept ones the backward frees merge into blocks its
// gradients can use.
void Transformer::refresh_lowp_copies() {
  for (Parameter& p : params_)
    if (p.value.empty()) {
      continue;  // sharded away (ZeRO-3): a stretch that reads it gathers its copy
    } else if (Allocation& copy = lowp_copy(p); !copy.empty()) {
      backend_.cast(p.value, copy);
    }
}

Allocation& Transformer::lowp_copy(Parameter& p) {
  const bool adamw_writes =
      weight_copies_ == WeightCopies::resident || (weight_copies_ == WeightCopies::kept && !graphs());
  return adamw_writes ? make_lowp_copy(p) : p.value_lowp;
}

Allocation& Transformer::make_lowp_copy(Parameter& p) {
  if (p.value_lowp.empty() && p.spec.matmul && compute_ != dtype_)
    p.value_lowp = backend_.allocator().allocate(
        p.spec.shape, compute_,
        {MemKind::parameter, p.spec.name + " (" + dtype_name(compute_) + " copy)", p.spec.layer});
  return p.value_lowp;
}

void Transformer::cast_missing_lowp_copies(std::initializer_list<Parameter*> weights, OpRanges& op) {
  if (compute_ == dtype_) return;
  std::vector<Tensor> masters, copies;
  for (Parameter* p : weights)
    if (p->spec.matmul && p->value_lowp.empty()) {
      masters.push_back(p->value.tensor());
      copies.push_back(make_lowp_copy(*p).tensor());
    }
  if (masters.empty()) return;
  op.next("weight copies");
  backend_.cast_all(masters, copies);
}

void Transformer::set_grad_dtype(DType t) {
  if (t != dtype_ && !(t == DType::bf16 && compute_ == DType::bf16))
    user_error(
        "gradients in {} need --precision bf16 (the weight-gradient GEMMs then write bf16); this model computes "
        "in {}",
        dtype_name(t), dtype_name(compute_));
  for (const Parameter& p : params_)
    LMSCOPE_CHECK(p.grad.empty(), "the gradients' dtype set while {} has a gradient", p.spec.name);
  LMSCOPE_CHECK(hooks_ == construction_hooks_, "the gradients' dtype set after a parallelism sized its buffers");
  grad_dtype_ = t;
}

const Tensor& Transformer::gradient(Parameter& p) {
  if (!p.grad.empty()) return p.grad;
  const GradientParts g = hooks_->gradient_parts();
  if (g.parts == 1) {
    p.grad = backend_.allocator().allocate(p.spec.shape, grad_dtype_, {MemKind::gradient, p.spec.name, p.spec.layer});
  } else {
    const std::int64_t n = shape_numel(p.spec.shape);
    p.grad = backend_.allocator().allocate({g.parts, n}, grad_dtype_, {MemKind::gradient, p.spec.name, p.spec.layer});
    p.grad.narrow(p.grad.block().rows(g.part, 1).view(p.spec.shape));
  }
  return p.grad;
}

void Transformer::set_hooks(StepHooks* hooks) {
  StepHooks* next = hooks ? hooks : &no_hooks();
  const GradientParts g = next->gradient_parts(), now = hooks_->gradient_parts();
  LMSCOPE_CHECK(g.parts >= 1 && g.part >= 0 && g.part < g.parts, "gradient part {} of {}", g.part, g.parts);
  const bool relaid = g.parts != now.parts || g.part != now.part;
  for (const Parameter& p : params_) {
    LMSCOPE_CHECK(!relaid || p.grad.empty(), "the gradients laid out anew while {} has one", p.spec.name);
    LMSCOPE_CHECK(next->local_shape(p.spec) == p.spec.shape,
                  "hooks that change {}'s shape must be given when the model is made", p.spec.name);
  }
  hooks_ = next;
}

const Tensor& Transformer::weight(Parameter* p) {
  if (!p->value_lowp.empty() || !p->spec.matmul || compute_ == dtype_)
    return p->value_lowp.empty() ? p->value.tensor() : p->value_lowp.tensor();
  backend_.cast(p->value, make_lowp_copy(*p));
  return p->value_lowp;
}

void Transformer::gradients_done(std::initializer_list<Parameter*> done) {
  if (!last_micro_batch_) return;
  for (Parameter* p : done) hooks_->gradient_ready(static_cast<std::size_t>(p - params_.data()));
}

void Transformer::drop_lowp_copies(std::initializer_list<Parameter*> done) {
  if (weight_copies_ == WeightCopies::resident) return;
  if (last_micro_batch_ || weight_copies_ == WeightCopies::transient)
    for (Parameter* p : done) p->value_lowp.reset();
}

void Transformer::drop_lowp_copies_after_forward(bool keep_copies, std::initializer_list<Parameter*> done) {
  if (!keep_copies)
    for (Parameter* p : done) p->value_lowp.reset();
}

namespace {

// Tensor `name`'s n initial values (MODEL.md): chunk k of 65536 draws from stream "<name>/k", the
// chunks in parallel.
template <typename T>
void draw_initial_values(std::uint64_t seed, const std::string& name, double init_std, std::int64_t n, T* out) {
  constexpr std::int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t start = 0; start < n; start += kChunk) {
    Rng rng = Rng::stream(seed, name + "/" + std::to_string(start / kChunk));
    for (std::int64_t i = start; i < std::min(n, start + kChunk); ++i)
      out[i] = static_cast<T>(init_std > 0 ? init_std * rng.truncated_normal(3.0) : 1.0);
  }
}

}  // namespace

bool Transformer::split(std::size_t i) const { return params_.at(i).spec.shape != whole_shapes_.at(i); }

template <typename T>
void Transformer::local_part(std::size_t i, const T* whole, T* local) const {
  const Shape& w = whole_shapes_.at(i);
  const Shape& l = params_.at(i).spec.shape;
  LMSCOPE_CHECK(w.size() == 2 && l.size() == 2, "a split parameter of {} dimensions", w.size());
  const StepHooks::Block b = blocks_.at(i);
  for (std::int64_t r = 0; r < l[0]; ++r) std::copy_n(whole + (b.row + r) * w[1] + b.col, l[1], local + r * l[1]);
}

std::vector<double> Transformer::local_values(std::size_t i, std::span<const double> whole) const {
  LMSCOPE_CHECK(static_cast<std::int64_t>(whole.size()) == shape_numel(whole_shapes_.at(i)), "values of {}",
                params_.at(i).spec.name);
  if (!split(i)) return {whole.begin(), whole.end()};
  std::vector<double> local(static_cast<std::size_t>(shape_numel(params_[i].spec.shape)));
  local_part(i, whole.data(), local.data());
  return local;
}

std::vector<double> Transformer::whole_values(std::size_t i) { return whole_values(i, params_.at(i).value); }

std::vector<double> Transformer::whole_values(std::size_t i, const Tensor& local) {
  LMSCOPE_CHECK(local.shape == params_.at(i).spec.shape, "values of {} in shape {}", params_[i].spec.name,
                shape_str(local.shape));
  if (!split(i)) return download(backend_, local);
  ParameterSpec whole = params_[i].spec;
  whole.shape = whole_shapes_[i];
  return hooks_->whole_values(whole, local);
}

template <typename T>
void Transformer::upload_whole(std::size_t i, const T* whole, std::vector<T>& scratch) {
  Parameter& p = params_[i];
  const T* values = whole;
  if (split(i)) {
    scratch.resize(static_cast<std::size_t>(shape_numel(p.spec.shape)));
    local_part(i, whole, scratch.data());
    values = scratch.data();
  }
  if constexpr (std::is_same_v<T, float>)
    upload_host(backend_, p.value, values);  // rounded into bf16 masters
  else
    backend_.copy_from_host(p.value, values);
}

template <typename T>
void Transformer::fill_initial_values(std::uint64_t seed) {
  std::int64_t largest = 0;
  for (const Shape& s : whole_shapes_) largest = std::max(largest, shape_numel(s));
  std::vector<T> host(static_cast<std::size_t>(largest)), local;  // one staging buffer for every tensor
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    draw_initial_values(seed, p.spec.name, p.spec.init_std, shape_numel(whole_shapes_[i]), host.data());
    upload_whole(i, host.data(), local);
  }
}

void Transformer::fill_kept_initial_values(std::uint64_t seed, KeptInitialValues& kept) {
  const auto same = [&](std::size_t i) {
    const auto it = kept.tensors.find(params_[i].spec.name);
    return it != kept.tensors.end() && it->second.numel == shape_numel(whole_shapes_[i]) &&
           it->second.init_std == params_[i].spec.init_std;
  };
  bool all_same = kept.seed == seed && kept.tensors.size() == params_.size();
  for (std::size_t i = 0; all_same && i < params_.size(); ++i) all_same = same(i);
  if (!all_same) {
    kept.tensors.clear();  // another model or seed: one model's values at a time
    // Drawn aside and moved in whole, so a draw that fails (out of host memory) leaves nothing kept.
    std::unordered_map<std::string, KeptInitialValues::Drawn> drawn;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Parameter& p = params_[i];
      KeptInitialValues::Drawn t{shape_numel(whole_shapes_[i]), p.spec.init_std, nullptr};
      t.values = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(t.numel));
      draw_initial_values(seed, p.spec.name, t.init_std, t.numel, t.values.get());
      drawn.emplace(p.spec.name, std::move(t));
    }
    kept.tensors = std::move(drawn);
    kept.seed = seed;
  }
  std::vector<float> local;
  for (std::size_t i = 0; i < params_.size(); ++i)
    upload_whole(i, kept.tensors.at(params_[i].spec.name).values.get(), local);
}

Allocation Transformer::act(const char* what, int layer, Shape shape, std::source_location where) {
  return backend_.allocator().allocate(std::move(shape), compute_, {MemKind::activation, what, layer}, where);
}

Allocation Transformer::wide(const char* what, int layer, Shape shape, MemKind kind, std::source_location where) {
  return backend_.allocator().allocate(std::move(shape), dtype_, {kind, what, layer}, where);
}

Allocation Transformer::stat(const char* what, int layer, Shape shape, MemKind kind, std::source_location where) {
  return backend_.allocator().allocate(std::move(shape), stats_dtype(), {kind, what, layer}, where);
}

const Tensor& Transformer::as_compute(const Tensor& t, Allocation& scratch, const char* what, int layer,
                                      std::source_location where) {
  if (t.dtype == compute_) return t;
  scratch = act(what, layer, t.shape, where);
  backend_.cast(t, scratch);
  return scratch.tensor();
}

void Transformer::set_batch(std::int64_t batch, std::int64_t ctx, const std::int32_t* ids,
                            const std::int32_t* targets) {
  if (batch != batch_ || ctx != ctx_ || ids_.empty()) {
    batch_ = batch;
    ctx_ = ctx;
    ids_ = backend_.allocator().allocate({batch * ctx}, DType::i32, {MemKind::input, "token_ids", -1});
    targets_ = backend_.allocator().allocate({batch * ctx}, DType::i32, {MemKind::input, "targets", -1});
  }
  backend_.copy_from_host(ids_, ids);
  backend_.copy_from_host(targets_, targets);
}

// y [N, out] = x [N, in] · Wᵀ, W [out, in].
void Transformer::linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const std::int64_t in = w.dim(1), out = w.dim(0), n = x.numel() / in;
  backend_.gemm(GemmArgs::packed(false, true, n, out, in, x, w, y));
}

AttentionCall Transformer::attention_call(int layer) const {
  return {.kind = attention_, .causal = true, .dq = FlashDq::deterministic, .stats = stats_dtype(), .layer = layer};
}

Allocation Transformer::layer_forward(int l, Allocation x, Layer& L, const Keep& keep, Normed* ln1, Normed* next) {
  auto drop_unless = [](bool kept, Allocation& a) {
    if (!kept) a.reset();
  };
  const LayerParams& P = layer_params_[l];
  // The layer's local shapes come from its weights' specs (StepHooks::local_shape): this rank's heads and
  // feed-forward width, the whole of them without tensor parallelism.
  const std::int64_t B = batch_, T = ctx_, N = B * T, d = config_.d_model, dk = config_.d_head(),
                     H = P.wq->spec.shape[0] / dk, f = P.w1->spec.shape[0];
  const double theta = config_.rope_theta, eps = 1e-5;
  OpRanges op(backend_.range_listener());
  L.x = std::move(x);
  if (ln1) {
    L.rstd1 = std::move(ln1->rstd);
    L.n1 = std::move(ln1->out);
  } else {
    op.next("ln1");
    L.rstd1 = stat("ln1.rstd", l, {N});
    L.n1 = act("ln1.out", l, {N, d});
    backend_.rmsnorm_forward(L.x, P.ln1->value, L.n1, L.rstd1, eps);
  }
  drop_unless(keep.statistics, L.rstd1);
  // Whenever the layer keeps its copies (kept and resident ones, and every copy in a full-recompute
  // rerun), the missing ones are made here, all in one cast_all rather than each where first used:
  // kept copies under device graphs, which each forward makes. Otherwise (transient copies in a
  // forward) each is cast where used and freed right after.
  if (keep.weight_copies) cast_missing_lowp_copies({P.wq, P.wk, P.wv, P.wo, P.w1, P.w3, P.w2}, op);

  op.next("q, k, v projections and RoPE");
  // Each head split right after its product, most likely still in L2: the three products first and
  // one launch for the three splits took the forward's head moves 13% longer at large ctx 1024 on an
  // H100 (0.92 → 1.04 ms a step), where the backward's merges gained from one launch.
  Allocation proj = act("attn.proj", l, {N, H * dk});
  Allocation* heads[3] = {&L.q, &L.k, &L.v};
  const char* names[3] = {"attn.q", "attn.k", "attn.v"};
  Parameter* weights[3] = {P.wq, P.wk, P.wv};
  for (int i = 0; i < 3; ++i) {
    linear(L.n1, weight(weights[i]), proj);
    drop_lowp_copies_after_forward(keep.weight_copies, {weights[i]});
    *heads[i] = act(names[i], l, {B, H, T, dk});
    backend_.split_heads(proj.tensor().view({B, T, H, dk}), *heads[i], i < 2 ? theta : 0.0);
  }
  proj.reset();
  drop_unless(keep.norm_outputs, L.n1);

  op.next("attention");
  {
    Allocation o_heads = act("attn.o_heads", l, {B, H, T, dk});
    const Shape flat{B * H, T, dk};
    attention_forward(backend_, attention_call(l), L.q.tensor().view(flat), L.k.tensor().view(flat),
                      L.v.tensor().view(flat), o_heads.tensor().view(flat), L.attn);
    for (Allocation* a : {&L.q, &L.k, &L.v, &L.attn.probs, &L.attn.lse}) drop_unless(keep.attention, *a);
    L.o = act("attn.o", l, {N, H * dk});
    backend_.merge_heads(o_heads, L.o.tensor().view({B, T, H, dk}), 0.0);
  }
  op.next("output projection and residual");
  Allocation attn_out = act("attn.out", l, {N, d});
  linear(L.o, weight(P.wo), attn_out);
  hooks_->partial_sum(attn_out, PartialSum::attention_output, l);
  drop_lowp_copies_after_forward(keep.weight_copies, {P.wo});
  drop_unless(keep.attention, L.o);
  L.h = wide("attn.residual", l, {N, d});
  if (fusion_) {  // the residual add and ln2 in one pass
    op.next("residual and ln2");
    L.rstd2 = stat("ln2.rstd", l, {N});
    L.n2 = act("ln2.out", l, {N, d});
    backend_.add_rmsnorm_forward(L.x, attn_out, L.h, P.ln2->value, L.n2, L.rstd2, eps);
    attn_out.reset();
    drop_unless(keep.input, L.x);
  } else {
    backend_.add(L.x, attn_out, L.h);
    attn_out.reset();
    drop_unless(keep.input, L.x);
    op.next("ln2");
    L.rstd2 = stat("ln2.rstd", l, {N});
    L.n2 = act("ln2.out", l, {N, d});
    backend_.rmsnorm_forward(L.h, P.ln2->value, L.n2, L.rstd2, eps);
  }
  drop_unless(keep.statistics, L.rstd2);
  op.next("w1, w3");
  L.a = act("ffn.w1_out", l, {N, f});
  L.b = act("ffn.w3_out", l, {N, f});
  linear(L.n2, weight(P.w1), L.a);
  linear(L.n2, weight(P.w3), L.b);
  drop_lowp_copies_after_forward(keep.weight_copies, {P.w1, P.w3});
  drop_unless(keep.norm_outputs, L.n2);
  op.next("SwiGLU");
  L.gate = act("ffn.gate", l, {N, f});
  backend_.swiglu_forward(L.a, L.b, L.gate);
  drop_unless(keep.ffn_products, L.a);
  drop_unless(keep.ffn_products, L.b);
  op.next("w2 and residual");
  Allocation ffn_out = act("ffn.out", l, {N, d});
  linear(L.gate, weight(P.w2), ffn_out);
  hooks_->partial_sum(ffn_out, PartialSum::ffn_output, l);
  drop_lowp_copies_after_forward(keep.weight_copies, {P.w2});
  drop_unless(keep.gate, L.gate);
  Allocation out = wide("ffn.residual", l, {N, d});
  if (next) {  // the residual add and the norm after it in one pass
    const bool last = l + 1 == config_.layers;
    op.next(last ? "residual and ln_final" : "residual and next ln1");
    next->rstd = stat(last ? "ln_final.rstd" : "ln1.rstd", last ? -1 : l + 1, {N});
    next->out = act(last ? "ln_final.out" : "ln1.out", last ? -1 : l + 1, {N, d});
    const Parameter& norm = last ? *ln_final_ : *layer_params_[l + 1].ln1;
    backend_.add_rmsnorm_forward(L.h, ffn_out, out, norm.value, next->out, next->rstd, eps);
  } else {
    backend_.add(L.h, ffn_out, out);
  }
  ffn_out.reset();
  drop_unless(keep.residual, L.h);
  return out;
}

std::uint64_t Transformer::graph_key(const char* phase) const {
  std::uint64_t h = hash_mix(reinterpret_cast<std::uintptr_t>(this), reinterpret_cast<std::uintptr_t>(phase));
  for (std::uint64_t w : {std::uint64_t(batch_), std::uint64_t(ctx_), std::uint64_t(recompute_.at(0)),
                          std::uint64_t(recompute_.at(config_.layers - 1)), std::uint64_t(recompute_.first_layers()),
                          std::uint64_t(weight_copies_), std::uint64_t(logit_chunk_bytes_), std::uint64_t(fusion_),
                          std::uint64_t(grad_dtype_)})
    h = hash_mix(h, w);
  for (const Parameter& p : params_)
    for (const Allocation* a : {&p.value, &p.value_lowp, &p.grad})
      h = hash_mix(h, reinterpret_cast<std::uintptr_t>(a->tensor().data));
  for (const Allocation* a : {&ids_, &targets_, &loss_})
    h = hash_mix(h, reinterpret_cast<std::uintptr_t>(a->tensor().data));
  return h;
}

void Transformer::forward(bool for_backward) {
  LMSCOPE_CHECK(!ids_.empty(), "forward before set_batch");
  discard_activations();
  GraphScope graph(backend_, graphs(), hash_mix(graph_key("forward"), std::uint64_t{for_backward}));
  // Without a backward to come, each buffer goes as soon as it has been read, as under PyTorch's
  // no_grad; the layer's record then holds nothing once its output is made.
  auto done = [&](Allocation& a) {
    if (!for_backward) a.reset();
  };
  const std::int64_t N = batch_ * ctx_, d = config_.d_model;
  const double eps = 1e-5;
  backend_.allocator().set_phase(Phase::forward);
  RangeListener* ranges = backend_.range_listener();
  Saved s;
  Allocation x = wide("embedding", -1, {N, d});
  {
    HookedStretch hooked(*hooks_, embedding_stretch_, Pass::forward);
    ScopedRange r(ranges, RangeLevel::op, "embedding");
    backend_.embedding_forward(ids_, embedding_->value, x);
  }
  // With fusion each layer's last residual add also makes the norm after it (docs/speed.md): the
  // next layer's ln1, which that layer takes from `normed` before writing its own successor's there.
  Normed normed;
  for (int l = 0; l < config_.layers; ++l) {
    ScopedRange r(ranges, RangeLevel::layer, "layer", l);
    HookedStretch hooked(*hooks_, layer_parameters(l, fusion_), Pass::forward);
    Layer L;
    const Keep keep = Keep::for_forward(for_backward, recompute_.at(l), weight_copies_);
    x = layer_forward(l, std::move(x), L, keep, l > 0 && fusion_ ? &normed : nullptr, fusion_ ? &normed : nullptr);
    if (for_backward) s.layers.push_back(std::move(L));
  }

  std::optional<HookedStretch> head(std::in_place, *hooks_, head_stretch_, Pass::forward);
  OpRanges op(ranges);
  s.x_final = std::move(x);
  if (fusion_) {
    s.rstd_final = std::move(normed.rstd);
    s.n_final = std::move(normed.out);
  } else {
    op.next("ln_final");
    s.rstd_final = stat("ln_final.rstd", -1, {N});
    s.n_final = act("ln_final.out", -1, {N, d});
    backend_.rmsnorm_forward(s.x_final, ln_final_->value, s.n_final, s.rstd_final, eps);
  }
  done(s.x_final);
  done(s.rstd_final);
  op.next("lm_head and loss");
  s.lse = stat("loss.lse", -1, {N});
  const std::int64_t rows = for_backward ? logit_chunk_rows() : N;
  if (rows >= N) {
    s.logits = act("lm_head.logits", -1, {N, config_.vocab});
    linear(s.n_final, weight(lm_head_), s.logits);
    backend_.cross_entropy_forward(s.logits, targets_, s.lse, loss_);
  } else {
    // The logits in chunks of rows, each gone once its loss is summed; the backward makes them again.
    for (std::int64_t r = 0; r < N; r += rows) {
      const std::int64_t n = std::min(rows, N - r);
      Allocation chunk = act("lm_head.logits", -1, {n, config_.vocab});
      linear(s.n_final.tensor().rows(r, n), weight(lm_head_), chunk);
      backend_.cross_entropy_forward(chunk, targets_.tensor().rows(r, n), s.lse.tensor().rows(r, n), loss_,
                                     1.0 / static_cast<double>(N), r > 0);
    }
  }
  drop_lowp_copies_after_forward(weight_copies_ != WeightCopies::transient, {lm_head_});
  head.reset();
  done(s.n_final);
  done(s.lse);
  s.for_backward = for_backward;
  s.graph_key = graph.key();
  saved_.push_back(std::move(s));
  op.done();  // the graph's launch belongs to the phase, not to its last op
  graph.end();
}

double Transformer::read_loss() { return read_scalar(backend_, loss_); }

const Tensor& Transformer::logits() const {
  LMSCOPE_CHECK(!saved_.empty(), "logits read without a forward");
  LMSCOPE_CHECK(!saved_.back().logits.empty(), "the logits of this forward were made in chunks and not kept");
  return saved_.back().logits;
}

std::int64_t Transformer::logit_chunk_rows() const {
  const std::int64_t row_bytes = config_.vocab * static_cast<std::int64_t>(dtype_size(compute_));
  const std::int64_t n = batch_ * ctx_;
  if (n * row_bytes <= kLogitChunksBeforeChunking * static_cast<std::int64_t>(logit_chunk_bytes_)) return n;
  const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(logit_chunk_bytes_) / row_bytes);
  return rows >= 128 ? rows / 128 * 128 : rows;
}

void Transformer::discard_activations() { saved_.clear(); }

}  // namespace lmscope
