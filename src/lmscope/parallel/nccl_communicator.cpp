// Collectives between GPUs on NCCL. Each runs on the communicator's own stream, after the work the
// backend's stream had enqueued when it was called (an event between the two), so a gradient's
// all-reduce overlaps the rest of the backward; wait() makes the backend's stream wait for it, and
// the host goes on. The ranks meet once, in the store, for NCCL's unique id. A watchdog
// (collective_watchdog.h) aborts the communicator when a collective does not end or NCCL reports an
// error of its own.
#include "lmscope/backend/backend.h"
#include "lmscope/backend/cuda/cuda_check.h"
#include "lmscope/backend/cuda/stream_pool.h"
#include "lmscope/parallel/collective_watchdog.h"
#include "lmscope/parallel/communicator.h"
#include "lmscope/parallel/nccl_version.h"

#include <nccl.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace lmscope::parallel {

int nccl_library_version();  // below; communicator.cpp's loaded_nccl_version

namespace {

// What NCCL said went wrong, in one line.
std::string nccl_failure(ncclComm_t comm, ncclResult_t r) {
  const char* last = ncclGetLastError(comm);
  return last && *last ? fmt::format("{} ({})", ncclGetErrorString(r), last) : ncclGetErrorString(r);
}

// A call that answers "in progress" (a non-blocking communicator's, or NCCL's initialisation under
// NCCL_COMM_BLOCKING=0): the next call waits until NCCL has finished it, at most `limit`.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, std::chrono::seconds limit) {
  if (r != ncclInProgress) return r;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() > until) return ncclInProgress;
    std::this_thread::yield();
  }
}

#define LMSCOPE_NCCL_CHECK(call, what)                                                                         \
  do {                                                                                                         \
    const ncclResult_t r_ = settle(comm_, (call), timeout_);                                                   \
    if (r_ == ncclInProgress)                                                                                  \
      throw RankFailure(                                                                                       \
          fmt::format("NCCL's {} did not finish within {} s on rank {}", what, timeout_.count(), rank_));      \
    if (r_ != ncclSuccess)                                                                                     \
      throw RankFailure(fmt::format("NCCL's {} failed on rank {}: {}", what, rank_, nccl_failure(comm_, r_))); \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
  }
  return ncclFloat32;
}

// An event both the work and the watchdog hold: destroyed when the later lets go.
using SharedEvent = std::shared_ptr<CUevent_st>;
SharedEvent shared_event(cudaEvent_t e) {
  return SharedEvent(e, [](cudaEvent_t p) { cudaEventDestroy(p); });
}

// The backend's stream waits for `done` (recorded after the collective on the communicator's).
class NcclWork final : public CollectiveWork {
 public:
  NcclWork(SharedEvent done, cudaStream_t compute) : done_(std::move(done)), compute_(compute) {}
  void wait() override { LMSCOPE_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0)); }

 private:
  SharedEvent done_;
  cudaStream_t compute_;
};

// Symmetric windows (ncclCommWindowRegister) came with NCCL 2.27.3; with an older NCCL the
// gradients sit in the backend's memory and the all-reduce is the ring's.
#define LMSCOPE_NCCL_WINDOWS (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3))

