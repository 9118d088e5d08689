#include "lmscope/run/run_spec.h"

#include "lmscope/backend/backend.h"
#include "lmscope/core/error.h"
#include "lmscope/core/json_kind.h"
#include "lmscope/run/mode_words.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include <algorithm>
#include <cmath>

namespace lmscope {
namespace {

// No device holds a step past this, and sizes past it overflow 64 bits in the allocator's and the dry
// run's sums; train --batch 10^12 ran out of host memory in the batch's own buffers instead.
constexpr double kMaxStepBytes = static_cast<double>(std::int64_t(1) << 50);

// About what a rank's micro-batch keeps for its backward, in fp32 (design.md's table: 8·d + 3·d_ff
// + 2 values per token and layer, the naive attention's h·T² probabilities or flash's h·T, the head's
// logits), in doubles so that no size overflows on the way.
double step_activation_bytes(const RunSpec& s) {
  const ModelConfig& m = s.model;
  const int shares = s.parallel.data ? std::max(1, s.parallel.world.size) : 1;  // tensor parallelism: every row
  const double rows = std::ceil(static_cast<double>(s.batch) / shares);
  const double t = static_cast<double>(s.ctx), tokens = rows * t, heads = static_cast<double>(m.heads);
  const double per_layer = tokens * static_cast<double>(8 * m.d_model + 3 * m.d_ff + 2) +
                           rows * heads * t * (s.attention == AttentionKind::naive ? t : 1.0);
  return 4 * (static_cast<double>(m.layers) * per_layer + tokens * static_cast<double>(m.d_model + m.vocab + 1));
}

}  // namespace

const char* grad_dtype_name(DType grad_dtype) { return grad_dtype == DType::bf16 ? "bf16" : "fp32"; }

DType parse_grad_dtype(const std::string& name) {
  if (name != "fp32" && name != "bf16") user_error("unknown --grad-dtype '{}' (use fp32 or bf16)", name);
  return gradient_dtype(name);
}

const char* master_dtype_name(DType master_dtype) { return master_dtype == DType::bf16 ? "bf16" : "fp32"; }

DType parse_master_dtype(const std::string& name) {
  if (name != "fp32" && name != "bf16") user_error("unknown --master-dtype '{}' (use fp32 or bf16)", name);
  return name == "bf16" ? DType::bf16 : DType::f32;
}

int RunSpec::exchange_sms() const {
  return parallel.data && device == "cuda" && parallel.world.size > 1 ? parallel.data->exchange_sms() : 0;
}

std::string RunSpec::label() const {
  std::string label = mode_words({.mode = step_mode_name(mode),
                                  .recompute = recompute_name(recompute),
                                  .grad_accum = micro_batches(),
                                  .weight_copies = weight_copies_name(weight_copies),
                                  .grad_dtype = grad_dtype_name(grad_dtype),
                                  .master_dtype = master_dtype_name(master_dtype),
                                  .graphs_off_on_cuda = !graphs && device == "cuda",
                                  .fusion = fusion});
  if (parallel.tp > 1) label += fmt::format(", {}, {} ranks", parallel.words(), parallel.world.size);
  if (parallel.data) {
    label += ", " + parallel.words();
    if (exchange_sms() > 0) label += fmt::format(", exchange on {} SMs", exchange_sms());
    label += fmt::format(", {} rank{}", parallel.world.size, parallel.world.size == 1 ? "" : "s");
  }
  return label;
}

nlohmann::ordered_json model_json(const ModelConfig& m) {
  return {{"name", m.name},
          {"d_model", m.d_model},
          {"d_ff", m.d_ff},
          {"layers", m.layers},
          {"heads", m.heads},
          {"vocab", m.vocab},
          {"rope_theta", m.rope_theta},
          {"parameters", m.parameter_count()}};
}

namespace {

// A field of a run's description by its kind, or UserError naming it (its path from the top, as
// "optimizer.lr") and what it holds: the JSON library's own words name neither.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {
    if (!j_.is_object()) user_error("a run's description gives {} the value {}, not an object", where(), j_.dump());
  }
  const nlohmann::json& at(const char* key) const {
    if (!j_.contains(key)) user_error("a run's description has no {}", path(key));
    return j_.at(key);
  }
  Fields object(const char* key) const { return Fields(at(key), path(key)); }
  template <typename T>
  T get(const char* key) const {
    const nlohmann::json& v = at(key);
    if (!json_holds<T>(v)) wrong(key, v, json_kind_words<T>());
    return v.get<T>();
  }
  bool is_null(const char* key) const { return at(key).is_null(); }
  bool has(const char* key) const { return j_.contains(key); }

