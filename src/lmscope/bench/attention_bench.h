// One attention benchmark cell (the seeds' and the assignment's attention benchmarks): random
// q, k, v of [batch·heads, seq, d], timed forward passes, the memory held before backward, timed
// backward passes and timed forward+backward pairs, naive or flash, in one precision.
#pragma once

#include "lmscope/bench/runner.h"
#include "lmscope/model/attention.h"

#include <string>

namespace lmscope {

struct AttentionBenchSpec {
  AttentionKind kind = AttentionKind::flash;
  std::string device = "cpu";
  std::string precision = "fp32";  // fp32 (no tensor cores), or bf16 or fp16 storage with fp32 accumulation
  std::int64_t batch = 8, heads = 1, seq = 1024, d = 64;
  bool causal = true;
  FlashDq dq = FlashDq::fastest;  // flash: how the backward sums dq (AttentionCall)
  int warmup = 10, iters = 100;
  double max_seconds = 10;  // per phase: stop timing early once this much was measured (at least 3 passes)
  std::uint64_t seed = 0;
};

struct AttentionBenchResult {
  AttentionBenchSpec spec;
  std::string status = "ok";
  PhaseStats forward, backward, forward_backward;
  // Causal FLOPs counted once: forward 4·n·T²·d (half of it under the mask), backward 2.5x that.
  double forward_flops = 0, backward_flops = 0;
  std::size_t input_bytes = 0;          // q, k, v, dO and dq, dk, dv
  std::size_t saved_bytes = 0;          // held after forward beyond the inputs: the output and what backward reads
  std::size_t saved_bytes_formula = 0;  // the same from the accounting: O, plus P (naive) or L (flash)
  std::size_t peak_bytes = 0;           // over one forward and backward
  double peak_tflops = 0;               // the device's datasheet peak for the precision; 0 when unknown
  bool deterministic = true;            // the backward's dq summed in a fixed order (what spec.dq resolved to)
  bool ok() const { return status == "ok"; }
  double tflops(const PhaseStats& p, double flops) const { return p.n ? flops / (p.mean * 1e-3) / 1e12 : 0.0; }
};

// Never throws for a failing cell: the failure (OOM, unsupported) becomes the status.
// UserError unless precision is one attention runs in: fp32, bf16 or fp16.
void check_attention_precision(const std::string& precision);

// UserError for a cell no device holds: past 2^50 bytes of inputs, gradients and what the forward
// keeps (its sizes overflowed 64 bits on the way: a d of 2^62 crashed, batch × heads of 2^64 ran as none).
void validate_attention_cell(const AttentionBenchSpec& spec);
AttentionBenchResult run_attention_cell(const AttentionBenchSpec& spec, const BenchProgress& progress = {});

}  // namespace lmscope