#if LMSCOPE_NCCL_WINDOWS
// The symmetric windows a communicator registered (symmetric_memory). Deregistering is collective,
// so it happens when the communicator goes, every rank at the same point; memory the allocator gives
// back before then is freed then too.
struct Windows {
  ncclComm_t comm = nullptr;  // null once the communicator is gone
  int rank = 0;
  bool copy_engines = false;                               // CommunicatorOptions's (what a missing window costs)
  std::chrono::seconds timeout{600};                       // the communicator's for a call in progress
  std::vector<std::pair<void*, ncclWindow_t>> registered;  // in the order made, the same on every rank
  std::vector<void*> given_back;
  bool registered_here(void* p) const {
    return std::any_of(registered.begin(), registered.end(), [&](const auto& r) { return r.first == p; });
  }
};
#endif

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Backend& backend, const World& world, Store& store, const CommunicatorOptions& options)
      : compute_(static_cast<cudaStream_t>(backend.cuda_stream())),
        allocator_(backend.allocator()),
        rank_(world.rank),
        size_(world.size),
        timeout_(world.timeout) {
    ncclUniqueId id{};
    const std::string key = "nccl.unique_id";
    if (world.rank == 0) {
      LMSCOPE_NCCL_CHECK(ncclGetUniqueId(&id), "unique id");
      store.set(key, std::vector<char>(id.internal, id.internal + sizeof id.internal));
    } else {
      store.wait({key}, std::chrono::duration_cast<std::chrono::milliseconds>(world.timeout));
      const std::vector<char> got = store.get(key);
      LMSCOPE_CHECK(got.size() == sizeof id.internal, "NCCL's unique id in the store has {} bytes", got.size());
      std::memcpy(id.internal, got.data(), got.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Blocking (NCCL's default): on a non-blocking communicator NCCL 2.28.9 returned from
    // ncclCommWindowRegister before it had filled in the window (no symmetric window, the ring's
    // all-reduce), and one of four 2.7B runs of two ranks ended in SIGSEGV (2026-11-28, two H200s,
    // docs/failures.md "Timeouts"). ncclCommAbort from the watchdog's thread ends a blocked rank either way.
    if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
    if (options.copy_engines) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#else
      throw Unsupported(
          fmt::format("NCCL's copy-engine collectives came with 2.28, and this build has NCCL's {} headers: use "
                      "--grad-exchange all-reduce, or build against a newer NCCL",
                      nccl_version_text(NCCL_VERSION_CODE)));
#endif
    }
    const ncclResult_t made =
        settle(comm_, ncclCommInitRankConfig(&comm_, world.size, id, world.rank, &config), world.timeout);
    if (made != ncclSuccess) {
      const std::string why =
          made == ncclInProgress
              ? fmt::format("the other ranks did not join within {} s (LMSCOPE_DIST_TIMEOUT)", world.timeout.count())
              : nccl_failure(comm_, made);
      if (comm_) ncclCommAbort(comm_);
      throw RankFailure(fmt::format("NCCL's initialisation failed on rank {}: {}", rank_, why));
    }
    timeout_ = world.collective_timeout;
    stream_ = cuda::take_stream();  // as the backend's: a sweep's later cells exchange as its first
#if LMSCOPE_NCCL_WINDOWS
    windows_->comm = comm_;
    windows_->rank = rank_;
    windows_->copy_engines = options.copy_engines;
    windows_->timeout = timeout_;
#endif
    int device = 0;
    LMSCOPE_CUDA_CHECK(cudaGetDevice(&device));
    recorder_ = std::make_unique<FlightRecorder>(world, "nccl");
    ncclComm_t comm = comm_;
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        *recorder_, world, "NCCL",
        CollectiveWatchdog::Hooks{[device] { cudaSetDevice(device); },
                                  [comm]() -> std::string {
                                    ncclResult_t state = ncclSuccess;
                                    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return "";
                                    return state == ncclSuccess || state == ncclInProgress ? std::string{}
                                                                                           : nccl_failure(comm, state);
                                  },
                                  [comm] { ncclCommAbort(comm); }});
  }

  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);  // watched still: a collective that never ends ends the rank
    watchdog_->stop();
#if LMSCOPE_NCCL_WINDOWS
    for (auto& [p, window] : windows_->registered)
      if (window) settle(comm_, ncclCommWindowDeregister(comm_, window), timeout_);
    for (void* p : windows_->given_back) ncclMemFree(p);
    windows_->registered.clear();
    windows_->given_back.clear();
    windows_->comm = nullptr;
