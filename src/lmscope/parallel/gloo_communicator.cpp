// Collectives between CPU processes on Gloo over TCP. Gloo's calls block, so each rank runs them in
// order on one worker thread (as PyTorch's Gloo process group does): an async op queues its call and
// returns, and the compute goes on beside it, which is what overlapping a backward needs.
#include "lmscope/parallel/collective_watchdog.h"
#include "lmscope/parallel/communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace lmscope::parallel {
namespace {

class GlooWork final : public CollectiveWork {
 public:
  explicit GlooWork(std::future<void> done) : done_(std::move(done)) {}
  void wait() override {
    if (done_.valid()) done_.get();  // rethrows the worker's failure
  }

 private:
  std::future<void> done_;
};

// The address other ranks reach this one at: loopback when the ranks meet on this machine, else the
// host's name (Gloo resolves it), as torch.distributed does unless told an interface. A name that
// resolves to nothing is said here: Gloo's device crashed on it (SIGSEGV).
std::string own_address(const World& world) {
  if (world.rendezvous.starts_with("tcp:127.") || world.rendezvous.starts_with("tcp:localhost:")) return "127.0.0.1";
  if (world.rendezvous.empty()) return "127.0.0.1";
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(name, nullptr, &hints, &found); rc != 0)
    throw RankFailure(fmt::format(
        "rank {} has no address for the other ranks to reach: this host's name '{}' does not resolve ({}); name it "
        "in /etc/hosts, or, with every rank on this machine, meet at tcp:127.0.0.1:PORT",
        world.rank, name, gai_strerror(rc)));
  freeaddrinfo(found);
  return name;
}

// Why Gloo could not connect the ranks, in words: the store's waits are ours already; Gloo's own
// exceptions carried "[enforce fail at file:line] condition" or "[file:line] what".
// Gloo's first line without the "[file:line] " it begins with.
std::string without_source_line(const std::exception& e) {
  std::string why = e.what();
  why = why.substr(0, why.find('\n'));
  if (why.starts_with("[")) why = why.substr(why.find("] ") == std::string::npos ? 0 : why.find("] ") + 2);
  return why;
}

std::string connect_failure(const std::exception& e) {
  if (dynamic_cast<const RankFailure*>(&e) != nullptr) return e.what();
  if (dynamic_cast<const gloo::EnforceNotMet*>(&e) != nullptr)
    return "what the other ranks left at the rendezvous does not match this rank's (ranks of different world sizes, "
           "or of another run, meeting at the same place?)";
  return fmt::format("a connection to another rank failed ({})", without_source_line(e));
}

