#include "lmscope/backend/meta/meta_backend.h"

#include "lmscope/backend/devices.h"
#include "lmscope/backend/op_scratch.h"
#include "lmscope/device/device_facts.h"
#include "lmscope/device/storage_elem.h"

#include <cstring>

namespace lmscope {
namespace {

// Addresses that stand for the device's: distinct, 512-byte aligned as cudaMalloc's are, never
// dereferenced. Nothing is reserved: a segment only moves a counter, which counts what the device
// counts (the CUDA driver's pages for cuda), so a segment fails where the device's would.
class MetaAllocator final : public Allocator {
 public:
  MetaAllocator(std::string name, std::size_t capacity, bool cuda_pages)
      : name_(std::move(name)), capacity_(capacity), cuda_pages_(cuda_pages) {}
  ~MetaAllocator() override { release_all(); }
  std::string device_name() const override { return name_; }
  std::size_t capacity() const override { return capacity_; }

 protected:
  void* segment_allocate(std::size_t bytes) override {
    if (counted_ + counted(bytes) > capacity_) return nullptr;
    counted_ += counted(bytes);
    const std::uintptr_t at = next_;
    next_ += (bytes + 511) / 512 * 512;
    return reinterpret_cast<void*>(at);  // NOLINT: a token, not memory
  }
  void segment_free(void*, std::size_t bytes) override { counted_ -= counted(bytes); }

 private:
  std::size_t counted(std::size_t bytes) const { return cuda_pages_ ? driver_segment_bytes(bytes) : bytes; }
  std::string name_;
  std::size_t capacity_;
  bool cuda_pages_;
  std::size_t counted_ = 0;
  std::uintptr_t next_ = std::uintptr_t(1) << 44;
};

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(const DryRunTarget& target)
      : target_(target),
        alloc_("dry run of " + target.device_name, target.memory - std::min(target.memory, target.overhead),
               target.device == "cuda") {}
  std::string name() const override { return alloc_.device_name(); }
  Allocator& allocator() override { return alloc_; }
  int mark() override { return 0; }
  double elapsed_ms(int, int) override { return 0; }
  void clear_marks() override {}

  void copy_from_host(const Tensor&, const void*) override {}
  void copy_to_host(void* dst, const Tensor& src) override { std::memset(dst, 0, src.bytes()); }
  void fill(const Tensor&, double) override {}
  void add(const Tensor&, const Tensor&, const Tensor&) override {}
  void cast(const Tensor&, const Tensor&) override {}
  void gemm(const GemmArgs&) override {
    // As the CUDA backend's first GEMM makes cuBLASLt's workspace (cuda/gemm.h), held from then on.
    if (on_cuda() && gemm_workspace_.empty()) gemm_workspace_ = scratch::cuda_gemm_workspace(alloc_);
  }
  void embedding_forward(const Tensor&, const Tensor&, const Tensor&) override {}
  void embedding_backward(const Tensor&, const Tensor&, const Tensor&, bool) override {}
  void rmsnorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) override {}
  void rmsnorm_backward(const Tensor&, const Tensor& x, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&) override {
    if (on_cuda()) const Allocation partials = scratch::cuda_rmsnorm_backward(alloc_, x.numel() / x.dim(-1), x.dim(-1));
  }
  void split_heads(const Tensor& in, const Tensor&, double theta) override { rope(in.dim(1), in.dim(3), theta); }
  void merge_heads(const Tensor&, const Tensor& out, double theta) override { rope(out.dim(1), out.dim(3), theta); }
  void softmax_forward(const Tensor&, const Tensor&, double, bool) override {}
  void softmax_backward(const Tensor&, const Tensor&, const Tensor&, double) override {}

