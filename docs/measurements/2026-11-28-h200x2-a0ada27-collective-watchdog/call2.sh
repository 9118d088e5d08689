#!/usr/bin/env bash
# The A/B of the data-parallel train step (2 ranks, bf16, flash, batch 4 a rank): 36e8c25's lmscope
# (/root/base-build) against this tree's (build-gpu), alternating, twice each: 2.7B at ctx 1024, DDP
# bucketed 25 MB and ZeRO-1. The communicator is non-blocking and watched here, not there. Then
# resume4.sh and the rank-fault tests through NCCL.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
PY=/opt/torch/.venv/bin/python
AB=/tmp/ab; mkdir -p $AB  # the rows and logs (copied to $OUT at the end: few files come back)
bench=(bench --device cuda --model 2.7B --ctx 1024 --precision bf16 --attention flash --warmup 3 --steps 10
  --batch 8 --format json)
for round in 1 2; do
  for who in base new; do
    exe=/root/base-build/lmscope; [[ $who == new ]] && exe=build-gpu/lmscope
    for par in "--ddp bucketed"; do
      tag=$(echo "$par" | tr -d ' -')
      timeout 100 "$exe" launch --nproc 2 -- "${bench[@]}" $par --out "$AB/ab-$who-$tag-$round.json" >"$AB/ab-$who-$tag-$round.md" 2>&1
      echo "== $who $par round $round: exit $? at $(date -u +%T)"
    done
  done
done
$PY - "$AB" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{out}/ab-*.json")):
    who, tag = f.split("/")[-1].split("-")[1:3]
    for r in json.load(open(f)):
        if r.get("status") == "ok":
            rows.setdefault((r["model"]["name"], tag), {}).setdefault(who, []).append(r["ms"]["step"]["median"])
for key, v in sorted(rows.items()):
    b, n = v.get("base", []), v.get("new", [])
    if b and n and None not in b + n:
        print(f"{key[0]:6} {key[1]:12} base {statistics.median(b):8.1f} ms  new {statistics.median(n):8.1f} ms  "
              f"new/base {statistics.median(n) / statistics.median(b):.3f}   ({b} / {n})")
    else:
        print(key, v)
PY
tar -C $AB -czf "$OUT/ab.tar.gz" .
grep -c "no symmetric window" $AB/*.md
bash "$(dirname "$0")/resume4.sh"
LMSCOPE_BUILD_DIR=build-gpu LMSCOPE_DDP_PARTS=faults scripts/gpu_multi_check.sh 2>&1 | grep -v "^index\|H200\|^20"
grep -A8 "^FAIL:\|^ERROR:" "$OUT/rank-faults.log" | cut -c1-300 | head -30
