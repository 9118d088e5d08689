#include "lmscope/backend/backend.h"

#include "lmscope/backend/devices.h"

namespace lmscope {

void upload(Backend& backend, const Tensor& t, std::span<const double> values) {
  LMSCOPE_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(), "upload of {} values into {}", values.size(),
                shape_str(t.shape));
  if (t.dtype == DType::f64) return backend.copy_from_host(t, values.data());
  LMSCOPE_CHECK(t.dtype == DType::f32, "upload into a {} tensor", dtype_name(t.dtype));
  std::vector<float> f(values.begin(), values.end());
  backend.copy_from_host(t, f.data());
}

std::vector<double> download(Backend& backend, const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype == DType::f64) {
    backend.copy_to_host(out.data(), t);
    return out;
  }
  LMSCOPE_CHECK(t.dtype == DType::f32, "download of a {} tensor", dtype_name(t.dtype));
  std::vector<float> f(out.size());
  backend.copy_to_host(f.data(), t);
  std::copy(f.begin(), f.end(), out.begin());
  return out;
}

double read_scalar(Backend& backend, const Tensor& t) { return download(backend, Tensor{t.data, t.dtype, {1}})[0]; }

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
    const auto gpus = list_gpus();
    throw Unsupported(fmt::format("the CUDA backend is not implemented yet (this build {} CUDA and sees {} GPU{})",
                                  built_with_cuda() ? "has" : "lacks", gpus.size(), gpus.size() == 1 ? "" : "s"));
  }
  user_error("unknown device '{}' (use cpu or cuda)", device);
}

// The GPU becomes the default once the CUDA backend exists (issue 3).
std::string default_device() { return "cpu"; }

}  // namespace lmscope
