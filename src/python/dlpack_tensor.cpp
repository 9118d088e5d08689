#include "dlpack_tensor.h"

#include "lmscope/core/error.h"

#include <dlpack/dlpack.h>

#include <optional>
#include <vector>

namespace py = pybind11;

namespace lmscope::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";  // unconsumed; a consumer renames it "used_dltensor"

std::optional<DType> dtype_of(const DLDataType& t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 64) return DType::f64;
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  return std::nullopt;
}

DLDataType dlpack_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f64:
      return {kDLFloat, 64, 1};
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
  }
  return {kDLFloat, 32, 1};
}

// What a lent tensor's consumer holds: the shape it points at and the owner kept alive.
struct Lent {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  py::object owner;
};

void free_lent(DLManagedTensor* m) {
  py::gil_scoped_acquire python;  // a consumer may let go from a thread without the interpreter's lock
  delete static_cast<Lent*>(m->manager_ctx);
}

// A capsule never consumed frees what it lends when it goes.
void free_unconsumed_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed: the consumer frees it
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (m != nullptr && m->deleter != nullptr) m->deleter(m);
}

}  // namespace

BorrowedTensor borrow_dlpack(const py::object& capsule, const char* what) {
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName))
    user_error("{} is not an unconsumed DLPack capsule (torch.utils.dlpack.to_dlpack gives one)", what);
  const auto* m = static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  const DLTensor& t = m->dl_tensor;
  BorrowedTensor b;
  if (t.device.device_type == kDLCPU)
    b.device = DLPackDevice::cpu;
  else if (t.device.device_type == kDLCUDA)
    b.device = DLPackDevice::cuda;
  else
    user_error("{} lives on a device of DLPack type {}; lmscope takes the CPU's and CUDA's", what,
               static_cast<int>(t.device.device_type));
  b.device_index = t.device.device_id;
  const std::optional<DType> dtype = dtype_of(t.dtype);
  if (!dtype)
    user_error(
        "{} has a dtype lmscope does not have (DLPack code {}, {} bits); it takes float32, float64, "
        "bfloat16, float16 and int32",
        what, static_cast<int>(t.dtype.code), static_cast<int>(t.dtype.bits));
  b.tensor.dtype = *dtype;
  b.tensor.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) {
    std::int64_t expected = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected)
        user_error("{} is not packed row-major (strides as .contiguous() leaves them)", what);
      expected *= t.shape[i];
    }
  }
  b.tensor.data = static_cast<char*>(t.data) + t.byte_offset;
  return b;
}

py::capsule lend_dlpack(const Tensor& t, DLPackDevice device, int device_index, py::object owner) {
  auto* lent = new Lent;
  lent->shape = t.shape;
  lent->owner = std::move(owner);
  DLTensor& d = lent->managed.dl_tensor;
  d.data = t.data;
  d.device = {device == DLPackDevice::cuda ? kDLCUDA : kDLCPU, device_index};
  d.ndim = static_cast<std::int32_t>(lent->shape.size());
  d.dtype = dlpack_dtype(t.dtype);
  d.shape = lent->shape.data();
  d.strides = nullptr;  // packed row-major
  d.byte_offset = 0;
  lent->managed.manager_ctx = lent;
  lent->managed.deleter = free_lent;
  return py::capsule(&lent->managed, kCapsuleName, free_unconsumed_capsule);
}

}  // namespace lmscope::python
