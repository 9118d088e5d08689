// Which NCCL library a run loaded (the one found at run time, which need not be the one whose headers
// the build used) and what lmscope trusts it with. Kept free of nccl.h so it is tested without NCCL.
#pragma once

#include <fmt/format.h>

#include <string>

namespace lmscope::parallel {

// ncclGetVersion's code (major·10000 + minor·100 + patch since NCCL 2.9) as "2.28.9".
inline std::string nccl_version_text(int code) {
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

// Whether data parallelism's gradients go into NCCL's symmetric windows with this NCCL. From 2.28.9:
// with 2.28.3 a bucket's all-reduces, one group of them in a window, summed wrongly on two H200s
// (2026-11-27, docs/distributed.md), where 2.28.9's summed right; the versions between were not tried.
constexpr int kSymmetricWindowsFrom = 22809;
constexpr bool symmetric_windows_trusted(int code) { return code >= kSymmetricWindowsFrom; }

}  // namespace lmscope::parallel
