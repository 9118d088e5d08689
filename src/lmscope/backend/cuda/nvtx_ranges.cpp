#include "lmscope/backend/cuda/nvtx_ranges.h"

#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>

namespace lmscope::cuda {
namespace {

class NvtxRanges final : public RangeListener {
 public:
  NvtxRanges() : domain_(nvtxDomainCreateA("lmscope")) {
    for (RangeLevel level : {RangeLevel::step, RangeLevel::phase, RangeLevel::layer, RangeLevel::op})
      nvtxDomainNameCategoryA(domain_, category(level), range_level_name(level));
  }
  ~NvtxRanges() override { nvtxDomainDestroy(domain_); }

  void begin(RangeLevel level, const char* name, int index) override {
    char numbered[96];
    if (index >= 0) {
      std::snprintf(numbered, sizeof numbered, "%s %d", name, index);
      name = numbered;
    }
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.category = category(level);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(domain_, &a);
  }
  void end() override { nvtxDomainRangePop(domain_); }

 private:
  static std::uint32_t category(RangeLevel level) { return static_cast<std::uint32_t>(level) + 1; }  // 0: none
  nvtxDomainHandle_t domain_;
};

}  // namespace

bool nvtx_tool_attached() {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  return path && *path;
}

std::unique_ptr<RangeListener> make_nvtx_ranges() { return std::make_unique<NvtxRanges>(); }

}  // namespace lmscope::cuda
