#!/usr/bin/env bash
# On a machine with two GPUs (the first two are used): build, the GPU tests on each GPU, then
# lmscope's data parallelism beside PyTorch's in the same run: the data-parallel tests through NCCL
# (two ranks equal one with the same global batch: fp32 5 steps, bf16 20 steps, bf16 with bf16
# gradients 20 steps), lmscope allreduce
# beside torch.distributed.all_reduce, and the train step of the models in LMSCOPE_DDP_MODELS
# (default xl,2.7B) at LMSCOPE_DDP_CTXS (default 512,1024), bf16, flash, batch 4 per rank: lmscope on
# one GPU, with each --ddp (bucketed at 1, 10, 25, 100 and 1000 MB) and --zero 1, 2 and 3 on two, and bucketed
# 25 MB with bf16 gradients (one GPU with them too), all-reduced and all-gathered, beside PyTorch DDP (25 MB buckets; also with its
# bf16_compress_hook), ZeRO-1 (ZeroRedundancyOptimizer) and FSDP2 (fully_shard per block), and the dry
# run's prediction of each ZeRO stage's per-rank peak. Also: lmscope's ranks started by torchrun itself (their trained weights against
# those of ranks started by lmscope launch), and bench --profile over two ranks (NCCL's kernels in
# the kernel profile, beside one GPU's profile of the same cell). Full logs in $OUT (or ./gpu-out);
# tools/ddp_table.py's short table prints last.
# The part faults: ranks lost inside a collective through NCCL (tests/cli/test_rank_faults.py: a rank
# killed in the backward's exchange, a hung rank caught by --collective-timeout and named by the flight
# records, a restart that ends with the uninterrupted run's bytes).
# LMSCOPE_DDP_PARTS (default tests,ddptests,faults,torchrun,profile,allreduce,bench,table) runs only those
# parts, so the run can be split across calls of a time limit (LMSCOPE_BUILD_DIR=build-gpu reuses
# the first call's build; LMSCOPE_DDP_VARIANTS, lmscope's flags a ';' apart, and LMSCOPE_DDP_PT_VARIANTS,
# bench_ddp.py's --variant, and LMSCOPE_DDP_ONE_GPU, the one-GPU cells' flags, narrow the bench part);
# the part overlap (not a default) probes the backward's slowdown beside NCCL
# (and the GEMMs beside NCCL's symmetric all-reduce, and beside local and NVLink traffic alone).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
if (($(nvidia-smi -L | wc -l) < 2)); then
  echo "gpu_multi_check.sh needs two GPUs; this machine has $(nvidia-smi -L | wc -l)"
  exit 2
fi
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1
date -u +%FT%TZ | tee -a "$OUT/gpus.txt"
models=${LMSCOPE_DDP_MODELS:-xl,2.7B} ctxs=${LMSCOPE_DDP_CTXS:-512,1024}
steps=(--warmup "${LMSCOPE_DDP_WARMUP:-3}" --steps "${LMSCOPE_DDP_MEASURED:-10}")
parts=",${LMSCOPE_DDP_PARTS:-tests,ddptests,faults,torchrun,profile,allreduce,bench,table},"
variants=${LMSCOPE_DDP_VARIANTS:-"--ddp naive;--ddp flat;--ddp overlap;--ddp bucketed --bucket-mb 1;\
--ddp bucketed --bucket-mb 10;--ddp bucketed --bucket-mb 25;--ddp bucketed --bucket-mb 100;\
--ddp bucketed --bucket-mb 1000;--zero 1;--zero 2;--zero 3;--ddp bucketed --bucket-mb 25 --grad-dtype bf16;\
--ddp bucketed --bucket-mb 25 --grad-dtype bf16 --grad-exchange all-gather"}
pt_variants=${LMSCOPE_DDP_PT_VARIANTS:-ddp,zero1,ddp-bf16,fsdp2}
one_gpu=${LMSCOPE_DDP_ONE_GPU:-"--graphs off,on --grad-dtype fp32,bf16"}

if [[ $parts == *,tests,* ]]; then
  for g in 0 1; do CUDA_VISIBLE_DEVICES=$g "$B/tests/lmscope_gpu_tests" >"$OUT/gpu-tests-$g.log" 2>&1 & done
  wait
  for g in 0 1; do echo "== GPU tests on GPU $g: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gpu-tests-$g.log" | tr '\n' ' ')"; done
fi