#endif
    for (auto& t : timed_) {
      cudaEventDestroy(t.first);
      cudaEventDestroy(t.second);
    }
    if (origin_) cudaEventDestroy(origin_);
    // Finalised (its last operations flushed) before it is destroyed; one that cannot be, aborted.
    if (settle(comm_, ncclCommFinalize(comm_), timeout_) == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
    cuda::give_back_stream(stream_);  // synchronised above
  }

  std::string name() const override { return "nccl"; }
  std::string version() const override {
    const int code = nccl_library_version();
    return code > 0 ? nccl_version_text(code) : std::string{};  // 0: ncclGetVersion did not say
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  using Communicator::all_reduce_async;
  std::unique_ptr<CollectiveWork> all_reduce_async(std::span<const Tensor> ts) override {
    return launch("all-reduce", ts, [&] {
      // The group is closed whatever fails inside it: an open group would defer every later NCCL call
      // of this thread (the next bench cell's too).
      LMSCOPE_NCCL_CHECK(ncclGroupStart(), "group start");
      ncclResult_t first = ncclSuccess;
      for (const Tensor& t : ts)
        if (first == ncclSuccess)
          first = ncclAllReduce(t.data, t.data, static_cast<std::size_t>(t.numel()), nccl_type(t.dtype), ncclSum, comm_,
                                stream_);
      const ncclResult_t end = ncclGroupEnd();
      LMSCOPE_NCCL_CHECK(first, "all-reduce");
      LMSCOPE_NCCL_CHECK(end, "all-reduce");
    });
  }

  std::unique_ptr<CollectiveWork> reduce_scatter_async(const Tensor& in, const Tensor& out) override {
    LMSCOPE_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * size_, "reduce-scatter of {} into {}",
                  in.numel(), out.numel());
    return launch("reduce-scatter", {&in, 1}, [&] {
      LMSCOPE_NCCL_CHECK(ncclReduceScatter(in.data, out.data, static_cast<std::size_t>(out.numel()),
                                           nccl_type(in.dtype), ncclSum, comm_, stream_),
                         "reduce-scatter");
    });
  }

  using Communicator::all_gather_async;
  std::unique_ptr<CollectiveWork> all_gather_async(std::span<const Tensor> ins, std::span<const Tensor> outs) override {
    check_all_gather(ins, outs);
    return launch("all-gather", ins, [&] {
      LMSCOPE_NCCL_CHECK(ncclGroupStart(), "group start");  // closed whatever fails, as all-reduce's
      ncclResult_t first = ncclSuccess;
      for (std::size_t i = 0; i < ins.size() && first == ncclSuccess; ++i)
        first = ncclAllGather(ins[i].data, outs[i].data, static_cast<std::size_t>(ins[i].numel()),
                              nccl_type(ins[i].dtype), comm_, stream_);
      const ncclResult_t end = ncclGroupEnd();
      LMSCOPE_NCCL_CHECK(first, "all-gather");
      LMSCOPE_NCCL_CHECK(end, "all-gather");
    });
  }

  std::unique_ptr<CollectiveWork> broadcast_async(const Tensor& t, int root) override {
    return launch("broadcast", {&t, 1}, [&] {
      LMSCOPE_NCCL_CHECK(
          ncclBroadcast(t.data, t.data, static_cast<std::size_t>(t.numel()), nccl_type(t.dtype), root, comm_, stream_),
          "broadcast");
    });
  }

  // An all-reduce of one number, waited for by the host: every rank has reached it. (Its buffer is
  // made here, not kept: a run's record stays the dry run's, whose collectives hold nothing.)
  void barrier() override {
    Allocation one = allocator_.allocate({1}, DType::f32, {MemKind::workspace, "nccl.barrier", -1});
    all_reduce_async(one)->wait();
    LMSCOPE_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

#if LMSCOPE_NCCL_WINDOWS
  RegionMemory symmetric_memory() override {
    // No windows from an NCCL older than the first seen to sum right in them (parallel/nccl_version.h):
    // the flags turn symmetric memory off for it already (cli/parallel_flags.cpp); this keeps any
    // other caller out too.
    if (!symmetric_windows_trusted(nccl_library_version())) return {};
    std::shared_ptr<Windows> w = windows_;
    auto allocate = [w](std::size_t bytes) -> void* {
      void* p = nullptr;
      if (ncclMemAlloc(&p, bytes) != ncclSuccess) return nullptr;
      ncclWindow_t window{};
      const ncclResult_t r =
          settle(w->comm, ncclCommWindowRegister(w->comm, p, bytes, &window, NCCL_WIN_COLL_SYMMETRIC), w->timeout);
      if (r != ncclSuccess) {
        ncclMemFree(p);
        throw RankFailure(fmt::format("NCCL's window registration failed on rank {}: {}", w->rank,
                                      r == ncclInProgress ? "it did not finish" : nccl_failure(w->comm, r)));
      }
      // NCCL answers with no window where its symmetric kernels cannot run (GPUs without peer access,
      // NCCL_WIN_ENABLE=0): the memory still serves, the all-reduce is the ring's.
      if (!window && w->rank == 0)
        fmt::print(stderr, "{}",
                   w->copy_engines
                       ? "lmscope: NCCL made no symmetric window here; the gradients' all-gather runs as NCCL's "
                         "kernel, not on the copy engines\n"
                       : "lmscope: NCCL made no symmetric window here; the gradients' all-reduce runs on its ring "
                         "(give --comm-sms 0 then, or --symmetric-memory off)\n");
      w->registered.emplace_back(p, window);
      return p;
    };
    auto free = [w](void* p, std::size_t) {
      if (w->comm && w->registered_here(p))
        w->given_back.push_back(p);  // freed once deregistered, as the communicator goes
      else
        ncclMemFree(p);
    };
    return {allocate, free};
  }

#endif

  void start_timing() override {
    if (!origin_) LMSCOPE_CUDA_CHECK(cudaEventCreate(&origin_));
    LMSCOPE_CUDA_CHECK(cudaEventRecord(origin_, compute_));
    timing_ = true;
  }

  std::vector<Span> finish_timing() override {
    std::vector<Span> spans;
    for (auto& [start, end] : timed_) {
      float a = 0, b = 0;
      LMSCOPE_CUDA_CHECK(cudaEventElapsedTime(&a, origin_, start));
      LMSCOPE_CUDA_CHECK(cudaEventElapsedTime(&b, origin_, end));
      spans.push_back({a, b});
      cudaEventDestroy(start);
      cudaEventDestroy(end);
    }
    timed_.clear();
    timing_ = false;
    return spans;
  }

 private:
  // Orders `call` (an NCCL op on stream_) after the backend's work so far; its end is the work's.
  template <typename Call>
  std::unique_ptr<CollectiveWork> launch(const char* kind, std::span<const Tensor> ts, Call&& call) {
    const std::uint64_t seq = recorder_->enter(kind, bytes_of(ts), static_cast<int>(ts.size()));
    cudaEvent_t ready = nullptr, done = nullptr;
    LMSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    LMSCOPE_CUDA_CHECK(cudaEventRecord(ready, compute_));
    LMSCOPE_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);  // released once it has fired
    cudaEvent_t start = nullptr;
    if (timing_) {
      LMSCOPE_CUDA_CHECK(cudaEventCreate(&start));
      LMSCOPE_CUDA_CHECK(cudaEventRecord(start, stream_));
    }
    call();
    LMSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&done, timing_ ? 0 : cudaEventDisableTiming));
    LMSCOPE_CUDA_CHECK(cudaEventRecord(done, stream_));
    SharedEvent shared = shared_event(done);
    watchdog_->watch(seq, [shared] { return cudaEventQuery(shared.get()) != cudaErrorNotReady; });
    if (timing_) {
      cudaEvent_t end = nullptr;  // a copy of `done` the work does not destroy
      LMSCOPE_CUDA_CHECK(cudaEventCreate(&end));
      LMSCOPE_CUDA_CHECK(cudaEventRecord(end, stream_));
      timed_.emplace_back(start, end);
    }
    return std::make_unique<NcclWork>(std::move(shared), compute_);
  }

  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  Allocator& allocator_;
#if LMSCOPE_NCCL_WINDOWS
  std::shared_ptr<Windows> windows_ = std::make_shared<Windows>();
#endif
  int rank_ = 0, size_ = 1;
  std::chrono::seconds timeout_;  // for a call NCCL finishes in the background: the rendezvous's, then a collective's
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  bool timing_ = false;
  cudaEvent_t origin_ = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timed_;
};

}  // namespace

int nccl_library_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const World& world, Store& store,
                                                     const CommunicatorOptions& options) {
  return std::make_unique<NcclCommunicator>(backend, world, store, options);
}

}  // namespace lmscope::parallel
