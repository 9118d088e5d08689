// Whether a JSON value read from a file can be taken as a T, and that kind in words, for every reader
// of lmscope's own files (a run's description, result rows, a checkpoint's configuration): the JSON
// library's get<T>() would throw in its own words, wrap -1 into an unsigned field or cut 2.5 to 2.
// Each reader frames its own sentence (which file, which field) around the words.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace lmscope {

template <typename T>
bool json_holds(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string();
  } else if constexpr (std::is_floating_point_v<T>) {
    return v.is_number() && std::isfinite(v.get<double>());
  } else if constexpr (std::is_unsigned_v<T>) {
    return v.is_number_unsigned() && v.get<std::uint64_t>() <= std::numeric_limits<T>::max();
  } else {
    static_assert(std::is_integral_v<T>);
    if (!v.is_number_integer()) return false;
    if (v.is_number_unsigned())
      return v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<T>::max());
    const std::int64_t x = v.get<std::int64_t>();
    return x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max();
  }
}

// "true or false", "a string", "a finite number", "a whole number from 0 to 2^64 - 1", ...
template <typename T>
std::string json_kind_words() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a finite number";
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    return "a whole number from 0 to 2^64 - 1";
  } else {
    return fmt::format("a whole number from {} to {}", std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  }
}

}  // namespace lmscope