// Why a collective failed, in words: most often a peer that ended (Gloo: "Connection closed by peer
// [ADDRESS]:PORT").
std::string collective_failure(const std::exception& e) {
  const std::string why = without_source_line(e);
  if (why.starts_with("Connection closed by peer"))
    return fmt::format("another rank closed its connection ({}): it ended, or was stopped", why.substr(26));
  // "Read error [ADDRESS]:PORT: Connection reset by peer": the same, seen while reading.
  if (const auto reset = why.find(": Connection reset by peer");
      why.starts_with("Read error ") && reset != std::string::npos)
    return fmt::format("another rank closed its connection ({}): it ended, or was stopped", why.substr(11, reset - 11));
  return why;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const World& world, Store& store) : world_(world) {
    auto device = gloo::transport::tcp::CreateDevice(gloo::transport::tcp::attr(own_address(world).c_str()));
    auto context = std::make_shared<gloo::rendezvous::Context>(world.rank, world.size);
    context->setTimeout(std::chrono::duration_cast<std::chrono::milliseconds>(world.timeout));
    gloo::rendezvous::PrefixStore prefixed("gloo", store);
    try {
      context->connectFullMesh(prefixed, device);
    } catch (const std::exception& e) {
      throw RankFailure(fmt::format("rank {} could not connect to the other {} ranks through Gloo: {}", world.rank,
                                    world.size - 1, connect_failure(e)));
    }
    context_ = std::move(context);
    recorder_ = std::make_unique<FlightRecorder>(world, "gloo");
    watchdog_ = std::make_unique<CollectiveWatchdog>(*recorder_, world, "Gloo", CollectiveWatchdog::Hooks{});
    worker_ = std::thread([this] { run_queue(); });
  }

  // Collectives queued but not started are dropped (after an exception, their tensors may be gone);
  // on the normal path every one has been waited for.
  ~GlooCommunicator() override {
    watchdog_->stop();
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      tasks_.clear();
    }
    wake_.notify_all();
    worker_.join();
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

  using Communicator::all_reduce_async;
  std::unique_ptr<CollectiveWork> all_reduce_async(std::span<const Tensor> ts) override {
    return queue("all-reduce", ts, [this, ts = std::vector<Tensor>(ts.begin(), ts.end())] {
      for (const Tensor& t : ts) with_type(t, [&](auto zero) { sum_in_place(t.as<decltype(zero)>(), t.numel()); });
    });
  }

  // Gloo's own reduce-scatter (ReduceScatterHalvingDoubling) left some ranks' parts unsummed over
  // three ranks (tests/unit/test_collectives.cpp), so this one all-reduces the whole of `in` and keeps
  // this rank's part: the same sums, with twice the bytes of a ring reduce-scatter on the wire.
  std::unique_ptr<CollectiveWork> reduce_scatter_async(const Tensor& in, const Tensor& out) override {
    LMSCOPE_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * world_.size, "reduce-scatter of {} into {}",
                  in.numel(), out.numel());
    return queue("reduce-scatter", {&in, 1}, [this, in, out] {
      with_type(in, [&](auto zero) {
        using T = decltype(zero);
        sum_in_place(in.as<T>(), in.numel());
        T* mine = in.as<T>() + static_cast<std::size_t>(world_.rank) * static_cast<std::size_t>(out.numel());
        if (mine != out.as<T>()) std::memcpy(out.data, mine, out.bytes());
      });
    });
  }

  using Communicator::all_gather_async;
  std::unique_ptr<CollectiveWork> all_gather_async(std::span<const Tensor> ins, std::span<const Tensor> outs) override {
    check_all_gather(ins, outs);
    return queue(
        "all-gather", ins,
        [this, ins = std::vector<Tensor>(ins.begin(), ins.end()),
         outs = std::vector<Tensor>(outs.begin(), outs.end())] {
          for (std::size_t i = 0; i < ins.size(); ++i) {
            const Tensor &in = ins[i], &out = outs[i];
            with_type(in, [&](auto zero) {
              using T = decltype(zero);
              T* mine = out.as<T>() + static_cast<std::size_t>(world_.rank) * static_cast<std::size_t>(in.numel());
              if (mine != in.as<T>()) std::memcpy(mine, in.data, in.bytes());
              gloo::AllgatherOptions opts(context_);
              opts.setOutput(out.as<T>(), static_cast<std::size_t>(out.numel()));  // this rank's part is its input
              opts.setTag(next_tag());
              gloo::allgather(opts);
            });
          }
        });
  }

  std::unique_ptr<CollectiveWork> broadcast_async(const Tensor& t, int root) override {
    return queue("broadcast", {&t, 1}, [this, t, root] {
      with_type(t, [&](auto zero) {
        using T = decltype(zero);
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(t.as<T>(), static_cast<std::size_t>(t.numel()));
        opts.setRoot(root);
        opts.setTag(next_tag());
        gloo::broadcast(opts);
      });
    });
  }

  void start_timing() override {
    std::lock_guard lock(mutex_);
    origin_ = std::chrono::steady_clock::now();
    timing_ = true;
    spans_.clear();
  }

  std::vector<Span> finish_timing() override {
    std::lock_guard lock(mutex_);
    timing_ = false;
    return std::move(spans_);
  }

  void barrier() override {
    queue("barrier", {}, [this] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    })->wait();
  }

 private:
  template <typename F>
  static void with_type(const Tensor& t, F&& f) {
    if (t.dtype == DType::f32)
      f(float{});
    else if (t.dtype == DType::f64)
      f(double{});
    else
      throw std::runtime_error(fmt::format("Gloo's collectives here take f32 or f64, not {}", dtype_name(t.dtype)));
  }

  std::uint32_t next_tag() { return tag_++; }
  // Gloo's all-reduce of n values at p, summed over the ranks in place (on the worker thread).
  template <typename T>
  void sum_in_place(T* p, std::int64_t n) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(p, static_cast<std::size_t>(n));
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<T>));
    opts.setTag(next_tag());
    gloo::allreduce(opts);
  }
  double ms_since_origin(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - origin_).count();
  }

  // Runs `call` (the collective `what` of `ts`) after every call queued before it; its failure,
  // worded once, surfaces at wait(). The flight record and the watchdog see it from its call to its
  // end.
  std::unique_ptr<CollectiveWork> queue(const char* what, std::span<const Tensor> ts, std::function<void()> call) {
    const std::uint64_t seq = recorder_->enter(what, bytes_of(ts), static_cast<int>(ts.size()));
    auto finished = std::make_shared<std::atomic<bool>>(false);
    auto task = std::make_shared<std::packaged_task<void()>>([this, what, seq, finished, call = std::move(call)] {
      const auto start = std::chrono::steady_clock::now();
      recorder_->started(seq);
      try {
        call();
        const auto end = std::chrono::steady_clock::now();
        recorder_->ended(seq, true);
        finished->store(true);
        std::lock_guard lock(mutex_);
        if (timing_) spans_.push_back({ms_since_origin(start), ms_since_origin(end)});
      } catch (const std::exception& e) {
        recorder_->ended(seq, false);
        finished->store(true);
        const CollectiveRecord r = recorder_->record(seq);
        const std::string path = recorder_->write("failed");
        throw RankFailure(fmt::format(
            "the {} #{} of step {} ({}) over Gloo failed on rank {} of {} after {:.1f} s: {}{}", what, seq, r.step,
            size_words(r.bytes, r.tensors), world_.rank, world_.size,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), collective_failure(e),
            path.empty() ? "" : fmt::format("; its last collectives are in '{}'", path)));
      }
    });
    std::future<void> done = task->get_future();
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back([task] { (*task)(); });
    }
    watchdog_->watch(seq, [finished] { return finished->load(); });
    wake_.notify_one();
    return std::make_unique<GlooWork>(std::move(done));
  }

  void run_queue() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, and nothing left to run
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  World world_;
  std::shared_ptr<gloo::Context> context_;
  std::uint32_t tag_ = 0;  // only the worker touches it
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool timing_ = false;  // these three under mutex_
  std::chrono::steady_clock::time_point origin_;
  std::vector<Span> spans_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const World& world, Store& store) {
  return std::make_unique<GlooCommunicator>(world, store);
}

}  // namespace lmscope::parallel