if [[ $parts == *,ddptests,* ]]; then
  for run in "fp32 5 fp32" "bf16 20 fp32" "bf16 20 bf16"; do
    set -- $run
    LMSCOPE="$B/lmscope" LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=$1 LMSCOPE_DDP_STEPS=$2 LMSCOPE_DDP_GRAD_DTYPE=$3 \
      $PY tests/cli/test_ddp_cli.py -v >"$OUT/ddp-tests-$1-$3.log" 2>&1
    echo "== data-parallel tests, two GPUs, $1, $3 gradients, $2 steps: exit $?"
    grep -E "within|ok$|FAIL|Error|Ran" "$OUT/ddp-tests-$1-$3.log" | sort -u | head -20
  done
fi

if [[ $parts == *,faults,* ]]; then
  LMSCOPE="$B/lmscope" LMSCOPE_FAULT_DEVICE=cuda $PY tests/cli/test_rank_faults.py -v >"$OUT/rank-faults.log" 2>&1
  echo "== ranks lost inside a collective, through NCCL: exit $?"
  grep -E "ok$|FAIL|Error|Ran" "$OUT/rank-faults.log" | head -10
fi

if [[ $parts == *,torchrun,* ]]; then
  # The same training run, its ranks started by torchrun (which serves its own store on MASTER_PORT)
  # and by lmscope launch: the same weights, bit for bit. (torchrun's parser takes any prefix of its
  # own options, even after the program's name: --log would be one, --save is not.)
  $PY -c "import numpy as np; np.random.default_rng(0).integers(0, 10000, 400000, dtype=np.uint16).tofile('$OUT/tokens.bin')"
  train=(train --device cuda --model small --data "$OUT/tokens.bin" --steps 10 --batch 8 --ctx 256 --precision bf16
    --sample sequential --ddp bucketed --print-every 5)
  torchrun --nproc-per-node 2 --no-python "$B/lmscope" "${train[@]}" --save "$OUT/train-torchrun.safetensors" \
    >"$OUT/train-torchrun.log" 2>&1
  echo "== lmscope train, two ranks started by torchrun: exit $?"
  "$B/lmscope" launch --nproc 2 -- "${train[@]}" --save "$OUT/train-launch.safetensors" >"$OUT/train-launch.log" 2>&1
  echo "== lmscope train, two ranks started by lmscope launch: exit $?"
  grep -E "^step|loss" "$OUT/train-torchrun.log" | tail -2
  cmp "$OUT/train-torchrun.safetensors" "$OUT/train-launch.safetensors" && echo "   the trained weights: the same bits"
fi

if [[ $parts == *,profile,* ]]; then
  # NCCL's kernels in the kernel profile: their time and the part other kernels ran beside; and the
  # backward's kernels by category on one GPU and beside the exchange on two.
  prof=(bench --device cuda --model xl --ctx 1024 --precision bf16 --attention flash --warmup 2 --steps 5 --profile
    --format json)
  "$B/lmscope" "${prof[@]}" --batch 4 --graphs off --out "$OUT/profile-one-gpu.json" >"$OUT/profile-one-gpu.md" 2>&1
  echo "== bench --profile, one GPU: exit $?"
  "$B/lmscope" launch --nproc 2 -- "${prof[@]}" --batch 8 --ddp bucketed --out "$OUT/profile-ddp.json" \
    >"$OUT/profile-ddp.md" 2>&1
  echo "== bench --profile, two ranks: exit $?"
  grep -E "^Collectives" "$OUT/profile-ddp.md"
  for f in one-gpu ddp; do echo "   $f:"; grep -E "^\| backward \| [A-Za-z]" "$OUT/profile-$f.md" | head -6; done
fi

if [[ $parts == *,allreduce,* ]]; then
  "$B/lmscope" launch --nproc 2 -- allreduce --device cuda --format json --out "$OUT/allreduce-lmscope.json" \
    >"$OUT/allreduce-lmscope.md" 2>"$OUT/allreduce-lmscope.err"
  echo "== lmscope allreduce: exit $?"
  torchrun --nproc-per-node 2 pytorch/bench_allreduce.py >"$OUT/allreduce-pytorch.md" 2>"$OUT/allreduce-pytorch.err"
  echo "== torch.distributed.all_reduce: exit $?"
fi

