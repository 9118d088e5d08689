// bench --trace on the GPU: every kernel, memset and memcpy of the kernel profile is in the trace
// once, on its stream's track, with a flow arrow from the host call that launched it, inside the
// measured steps on the host's time line. Skips where no GPU is visible.
#include "../common/small_cuda_cell.h"

#include "lmscope/backend/devices.h"
#include "lmscope/bench/runner.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>

namespace lmscope {
namespace {

using nlohmann::json;

TEST(TraceOnGpu, EveryProfiledKernelIsOnItsStreamWithItsLaunch) {
  if (list_gpus().empty()) GTEST_SKIP() << "no CUDA GPU visible";
  BenchSpec spec = test::small_cuda_cell("bf16", 1, 2);
  spec.profile = true;
  spec.trace = true;
  const BenchResult r = run_bench_cell(spec);
  ASSERT_TRUE(r.ok()) << r.status;
  const json trace = json::parse(r.trace);
  const json& events = trace.at("traceEvents");

  std::map<std::string, double> profiled;  // name -> calls over the measured steps
  for (const KernelSummary& k : r.kernels.kernels) profiled[k.name] += k.calls_per_step * r.kernels.steps;
  std::map<std::string, int> traced;
  std::map<long long, const json*> launch_of;                   // correlation -> host call
  std::map<long long, double> flow_start;                       // flow id -> its tail's time (on the host)
  std::map<std::tuple<int, int, double>, long long> flow_head;  // (pid, tid, ts) -> flow id
  double steps_from = INFINITY, steps_to = -INFINITY;
  int host_pid = -1;
  for (const json& e : events) {
    const std::string ph = e.at("ph"), cat = e.value("cat", "");
    if (ph == "X" && cat == "step") {
      steps_from = std::min(steps_from, e.at("ts").get<double>());
      steps_to = std::max(steps_to, e.at("ts").get<double>() + e.at("dur").get<double>());
      host_pid = e.at("pid");
    }
    if (ph == "X" && (cat == "cuda_runtime" || cat == "cuda_driver"))
      launch_of[e.at("args").at("correlation").get<long long>()] = &e;
    if (ph == "s") {
      EXPECT_TRUE(flow_start.emplace(e.at("id").get<long long>(), e.at("ts").get<double>()).second) << e;
    }
    if (ph == "f") {
      const std::tuple<int, int, double> at{e.at("pid").get<int>(), e.at("tid").get<int>(), e.at("ts").get<double>()};
      EXPECT_TRUE(flow_head.emplace(at, e.at("id").get<long long>()).second) << e;
    }
  }
  ASSERT_GT(steps_to, steps_from);
  std::set<std::pair<int, int>> named_streams;
  for (const json& e : events)
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("pid") != host_pid)
      named_streams.insert({e.at("pid").get<int>(), e.at("tid").get<int>()});

  for (const json& e : events) {
    const std::string cat = e.value("cat", "");
    if (e.at("ph") != "X" || (cat != "kernel" && cat != "gpu_memset" && cat != "gpu_memcpy")) continue;
    ++traced[e.at("name")];
    EXPECT_NE(e.at("pid"), host_pid);
    EXPECT_TRUE(named_streams.count({e.at("pid").get<int>(), e.at("tid").get<int>()})) << e;
    EXPECT_EQ(e.at("tid"), e.at("args").at("stream"));
    const long long id = e.at("args").at("correlation");
    ASSERT_TRUE(launch_of.count(id)) << e;
    const json& launch = *launch_of.at(id);
    EXPECT_LE(launch.at("ts").get<double>(), e.at("ts").get<double>()) << e;  // launched before it ran
    // An arrow from the call's start to the kernel's, by a flow of its own.
    const auto head = flow_head.find({e.at("pid").get<int>(), e.at("tid").get<int>(), e.at("ts").get<double>()});
    ASSERT_NE(head, flow_head.end()) << e;
    ASSERT_TRUE(flow_start.count(head->second)) << e;
    EXPECT_EQ(flow_start.at(head->second), launch.at("ts").get<double>()) << e;
    // Inside the measured steps: the clocks agree (a kernel may end after its step's host range
    // only if the step did not wait for it, and every step synchronises).
    EXPECT_GE(launch.at("ts").get<double>(), steps_from);
    EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), steps_to + 1.0) << e;
  }
  ASSERT_FALSE(profiled.empty());
  for (const auto& [name, calls] : profiled) EXPECT_EQ(traced[name], std::lround(calls)) << name;
  EXPECT_EQ(traced.size(), profiled.size());
}

}  // namespace
}  // namespace lmscope
