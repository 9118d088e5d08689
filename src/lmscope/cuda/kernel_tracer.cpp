// CUPTI's activity API gives each kernel, memset and memcpy with device start and end. The phase of
// a record comes from an external correlation id pushed per phase: CUPTI writes one
// external-correlation record per launch made under it, and the launch's correlation id ties that to
// the kernel record.
#include "lmscope/cuda/kernel_tracer.h"

#include "lmscope/cuda/cuda_check.h"

#include <cupti.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace lmscope::cuda {
namespace {

constexpr CUpti_ExternalCorrelationKind kPhaseKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
// External-correlation records come only with API records, so the runtime's and the driver's
// (cuBLASLt launches through the driver) are on too, though nothing reads them.
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
// process-wide place; hence one tracer at a time.
struct Collector {
  std::mutex mu;
  bool active = false;
  std::vector<KernelRecord> records;
  std::vector<std::uint32_t> correlation;                     // of records[i]
  std::unordered_map<std::uint32_t, std::uint64_t> phase_of;  // correlation id -> Phase
  std::unordered_map<const char*, std::string> names;         // CUPTI's name pointer -> short name
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

void add(Collector& c, std::string name, std::uint64_t start, std::uint64_t end, std::uint32_t correlation) {
  c.records.push_back({std::move(name), Phase::setup, start, end});
  c.correlation.push_back(correlation);
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
          add(c, it->second, k->start, k->end, k->correlationId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
          add(c, "[memset]", m->start, m->end, m->correlationId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
          add(c, "[memcpy]", m->start, m->end, m->correlationId);
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
      c.records.clear();
      c.correlation.clear();
      c.phase_of.clear();
    }
    try {
      LMSCOPE_CUDA_CHECK(cudaDeviceSynchronize());  // earlier work is not this tracer's
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

  std::vector<KernelRecord> finish() override {
    LMSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
    stop();
    std::vector<KernelRecord> out;
    std::size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
    {
      Collector& c = collector();
      std::lock_guard lock(c.mu);
      out = std::move(c.records);
      for (std::size_t i = 0; i < out.size(); ++i) {
        auto it = c.phase_of.find(c.correlation[i]);
        if (it != c.phase_of.end()) out[i].phase = static_cast<Phase>(it->second);
      }
    }
    release();
    if (dropped > 0) throw std::runtime_error(fmt::format("CUPTI dropped {} activity records", dropped));
    std::sort(out.begin(), out.end(),
              [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
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
