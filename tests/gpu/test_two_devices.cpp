// Two CUDA backends on two GPUs of one process (each made for its Device): trained side by side, their
// steps interleaved from one thread or each on a thread of its own, each gets the bits a backend alone
// gets (every step's loss and gradient norm, every parameter after the steps), op by op and with
// device graphs; each one's memory is on its own GPU, and the caller's current device is left as it
// was. Skipped with fewer than two GPUs.
#include "../common/tiny_model.h"

#include "lmscope/backend/backend.h"
#include "lmscope/backend/devices.h"
#include "lmscope/core/rng.h"
#include "lmscope/device/device.h"
#include "lmscope/model/optimizer.h"
#include "lmscope/model/transformer.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace lmscope::test {
namespace {

struct Trained {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;
};

// One backend on one device, its model and optimizer, stepped one step at a time.
class Trainer {
 public:
  Trainer(const Device& device, bool graphs)
      : be_(make_backend(device, "bf16")), model_(gpu_model(), *be_, DType::f32, DType::bf16), opt_(model_, {}) {
    model_.set_graphs(graphs);
    model_.init_parameters(7);
  }
  void step(int i) {
    std::vector<std::int32_t> ids(kBatch * kCtx), targets(kBatch * kCtx);
    Rng rng = Rng::stream(11 + static_cast<std::uint64_t>(i), "two-devices.tokens");
    for (std::size_t k = 0; k < ids.size(); ++k) {
      ids[k] = static_cast<std::int32_t>(rng.below(503));
      targets[k] = static_cast<std::int32_t>(rng.below(503));
    }
    model_.set_batch(kBatch, kCtx, ids.data(), targets.data());
    model_.forward();
    model_.backward({0, 1});
    r_.losses.push_back(model_.read_loss());
    opt_.step(schedule_.at(i));
    r_.norms.push_back(opt_.last_grad_norm());
  }
  Trained result() {
    for (Parameter& p : model_.parameters()) {
      r_.params.emplace_back(static_cast<std::size_t>(p.value.tensor().numel()));
      be_->copy_to_host(r_.params.back().data(), p.value);
    }
    return r_;
  }
  // The GPU a parameter's memory is on.
  int parameter_device() {
    cudaPointerAttributes a{};
    EXPECT_EQ(cudaPointerGetAttributes(&a, model_.parameters().front().value.tensor().data), cudaSuccess);
    return a.device;
  }

 private:
  static constexpr std::int64_t kBatch = 4, kCtx = 64;
  std::unique_ptr<Backend> be_;
  Transformer model_;
  AdamW opt_;
  LrSchedule schedule_{.cosine = true, .lr_max = 3e-3, .lr_min = 3e-4, .warmup_iters = 3, .cosine_iters = 8};
  Trained r_;
};

constexpr int kSteps = 8;

Trained alone(const Device& device, bool graphs) {
  Trainer t(device, graphs);
  for (int i = 0; i < kSteps; ++i) t.step(i);
  return t.result();
}

void expect_same_bits(const Trained& a, const Trained& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(double)), 0) << what;
  EXPECT_EQ(std::memcmp(a.norms.data(), b.norms.data(), a.norms.size() * sizeof(double)), 0) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    EXPECT_EQ(std::memcmp(a.params[i].data(), b.params[i].data(), a.params[i].size() * sizeof(float)), 0)
        << what << ": parameter " << i;
}

int current() {
  int d = -1;
  EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
  return d;
}

TEST(TwoDevices, InterleavedFromOneThreadEachGetsTheBitsOfOneAlone) {
  if (list_gpus().size() < 2) GTEST_SKIP() << "fewer than 2 CUDA GPUs visible";
  const Device gpu0 = cuda_device(0), gpu1 = cuda_device(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  for (bool graphs : {false, true}) {
    const std::string what = graphs ? "with device graphs" : "op by op";
    const Trained alone0 = alone(gpu0, graphs), alone1 = alone(gpu1, graphs);
    EXPECT_EQ(current(), 0) << what << ": a backend on GPU 1 left it current";
    Trainer a(gpu0, graphs), b(gpu1, graphs);
    EXPECT_EQ(a.parameter_device(), 0) << what;
    EXPECT_EQ(b.parameter_device(), 1) << what;
    for (int i = 0; i < kSteps; ++i) {
      a.step(i);
      b.step(i);
    }
    EXPECT_EQ(current(), 0) << what;
    expect_same_bits(a.result(), alone0, what + ", GPU 0");
    expect_same_bits(b.result(), alone1, what + ", GPU 1");
    if (gpu0.facts().name == gpu1.facts().name) expect_same_bits(alone0, alone1, what + ", GPU 0 against GPU 1");
  }
}

TEST(TwoDevices, OnAThreadEachGetsTheBitsOfOneAlone) {
  if (list_gpus().size() < 2) GTEST_SKIP() << "fewer than 2 CUDA GPUs visible";
  const Device gpu0 = cuda_device(0), gpu1 = cuda_device(1);
  const Trained alone0 = alone(gpu0, true), alone1 = alone(gpu1, true);
  Trained r0, r1;
  std::string error0, error1;
  // A new thread's current device is 0: the backend on GPU 1 must not need it made current.
  auto run = [](const Device& d, Trained& out, std::string& error) {
    try {
      Trainer t(d, true);
      for (int i = 0; i < kSteps; ++i) t.step(i);
      out = t.result();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  std::thread t0(run, std::cref(gpu0), std::ref(r0), std::ref(error0));
  std::thread t1(run, std::cref(gpu1), std::ref(r1), std::ref(error1));
  t0.join();
  t1.join();
  ASSERT_EQ(error0, "");
  ASSERT_EQ(error1, "");
  expect_same_bits(r0, alone0, "GPU 0 on a thread");
  expect_same_bits(r1, alone1, "GPU 1 on a thread");
}

}  // namespace
}  // namespace lmscope::test
