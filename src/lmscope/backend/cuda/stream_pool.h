// The CUDA backend's streams (and the NCCL exchange's, and the one that holds SMs while GEMM plans are
// timed), kept for the process's life and handed to the next taker on the same device once their
// owner ends. A stream created after another was destroyed ran a small step's
// device graphs 4-5% slower than the process's first stream, every kernel as long but the time
// between them longer (H200, docs/timing.md); one taken back runs as the first did. So a sweep's
// later cells, each with a backend of its own, time as its first.
#pragma once

#include <cuda_runtime.h>

namespace lmscope::cuda {

// A non-blocking stream on the current device: one given back earlier, else a new one.
cudaStream_t take_stream();
// Back to the pool, for the next take_stream on its device; the caller has synchronised it.
void give_back_stream(cudaStream_t stream);

}  // namespace lmscope::cuda
