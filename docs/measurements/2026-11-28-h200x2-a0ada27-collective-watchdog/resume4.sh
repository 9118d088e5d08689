#!/usr/bin/env bash
# Whether a run of two NCCL ranks (and of one GPU) stopped after step 2 (LMSCOPE_TEST_FAULT=0:2:exit,
# a checkpoint every step) and resumed ends with the bits of the run never stopped, in fp32, per
# exchange: the rank-fault test's restart, bucketed 0.1 MB in fp32, differed from the uninterrupted run
# on two H200s while two uninterrupted runs agreed.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
W=/tmp/resume; mkdir -p $W
/opt/torch/.venv/bin/python -c "import numpy as np; np.random.default_rng(0).integers(0, 300, 20000, dtype=np.uint16).tofile('$W/tok.bin')"
B=build-gpu
T=(train --device cuda --d-model 64 --d-ff 128 --layers 2 --heads 2 --vocab 300 --ctx 16 --data "$W/tok.bin" --batch 2
  --sample sequential --steps 5)
for prec in fp32; do
  for par in ${RESUME_CASES:-"--ddp bucketed --bucket-mb 0.1" "--ddp flat" "one GPU"}; do
    par=${par//%/ }  # RESUME_CASES spells a case's spaces as %
    tag=$prec-$(echo "$par" | tr -d ' -'); run=("$B/lmscope" launch --nproc 2 --); flags=($par)
    [[ $par == "one GPU" ]] && run=("$B/lmscope") flags=()
    "${run[@]}" "${T[@]}" --precision $prec "${flags[@]}" --save "$W/whole-$tag.st" >/dev/null 2>&1
    LMSCOPE_TEST_FAULT=0:2:exit "${run[@]}" "${T[@]}" --precision $prec "${flags[@]}" --checkpoint-dir "$W/ck-$tag" --save-every 1 >/dev/null 2>&1
    "${run[@]}" train --resume "$W/ck-$tag" --save "$W/resumed-$tag.st" >"$W/resumed-$tag.log" 2>&1
    cmp -s "$W/whole-$tag.st" "$W/resumed-$tag.st" && echo "== $prec $par: resumed = whole" || echo "== $prec $par: resumed DIFFERS: $(grep -c step "$W/resumed-$tag.log") step lines"
  done
done
