// A small, fully specified random generator (SplitMix64 stream + Box-Muller), so that a seed
// gives the same weights and batches on every platform and compiler. The std:: distributions
// are implementation-defined and would not.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace lmscope {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  // The whole state: Rng(state()) continues where this one stands (checkpoints save it).
  std::uint64_t state() const { return state_; }
  // An independent stream for a named purpose ("layers.3.attn.q_proj.weight", "batches").
  static Rng stream(std::uint64_t seed, std::string_view name) {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, mixed with the seed
    for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return Rng(mix(seed ^ mix(h)));
  }

  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return static_cast<std::uint64_t>(uniform() * static_cast<double>(n)); }
  double normal() {
    double u1 = 1.0 - uniform();  // (0, 1]
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Standard normal conditioned on |z| <= cut (rejection), as torch.nn.init.trunc_normal_ draws.
  double truncated_normal(double cut) {
    for (;;) {
      double z = normal();
      if (std::fabs(z) <= cut) return z;
    }
  }

 private:
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

}  // namespace lmscope
