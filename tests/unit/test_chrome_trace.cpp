// The Chrome trace's layout of device work, from records as the CUDA backend's tracer gives them:
// stream tracks named once, each kernel an X event at the allocator's clock, and an arrow of its own
// from the launching call to every piece of work it enqueued (a graph's launch enqueues many).
// The same layout is checked from real CUPTI records on the GPU (tests/gpu/test_trace_on_gpu.cpp).
#include "lmscope/profile/chrome_trace.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>

namespace lmscope {
namespace {

KernelRecord work(const char* name, DeviceWork kind, std::uint64_t start, std::uint64_t end, std::uint32_t stream,
                  std::uint32_t correlation) {
  KernelRecord r;
  r.name = name;
  r.work = kind;
  r.start_ns = start;
  r.end_ns = end;
  r.stream = stream;
  r.correlation = correlation;
  return r;
}

TEST(ChromeTrace, DeviceWorkOnStreamTracksWithAnArrowFromItsLaunch) {
  TraceContents t;
  t.clock_origin_ns = 1'000'000;
  t.labels.process = "test";
  t.ranges.push_back({RangeLevel::step, "step 0", 0.0, 100.0});
  LaunchRecord launch{"cudaLaunchKernel", 1'010'000, 1'012'000, 7, false};
  LaunchRecord graph{"cudaGraphLaunch", 1'020'000, 1'021'000, 8, false};
  LaunchRecord sync{"cudaStreamSynchronize", 1'060'000, 1'090'000, 9, false};
  t.device.launches = {launch, graph, sync};
  t.device.work = {work("a_kernel", DeviceWork::kernel, 1'015'000, 1'018'000, 13, 7),
                   work("b_kernel", DeviceWork::kernel, 1'025'000, 1'030'000, 13, 8),
                   work("c_kernel", DeviceWork::kernel, 1'031'000, 1'040'000, 13, 8),
                   work("[memcpy]", DeviceWork::memcpy, 1'041'000, 1'042'000, 14, 99)};  // its call unseen
  const nlohmann::json events = nlohmann::json::parse(chrome_trace_json(t)).at("traceEvents");

  std::set<std::pair<int, int>> named;
  std::map<std::string, nlohmann::json> by_name;
  std::map<long long, nlohmann::json> tails, heads;
  for (const auto& e : events) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      EXPECT_TRUE(named.insert({e["pid"].get<int>(), e["tid"].get<int>()}).second) << e;
    }
    if (e["ph"] == "X") by_name[e["name"]] = e;
    if (e["ph"] == "s") {
      EXPECT_TRUE(tails.emplace(e["id"].get<long long>(), e).second) << "a flow id used twice: " << e;
    }
    if (e["ph"] == "f") {
      EXPECT_TRUE(heads.emplace(e["id"].get<long long>(), e).second) << "a flow id used twice: " << e;
    }
  }
  EXPECT_TRUE(named.count({0, 13}) && named.count({0, 14}));        // GPU 0's streams
  EXPECT_DOUBLE_EQ(by_name["a_kernel"]["ts"].get<double>(), 15.0);  // µs from the allocator's zero
  EXPECT_DOUBLE_EQ(by_name["a_kernel"]["dur"].get<double>(), 3.0);
  EXPECT_EQ(by_name["[memcpy]"]["cat"], "gpu_memcpy");
  EXPECT_EQ(by_name["cudaStreamSynchronize"]["cat"], "cuda_runtime");
  EXPECT_DOUBLE_EQ(by_name["cudaGraphLaunch"]["ts"].get<double>(), 20.0);
  // Three arrows: one per kernel whose launch was seen, two of them from the graph's launch.
  ASSERT_EQ(tails.size(), 3u);
  ASSERT_EQ(heads.size(), 3u);
  std::multiset<double> tail_times, head_times;
  for (const auto& [id, head] : heads) {
    ASSERT_TRUE(tails.count(id));
    EXPECT_EQ(head["bp"], "e");
    EXPECT_EQ(head["tid"], 13);
    EXPECT_EQ(tails[id]["tid"], by_name["step 0"]["tid"]);  // from the host's track
    tail_times.insert(tails[id]["ts"].get<double>());
    head_times.insert(head["ts"].get<double>());
  }
  EXPECT_EQ(tail_times, (std::multiset<double>{10.0, 20.0, 20.0}));
  EXPECT_EQ(head_times, (std::multiset<double>{15.0, 25.0, 31.0}));
}

}  // namespace
}  // namespace lmscope
