#include "lmscope/model/recompute.h"

#include "lmscope/core/error.h"

#include <charconv>

namespace lmscope {
namespace {

constexpr const char* kModes = "none, selective or full";

Recompute parse_mode(const std::string& s, const std::string& whole) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    if (s == recompute_name(r)) return r;
  if (s == whole) user_error("unknown --recompute '{}' (use {}, or MODE:N+MODE for the first N layers)", whole, kModes);
  user_error("--recompute '{}': unknown mode '{}' (use {})", whole, s, kModes);
}

int mode_work(Recompute r) { return static_cast<int>(r); }

}  // namespace

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

RecomputePlan::RecomputePlan(Recompute first, int first_layers, Recompute rest)
    : first_(first), rest_(rest), first_layers_(first_layers) {
  LMSCOPE_CHECK(first_layers >= 1, "a recompute plan's first layers number {}", first_layers);
}

std::string recompute_name(const RecomputePlan& p) {
  const Recompute first = p.at(0);
  if (p.first_layers() == 0) return recompute_name(first);
  const Recompute rest = p.at(p.first_layers());
  const std::string s = std::string(recompute_name(first)) + ":" + std::to_string(p.first_layers());
  return rest == Recompute::none ? s : s + "+" + recompute_name(rest);
}

void RecomputePlan::validate(int layers) const {
  if (first_layers_ > layers)
    user_error("--recompute {} names the first {} layers; the model has {}", recompute_name(*this), first_layers_,
               layers);
}

int RecomputePlan::work(int layers) const {
  int sum = 0;
  for (int l = 0; l < layers; ++l) sum += mode_work(at(l));
  return sum;
}

bool RecomputePlan::no_more_than(const RecomputePlan& other, int layers) const {
  for (int l = 0; l < layers; ++l)
    if (mode_work(at(l)) > mode_work(other.at(l))) return false;
  return true;
}

RecomputePlan parse_recompute(const std::string& s) {
  const std::size_t colon = s.find(':');
  if (colon == std::string::npos) return RecomputePlan(parse_mode(s, s));
  const Recompute first = parse_mode(s.substr(0, colon), s);
  const std::size_t plus = s.find('+', colon);
  const std::string count = s.substr(colon + 1, plus == std::string::npos ? std::string::npos : plus - colon - 1);
  int n = 0;
  const auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), n);
  if (count.empty() || ec != std::errc() || end != count.data() + count.size() || n < 1)
    user_error("--recompute '{}': '{}' is not a number of layers from 1", s, count);
  const Recompute rest = plus == std::string::npos ? Recompute::none : parse_mode(s.substr(plus + 1), s);
  if (rest == first)
    user_error("--recompute '{}': the first {} layers and the rest have one mode; say '{}'", s, n,
               recompute_name(first));
  return RecomputePlan(first, n, rest);
}

}  // namespace lmscope
