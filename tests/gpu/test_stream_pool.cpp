// The CUDA backend's streams come from a pool (cuda/stream_pool.h): a backend made after another
// ended runs on the stream the first ran on, and backends alive together on streams of their own.
// Skipped without a GPU.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace lmscope::test {
namespace {

// By the driver's stream id, which no new stream reuses (a stream made after one was destroyed may
// get the destroyed one's address).
unsigned long long stream_id(void* stream) {
  unsigned long long id = 0;
  EXPECT_EQ(cudaStreamGetId(static_cast<cudaStream_t>(stream), &id), cudaSuccess);
  return id;
}

TEST(StreamPool, ALaterBackendRunsOnTheStreamOfOneThatEnded) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  unsigned long long first = 0;
  {
    auto a = make_cuda_backend(GemmMath::fp32);
    ASSERT_NE(a->cuda_stream(), nullptr);
    first = stream_id(a->cuda_stream());
    auto b = make_cuda_backend(GemmMath::fp32);
    EXPECT_NE(stream_id(b->cuda_stream()), first) << "two live backends share a stream";
  }
  auto c = make_cuda_backend(GemmMath::fp32);
  EXPECT_EQ(stream_id(c->cuda_stream()), first) << "the earliest stream made, free again, goes first";
  // And it works: a fill and a read back through it.
  Allocation t = c->allocator().allocate({3}, DType::f32, {});
  c->fill(t, 2.5);
  EXPECT_EQ(download(*c, t), (std::vector<double>{2.5, 2.5, 2.5}));
}

}  // namespace
}  // namespace lmscope::test
