// Built when CUDA is off: no accelerator is visible, and asking for the CUDA backend says why.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"

namespace lmscope {

bool built_with_cuda() { return false; }
std::vector<GpuInfo> list_gpus() { return {}; }
void use_gpu(int) {
  throw Unsupported("this build of lmscope has no CUDA backend (configured with -DLMSCOPE_CUDA=OFF)");
}
FlashKernelFacts visible_gpu_flash_facts() {
  throw Unsupported("this build of lmscope has no CUDA backend (configured with -DLMSCOPE_CUDA=OFF)");
}
int current_cuda_device() {
  throw Unsupported("this build of lmscope has no CUDA backend (configured with -DLMSCOPE_CUDA=OFF)");
}
Device cuda_device(int) {
  throw Unsupported("this build of lmscope has no CUDA backend (configured with -DLMSCOPE_CUDA=OFF)");
}
std::unique_ptr<Backend> make_cuda_backend(const Device&, GemmMath) {
  throw Unsupported("this build of lmscope has no CUDA backend (configured with -DLMSCOPE_CUDA=OFF)");
}
std::unique_ptr<Backend> make_cuda_backend(GemmMath) {
  throw Unsupported("this build of lmscope has no CUDA backend (configured with -DLMSCOPE_CUDA=OFF)");
}

}  // namespace lmscope
