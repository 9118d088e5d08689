#include "lmscope/run/run_spec.h"

#include "lmscope/backend/backend.h"
#include "lmscope/core/error.h"
#include "lmscope/run/mode_words.h"

#include <fmt/format.h>

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
  const double rows = std::ceil(static_cast<double>(s.batch) / std::max(1, s.parallel.world.size));
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

int RunSpec::exchange_sms() const {
  return parallel.data && device == "cuda" && parallel.world.size > 1 ? parallel.data->exchange_sms() : 0;
}

std::string RunSpec::label() const {
  std::string label = mode_words({.mode = step_mode_name(mode),
                                  .recompute = recompute_name(recompute),
                                  .grad_accum = micro_batches(),
                                  .weight_copies = weight_copies_name(weight_copies),
                                  .grad_dtype = grad_dtype_name(grad_dtype),
                                  .graphs_off_on_cuda = !graphs && device == "cuda",
                                  .fusion = fusion});
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

ModelConfig model_from_json(const nlohmann::json& j) {
  ModelConfig c;  // validated where a model is made of it
  c.name = j.at("name").get<std::string>();
  c.d_model = j.at("d_model").get<std::int64_t>();
  c.d_ff = j.at("d_ff").get<std::int64_t>();
  c.layers = j.at("layers").get<std::int64_t>();
  c.heads = j.at("heads").get<std::int64_t>();
  c.vocab = j.at("vocab").get<std::int64_t>();
  c.rope_theta = j.at("rope_theta").get<double>();
  return c;
}

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
  return j;
}

RunSpec RunSpec::from_json(const nlohmann::json& j) {
  try {
    RunSpec s;
    s.model = model_from_json(j.at("model"));
    s.mode = parse_step_mode(j.at("mode").get<std::string>());
    s.batch = j.at("batch").get<std::int64_t>();
    s.ctx = j.at("ctx").get<std::int64_t>();
    s.grad_accum = j.at("grad_accum").get<int>();
    s.device = j.at("device").get<std::string>();
    s.precision = j.at("precision").get<std::string>();
    check_precision(s.precision);
    s.attention = parse_attention(j.at("attention").get<std::string>());
    s.recompute = parse_recompute(j.at("recompute").get<std::string>());
    s.weight_copies = parse_weight_copies(j.at("weight_copies").get<std::string>());
    s.grad_dtype = parse_grad_dtype(j.at("grad_dtype").get<std::string>());
    s.graphs = j.at("graphs").get<bool>();
    s.fusion = j.at("fusion").get<bool>();
    s.seed = j.at("seed").get<std::uint64_t>();
    const nlohmann::json& o = j.at("optimizer");
    s.optimizer.lr = o.at("lr").get<double>();
    s.optimizer.beta1 = o.at("beta1").get<double>();
    s.optimizer.beta2 = o.at("beta2").get<double>();
    s.optimizer.eps = o.at("eps").get<double>();
    s.optimizer.weight_decay = o.at("weight_decay").get<double>();
    s.optimizer.clip = o.at("clip").get<double>();
    s.optimizer.loss_scaling.initial = o.at("loss_scale").get<double>();
    s.optimizer.loss_scaling.interval = o.at("loss_scale_interval").get<std::int64_t>();
    const nlohmann::json& l = j.at("schedule");
    const std::string kind = l.at("kind").get<std::string>();
    if (kind != "constant" && kind != "cosine") user_error("unknown schedule '{}' in a run's description", kind);
    s.schedule.cosine = kind == "cosine";
    s.schedule.lr_max = l.at("lr_max").get<double>();
    s.schedule.lr_min = l.at("lr_min").get<double>();
    s.schedule.warmup_iters = l.at("warmup_iters").get<std::int64_t>();
    s.schedule.cosine_iters = l.at("cosine_iters").get<std::int64_t>();
    s.parallel.world.size = j.at("world_size").get<int>();
    if (const nlohmann::json& p = j.at("data_parallel"); !p.is_null()) {
      parallel::DataParallelSpec d;
      d.mode = parallel::parse_ddp_mode(p.at("ddp").get<std::string>());
      d.exchange = parallel::parse_grad_exchange(p.at("grad_exchange").get<std::string>());
      d.bucket_mb = p.at("bucket_mb").get<double>();
      d.zero = p.at("zero").get<int>();
      d.symmetric_memory = p.at("symmetric_memory").get<bool>();
      const nlohmann::json& sms = p.at("comm_sms");
      d.comm_sms = sms.is_string() && sms.get<std::string>() == "auto" ? parallel::DataParallelSpec::kAutoCommSms
                                                                       : sms.get<int>();
      s.parallel.data = d;
    }
    return s;
  } catch (const nlohmann::json::exception&) {
    user_error("a run's description cannot be read: a field is missing or of the wrong kind");
  }
}

void check_weight_copies(WeightCopies copies, const std::string& precision) {
  if (copies != WeightCopies::kept && compute_dtype(precision) == DType::f32)
    user_error("--weight-copies {} needs --precision bf16 or fp16: under fp32 and tf32 the weights have no copies",
               weight_copies_name(copies));
}

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
  check_precision(s.precision);
  check_weight_copies(s.weight_copies, s.precision);
  // Only a backward accumulates, and only it has gradients to keep in another dtype.
  if (!has_backward(s.mode)) {
    s.grad_accum = 1;
    s.grad_dtype = DType::f32;
  }
  check_grad_dtype(grad_dtype_name(s.grad_dtype), s.precision);
  s.optimizer.validate();
  s.schedule.validate();
  s.parallel.validate(s.batch, has_backward(s.mode), s.mode == StepMode::train);
  if (s.parallel.data) s.graphs = false;  // the collectives are not recorded
}

}  // namespace lmscope
