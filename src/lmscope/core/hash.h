// A 64-bit running hash of words (splitmix64's finaliser over the running value): for keys that name
// a state, such as the allocator's (Allocator::state_hash) or the ops a device graph holds, where a
// collision would need 2^32 states to become likely.
#pragma once

#include <bit>
#include <cstdint>

namespace lmscope {

inline std::uint64_t hash_mix(std::uint64_t h, std::uint64_t word) {
  std::uint64_t z = h + 0x9e3779b97f4a7c15ull + word;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline std::uint64_t hash_mix(std::uint64_t h, double value) {
  return hash_mix(h, std::bit_cast<std::uint64_t>(value));
}

}  // namespace lmscope
