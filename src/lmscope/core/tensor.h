// Tensor: a non-owning, row-major, contiguous view of typed memory on some backend.
// Ownership lives in Allocation (allocator.h); ops take views.
#pragma once

#include "lmscope/core/error.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace lmscope {

enum class DType { f32, f64, bf16, f16, i32 };

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

using Shape = std::vector<std::int64_t>;

inline std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;

  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  std::int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  bool empty() const { return data == nullptr; }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Same memory, another shape with the same element count.
  Tensor view(Shape s) const {
    LMSCOPE_CHECK(shape_numel(s) == numel(), "view {} of {}", shape_str(s), shape_str(shape));
    return Tensor{data, dtype, std::move(s)};
  }
  // Rows [begin, begin+count) along the first dimension.
  Tensor rows(std::int64_t begin, std::int64_t count) const {
    Shape s = shape;
    std::int64_t row = numel() / s[0];
    s[0] = count;
    return Tensor{static_cast<char*>(data) + begin * row * dtype_size(dtype), dtype, s};
  }
};

}  // namespace lmscope
