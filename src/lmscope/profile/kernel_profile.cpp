#include "lmscope/profile/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <tuple>

namespace lmscope {

const char* kernel_category(std::string_view name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string_view::npos; };
  // Our own kernels are named for their op; cuBLASLt's carry one of these tags.
  if (has("[memset") || has("[memcpy")) return "memset/memcpy";
  // NCCL's, on its own stream: its ring and tree kernels, and those for symmetric memory.
  if (has("ncclDevKernel") || has("ncclKernel") || has("ncclSymkDevKernel")) return "collective";
  if (has("gemm") || has("nvjet") || has("xmma") || has("cutlass") || has("cublas")) return "GEMM";
  // The flash kernels' helpers too: the parts' sums and the Hopper backward's dQ from its tiles.
  if (has("flash_") || has("softmax_") || has("add_parts") || has("combine_parts") || has("dq_from_tiles"))
    return "attention";
  if (has("rmsnorm_")) return "RMSNorm";
  if (has("permute_heads")) return "RoPE/heads";
  if (has("swiglu_")) return "SwiGLU";
  if (has("cross_entropy_") || has("loss_")) return "loss";
  if (has("embedding_")) return "embedding";
  if (has("adamw_") || has("sum_squares_") || has("sum_partials_sqrt")) return "optimizer";
  if (has("add_kernel") || has("add_many_kernel") || has("cast_kernel") || has("cast_many_kernel") ||
      has("fill_kernel"))
    return "elementwise";
  return "other";
}

std::string short_kernel_name(const char* raw) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(raw, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && demangled ? demangled.get() : raw;
  const std::string anon = "(anonymous namespace)::";
  for (std::size_t at; (at = s.find(anon)) != std::string::npos;) s.erase(at, anon.size());
  // The argument list: from the '(' that matches the final ')'.
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (std::size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  // The return type ends at the first space outside template brackets; namespaces at the last "::".
  int angle = 0;
  std::size_t name_start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    angle += s[i] == '<' ? 1 : s[i] == '>' ? -1 : 0;
    if (angle != 0) continue;
    if (s[i] == ' ' && name_start == 0) name_start = i + 1;
    if (s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':') name_start = i + 2;
  }
  s.erase(0, name_start);
  return s;
}

double KernelProfile::busy_ms(Phase p) const {
  double ms = 0;
  for (const KernelSummary& c : categories)
    if (c.phase == p && c.category != "collective") ms += c.ms_per_step;
  return ms;
}

double KernelProfile::collective_ms() const {
  double ms = 0;
  for (const KernelSummary& c : categories)
    if (c.category == "collective") ms += c.ms_per_step;
  return ms;
}

namespace {
// The part of the collectives' time that other kernels ran beside (summed, in ns); category[i] is
// records[i]'s.
double collective_overlap_ns(const std::vector<KernelRecord>& records, const std::vector<const char*>& category) {
  auto collective = [&](std::size_t i) { return std::string_view(category[i]) == "collective"; };
  std::vector<std::pair<std::uint64_t, std::uint64_t>> others, merged;
  for (std::size_t i = 0; i < records.size(); ++i)
    if (records[i].work == DeviceWork::kernel && !collective(i))
      others.emplace_back(records[i].start_ns, records[i].end_ns);
  std::sort(others.begin(), others.end());
  for (const auto& [a, b] : others)
    if (!merged.empty() && a <= merged.back().second)
      merged.back().second = std::max(merged.back().second, b);
    else
      merged.emplace_back(a, b);
  double overlapped = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (!collective(i)) continue;
    const KernelRecord& r = records[i];
    auto it = std::lower_bound(merged.begin(), merged.end(), std::pair{r.start_ns, std::uint64_t(0)});
    if (it != merged.begin()) --it;
    for (; it != merged.end() && it->first < r.end_ns; ++it)
      if (it->second > r.start_ns)
        overlapped += static_cast<double>(std::min(it->second, r.end_ns) - std::max(it->first, r.start_ns));
  }
  return overlapped;
}
}  // namespace

KernelProfile summarize_kernels(const std::vector<KernelRecord>& records, int steps) {
  KernelProfile out;
  out.steps = steps;
  if (steps <= 0) return out;
  std::map<std::tuple<Phase, std::string, std::string>, KernelSummary> by_kernel, by_category;
  std::vector<const char*> categories(records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const KernelRecord& r = records[i];
    const char* category = categories[i] = kernel_category(r.name);
    const double ms = static_cast<double>(r.end_ns - r.start_ns) / 1e6;
    for (auto* m : {&by_kernel, &by_category}) {
      KernelSummary& k = (*m)[{r.phase, category, m == &by_kernel ? r.name : std::string()}];
      k.phase = r.phase;
      k.category = category;
      if (m == &by_kernel) k.name = r.name;
      k.calls_per_step += 1.0 / steps;
      k.ms_per_step += ms / steps;
    }
  }
  auto longest_first = [](const KernelSummary& a, const KernelSummary& b) { return a.ms_per_step > b.ms_per_step; };
  out.collective_overlapped_ms = collective_overlap_ns(records, categories) / 1e6 / steps;
  for (auto& [key, k] : by_kernel) out.kernels.push_back(k);
  std::sort(out.kernels.begin(), out.kernels.end(), longest_first);
  for (auto& [key, k] : by_category) out.categories.push_back(k);
  std::stable_sort(out.categories.begin(), out.categories.end(), [&](const KernelSummary& a, const KernelSummary& b) {
    return a.phase != b.phase ? a.phase < b.phase : longest_first(a, b);
  });
  return out;
}

}  // namespace lmscope
