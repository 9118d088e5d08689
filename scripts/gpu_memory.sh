#!/usr/bin/env bash
# On the GPU machine: builds, then runs the stages named (default: all of them), everything landing
# in $OUT:
#   tests    the memory tests on the GPU (the dry run against the CUDA record over the grid, the
#            driver's count, the stored H100 facts)
#   seeds    lmscope memory beside pytorch/memory_reference.py on the seeds' 2.7B cells, and the
#            snapshots that tools/render_memory_viz.py draws with PyTorch's own viewer
#   context  beyond ctx 1024: 2.7B inference and forward with flash, large's train step naive
#            against flash, and the largest allocations at the reference shape, beside PyTorch
#   plan     lmscope plan, each row's largest context run for real with one multiple more beside it
#            (scripts/check_plan.py)
#   diet     recomputation and gradient accumulation: their GPU tests, what each recompute mode
#            costs in step time, and the cells that only they make fit
#   lean     the leaner step against PyTorch: the 20-cell bf16 train grid's peaks (allocated and
#            held), and its step times beside those of the build in $LMSCOPE_BEFORE (if set), in one
#            process per cell pair
#   copies   transient bf16 weight copies: their GPU test, and what they save and cost against kept
#            ones, cell by cell in one process each
#   recommend  plan --recommend --measure: the fastest way to train each preset at ctx 1024..8192
#            with 4 sequences per step, every candidate timed
#   scripts/gpu_memory.sh [tests] [seeds] [context] [plan] [diet] [lean] [copies] [recommend]
set -uo pipefail
STAGES=${*:-tests seeds context plan diet lean copies recommend}
want() { [[ " $STAGES " == *" $1 "* ]]; }
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/memory-gpu.txt"
date -u +%FT%TZ | tee -a "$OUT/memory-gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/memory-gpu.txt"

L="$B/lmscope memory --device cuda --batch 4 --top 10"
PYMEM="$PY memory_reference.py --batch 4"

if want tests; then
"$B/tests/lmscope_gpu_tests" --gtest_filter='MemoryOnGpu.*' >"$OUT/memory-tests.log" 2>&1
echo "== memory tests exit $?"; grep -E "live facts|live memory|^    \{|compared|Failure|FAILED|PASSED" -A0 "$OUT/memory-tests.log" | head -30
fi

if want seeds; then
# The seeds' questions: 2.7B forward-only and train step over ctx, fp32 and bf16, naive and flash.
$L --model 2.7B --ctx 128,256,512,1024 --mode inference,forward,train --precision fp32,bf16 --attention naive,flash \
  --format json --out "$OUT/lmscope-memory-2.7B.json" >"$OUT/lmscope-memory-2.7B.md" 2>"$OUT/lmscope-memory-2.7B.err"
$L --model 2.7B --ctx 128,256,512,1024 --mode inference,forward,train --precision fp32,bf16 --attention naive,flash \
  --dry-run --format json --out "$OUT/lmscope-memory-2.7B-dry.json" >/dev/null 2>&1
(cd pytorch && for att in naive sdpa; do $PY memory_reference.py --model 2.7B --ctx 128,256,512,1024 \
  --mode inference,forward,train --precision fp32,bf16 --attention $att; done) >"$OUT/pytorch-memory-2.7B.md" 2>&1
# Timelines: lmscope's snapshots and pictures, PyTorch's snapshot of the same cell.
$L --model 2.7B --ctx 256 --mode inference --snapshot "$OUT/lmscope-2.7B-inference-256.pickle" \
  --svg "$OUT/lmscope-2.7B-inference-256.svg" >/dev/null 2>&1
$L --model 2.7B --ctx 256 --mode train --snapshot "$OUT/lmscope-2.7B-train-256.pickle" \
  --svg "$OUT/lmscope-2.7B-train-256.svg" >/dev/null 2>&1
(cd pytorch && $PY memory_reference.py --model 2.7B --ctx 256 --mode train --snapshot "$OUT/pytorch-2.7B-train-256.pickle") \
  >>"$OUT/pytorch-memory-2.7B.md" 2>&1
