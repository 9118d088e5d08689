// Tensors shared with PyTorch and NumPy through DLPack, in place: theirs read and written by
// lmscope's kernels, lmscope's read by them. Only packed row-major tensors of the dtypes lmscope has
// (float32, float64, bfloat16, float16, int32) pass; anything else is refused in one sentence.
#pragma once

#include "lmscope/core/tensor.h"

#include <pybind11/pybind11.h>

namespace lmscope::python {

enum class DLPackDevice { cpu, cuda };

struct BorrowedTensor {
  Tensor tensor;
  DLPackDevice device = DLPackDevice::cpu;
  int device_index = 0;
};

// The tensor a "dltensor" capsule describes, borrowed for as long as the caller holds the capsule (it
// is not consumed: the capsule's producer frees it as ever). UserError naming `what` for a capsule of
// another kind, strides that are not packed row-major, or a dtype lmscope does not have.
BorrowedTensor borrow_dlpack(const pybind11::object& capsule, const char* what);

// A "dltensor" capsule of `t`, whose memory `owner` keeps alive: a consumer (torch.from_dlpack,
// numpy.from_dlpack) holds a reference to owner until it lets the tensor go.
pybind11::capsule lend_dlpack(const Tensor& t, DLPackDevice device, int device_index, pybind11::object owner);

}  // namespace lmscope::python
