#!/usr/bin/env bash
# On the GPU machine (shared/GPU-MACHINE.md): build, run the GPU tests, compute-sanitizer over the
# op tests, then lmscope and the PyTorch reference on the same cells in the same run.
# Full logs go to $OUT (or ./gpu-out); a short table prints last.
set -uo pipefail
refuse() { echo "gpu_check.sh: $*" >&2; exit 2; }
# --compile-table's settings, refused before anything is built (its section below says what they mean).
if [[ "${1:-}" == "--compile-table" ]]; then
  (($# >= 4)) || refuse "--compile-table takes MODE MODELS CTXS [COMPILES]"
  [[ "$2" =~ ^(forward|forward-backward|train)$ ]] || refuse "--compile-table's MODE is forward, forward-backward or train, not '$2'"
  mode=$2 models=$3 ctxs=$4 compiles=${5:-none,default,max-autotune}
  deadline=${LMSCOPE_COMPILE_SECONDS:-540}
  [[ "$deadline" =~ ^[0-9]+$ ]] || refuse "LMSCOPE_COMPILE_SECONDS must be whole seconds, not '$deadline'"
  deadline=$((10#$deadline))
  timing=${LMSCOPE_COMPILE_TIMING:-parallel}
  [[ "$timing" =~ ^(parallel|serial|none)$ ]] || refuse "LMSCOPE_COMPILE_TIMING must be parallel, serial or none, not '$timing'"
  [[ "$timing" != none || -n "${LMSCOPE_COMPILE_SPLIT:-}" ]] ||
    refuse "LMSCOPE_COMPILE_TIMING=none needs LMSCOPE_COMPILE_SPLIT: only its groups compile apart from timing"
  warm_deadline=${LMSCOPE_COMPILE_WARM_SECONDS:-$([[ "$timing" == none ]] && echo "$deadline" || echo $((deadline * 2 / 3)))}
  [[ "$warm_deadline" =~ ^[0-9]+$ ]] && warm_deadline=$((10#$warm_deadline)) && ((warm_deadline <= deadline)) ||
    refuse "LMSCOPE_COMPILE_WARM_SECONDS must be whole seconds up to the deadline ($deadline), not '$warm_deadline'"
  [[ "$timing" != none ]] || ((warm_deadline > 0)) ||
    refuse "LMSCOPE_COMPILE_TIMING=none with LMSCOPE_COMPILE_WARM_SECONDS=0 leaves nothing to do"
  # SETTING PREFIX: the ';'-groups of SETTING as PREFIX_models and PREFIX_ctxs (CTXS where a group has no '@').
  split_groups() {
    local -n models_of=$2_models ctxs_of=$2_ctxs
    local g all
    models_of=() ctxs_of=()
    IFS=';' read -ra all <<<"${!1:-}"
    [[ "${!1:-}" != *";" ]] || all+=("")  # read drops a trailing empty group
    for g in "${all[@]}"; do
      [[ "$g" =~ ^[^@[:space:]]+(@[0-9]+(,[0-9]+)*)?$ ]] || refuse "$1: a group is MODELS or MODELS@CTXS, not '$g'"
      models_of+=("${g%%@*}")
      [[ "$g" == *@* ]] && ctxs_of+=("${g#*@}") || ctxs_of+=("$ctxs")
    done
  }
  split_groups LMSCOPE_COMPILE_SPLIT timed
  [[ -n "${LMSCOPE_COMPILE_WARM_SPLIT:-}" && -z "${LMSCOPE_COMPILE_SPLIT:-}" ]] &&
    refuse "LMSCOPE_COMPILE_WARM_SPLIT needs LMSCOPE_COMPILE_SPLIT, the groups that are timed"
  LMSCOPE_COMPILE_WARM_SPLIT=${LMSCOPE_COMPILE_WARM_SPLIT:-${LMSCOPE_COMPILE_SPLIT:-}}
  split_groups LMSCOPE_COMPILE_WARM_SPLIT warm
  # PREFIX: its groups' cells, one MODEL@CTX a line, sorted.
  cells_of() {
    local -n models_of=$1_models ctxs_of=$1_ctxs
    local i m c
    for i in "${!models_of[@]}"; do
      for m in ${models_of[$i]//,/ }; do for c in ${ctxs_of[$i]//,/ }; do echo "$m@$((10#$c))"; done; done
    done | sort -u
  }
  # A cell compiled but not timed is time lost; one timed but not compiled compiles beside the others' timing.
  odd=$(comm -3 <(cells_of warm) <(cells_of timed) | tr -d '\t' | head -4 | paste -sd' ')
  [[ -z "$odd" ]] || refuse "LMSCOPE_COMPILE_WARM_SPLIT and LMSCOPE_COMPILE_SPLIT must hold the same cells; one holds $odd and the other not"
fi
if [[ "${1:-}" == "--ab" ]]; then  # its settings, refused before anything is built (its section below)
  (($# >= 4)) || refuse "--ab takes BASE NEW CELLS [ROUNDS]"
  [[ "${5:-2}" =~ ^[1-9][0-9]*$ ]] || refuse "--ab: ROUNDS must be a whole number from 1, not '${5:-}'"
  IFS=, read -ra ab_cells <<<"$4"
  for cell in "${ab_cells[@]}"; do [[ "$cell" =~ ^[^@]+@[0-9]+$ ]] || refuse "--ab: a cell is MODEL@CTX, not '$cell'"; done
fi
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
date -u +%FT%TZ | tee -a "$OUT/gpu.txt"

if [[ "${LMSCOPE_SKIP_GPU_TESTS:-}" != 1 ]]; then
  "$B/tests/lmscope_gpu_tests" >"$OUT/gpu-tests.log" 2>&1
  tail -5 "$OUT/gpu-tests.log"
  grep -E "Failed|failed" -A15 "$OUT/gpu-tests.log" | head -60
  # NVTX as a profiler hears it (a process of its own: it points NVTX at CUPTI before any call).
  "$B/tests/lmscope_nvtx_test" >"$OUT/nvtx-test.log" 2>&1
  echo "== NVTX ranges test exit $?: $(tail -1 "$OUT/nvtx-test.log")"
  # bench --trace and train --trace end to end on the GPU: kernels on stream tracks, launch arrows.
  LMSCOPE="$B/lmscope" LMSCOPE_TRACE_DEVICE=cuda $PY tests/cli/test_trace_cli.py -v >"$OUT/trace-cuda.log" 2>&1
  echo "== trace on cuda: exit $?"; grep -E "FAIL|Error|Ran" "$OUT/trace-cuda.log"
  # (CUPTI tracing cannot run under compute-sanitizer, which holds the same tools interface.)
  compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/lmscope_gpu_tests" \
    --gtest_filter='-*Training*:*OutOfMemory*:*Model*:*KernelTracer*:*CudaProfile*:*TraceOnGpu*:*MemoryOnGpu*' >"$OUT/sanitizer.log" 2>&1
  echo "== compute-sanitizer memcheck exit $? ($(grep -c 'OK \]' "$OUT/sanitizer.log") tests ok): $(tail -1 "$OUT/sanitizer.log")"
  # --master-dtype bf16 against PyTorch's bf16 model with torch.optim.AdamW, 5 steps.
  LMSCOPE="$B/lmscope" $PY tests/gpu/test_master_bf16_parity.py -v >"$OUT/master-bf16-parity.log" 2>&1
  echo "== bf16 masters against PyTorch bf16: exit $?"; grep -E "ok$|FAIL|Error|Ran|losses|PyTorch bf16 \[|fp32 masters \[|largest" "$OUT/master-bf16-parity.log"
fi

# --training: the training-run tests (checkpoints, kill and resume, held-out loss) on the GPU: a run
# killed and resumed must equal the run never stopped, bit for bit, on CUDA too, in fp32, bf16 and fp16.
if [[ "${1:-}" == "--training" ]]; then
  for prec in fp32 bf16 fp16; do
    LMSCOPE="$B/lmscope" LMSCOPE_TRAIN_DEVICE=cuda LMSCOPE_TRAIN_PRECISION=$prec $PY tests/cli/test_train_cli.py -v \
      >"$OUT/training-cuda-$prec.log" 2>&1
    echo "== training runs on cuda, $prec: exit $?"; grep -E "ok$|FAIL|Error|Ran" "$OUT/training-cuda-$prec.log"
  done
fi

# --python: the Python package installed into PyTorch's venv with the README's command, its tests on
# the GPU (the attention Function in bf16, fp16 and fp32 against PyTorch's), and the Function's speed
# beside `lmscope attention` and SDPA (tools/attention_through_pytorch.py).
if [[ "${1:-}" == "--python" ]]; then
  LMSCOPE_BUILD_DIR=$B scripts/install_python.sh "$PY" >"$OUT/install-python.log" 2>&1
  echo "== install into $PY: exit $?"; tail -2 "$OUT/install-python.log"
  LMSCOPE="$PWD/$B/lmscope" $PY -m pytest -q -p no:cacheprovider tests/package >"$OUT/package-tests.log" 2>&1
  echo "== package tests: exit $?"; tail -3 "$OUT/package-tests.log"
  $PY tools/attention_through_pytorch.py --lmscope "$B/lmscope" --out "$OUT/attention-through-pytorch.json" \
    >"$OUT/attention-through-pytorch.md" 2>"$OUT/attention-through-pytorch.log"
  echo "== attention through PyTorch: exit $?"; cat "$OUT/attention-through-pytorch.md"; tail -3 "$OUT/attention-through-pytorch.log"
fi

# --data-parallel: the data-parallel tests through NCCL (a world of one on one GPU: every --ddp mode
# gives the bits of the run without it; two ranks where there are two GPUs), the all-reduce benchmark,
# and bench with each --ddp mode, --zero 1 and --zero 2 on the ranks there are (lmscope launch, one per GPU).
if [[ "${1:-}" == "--data-parallel" ]]; then
  grep -q "NCCL found" "$OUT/configure.log" 2>/dev/null || echo "== note: the configure log does not say NCCL was found"
  for prec in fp32 bf16; do
    LMSCOPE="$B/lmscope" LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=$prec $PY tests/cli/test_ddp_cli.py -v \
      >"$OUT/ddp-cuda-$prec.log" 2>&1
    echo "== data-parallel tests on cuda, $prec: exit $?"; grep -E "ok$|skipped|FAIL|Error|Ran" "$OUT/ddp-cuda-$prec.log"
  done
  gpus=$(nvidia-smi -L | wc -l)
  "$B/lmscope" launch --nproc "$gpus" -- allreduce --device cuda --format md >"$OUT/allreduce-cuda.md" 2>&1
  echo "== allreduce over $gpus GPU(s): exit $?"; cat "$OUT/allreduce-cuda.md"
  for par in "--ddp naive" "--ddp flat" "--ddp overlap" "--ddp bucketed" "--zero 1" "--zero 2"; do
    [[ "$par" == "--zero"* && $gpus -lt 2 ]] && continue
    "$B/lmscope" launch --nproc "$gpus" -- bench --device cuda --model "${LMSCOPE_DDP_MODELS:-medium}" --ctx 512 \
      --batch $((4 * gpus)) --precision bf16 $par --warmup 3 --steps 10 >"$OUT/ddp-bench-${par// /}.md" 2>&1
    echo "== bench $par: exit $?"; grep -E "^\| (small|medium|large|xl|2.7B) " "$OUT/ddp-bench-${par// /}.md"
  done
fi

# --grid PRECISION MODELS CTXS [MODES] [ATTENTION]: lmscope and PyTorch over the same cells, batch 4,
# 5 warm-up and 10 measured steps (MODES default train; ATTENTION naive, or flash against PyTorch's
# SDPA). LMSCOPE_SKIP_GPU_TESTS=1 skips the tests before it.
if [[ "${1:-}" == "--grid" ]]; then
  prec=$2 models=$3 ctxs=$4 modes=${5:-train} attn=${6:-naive}
  tag="$prec-$attn-${modes//,/-}"
  "$B/lmscope" bench --device cuda --model "$models" --ctx "$ctxs" --batch 4 --precision "$prec" --mode "$modes" \
    --attention "$attn" --warmup 5 --steps 10 --format csv --out "$OUT/lmscope-$tag.csv" >"$OUT/lmscope-$tag.md" 2>/dev/null
  (cd pytorch && $PY bench_reference.py --device cuda --model "$models" --ctx "$ctxs" --mode "$modes" --batch 4 \
    --attention "${attn/flash/sdpa}" --precision "$prec" --warmup 5 --steps 10) >"$OUT/pytorch-$tag.md" 2>&1
  $PY tools/compare_grid.py "$OUT/lmscope-$tag.csv" "$OUT/pytorch-$tag.md"
fi

# --compile-table MODE MODELS CTXS [COMPILES]: the seeds' "vanilla vs compiled" table for MODE (forward,
# forward-backward or train): lmscope bf16 flash with fusion and graphs each off and on, then PyTorch
# bf16 SDPA with fused AdamW in each of COMPILES (default none,default,max-autotune: eager and the two
# torch.compile modes, each context length compiled for its own shapes), batch 4, 5 warm-up and 10
# measured steps. Like every mode it runs the GPU tests first unless LMSCOPE_SKIP_GPU_TESTS=1; its
# arguments and settings are checked at the top, before anything builds.
# LMSCOPE_COMPILE_SECONDS (whole seconds, default 540: a device call's 600 less the merging) is when
# the sweeps must end, counted from the script's start: each sweep gets what is left and prints its
# rows as they are measured, so the table comes out with the cells measured by then.
# LMSCOPE_COMPILE_SPLIT="small,medium;large;xl@128,256;xl@512,1024" (MODELS then unused) runs each
# ';'-group of models (at the context lengths after its '@', else CTXS) on a GPU of its own, group i on
# GPU i pinned to the i-th share of the physical cores (a core's hardware threads stay in one share).
# It runs in two phases, because compiling takes the host's every core and PyTorch's host-bound steps
# slow down beside it (up to 2x, docs/compile.md): first the cells are compiled (one step a cell,
# which fills torch.compile's cache on disk) until LMSCOPE_COMPILE_WARM_SECONDS (default two thirds of
# the deadline; 0 skips this phase, for a call on a machine whose cache an earlier call filled), by
# the groups of LMSCOPE_COMPILE_WARM_SPLIT (default: the same groups), all at once,
# group i on GPU i modulo the GPUs and on the i-th share of the cores: compiling is mostly one Python
# thread, so more groups than GPUs compile more cells in the time (their steps must fit the GPU's
# memory together); then the timed groups run, the cells compiled by then loading from the cache in
# seconds (a cell not compiled yet compiles now, beside the others' timing), at once
# (LMSCOPE_COMPILE_TIMING=parallel, the default) or one after another (serial, each group given an
# equal share of the time left); none compiles only (the compiling phase then has the whole deadline
# by default), for a later call on the same machine to time with LMSCOPE_COMPILE_WARM_SECONDS=0.
# Each cell's lmscope and PyTorch rows still come from one GPU, and the rows land in the same files
# as one GPU's, in the groups' order.
left() { local by=${1:-$deadline}; echo $((by - SECONDS > 1 ? by - SECONDS : 1)); }  # seconds to a deadline
reference() {  # COMPILE DEADLINE ARGS...: pytorch/bench_reference.py in this table's settings
  local c=$1 by=$2
  shift 2
  (cd pytorch && PYTHONUNBUFFERED=1 timeout -k 10 "$(left "$by")" $PY bench_reference.py --device cuda --mode "$mode" \
    --batch 4 --attention sdpa --precision bf16 --compile "$c" --compile-shapes static "$@")
}
ended() {  # WHAT EXIT ROWS: a PyTorch sweep's end, its cells measured and when (seconds from the start)
  echo "== $1: exit $2, $(grep -c '| ok |' "$3") cells, done at $SECONDS s"
}
compile_sweep() {  # DIR MODELS CTXS COMPILES
  local dir=$1 models=$2 ctxs=$3 compiles=$4 c
  mkdir -p "$dir"
  timeout -k 10 "$(left)" "$B/lmscope" bench --device cuda --model "$models" --ctx "$ctxs" --batch 4 \
    --precision bf16 --mode "$mode" --attention flash --fusion on,off --graphs on,off --warmup 5 --steps 10 \
    --format csv --out "$dir/lmscope-compile-$mode.csv" >"$dir/lmscope-compile-$mode.md" \
    2>"$dir/lmscope-compile-$mode.err" || { echo "== lmscope bench failed ($models):"; tail -3 "$dir/lmscope-compile-$mode.err"; }
  echo "== lmscope ($models @ $ctxs): done at $SECONDS s"
  for c in ${compiles//,/ }; do
    reference "$c" "$deadline" --model "$models" --ctx "$ctxs" --warmup 5 --steps 10 \
      >"$dir/pytorch-compile-$mode-$c.md" 2>"$dir/pytorch-compile-$mode-$c.err"
    ended "PyTorch --compile $c ($models @ $ctxs)" $? "$dir/pytorch-compile-$mode-$c.md"
  done
}
warm_sweep() {  # DIR MODELS CTXS COMPILES: one step a cell in each torch.compile mode, untimed
  local dir=$1 models=$2 ctxs=$3 compiles=$4 c
  mkdir -p "$dir"
  for c in ${compiles//,/ }; do
    [[ "$c" == none ]] && continue
    reference "$c" "$warm_deadline" --model "$models" --ctx "$ctxs" --warmup 0 --steps 1 \
      >"$dir/warm-$mode-$c.md" 2>"$dir/warm-$mode-$c.err"
    ended "compiled --compile $c ($models @ $ctxs)" $? "$dir/warm-$mode-$c.md"
  done
}
# each_group PREFIX FUNCTION [serial]: FUNCTION DIR MODELS CTXS COMPILES for every group of PREFIX
# (timed or warm), group i on GPU i modulo the GPUs and on the i-th share of the cores (torch.compile's
# worker processes held to it too, however PyTorch counts the cores), all at once or, with "serial",
# one after another, each with an equal share of the time left.
each_group() {
  local -n models_of=$1_models ctxs_of=$1_ctxs
  local i mine n=${#models_of[@]} share=$((${#cpus[@]} / ${#models_of[@]}))
  for ((i = 0; i < n; i++)); do
    mine=$(IFS=,; echo "${cpus[*]:$((i * share)):$share}")
    (taskset -pc "$mine" $BASHPID >/dev/null || { echo "== cannot pin group $i to CPUs $mine"; exit 1; }
      [[ "${3:-}" == serial ]] && deadline=$((SECONDS + (deadline - SECONDS) / (n - i)))
      CUDA_VISIBLE_DEVICES=$((i % gpus)) TORCHINDUCTOR_COMPILE_THREADS=$share "$2" "$OUT/$1$i" "${models_of[$i]}" \
        "${ctxs_of[$i]}" "$compiles") &
    [[ "${3:-}" == serial ]] && wait
  done
  wait
}
# NAME HEADER_LINES: the groups' files of NAME as one, the header from the first that has one (a sweep
# stopped before its first row may have left an empty file), then every group's rows.
merge_parts() {
  local header="" i part
  for ((i = 0; i < ${#timed_models[@]}; i++)); do
    part="$OUT/timed$i/$1"
    [[ -f "$part" ]] && (($(wc -l <"$part") >= $2)) || continue
    [[ -n "$header" ]] || { header=1; head -n "$2" "$part"; }
    tail -n +$(($2 + 1)) "$part"
  done >"$OUT/$1"
}
# PREFIX PATTERNS...: every group's files matching PATTERNS, each under its name, in the groups' order.
group_logs() {
  local -n models_of=$1_models
  local i pattern log
  for ((i = 0; i < ${#models_of[@]}; i++)); do
    for pattern in "${@:2}"; do
      for log in "$OUT/$1$i"/$pattern; do
        [[ -f "$log" ]] && { echo "== ${log#"$OUT"/}"; cat "$log"; }
      done
    done
  done
}
if [[ "${1:-}" == "--compile-table" ]]; then
  if [[ -z "${LMSCOPE_COMPILE_SPLIT:-}" ]]; then
    compile_sweep "$OUT" "$models" "$ctxs" "$compiles"
  else
    gpus=$(nvidia-smi -L | wc -l)
    ((${#timed_models[@]} <= gpus)) || refuse "LMSCOPE_COMPILE_SPLIT has ${#timed_models[@]} groups for $gpus GPU(s)"
    # The CPUs this script may use in the order of their physical cores, cut into one share a group.
    mapfile -t cpus < <(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -k1,1n | cut -d, -f1 |
      grep -xFf <(taskset -pc $$ | sed 's/.*: //' | tr ',' '\n' |
        awk -F- '{for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c}'))
    most=0  # the groups of each phase that runs
    [[ "$timing" == none ]] || most=${#timed_models[@]}
    ((warm_deadline > 0 && ${#warm_models[@]} > most)) && most=${#warm_models[@]}
    ((${#cpus[@]} >= most)) || refuse "${#cpus[@]} CPUs for $most groups"
    rm -rf "$OUT"/warm[0-9]* "$OUT"/timed[0-9]*
    if ((warm_deadline > 0)); then
      each_group warm warm_sweep
      echo "== compiling ended at ${SECONDS} s"
    else
      echo "== no compiling phase (LMSCOPE_COMPILE_WARM_SECONDS=0): each cell loads from torch.compile's cache or compiles as it is timed"
    fi
    if [[ "$timing" == none ]]; then
      echo "== nothing timed (LMSCOPE_COMPILE_TIMING=none): the cache holds what compiled for a later call"
      group_logs warm "warm-*.md" "*.err" >"$OUT/compile-$mode-logs.txt"
    else
      echo "== timing the groups ($timing)"
      each_group timed compile_sweep "$timing"
      merge_parts "lmscope-compile-$mode.csv" 1
      for c in ${compiles//,/ }; do merge_parts "pytorch-compile-$mode-$c.md" 2; done
      { group_logs warm "warm-*.md" "*.err"; group_logs timed "*.err" "lmscope-compile-$mode.md"; } \
        >"$OUT/compile-$mode-logs.txt"
    fi
    rm -rf "$OUT"/warm[0-9]* "$OUT"/timed[0-9]*
  fi
  if [[ "$timing" != none ]]; then
    tables=("$OUT/lmscope-compile-$mode.csv")
    for c in ${compiles//,/ }; do tables+=("$OUT/pytorch-compile-$mode-$c.md"); done
    $PY tools/compile_table.py "${tables[@]}" | tee "$OUT/compile-table-$mode.md"
  fi
fi

# --attention PRECISION SEQS DIMS BATCH [IMPLS]: lmscope attention (naive, flash) and PyTorch (naive,
# SDPA) over the same causal cells in the same run; IMPLS default naive,flash.
if [[ "${1:-}" == "--attention" ]]; then
  prec=$2 seqs=$3 dims=$4 batch=$5 impls=${6:-naive,flash}
  tag="attn-$prec-b$batch-${impls//,/-}"
  "$B/lmscope" attention --device cuda --attention "$impls" --precision "$prec" --seq "$seqs" --d "$dims" \
    --batch "$batch" --max-seconds 2 --format csv --out "$OUT/lmscope-$tag.csv" >"$OUT/lmscope-$tag.md" 2>/dev/null
  pt_impls=${impls/flash/sdpa}
  (cd pytorch && $PY bench_attention.py --impl "$pt_impls" --precision "$prec" --seq "$seqs" --d "$dims" \
    --batch "$batch" --max-seconds 2) >"$OUT/pytorch-$tag.md" 2>&1
  # The share of a measured ceiling too: ANCHORS.md's bf16 GEMM on this H100, 800 TFLOP/s.
  $PY tools/compare_attention.py "$OUT/lmscope-$tag.csv" "$OUT/pytorch-$tag.md" --ceiling "${LMSCOPE_CEILING_TFLOPS:-800}"
fi

# --curves [STEPS]: one training run in fp32, bf16 and fp16 (dynamic loss scaling) on the same
# byte-level text (the repository's docs and sources, vocab 256; a tenth held out), small model,
# batch 8, ctx 256, STEPS (default 600) steps: the logs and lmscope report's page of their curves.
# The byte-level text of --curves and --masters: $OUT/train.bin and a tenth held out, $OUT/val.bin.
byte_text() {
  cat docs/*.md docs/log/*.md src/lmscope/*/*.{cpp,h} src/lmscope/backend/cuda/*.{cu,cuh} src/lmscope/backend/cuda/flash/*.cuh \
    >"$OUT/text.txt"
  $PY -c "
import numpy as np
b = np.frombuffer(open('$OUT/text.txt', 'rb').read(), dtype=np.uint8).astype(np.uint16)
n = len(b) * 9 // 10
b[:n].tofile('$OUT/train.bin'); b[n:].tofile('$OUT/val.bin')"
}
if [[ "${1:-}" == "--curves" ]]; then
  steps=${2:-600}
  byte_text
  logs=()
  for prec in fp32 bf16 fp16; do
    "$B/lmscope" train --device cuda --model small --vocab 256 --precision $prec --data "$OUT/train.bin" \
      --val-data "$OUT/val.bin" --eval-every 100 --eval-batches 20 --steps "$steps" --batch 8 --ctx 256 --lr 1e-3 \
      --lr-schedule cosine --warmup-iters 50 --print-every 100 --log "$OUT/small-bytes-$prec.jsonl" \
      >"$OUT/small-bytes-$prec.txt" 2>&1
    echo "== $prec: $(tail -1 "$OUT/small-bytes-$prec.txt")"
    logs+=("$OUT/small-bytes-$prec.jsonl")
  done
  rm -f "$OUT/text.txt" "$OUT/train.bin" "$OUT/val.bin"
  (IFS=,; "$B/lmscope" report --train "${logs[*]}" --title "small on bytes: fp32, bf16, fp16" --out "$OUT/curves.html")
fi

# --masters [STEPS] [SEED]: what bf16 masters cost in loss: small and 2.7B trained in bf16 with fp32
# masters and with --master-dtype bf16 on the same byte-level text as --curves, the same batches and
# initial weights (--seed SEED, default 0), batch 8, ctx 256, STEPS (default 500) steps of cosine
# schedule (small from lr 1e-3, 2.7B from 3e-4): the logs and lmscope report's page of their curves.
if [[ "${1:-}" == "--masters" ]]; then
  steps=${2:-500} seed=${3:-0}
  byte_text
  logs=()
  for model in small 2.7B; do
    [[ $model == small ]] && lr=1e-3 || lr=3e-4
    for masters in fp32 bf16; do
      "$B/lmscope" train --device cuda --model $model --vocab 256 --precision bf16 --master-dtype $masters \
        --data "$OUT/train.bin" --val-data "$OUT/val.bin" --eval-every 100 --eval-batches 20 --steps "$steps" \
        --batch 8 --ctx 256 --lr $lr --lr-schedule cosine --warmup-iters 50 --print-every 100 --seed "$seed" \
        --log "$OUT/$model-$masters-masters-seed$seed.jsonl" >"$OUT/$model-$masters-masters-seed$seed.txt" 2>&1
      echo "== $model, $masters masters, seed $seed: $(tail -1 "$OUT/$model-$masters-masters-seed$seed.txt")"
      logs+=("$OUT/$model-$masters-masters-seed$seed.jsonl")
    done
  done
  rm -f "$OUT/text.txt" "$OUT/train.bin" "$OUT/val.bin"
  (IFS=,; "$B/lmscope" report --train "${logs[*]}" --title "fp32 and bf16 masters: small and 2.7B on bytes, seed $seed" \
    --out "$OUT/masters-seed$seed.html")
fi

# --profile PRECISION MODELS CTXS [MODES] [ATTENTION]: lmscope's kernel profile of those cells (CUPTI:
# time by phase, op category and kernel), batch 4, 5 warm-up and 10 measured steps.
if [[ "${1:-}" == "--profile" ]]; then
  prec=$2 models=$3 ctxs=$4 modes=${5:-train} attn=${6:-naive}
  tag="profile-$prec-$attn-${modes//,/-}"
  "$B/lmscope" bench --device cuda --model "$models" --ctx "$ctxs" --batch 4 --precision "$prec" --mode "$modes" \
    --attention "$attn" --warmup 5 --steps 10 --profile --format json --out "$OUT/lmscope-$tag.json" \
    >"$OUT/lmscope-$tag.md" 2>/dev/null
  head -8 "$OUT/lmscope-$tag.md"
fi

# --ab BASE NEW CELLS [ROUNDS]: two lmscope binaries (or one, twice), the train step of each cell
# (MODEL@CTX, comma-separated) one process a cell, base then new, for ROUNDS rounds (default 2), so
# that both see the card alike and each cell's rounds show the spread; bf16, flash, batch 4, fusion
# and graphs on, medians of 20 steps after 5 (small, medium) or of 10 after 3 (the larger models).
# LMSCOPE_AB_ARGS are added to both sides' bench, LMSCOPE_AB_BASE_ARGS and LMSCOPE_AB_NEW_ARGS to one
# (e.g. "--weight-copies resident"). The table (tools/ab_table.py) in $OUT/ab.md, each run's JSON and
# Markdown in $OUT/ab.tgz.
if [[ "${1:-}" == "--ab" ]]; then
  base=$2 new=$3 rounds=${5:-2}
  for bin in "$base" "$new"; do [[ -x "$bin" ]] || refuse "--ab: no lmscope binary at '$bin'"; done
  mkdir -p "$OUT/ab"
  for round in $(seq "$rounds"); do
    for cell in "${ab_cells[@]}"; do
      model=${cell%@*} ctx=${cell#*@}
      [[ "$model" =~ ^(small|medium)$ ]] && steps=(--warmup 5 --steps 20) || steps=(--warmup 3 --steps 10)
      for side in base new; do
        [[ $side == base ]] && bin=$base extra=${LMSCOPE_AB_BASE_ARGS:-} || bin=$new extra=${LMSCOPE_AB_NEW_ARGS:-}
        name="$side-$model-$ctx-$round"
        # shellcheck disable=SC2086  # the settings' words are bench's arguments
        timeout 300 "$bin" bench --device cuda --model "$model" --ctx "$ctx" --precision bf16 --attention flash \
          --batch 4 "${steps[@]}" ${LMSCOPE_AB_ARGS:-} $extra --format json --out "$OUT/ab/$name.json" \
          >"$OUT/ab/$name.md" 2>&1
        echo "== $name: exit $?"
      done
    done
  done
  $PY tools/ab_table.py "$OUT/ab" | tee "$OUT/ab.md"
  tar -C "$OUT" -czf "$OUT/ab.tgz" ab && rm -r "$OUT/ab"  # one file back from the machine, not four a cell
fi