 private:
  std::string path(const char* key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  std::string where() const { return prefix_.empty() ? "itself" : prefix_; }
  [[noreturn]] void wrong(const char* key, const nlohmann::json& v, const std::string& kind) const {
    user_error("a run's description gives {} the value {}, which is not {}", path(key), v.dump(), kind);
  }
  const nlohmann::json& j_;
  std::string prefix_;
};

ModelConfig model_from_fields(const Fields& f) {
  ModelConfig c;
  c.name = f.get<std::string>("name");
  c.d_model = f.get<std::int64_t>("d_model");
  c.d_ff = f.get<std::int64_t>("d_ff");
  c.layers = f.get<std::int64_t>("layers");
  c.heads = f.get<std::int64_t>("heads");
  c.vocab = f.get<std::int64_t>("vocab");
  c.rope_theta = f.get<double>("rope_theta");
  return c;
}

}  // namespace

ModelConfig model_from_json(const nlohmann::json& j) { return model_from_fields(Fields(j, "model")); }

nlohmann::ordered_json RunSpec::to_json() const {
  nlohmann::ordered_json j{{"model", model_json(model)},
                           {"mode", step_mode_name(mode)},
                           {"batch", batch},
                           {"ctx", ctx},
                           {"grad_accum", grad_accum},
                           {"device", device},
                           {"precision", precision},
                           {"attention", attention_name(attention)},
                           {"recompute", recompute_name(recompute)},
                           {"weight_copies", weight_copies_name(weight_copies)},
                           {"grad_dtype", grad_dtype_name(grad_dtype)},
                           {"master_dtype", master_dtype_name(master_dtype)},
                           {"graphs", graphs},
                           {"fusion", fusion},
                           {"seed", seed},
                           {"optimizer",
                            {{"lr", optimizer.lr},
                             {"beta1", optimizer.beta1},
                             {"beta2", optimizer.beta2},
                             {"eps", optimizer.eps},
                             {"weight_decay", optimizer.weight_decay},
                             {"clip", optimizer.clip},
                             {"loss_scale", optimizer.loss_scaling.initial},
                             {"loss_scale_interval", optimizer.loss_scaling.interval}}},
                           {"schedule",
                            {{"kind", schedule.cosine ? "cosine" : "constant"},
                             {"lr_max", schedule.lr_max},
                             {"lr_min", schedule.lr_min},
                             {"warmup_iters", schedule.warmup_iters},
                             {"cosine_iters", schedule.cosine_iters}}},
                           {"world_size", parallel.world.size},
                           {"tensor_parallel", parallel.tp},
                           {"data_parallel", nullptr}};
  if (parallel.data) {
    const parallel::DataParallelSpec& p = *parallel.data;
    j["data_parallel"] = {
        {"ddp", parallel::ddp_mode_name(p.mode)},
        {"grad_exchange", parallel::grad_exchange_name(p.exchange)},
        {"bucket_mb", p.bucket_mb},
        {"zero", p.zero},
        {"symmetric_memory", p.symmetric_memory},
        {"comm_sms", p.comm_sms == parallel::DataParallelSpec::kAutoCommSms ? nlohmann::ordered_json("auto")
                                                                            : nlohmann::ordered_json(p.comm_sms)}};
  }
  return j;
}

