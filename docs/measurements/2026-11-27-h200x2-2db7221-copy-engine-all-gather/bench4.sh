#!/usr/bin/env bash
# Two GPUs: the two-rank tests (fp32, every mode with both exchanges); then xl and 2.7B at ctx 512
# and 1024, bf16, flash, batch 4 a rank, bf16 gradients: one GPU, bucketed 25 MB with the all-reduce,
# bucketed 25 MB with the copy engines' all-gather, one GPU again.
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpus.txt; date -u >> $OUT/gpus.txt
cd tests/cli && LMSCOPE=../../$B/lmscope LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=fp32 timeout 150 /opt/torch/.venv/bin/python test_ddp_cli.py -v TwoRanks.test_every_mode_steps_as_one_process_with_the_whole_batch TwoRanks.test_a_world_of_one_through_the_same_path_gives_the_same_bits > $OUT/ddp.log 2>&1; echo "ddp tests: $?"; grep -E "within|FAIL|Error" $OUT/ddp.log | head -20; cd ../..
cell=(--device cuda --model xl,2.7B --ctx 512,1024 --precision bf16 --attention flash --warmup 3 --steps 10 --grad-dtype bf16 --format json)
one() { $B/lmscope bench "${cell[@]}" --batch 4 --graphs off --out $OUT/one-$1.json > $OUT/one-$1.md 2>&1; echo "one $1: $?"; }
two() { $B/lmscope launch --nproc 2 -- bench "${cell[@]}" --batch 8 --ddp bucketed --bucket-mb 25 --grad-exchange $2 --out $OUT/$2-$1.json > $OUT/$2-$1.md 2>&1; echo "$2 $1: $?"; }
one 1; two 1 all-reduce; two 1 all-gather; one 2
/opt/torch/.venv/bin/python - $OUT <<'PY'
import json, sys, glob, os
out = sys.argv[1]
t = {}
for f in sorted(glob.glob(out + "/*.json")):
    for r in json.load(open(f)):
        k = (r["model"]["name"], r["ctx"])
        t.setdefault(k, {})[os.path.basename(f)[:-5]] = (r["ms"]["step"]["median"] if r.get("ms") else None, r.get("peak_bytes"), r["status"])
for k, v in t.items():
    print(k, v)
PY
cd $OUT && tar czf all.tgz *.json *.md *.log && rm -f *.json *.md *.log