# PyTorch's own viewer, handed lmscope's snapshot: the page trace_plot makes, and the viewer's script.
$PY - "$OUT" <<'PYEOF'
import os, pickle, shutil, sys
import torch, torch.cuda._memory_viz as mv
out = sys.argv[1]
for name in ("lmscope-2.7B-train-256", "lmscope-2.7B-inference-256"):
    with open(f"{out}/{name}.pickle", "rb") as f:
        snap = pickle.load(f)
    with open(f"{out}/{name}.html", "w") as f:
        f.write(mv.trace_plot(snap))
shutil.copy(os.path.join(os.path.dirname(torch.__file__), "utils", "viz", "MemoryViz.js"), f"{out}/MemoryViz.js")
print("viewer pages written, torch", torch.__version__)
PYEOF
cat "$OUT/pytorch-memory-2.7B.md" | head -60
head -30 "$OUT/lmscope-memory-2.7B.md"
fi

if want context; then
$L --model 2.7B --ctx 2048,4096,8192,16384 --mode inference,forward --precision fp32,bf16 --attention flash \
  --format json --out "$OUT/lmscope-memory-2.7B-long.json" >"$OUT/lmscope-memory-2.7B-long.md" 2>&1
$L --model large --ctx 1024,2048,4096,8192 --mode train --precision bf16 --attention naive,flash \
  --format json --out "$OUT/lmscope-memory-large-train.json" >"$OUT/lmscope-memory-large-train.md" 2>&1
$L --model 2.7B --ctx 256 --mode train,inference --precision fp32 --attention flash \
  >"$OUT/lmscope-memory-2.7B-256-top.md" 2>&1
(cd pytorch && $PYMEM --model 2.7B --ctx 2048,4096,8192,16384 --mode inference,forward --precision fp32,bf16 \
  --attention sdpa && for att in naive sdpa; do $PYMEM --model large --ctx 1024,2048,4096,8192 --mode train \
  --precision bf16 --attention $att; done && $PYMEM --model 2.7B --ctx 256 --mode train,inference --precision fp32 \
  --attention sdpa --top 10) >"$OUT/pytorch-memory-context.md" 2>&1
echo "== context"; cat "$OUT/pytorch-memory-context.md" | head -40; grep "^| 2.7B\|^| large" "$OUT/lmscope-memory-2.7B-long.md" "$OUT/lmscope-memory-large-train.md"
fi

if want plan; then
"$B/lmscope" plan --precision fp32,bf16 --format json --out "$OUT/plan.json" >"$OUT/plan.md" 2>/dev/null
echo "== plan"; cat "$OUT/plan.md"
$PY scripts/check_plan.py "$B/lmscope" "$OUT/plan.json" >"$OUT/plan-check.md" 2>&1
echo "== plan check exit $?"; cat "$OUT/plan-check.md"
fi

if want diet; then
"$B/tests/lmscope_gpu_tests" --gtest_filter='MemoryDietOnGpu.*:MemoryOnGpu.DryRunRecordsEvery*' \
  >"$OUT/diet-tests.log" 2>&1
echo "== diet tests exit $?"; grep -E "gradients within|micro-batches:|equal$|Failure|FAILED|PASSED" "$OUT/diet-tests.log" | head -40
BENCH="$B/lmscope bench --device cuda --warmup 3 --precision bf16 --attention flash"
# What each mode costs: the same cell three ways, in one process.
for cell in "--model large --ctx 1024" "--model 2.7B --ctx 1024" "--model 2.7B --ctx 256"; do
  $BENCH $cell --batch 4 --recompute none,selective,full --steps 10 2>/dev/null | grep "^|"
done | awk 'NR == 1 || !/^\| model/' | tee "$OUT/diet-cost.md"
# What accumulation costs: the same tokens per step as 1, 2 and 4 micro-batches.
for cell in "--model large --ctx 1024" "--model 2.7B --ctx 1024" "--model 2.7B --ctx 256" "--model small --ctx 256"; do
  for bk in "4 1" "2 2" "1 4"; do
    set -- $bk; $BENCH $cell --batch $1 --grad-accum $2 --steps 10 2>/dev/null | grep "^|"
  done
