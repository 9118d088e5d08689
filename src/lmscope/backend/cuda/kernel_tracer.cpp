// CUPTI's activity API gives each kernel, memset and memcpy with device start and end, and each
// runtime and driver call with host start and end; a correlation id ties a call to the work it
// enqueued. The phase of a record comes from an external correlation id pushed per phase: CUPTI
// writes one external-correlation record per launch made under it. CUPTI takes its timestamps from
// the host's steady clock here (a timestamp callback), the allocator's clock, so that device work,
// host calls and host ranges share one time line.
#include "lmscope/backend/cuda/kernel_tracer.h"

#include "lmscope/backend/cuda/cuda_check.h"

#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace lmscope::cuda {
namespace {

constexpr CUpti_ExternalCorrelationKind kPhaseKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
// The driver's calls are on beside the runtime's because cuBLASLt launches through the driver.
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
constexpr std::size_t kBufferBytes = std::size_t{8} << 20;

void cupti_check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  throw Unsupported(fmt::format("CUPTI {} failed: {}", what, msg ? msg : "unknown error"));
}

// CUPTI hands buffers back to plain functions (on its own thread), so records gather in one
// process-wide place; hence one tracer at a time. Per process, not per device, as CUPTI's activity
// API is: it hears every device's kernels, each record naming its device.
struct Collector {
  std::mutex mu;
  bool active = false;
  DeviceActivity activity;
  std::unordered_map<std::uint32_t, std::uint64_t> phase_of;  // correlation id -> Phase
  std::unordered_map<const char*, std::string> names;         // CUPTI's name pointer -> short name
  std::unordered_map<std::uint64_t, std::string> api_names;   // domain << 32 | callback id -> name
};
Collector& collector() {
  static Collector c;
  return c;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

KernelRecord device_work(std::string name, DeviceWork work, std::uint64_t start, std::uint64_t end,
                         std::uint32_t device, std::uint32_t stream, std::uint32_t correlation) {
  KernelRecord r;
  r.name = std::move(name);
  r.work = work;
  r.start_ns = start;
  r.end_ns = end;
  r.device = device;
  r.stream = stream;
  r.correlation = correlation;
  return r;
}

std::uint64_t CUPTIAPI steady_clock_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

const char* copy_kind(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "PtoP";
    default:
      return "other";
  }
}

// "cudaLaunchKernel" for the runtime's cudaLaunchKernel_v7000.
const std::string& api_name(Collector& c, CUpti_CallbackDomain domain, std::uint32_t cbid) {
  auto [it, fresh] = c.api_names.try_emplace(std::uint64_t{domain} << 32 | cbid);
  if (fresh) {
    const char* raw = nullptr;
    if (cuptiGetCallbackName(domain, cbid, &raw) != CUPTI_SUCCESS || !raw) raw = "cuda call";
    std::string name(raw);
    const std::size_t v = name.rfind("_v");
    if (v != std::string::npos && v + 2 < name.size() &&
        name.find_first_not_of("0123456789", v + 2) == std::string::npos)
      name.resize(v);
    it->second = std::move(name);
  }
  return it->second;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t, std::size_t valid) {
  Collector& c = collector();
  {
    std::lock_guard lock(c.mu);
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
          auto [it, fresh] = c.names.try_emplace(k->name);
          if (fresh) it->second = short_kernel_name(k->name);
          KernelRecord r =
              device_work(it->second, DeviceWork::kernel, k->start, k->end, k->deviceId, k->streamId, k->correlationId);
          r.grid[0] = static_cast<std::uint32_t>(k->gridX);
          r.grid[1] = static_cast<std::uint32_t>(k->gridY);
          r.grid[2] = static_cast<std::uint32_t>(k->gridZ);
          r.block[0] = static_cast<std::uint32_t>(k->blockX);
          r.block[1] = static_cast<std::uint32_t>(k->blockY);
          r.block[2] = static_cast<std::uint32_t>(k->blockZ);
          r.registers = k->registersPerThread;
          r.shared_bytes = k->staticSharedMemory + k->dynamicSharedMemory;
          c.activity.work.push_back(std::move(r));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          KernelRecord r =
              device_work("[memset]", DeviceWork::memset, m->start, m->end, m->deviceId, m->streamId, m->correlationId);
          r.bytes = m->bytes;
          c.activity.work.push_back(std::move(r));
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          KernelRecord r =
              device_work("[memcpy]", DeviceWork::memcpy, m->start, m->end, m->deviceId, m->streamId, m->correlationId);
          r.bytes = m->bytes;
          r.copy = copy_kind(m->copyKind);
          c.activity.work.push_back(std::move(r));
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
          const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
          const auto domain =
              rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
          c.activity.launches.push_back(
              {api_name(c, domain, a->cbid), a->start, a->end, a->correlationId, domain == CUPTI_CB_DOMAIN_DRIVER_API});
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(rec);
          if (e->externalKind == kPhaseKind) c.phase_of[e->correlationId] = e->externalId;
          break;
        }
        default:
          break;
      }
    }
  }
  std::free(buffer);
}

class CuptiKernelTracer final : public KernelTracer {
 public:
  CuptiKernelTracer() {
    Collector& c = collector();
    {
      std::lock_guard lock(c.mu);
      if (c.active) throw Unsupported("only one kernel tracer can run at a time");
      c.active = true;
      c.activity = {};
      c.phase_of.clear();
    }
    try {
      LMSCOPE_CUDA_CHECK(cudaDeviceSynchronize());  // earlier work is not this tracer's
      // Before any kind is enabled, as CUPTI asks, so every record uses it.
      cupti_check(cuptiActivityRegisterTimestampCallback(steady_clock_ns), "timestamp callback");
      cupti_check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "activity callbacks");
      for (CUpti_ActivityKind k : kKinds) cupti_check(cuptiActivityEnable(k), "enabling activity records");
    } catch (...) {
      release();
      throw;
    }
  }
  ~CuptiKernelTracer() override {
    if (finished_) return;
    stop();
    release();
  }

  void set_phase(Phase p) override {
    pop();
    cupti_check(cuptiActivityPushExternalCorrelationId(kPhaseKind, static_cast<std::uint64_t>(p)), "phase push");
    pushed_ = true;
  }

  DeviceActivity finish() override {
    LMSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    stop();
    DeviceActivity out;
    std::size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
    {
      Collector& c = collector();
      std::lock_guard lock(c.mu);
      out = std::move(c.activity);
      for (KernelRecord& r : out.work) {
        auto it = c.phase_of.find(r.correlation);
        if (it != c.phase_of.end()) r.phase = static_cast<Phase>(it->second);
      }
    }
    release();
    if (dropped > 0) throw std::runtime_error(fmt::format("CUPTI dropped {} activity records", dropped));
    auto by_start = [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; };
    std::sort(out.work.begin(), out.work.end(), by_start);
    std::sort(out.launches.begin(), out.launches.end(), by_start);
    return out;
  }

 private:
  void pop() {
    if (pushed_) cuptiActivityPopExternalCorrelationId(kPhaseKind, nullptr);
    pushed_ = false;
  }
  // Best effort: also runs from the destructor, where throwing is not an option.
  void stop() {
    pop();
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
    finished_ = true;
  }
  static void release() {
    Collector& c = collector();
    std::lock_guard lock(c.mu);
    c.active = false;
  }

  bool pushed_ = false, finished_ = false;
};

}  // namespace

std::unique_ptr<KernelTracer> make_kernel_tracer() { return std::make_unique<CuptiKernelTracer>(); }

}  // namespace lmscope::cuda
