// Built when CUDA is off: no accelerator is visible to this build.
#include "lmscope/backend/devices.h"

namespace lmscope {

bool built_with_cuda() { return false; }
std::vector<GpuInfo> list_gpus() { return {}; }

}  // namespace lmscope
