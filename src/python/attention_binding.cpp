// lmscope's FlashAttention-2 kernels on tensors a caller shares through DLPack (lmscope.torch's
// autograd Function): q, k, v [n, t, d] packed, the output and the log-sum-exp written in place, on
// the caller's CUDA stream. One backend per device, made at first use, serves every call there.
#include "bindings.h"
#include "dlpack_tensor.h"

#include "lmscope/backend/backend.h"
#include "lmscope/core/error.h"
#include "lmscope/device/device.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace lmscope::python {
namespace {

using BackendKey = std::pair<DLPackDevice, int>;

// Made once per device and dropped by release_backends (the package calls it at exit, while CUDA is
// still up); on the heap so that no static destructor runs after CUDA's own teardown.
std::map<BackendKey, std::unique_ptr<Backend>>& backends() {
  static auto* made = new std::map<BackendKey, std::unique_ptr<Backend>>;
  return *made;
}

struct Operands {
  Backend* backend = nullptr;
  std::vector<Tensor> tensors;
};

// The capsules' tensors, all on one device, and that device's backend running on `stream` (the
// caller's current CUDA stream as an integer; 0 is the legacy default stream).
Operands operands(const std::vector<std::pair<py::object, const char*>>& capsules, std::uintptr_t stream) {
  Operands o;
  std::optional<BackendKey> where;
  for (const auto& [capsule, what] : capsules) {
    const BorrowedTensor b = borrow_dlpack(capsule, what);
    const BackendKey key{b.device, b.device_index};
    if (where && *where != key) user_error("{} lies on another device than {}", what, capsules.front().second);
    where = key;
    o.tensors.push_back(b.tensor);
  }
  std::unique_ptr<Backend>& backend = backends()[*where];
  if (!backend)
    backend = where->first == DLPackDevice::cpu ? make_backend(cpu_device()) : make_backend(cuda_device(where->second));
  if (where->first == DLPackDevice::cuda) backend->run_on_stream(reinterpret_cast<void*>(stream));
  o.backend = backend.get();
  return o;
}

void flash_forward(py::object q, py::object k, py::object v, py::object out, py::object lse, double scale, bool causal,
                   std::uintptr_t stream) {
  Operands o = operands({{q, "q"}, {k, "k"}, {v, "v"}, {out, "the output"}, {lse, "the log-sum-exp"}}, stream);
  const std::vector<Tensor>& t = o.tensors;
  o.backend->flash_attention_forward(t[0], t[1], t[2], t[3], t[4], scale, causal);
}

std::string flash_backward(py::object q, py::object k, py::object v, py::object out, py::object lse, py::object dout,
                           py::object dq, py::object dk, py::object dv, double scale, bool causal, bool deterministic,
                           std::uintptr_t stream) {
  Operands o = operands({{q, "q"},
                         {k, "k"},
                         {v, "v"},
                         {out, "the output"},
                         {lse, "the log-sum-exp"},
                         {dout, "the output's gradient"},
                         {dq, "dq"},
                         {dk, "dk"},
                         {dv, "dv"}},
                        stream);
  const std::vector<Tensor>& t = o.tensors;
  const FlashDq summed =
      o.backend->flash_attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], scale, causal,
                                          deterministic ? FlashDq::deterministic : FlashDq::fastest);
  return summed == FlashDq::atomic ? "atomic" : "deterministic";
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("flash_attention_forward", &flash_forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("scale"), py::arg("causal"), py::arg("stream"),
        "FlashAttention-2's forward on DLPack capsules: q [n, tq, d], k and v [n, tk, d] -> out [n, tq, d] and the "
        "log-sum-exp [n, tq], written in place");
  m.def("flash_attention_backward", &flash_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("scale"),
        py::arg("causal"), py::arg("deterministic"), py::arg("stream"),
        "FlashAttention-2's backward on DLPack capsules, dq, dk and dv written in place; says how dq was summed "
        "('atomic' or 'deterministic')");
  m.def(
      "release_attention_backends", [] { backends().clear(); },
      "Lets go of the backends the attention calls made (their memory and streams)");
}

}  // namespace lmscope::python