done | awk 'NR == 1 || !/^\| model/' | tee "$OUT/diet-accumulation-cost.md"
# Cells that fit only with recomputation, and fp32 2.7B at ctx 1024.
( $BENCH --batch 4 --model 2.7B --ctx 4096 --recompute full --steps 3;
  $BENCH --batch 4 --model xl --ctx 8192 --recompute full --steps 3;
  $B/lmscope bench --device cuda --batch 4 --warmup 2 --steps 3 --precision fp32 --attention flash --model 2.7B --ctx 1024
) 2>/dev/null | grep "^|" | awk 'NR == 1 || !/^\| model/' | tee "$OUT/diet-fits.md"
fi

if want lean; then
GRID="--model small,medium,large,xl,2.7B --ctx 128,256,512,1024 --precision bf16"
$L $GRID --attention flash --format csv --out "$OUT/lean-lmscope.csv" >"$OUT/lean-lmscope.md" 2>"$OUT/lean-lmscope.err"
(cd pytorch && $PYMEM $GRID --attention sdpa --mode train) >"$OUT/lean-pytorch.md" 2>&1
echo "== lean grid"; grep "^| " "$OUT/lean-lmscope.md" | cut -d'|' -f2,8,9,10 | head -22; cat "$OUT/lean-pytorch.md"
# Step time, this build against the one before the leaner step, alternating cell by cell.
if [[ -n "${LMSCOPE_BEFORE:-}" ]]; then
  for cell in "small --ctx 256" "medium --ctx 512" "large --ctx 1024" "xl --ctx 512" "2.7B --ctx 256" "2.7B --ctx 1024"; do
    for build in "$LMSCOPE_BEFORE" "$B/lmscope"; do
      $build bench --device cuda --warmup 3 --steps 10 --batch 4 --precision bf16 --attention flash --model $cell \
        2>/dev/null | grep "^| [a-z0-9]" | sed "s#^#| $(basename $(dirname $build)) #"
    done
  done | tee "$OUT/lean-speed.md"
fi
fi

if want copies; then
"$B/tests/lmscope_gpu_tests" --gtest_filter='MemoryDietOnGpu.Transient*:MemoryDietOnGpu.Resident*' >"$OUT/copies-tests.log" 2>&1
echo "== copies tests exit $?"; grep -E "(transient|resident) copies:|Failure|FAILED|PASSED" "$OUT/copies-tests.log" | head
# Step time and peak, kept against resident and transient, in one process per cell; then cells that fit only
# with transient copies (by the plan: xl at ctx 4096 without recompute).
for cell in "small --ctx 256" "large --ctx 1024" "2.7B --ctx 256" "2.7B --ctx 1024" "2.7B --ctx 2048 --recompute full"; do
  "$B/lmscope" bench --device cuda --warmup 3 --steps 10 --batch 4 --precision bf16 --attention flash \
    --weight-copies kept,resident,transient --model $cell 2>/dev/null | grep "^|"
done | awk 'NR == 1 || !/^\| model/' | tee "$OUT/copies-cost.md"
$L --model small,large,2.7B --ctx 1024 --precision bf16 --mode inference,train --weight-copies kept,resident,transient \
  --format csv --out "$OUT/copies-memory.csv" >/dev/null 2>&1
cut -d, -f1,6,9,12,20 "$OUT/copies-memory.csv" | tee "$OUT/copies-memory.txt"
"$B/lmscope" bench --device cuda --warmup 2 --steps 3 --batch 4 --precision bf16 --attention flash --model xl \
  --ctx 4096 --weight-copies transient 2>/dev/null | grep "^|" | tee "$OUT/copies-fits.md"
fi

if want recommend; then
"$B/lmscope" plan --recommend --measure --precision bf16 --attention flash --ctx 1024,2048,4096,8192 --batch 4 \
  --format json --out "$OUT/recommend.json" >"$OUT/recommend.md" 2>"$OUT/recommend.err"
echo "== recommend exit $?"; cat "$OUT/recommend.md"
fi
