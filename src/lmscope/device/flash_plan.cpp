#include "lmscope/device/flash_plan.h"

#include "lmscope/device/tile_order.h"

#include <algorithm>
#include <stdexcept>

namespace lmscope {
namespace {

// Inner tiles of 64 that outer tile i of `rows` rows walks: key tiles under a query tile (the forward
// and dQ kernels), query tiles under a key tile (the dK/dV kernels), as the kernels bound their loops.
long long keys_seen(long long i, int rows, long long tk, bool causal) {
  return ((causal ? std::min(tk, (i + 1) * rows) : tk) + 63) / 64;
}
long long queries_seen(long long j, int rows, long long tq, bool causal) {
  const long long tiles = (tq + 63) / 64;
  return tiles - (causal ? std::min(tiles, j * rows / 64) : 0);
}

// Parts per tile (tile_order.h) for n sequences of t outer rows in tiles of `rows`, `per_sm` CTAs
// resident per SM: by two of them per SM, or, in long parts, by all of them where there are more.
template <typename Inner>
int parts_for(long long sms, long long n, long long t, int rows, int per_sm, int shares, Inner inner) {
  const long long tiles = (t + rows - 1) / rows, slots = sms * std::min(per_sm, 2);
  if (n * tiles >= 2 * sms * per_sm) return 1;  // the heaviest tile is at most about one slot's share
  long long work = 0, longest = 0;
  for (long long i = 0; i < tiles; ++i) {
    const long long w = inner(i);
    work += w, longest = std::max(longest, w);
  }
  const int parts = split_parts(n * work, longest, slots, shares);
  return per_sm > 2 ? std::max(parts, split_parts(n * work, longest, sms * per_sm, kLongPartShares, kLongPartTiles))
                    : parts;
}

struct KernelChoice {
  bool wgmma;
  int parts;
};
// The Hopper kernel (128-row tiles) where there is one, with parts, and CTAs for at least 7/8 of the
// SMs; else the mma.sync one (64-row tiles). Measured on the H100 (132 SMs, docs/flash-attention.md):
// with 64 128-row CTAs the mma.sync kernels' 64-row tiles spread over more SMs and win (forward,
// batch 8, seq 1024: 0.025 against 0.030 ms); with 128 the wgmma kernels win (batch 1, seq 16384,
// d 128: backward 1.26 against 1.10 ms; batch 8, seq 2048, d 64: 0.133 against 0.112 ms).
template <typename Inner>
KernelChoice choose(const FlashKernelFacts& gpu, bool hopper, long long n, long long t, int hopper_per_sm,
                    int tc_per_sm, int shares, Inner inner) {
  if (hopper) {
    const int parts = parts_for(gpu.sms, n, t, kPlanHopperTile, hopper_per_sm, shares,
                                [&](long long i) { return inner(i, kPlanHopperTile); });
    if (8 * n * ((t + kPlanHopperTile - 1) / kPlanHopperTile) * parts >= 7ll * gpu.sms) return {true, parts};
  }
  return {false, parts_for(gpu.sms, n, t, kPlanSyncTile, tc_per_sm, shares,
                           [&](long long i) { return inner(i, kPlanSyncTile); })};
}

std::int64_t whole_query_tiles(std::int64_t tq) {
  return (tq + kPlanHopperQueryTile - 1) / kPlanHopperQueryTile * kPlanHopperQueryTile;
}

}  // namespace

bool tensor_core_head_dim(int d) { return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128; }
bool hopper_head_dim(int d) { return d == 32 || d == 64 || d == 80 || d == 128; }
bool hopper_atomic_head_dim(int d) { return d == 32 || d == 64 || d == 128; }

FlashAttentionPlan flash_attention_plan(const FlashKernelFacts& gpu, Elem e, int d, std::int64_t n, std::int64_t tq,
                                        std::int64_t tk, bool causal, bool deterministic) {
  if (d < 1 || d > 128) throw std::invalid_argument("flash attention supports head dims 1 to 128");
  FlashAttentionPlan plan;
  if ((e == Elem::bf16 || e == Elem::f16) && tensor_core_head_dim(d)) {
    const FlashResidency& r = gpu.at(d);
    const bool hopper = hopper_head_dim(d) && gpu.hopper && e == Elem::bf16;  // the wgmma kernels take bf16 only
    const bool atomics = !deterministic;
    auto keys = [&](long long i, int rows) { return keys_seen(i, rows, tk, causal); };
    auto queries = [&](long long j, int rows) { return queries_seen(j, rows, tq, causal); };
    const KernelChoice forward = choose(gpu, hopper, n, tq, r.forward_wgmma, r.forward_tc, kForwardShares, keys);
    const KernelChoice dkdv = choose(gpu, hopper && (!atomics || hopper_atomic_head_dim(d)), n, tk,
                                     atomics ? r.backward_wgmma_atomic : r.backward_wgmma,
                                     atomics ? r.dkdv_tc_atomic : r.dkdv_tc, kBackwardShares, queries);
    plan.forward_wgmma = forward.wgmma, plan.forward_parts = forward.parts;
    plan.dkdv_wgmma = dkdv.wgmma, plan.dkdv_parts = dkdv.parts;
    if (dkdv.wgmma) plan.row_stats_rows = whole_query_tiles(tq);
    if (deterministic) {
      const KernelChoice dq = choose(gpu, hopper, n, tq, r.dq_wgmma, r.dq_tc, kBackwardShares, keys);
      plan.dq_wgmma = dq.wgmma, plan.dq_parts = dq.parts;
    } else {  // the Hopper kernel adds whole 64-query tiles in its own order; the mma.sync one adds rows
      plan.dq_accum_rows = dkdv.wgmma ? whole_query_tiles(tq) : tq;
    }
  }
  const std::int64_t q_elems = n * tq * d, k_elems = n * tk * d;
  if (plan.forward_parts > 1) plan.forward_workspace = plan.forward_parts * (q_elems + n * tq);
  plan.backward_workspace = std::max(plan.dkdv_parts > 1 ? 2 * plan.dkdv_parts * k_elems : 0,
                                     plan.dq_parts > 1 ? plan.dq_parts * q_elems : 0);
  return plan;
}

FlashAttentionPlan flash_attention_fastest_plan(const FlashKernelFacts& gpu, Elem e, int d, std::int64_t n,
                                                std::int64_t tq, std::int64_t tk, bool causal) {
  const FlashAttentionPlan atomic = flash_attention_plan(gpu, e, d, n, tq, tk, causal, false);
  return atomic.dkdv_wgmma ? atomic : flash_attention_plan(gpu, e, d, n, tq, tk, causal, true);
}

}  // namespace lmscope