  void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                               double, bool causal) override {
    const AttentionShape s = attention_shape(q, k, v, out, lse);
    if (!on_cuda()) return;
    scratch::cuda_flash_limits(s);
    const Allocation parts = scratch::cuda_flash_forward(
        alloc_, flash_attention_plan(target_.flash, elem(q), static_cast<int>(s.d), s.n, s.tq, s.tk, causal, true));
  }
  FlashDq flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   double, bool causal, FlashDq dq_sum) override {
    const AttentionShape s = attention_shape(q, k, v, out, lse);
    if (!on_cuda()) {
      const Allocation delta = scratch::cpu_flash_backward(alloc_, s, q.dtype);
      return FlashDq::deterministic;
    }
    scratch::cuda_flash_limits(s);
    const FlashAttentionPlan plan = scratch::cuda_flash_backward_plan(target_.flash, elem(q), s, causal, dq_sum);
    const scratch::CudaFlashBackward w = scratch::cuda_flash_backward(alloc_, plan, s);
    return plan.atomic_dq() ? FlashDq::atomic : FlashDq::deterministic;
  }

  void swiglu_forward(const Tensor&, const Tensor&, const Tensor&) override {}
  void swiglu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  using Backend::cross_entropy_forward;
  void cross_entropy_forward(const Tensor& logits, const Tensor&, const Tensor&, const Tensor&, double, bool) override {
    if (on_cuda()) const Allocation row_loss = scratch::cuda_cross_entropy(alloc_, logits.numel() / logits.dim(-1));
  }
  void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) override {}
  void global_norm(std::span<const Tensor> tensors, const Tensor&) override {
    // As the CUDA backend does: made again when the number of tensors changes.
    if (on_cuda() && (norm_sum_.empty() || norm_sum_.tensor().numel() != static_cast<std::int64_t>(tensors.size()) *
                                                                             scratch::kGlobalNormBlocks)) {
      norm_sum_.reset();
      norm_sum_ = scratch::cuda_global_norm(alloc_, tensors.size());
    }
  }
  void adamw(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWArgs&, const Tensor&,
             const Tensor&) override {}
  std::size_t adamw_group() const override { return on_cuda() ? scratch::kCudaAdamWGroup : 1; }

 private:
  bool on_cuda() const { return target_.device == "cuda"; }
  static Elem elem(const Tensor& t) { return storage_elem(t); }
  void rope(std::int64_t t, std::int64_t dk, double theta) {
    if (on_cuda()) rope_tables_.get(alloc_, t, dk, theta);
  }

  DryRunTarget target_;
  MetaAllocator alloc_;
  Allocation gemm_workspace_;
  Allocation norm_sum_;
  scratch::RopeTables rope_tables_;
};

}  // namespace

DryRunTarget dry_run_target(const std::string& device, std::size_t memory_limit) {
  DryRunTarget t;
  t.device = device;
  if (device == "cpu") {
    t.device_name = "cpu";
    t.memory = memory_limit ? memory_limit : host_available_memory();
    return t;
  }
  if (device != "cuda") user_error("unknown device '{}' (use cpu or cuda)", device);
  // The current GPU where there is one, else the stored H100 standing as GPU 0.
  const Device gpu =
      list_gpus().empty() ? Device(DeviceKind::cuda, 0, h100_facts()) : cuda_device(current_cuda_device());
  t.device_name = gpu.name();
  t.memory = memory_limit ? memory_limit : gpu.facts().memory_bytes;
  t.flash = gpu.facts().flash;
  if (t.device_name.find("H100 80GB HBM3") != std::string::npos) {
    t.overhead = h100_device_overhead_bytes();
    t.overhead_source = h100_device_overhead_source();
  }
  return t;
}

std::unique_ptr<Backend> make_meta_backend(const DryRunTarget& target, const std::string& precision) {
  check_precision(precision);
  if (target.device == "cpu" && precision != "fp32")
    throw Unsupported(fmt::format("the CPU backend computes in fp32 only, not {}", precision));
  return std::make_unique<MetaBackend>(target);
}

bool is_dry_run(const Backend& backend) { return dynamic_cast<const MetaBackend*>(&backend) != nullptr; }

}  // namespace lmscope
