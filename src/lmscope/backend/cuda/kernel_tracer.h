// The CUDA backend's KernelTracer: CUPTI activity records of every kernel, memset and memcpy.
#pragma once

#include "lmscope/profile/kernel_profile.h"

#include <memory>

namespace lmscope::cuda {

// Throws Unsupported when CUPTI cannot trace here, or while another tracer is alive.
std::unique_ptr<KernelTracer> make_kernel_tracer();

}  // namespace lmscope::cuda
