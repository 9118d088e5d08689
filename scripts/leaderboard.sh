#!/usr/bin/env bash
# The assignment's two public leaderboards, timed as they are read: the mean and the median of the
# timed repetitions after the warm-up ones, on this GPU machine (shared/GPU-MACHINE.md).
#   attention  Spring 2025: FlashAttention-2 forward and backward of q, k, v of (16, 16384, 64), bf16,
#              causal, on one GPU (lmscope attention: 100 timed passes after 10).
#   step       Spring 2026: one full training step of --model 8B-leaderboard (d 4096, d_ff 11008, 34
#              layers, 32 heads, vocabulary 151,936), batch 2, ctx 32768, bf16, on two GPUs: lmscope
#              launch --nproc 2 -- bench with ZeRO-1 and full recomputation, the layout that fits an H200
#              today (plan --recommend --model 8B-leaderboard --world-size 2 --zero 1 --batch 2 --ctx
#              32768 --memory-limit 139GiB names it), LMSCOPE_LEADERBOARD_STEPS (default 5) after 2.
#   attention8b  not a leaderboard: the 2026 step's attention, 32 heads of d 128 at ctx 32768, bf16,
#              causal, forward and backward with TFLOP/s (lmscope attention: 20 passes after 3, its
#              32 heads as 32 sequences of one, the same work), beside PyTorch's SDPA in the same call.
# Usage: scripts/leaderboard.sh [attention|step|attention8b|all] (default all: the two leaderboards).
# The JSON of each goes to $OUT.
set -uo pipefail
which=${1:-all}
[[ "$which" =~ ^(attention|step|attention8b|all)$ ]] ||
  { echo "usage: scripts/leaderboard.sh [attention|step|attention8b|all]"; exit 2; }
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/leaderboard-gpus.txt"
# "NAME: mean M ms, median D ms over N after W" from a result file's PHASE timing.
said() {
  $PY - "$@" <<'PY'
import json, sys
path, phase, name, warmup = sys.argv[1:5]
row = json.load(open(path))[0]
if row.get("status", "ok") != "ok":
    print(f"{name}: {row['status']}")
    sys.exit(1)
t = row["ms"][phase]
print(f"{name}: mean {t['mean']:.3f} ms, median {t['median']:.3f} ms over {t['n']} after {warmup}")
PY
}
status=0
if [[ "$which" == attention || "$which" == all ]]; then
  "$B/lmscope" attention --device cuda --attention flash --precision bf16 --causal true --batch 16 --heads 1 \
    --seq 16384 --d 64 --warmup 10 --iters 100 --format json --out "$OUT/leaderboard-attention.json" \
    >"$OUT/leaderboard-attention.md" 2>&1 || status=1
  said "$OUT/leaderboard-attention.json" forward_backward \
    "2025 attention, (16, 16384, 64) bf16 causal forward+backward" 10 || status=1
fi
if [[ "$which" == attention8b ]]; then
  "$B/lmscope" attention --device cuda --attention flash --precision bf16 --causal true --batch 32 --heads 1 \
    --seq 32768 --d 128 --warmup 3 --iters 20 --format json --out "$OUT/attention-8b.json" \
    >"$OUT/attention-8b.md" 2>&1 || status=1
  said "$OUT/attention-8b.json" forward_backward "8B attention, 32 x 32768 x 128 bf16 causal forward+backward" 3 ||
    status=1
  $PY - "$OUT/attention-8b.json" <<'PY' || status=1
import json, sys
row = json.load(open(sys.argv[1]))[0]
t, f = row["ms"], row["tflops"]
print(f"lmscope: forward {t['forward']['mean']:.2f} ms ({f['forward']:.0f} TFLOP/s), "
      f"backward {t['backward']['mean']:.2f} ms ({f['backward']:.0f} TFLOP/s)")
PY
  $PY pytorch/bench_attention.py --impl sdpa --precision bf16 --batch 32 --seq 32768 --d 128 --warmup 3 --iters 20 \
    | tee "$OUT/attention-8b-sdpa.md" || status=1
fi
if [[ "$which" == step || "$which" == all ]]; then
  if (($(nvidia-smi -L | wc -l) < 2)); then
    echo "2026 step: needs two GPUs; this machine has $(nvidia-smi -L | wc -l)"
    status=1
  else
    steps=${LMSCOPE_LEADERBOARD_STEPS:-5}
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} "$B/lmscope" launch --nproc 2 -- bench --device cuda \
      --model 8B-leaderboard --ctx 32768 --batch 2 --precision bf16 --attention flash --mode train --zero 1 \
      --recompute full --warmup 2 --steps "$steps" --format json --out "$OUT/leaderboard-step.json" \
      >"$OUT/leaderboard-step.md" 2>&1 || status=1
    said "$OUT/leaderboard-step.json" step "2026 step, 8B-leaderboard batch 2 ctx 32768 bf16 on two GPUs" 2 ||
      status=1
  fi
fi
exit $status
