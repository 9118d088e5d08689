#!/usr/bin/env bash
# Call 2 (warm from call 1): train logs of e46b528 and of this tree on CUDA with --sample sequential
# must be the same bits; then the train step of each tree, alternating, two rounds (gpu_check.sh --ab).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export LMSCOPE_BUILD_DIR=build-gpu LMSCOPE_SKIP_GPU_TESTS=1
source scripts/gpu_env.sh
$PY -c "import numpy as np; np.random.seed(0); np.random.randint(0,10000,size=400000).astype(np.uint16).tofile('/tmp/tok.bin')"
T="--device cuda --model small --ctx 256 --batch 4 --data /tmp/tok.bin --sample sequential --steps 8 --print-every 100"
i=0
for args in "--precision fp32" "--precision bf16" "--precision bf16 --graphs off" "--precision bf16 --grad-accum 2 --lr-schedule cosine --warmup-iters 2" "--precision fp16" "--precision bf16 --recompute full --weight-copies transient"; do
  i=$((i + 1))
  for side in base new; do
    [[ $side == base ]] && bin=/root/base-build/lmscope || bin=build-gpu/lmscope
    # shellcheck disable=SC2086
    $bin train $T $args --log /tmp/$side-$i.jsonl >/tmp/$side-$i.out 2>&1 || { echo "$side $i failed"; tail -3 /tmp/$side-$i.out; }
  done
  $PY - "$i" "$args" <<'PYEOF'
import json, sys
i, args = sys.argv[1], sys.argv[2]
rows = lambda side: [{k: v for k, v in json.loads(l).items() if k != "elapsed_s"} for l in open(f"/tmp/{side}-{i}.jsonl")]
a, b = rows("base"), rows("new")
print(f"== train log {args}: {len(a)} and {len(b)} steps, {'the same bits' if a == b and a else 'DIFFERENT'}; last loss {b[-1]['loss'] if b else None}")
PYEOF
done
scripts/gpu_check.sh --ab /root/base-build/lmscope build-gpu/lmscope small@256,large@1024,2.7B@1024 2