if [[ $parts == *,bench,* ]]; then
  bench=(bench --device cuda --model "$models" --ctx "$ctxs" --precision bf16 --attention flash "${steps[@]}" --format json)
  "$B/lmscope" "${bench[@]}" --batch 4 $one_gpu --out "$OUT/ddp-one-gpu.json" \
    >"$OUT/ddp-one-gpu.md" 2>&1
  echo "== lmscope, one GPU: exit $?"
  IFS=';' read -ra pars <<<"$variants"
  for par in "${pars[@]}"; do
    tag=$(echo "$par" | tr -d ' -')
    "$B/lmscope" launch --nproc 2 -- "${bench[@]}" --batch 8 $par --out "$OUT/ddp-$tag.json" >"$OUT/ddp-$tag.md" 2>&1
    echo "== lmscope, two GPUs, $par: exit $?"
  done
  # A rank out of memory ends the whole torchrun (bench_ddp.py says why): start again after the cells
  # printed while that gets further; two ranks' copies of a run's one OOM row count once.
  cells=$(($(tr ',' '\n' <<<"$models" | wc -l) * $(tr ',' '\n' <<<"$ctxs" | wc -l) * $(tr ',' '\n' <<<"$pt_variants" | wc -l)))
  : >"$OUT/ddp-pytorch.md"
  : >"$OUT/ddp-pytorch.err"
  printed=0
  while :; do
    (cd pytorch && torchrun --nproc-per-node 2 bench_ddp.py --model "$models" --ctx "$ctxs" --batch 4 \
      --variant "$pt_variants" --warmup "${LMSCOPE_DDP_WARMUP:-3}" --steps "${LMSCOPE_DDP_MEASURED:-10}" \
      --skip "$printed") >"$OUT/ddp-pytorch.run" 2>>"$OUT/ddp-pytorch.err"
    status=$?
    awk '!(/\| OOM \|$/ && $0 == last) {print} {last = $0}' "$OUT/ddp-pytorch.run" >"$OUT/ddp-pytorch.rows"
    cat "$OUT/ddp-pytorch.rows" >>"$OUT/ddp-pytorch.md"
    now=$((printed + $(grep -c '^| PyTorch' "$OUT/ddp-pytorch.rows")))
    rm -f "$OUT/ddp-pytorch.run" "$OUT/ddp-pytorch.rows"
    ((status != 0 && now > printed && now < cells)) || break
    echo "== PyTorch DDP and ZeRO-1 stopped after $now of $cells cells (exit $status): again from the next"
    printed=$now
  done
  echo "== PyTorch DDP and ZeRO-1: exit $status, $(grep -c '| ok |' "$OUT/ddp-pytorch.md") of $cells cells ok"
  for z in 1 2 3; do
    "$B/lmscope" memory --dry-run --device cuda --model "$models" --ctx "$ctxs" --batch 8 --precision bf16 \
      --world-size 2 --zero $z --format json --out "$OUT/zero$([[ $z == 1 ]] || echo $z)-dry-run.json" >/dev/null 2>&1
    echo "== the dry run of a ZeRO-$z rank: exit $?"
  done
fi

if [[ $parts == *,overlap,* ]]; then
  # Why the backward slows beside the exchange (docs/distributed.md): kernels beside NCCL's all-reduces
  # and beside a kernel that only holds SMs, and cuBLASLt's GEMMs beside held SMs. Not in the default
  # parts; the probe needs CuPy, which the GPU machine's Python has.
  torchrun --nproc-per-node 2 pytorch/overlap_probe.py --label "NCCL's own" >"$OUT/overlap-probe.md" 2>&1
  echo "== overlap probe, NCCL's own blocks: exit $?"
  NCCL_MAX_CTAS=16 torchrun --nproc-per-node 2 pytorch/overlap_probe.py --label "16 NCCL blocks" \
    --backgrounds none,allreduce,spin16_smem >"$OUT/overlap-probe-16.md" 2>&1
  echo "== overlap probe, 16 NCCL blocks: exit $?"
  CUDA_VISIBLE_DEVICES=0 "$B/gemm_beside_held_sms" 2,8,24 >"$OUT/gemm-beside-held-sms.md" 2>&1
  echo "== cuBLASLt beside held SMs: exit $?"
  # The same beside NCCL's all-reduce in ordinary memory (its ring) and in a symmetric window.
  "$B/nccl_symmetric_beside_gemm" 25 8 >"$OUT/nccl-symmetric-beside-gemm.md" 2>&1
  echo "== GEMMs beside NCCL's ring and symmetric all-reduce: exit $?"
  grep -E "all-reduce of" "$OUT/nccl-symmetric-beside-gemm.md"
  # And beside traffic without NCCL: copies within GPU 0, and over NVLink either way (which slows them).
  "$B/gemm_beside_traffic" 8 256 >"$OUT/gemm-beside-traffic.md" 2>&1
  echo "== GEMMs beside local and NVLink traffic: exit $?"
  cat "$OUT/gemm-beside-traffic.md"
  grep -hE "^\| gemm|^# rank" "$OUT"/overlap-probe*.md | head -30
fi

if [[ $parts == *,table,* ]]; then $PY tools/ddp_table.py "$OUT" | tee "$OUT/ddp-table.md"; fi
