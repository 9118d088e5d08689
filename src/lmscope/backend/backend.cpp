#include "lmscope/backend/backend.h"

#include "lmscope/backend/devices.h"
#include "lmscope/core/hash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace lmscope {

namespace {

// IEEE bf16 from float and back on the host: round to nearest even, as the device's conversions do
// (a NaN stays a NaN).
std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_value(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void upload(Backend& backend, const Tensor& t, std::span<const double> values) {
  LMSCOPE_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(), "upload of {} values into {}", values.size(),
                shape_str(t.shape));
  if (t.dtype == DType::f64) return backend.copy_from_host(t, values.data());
  const std::vector<float> f(values.begin(), values.end());
  upload_host(backend, t, f.data());
}

void upload_host(Backend& backend, const Tensor& t, const float* values) {
  if (t.dtype == DType::f32) return backend.copy_from_host(t, values);
  LMSCOPE_CHECK(t.dtype == DType::bf16, "upload into a {} tensor", dtype_name(t.dtype));
  std::vector<std::uint16_t> h(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = bf16_bits(values[i]);
  backend.copy_from_host(t, h.data());
}

std::vector<double> download(Backend& backend, const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype == DType::f64) {
    backend.copy_to_host(out.data(), t);
    return out;
  }
  if (t.dtype == DType::bf16) {
    std::vector<std::uint16_t> h(out.size());
    backend.copy_to_host(h.data(), t);
    std::transform(h.begin(), h.end(), out.begin(), bf16_value);
    return out;
  }
  LMSCOPE_CHECK(t.dtype == DType::f32, "download of a {} tensor", dtype_name(t.dtype));
  std::vector<float> f(out.size());
  backend.copy_to_host(f.data(), t);
  std::copy(f.begin(), f.end(), out.begin());
  return out;
}

AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse) {
  LMSCOPE_CHECK(q.shape.size() == 3, "flash attention takes q as [n, tq, d], got {}", shape_str(q.shape));
  const AttentionShape s{q.dim(0), q.dim(1), k.shape.size() == 3 ? k.dim(1) : 0, q.dim(2)};
  LMSCOPE_CHECK(s.tq > 0 && s.tk > 0 && s.d > 0, "flash attention needs at least one query, key and channel");
  LMSCOPE_CHECK(k.shape == (Shape{s.n, s.tk, s.d}), "flash attention k: {} against q {}", shape_str(k.shape),
                shape_str(q.shape));
  LMSCOPE_CHECK(v.shape == k.shape, "flash attention v: {} against k {}", shape_str(v.shape), shape_str(k.shape));
  LMSCOPE_CHECK(out.shape == q.shape, "flash attention out: {} against q {}", shape_str(out.shape), shape_str(q.shape));
  LMSCOPE_CHECK(lse.shape == (Shape{s.n, s.tq}), "flash attention lse: {} where [{}, {}] was expected",
                shape_str(lse.shape), s.n, s.tq);
  return s;
}

std::array<double, 3> adamw_step_scalars(const AdamWArgs& a) {
  const double t = static_cast<double>(a.step);
  return {a.lr * std::sqrt(1.0 - std::pow(a.beta2, t)) / (1.0 - std::pow(a.beta1, t)), a.lr * a.weight_decay,
          a.grad_scale};
}

GraphScope::GraphScope(Backend& backend, bool on, std::uint64_t key) {
  if (!on || !backend.has_graphs()) return;
  key_ = hash_mix(key, backend.allocator().state_hash());
  backend.begin_graph(key_);
  backend_ = &backend;
}

GraphScope::~GraphScope() {
  if (backend_) backend_->abort_graph();
}

void GraphScope::end() {
  if (!backend_) return;
  Backend* b = std::exchange(backend_, nullptr);
  b->end_graph();
}

double read_scalar(Backend& backend, const Tensor& t) { return download(backend, Tensor{t.data, t.dtype, {1}})[0]; }

void check_precision(const std::string& precision) {
  if (precision != "fp32" && precision != "tf32" && precision != "bf16" && precision != "fp16")
    user_error("unknown --precision '{}' (use fp32, tf32, bf16 or fp16)", precision);
}

std::unique_ptr<Backend> make_backend(const std::string& device, const std::string& precision) {
  check_precision(precision);
  if (device == "cpu") {
    if (precision != "fp32") throw Unsupported(fmt::format("the CPU backend computes in fp32 only, not {}", precision));
    return make_cpu_backend();
  }
  if (device == "cuda") {
    return make_cuda_backend(precision == "tf32" ? GemmMath::tf32 : GemmMath::fp32);
  }
  user_error("unknown device '{}' (use cpu or cuda)", device);
}

std::unique_ptr<Backend> make_backend(const Device& device, const std::string& precision) {
  check_precision(precision);
  if (device.kind() == DeviceKind::cpu) return make_backend("cpu", precision);
  return make_cuda_backend(device, precision == "tf32" ? GemmMath::tf32 : GemmMath::fp32);
}

DType compute_dtype(const std::string& precision) {
  return precision == "bf16" ? DType::bf16 : precision == "fp16" ? DType::f16 : DType::f32;
}

bool grad_dtype_fits(const std::string& grad_dtype, const std::string& precision) {
  return grad_dtype == "fp32" || precision == "bf16";
}

void check_grad_dtype(const std::string& grad_dtype, const std::string& precision) {
  if (grad_dtype != "fp32" && grad_dtype != "bf16")
    user_error("unknown --grad-dtype '{}' (use fp32 or bf16)", grad_dtype);
  if (!grad_dtype_fits(grad_dtype, precision))
    user_error(
        "--grad-dtype bf16 needs --precision bf16 (the weight-gradient GEMMs write bf16 from bf16 operands); "
        "this is {}",
        precision);
}

DType gradient_dtype(const std::string& grad_dtype) { return grad_dtype == "bf16" ? DType::bf16 : DType::f32; }

std::string default_device() { return list_gpus().empty() ? "cpu" : "cuda"; }

}  // namespace lmscope