nlohmann::ordered_json RunSpec::row() const {
  nlohmann::ordered_json j{{"model", model_json(model)},
                           {"device", device},
                           {"precision", precision},
                           {"attention", attention_name(attention)},
                           {"mode", step_mode_name(mode)},
                           {"recompute", recompute_name(recompute)},
                           {"grad_accum", grad_accum},
                           {"weight_copies", weight_copies_name(weight_copies)},
                           {"grad_dtype", grad_dtype_name(grad_dtype)},
                           {"master_dtype", master_dtype_name(master_dtype)},
                           {"graphs", graphs},
                           {"fusion", fusion},
                           {"batch", batch},
                           {"ctx", ctx}};
  if (parallel.data) {
    const parallel::DataParallelSpec& p = *parallel.data;
    auto unless_zero = [&](const char* word) {
      return p.zero ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(word);
    };
    j["data_parallel"] = {{"world_size", parallel.world.size},
                          {"ddp", unless_zero(parallel::ddp_mode_name(p.mode))},
                          {"grad_exchange", unless_zero(parallel::grad_exchange_name(p.exchange))},
                          {"zero", p.zero},
                          {"bucket_mb", p.bucket_mb},
                          {"symmetric_memory", p.zero == 0 && p.symmetric_memory},
                          {"comm_sms", exchange_sms()}};
  }
  if (parallel.tp > 1) j["tensor_parallel"] = {{"world_size", parallel.world.size}, {"tp", parallel.tp}};
  return j;
}

RunSpec RunSpec::from_json(const nlohmann::json& j) {
  const Fields f(j, "");
  RunSpec s;
  s.model = model_from_fields(f.object("model"));
  s.mode = parse_step_mode(f.get<std::string>("mode"));
  s.batch = f.get<std::int64_t>("batch");
  s.ctx = f.get<std::int64_t>("ctx");
  s.grad_accum = f.get<int>("grad_accum");
  s.device = f.get<std::string>("device");
  s.precision = f.get<std::string>("precision");
  check_precision(s.precision);
  s.attention = parse_attention(f.get<std::string>("attention"));
  s.recompute = parse_recompute(f.get<std::string>("recompute"));
  s.weight_copies = parse_weight_copies(f.get<std::string>("weight_copies"));
  s.grad_dtype = parse_grad_dtype(f.get<std::string>("grad_dtype"));
  // Absent from descriptions written before bf16 masters were possible: fp32.
  if (f.has("master_dtype")) s.master_dtype = parse_master_dtype(f.get<std::string>("master_dtype"));
  s.graphs = f.get<bool>("graphs");
  s.fusion = f.get<bool>("fusion");
  s.seed = f.get<std::uint64_t>("seed");
  const Fields o = f.object("optimizer");
  s.optimizer.lr = o.get<double>("lr");
  s.optimizer.beta1 = o.get<double>("beta1");
  s.optimizer.beta2 = o.get<double>("beta2");
  s.optimizer.eps = o.get<double>("eps");
  s.optimizer.weight_decay = o.get<double>("weight_decay");
  s.optimizer.clip = o.get<double>("clip");
  s.optimizer.loss_scaling.initial = o.get<double>("loss_scale");
  s.optimizer.loss_scaling.interval = o.get<std::int64_t>("loss_scale_interval");
  const Fields l = f.object("schedule");
  const std::string kind = l.get<std::string>("kind");
  if (kind != "constant" && kind != "cosine") user_error("unknown schedule '{}' in a run's description", kind);
  s.schedule.cosine = kind == "cosine";
  s.schedule.lr_max = l.get<double>("lr_max");
  s.schedule.lr_min = l.get<double>("lr_min");
  s.schedule.warmup_iters = l.get<std::int64_t>("warmup_iters");
  s.schedule.cosine_iters = l.get<std::int64_t>("cosine_iters");
  s.parallel.world.size = f.get<int>("world_size");
  if (f.has("tensor_parallel")) s.parallel.tp = f.get<int>("tensor_parallel");  // absent before it was built
  if (!f.is_null("data_parallel")) {
    const Fields p = f.object("data_parallel");
    parallel::DataParallelSpec d;
    d.mode = parallel::parse_ddp_mode(p.get<std::string>("ddp"));
    d.exchange = parallel::parse_grad_exchange(p.get<std::string>("grad_exchange"));
    d.bucket_mb = p.get<double>("bucket_mb");
    d.zero = p.get<int>("zero");
    d.symmetric_memory = p.get<bool>("symmetric_memory");
    d.comm_sms = p.at("comm_sms") == "auto" ? parallel::DataParallelSpec::kAutoCommSms : p.get<int>("comm_sms");
    s.parallel.data = d;
  }
  return s;
}

