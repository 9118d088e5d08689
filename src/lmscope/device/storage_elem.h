// The storage type the CUDA kernels take for a tensor (host side; the real backend and the dry run
// of it share it, so both see the same types).
#pragma once

#include "lmscope/core/error.h"
#include "lmscope/core/tensor.h"
#include "lmscope/device/flash_plan.h"

#include <fmt/format.h>

namespace lmscope {

// f32, bf16 or f16; Unsupported for any other dtype.
inline Elem storage_elem(const Tensor& t) {
  switch (t.dtype) {
    case DType::f32:
      return Elem::f32;
    case DType::bf16:
      return Elem::bf16;
    case DType::f16:
      return Elem::f16;
    default:
      throw Unsupported(fmt::format("the CUDA backend stores f32, bf16 and f16, not {}", dtype_name(t.dtype)));
  }
}

}  // namespace lmscope