void check_weight_copies(WeightCopies copies, const std::string& precision) {
  if (copies != WeightCopies::kept && compute_dtype(precision) == DType::f32)
    user_error("--weight-copies {} needs --precision bf16 or fp16: under fp32 and tf32 the weights have no copies",
               weight_copies_name(copies));
}

namespace {

// bf16 masters: bf16 compute on CUDA, one process, and the gradients in bf16 too (what the backward
// of a bf16 model makes).
void check_master_dtype(RunSpec& s) {
  if (s.master_dtype == DType::f32) return;
  if (s.precision != "bf16")
    user_error("--master-dtype bf16 needs --precision bf16 (a bf16 model computes in bf16), not {}", s.precision);
  if (s.device != "cuda")
    user_error("--master-dtype bf16 runs on CUDA only: the CPU backend keeps its parameters in fp32");
  if (s.parallel.data || s.parallel.tp > 1)
    user_error(
        "--master-dtype bf16 runs in one process for now: with data parallelism, ZeRO or tensor parallelism it is "
        "not yet built and checked");
  if (s.weight_copies != WeightCopies::kept)
    user_error("--weight-copies {} has nothing to place under --master-dtype bf16: the bf16 weights are the masters",
               weight_copies_name(s.weight_copies));
  if (has_backward(s.mode)) s.grad_dtype = DType::bf16;
}

}  // namespace

void validate_run(RunSpec& s) {
  s.model.validate();
  if (s.batch <= 0) user_error("--batch must be positive, got {}", s.batch);
  if (s.ctx <= 0) user_error("--ctx must be positive, got {}", s.ctx);
  if (const double bytes = step_activation_bytes(s); bytes > kMaxStepBytes)
    user_error(
        "batch {} of ctx {} would hold about {:.2g} bytes of activations in a step of {}, more than the 2^50 "
        "(1 PiB) lmscope plans for; lower --batch or --ctx",
        s.batch, s.ctx, bytes, s.model.name);
  if (s.grad_accum <= 0) user_error("--grad-accum must be positive, got {}", s.grad_accum);
  s.recompute.validate(s.model.layers);
  check_precision(s.precision);
  check_weight_copies(s.weight_copies, s.precision);
  // Only a backward accumulates, and only it has gradients to keep in another dtype.
  if (!has_backward(s.mode)) {
    s.grad_accum = 1;
    s.grad_dtype = DType::f32;
  }
  check_grad_dtype(grad_dtype_name(s.grad_dtype), s.precision);
  check_master_dtype(s);
  s.optimizer.validate();
  s.schedule.validate();
  s.parallel.validate(s.batch, has_backward(s.mode), s.mode == StepMode::train);
  s.parallel.check_model(s.model);
  if (s.parallel.data && s.parallel.data->zero == 3 && s.weight_copies == WeightCopies::resident)
    user_error(
        "--weight-copies resident keeps every bf16 copy on every rank, and --zero 3 gathers each layer's "
        "weights as its copies only while the layer runs: use kept or transient");
  if (s.parallel.data || s.parallel.tp > 1) s.graphs = false;  // the collectives are not recorded
}

}  // namespace lmscope
