#!/usr/bin/env bash
# Call 5 (the blocking communicator, 5a9a86d on): this tree's lmscope and 36e8c25's (ab-base/); the
# rank-fault tests through NCCL; whether a resumed fp32 bucketed run of two ranks ends with the
# uninterrupted run's bits with --comm-sms auto (the backward's GEMMs chosen by timing beside the held
# SMs) and 0; and the A/B of the DDP bucketed step (2.7B ctx 1024, bf16), once each.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
build() {
  local src=$1 dir=$2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DLMSCOPE_NCCL_ROOT="$NCCL" >/tmp/configure-$(basename "$dir").log 2>&1 &&
    cmake --build "$dir" -j 16 --target lmscope >/tmp/build-$(basename "$dir").log 2>&1
}
build . build-gpu & new=$!; build ab-base /root/base-build & base=$!
wait $new; echo "== this tree's build: exit $? at $(date -u +%T)"; wait $base; echo "== base build: exit $?"
mkdir -p build-gpu/tests && touch build-gpu/tests/lmscope_gpu_tests && chmod +x build-gpu/tests/lmscope_gpu_tests
LMSCOPE_BUILD_DIR=build-gpu LMSCOPE_DDP_PARTS=faults scripts/gpu_multi_check.sh 2>&1 | grep -v "^index\|H200\|^20"
grep -A8 "^FAIL:\|^ERROR:" "$OUT/rank-faults.log" | cut -c1-300 | head -20
RESUME_CASES="--ddp%bucketed%--bucket-mb%0.1%--comm-sms%auto --ddp%bucketed%--bucket-mb%0.1%--comm-sms%0" \
  bash "$(dirname "$0")/resume4.sh"
bench=(bench --device cuda --model 2.7B --ctx 1024 --precision bf16 --attention flash --warmup 3 --steps 10 --batch 8
  --format json --ddp bucketed)
for who in base new new base; do
  exe=/root/base-build/lmscope; [[ $who == new ]] && exe=build-gpu/lmscope
  timeout 100 "$exe" launch --nproc 2 -- "${bench[@]}" --out /tmp/ab-$who.json >/tmp/ab-$who.md 2>&1
  echo "== $who: exit $? $(/opt/torch/.venv/bin/python -c "import json; print(round(json.load(open('/tmp/ab-$who.json'))[0]['ms']['step']['median'], 1), 'ms')") $(grep -c 'no symmetric window' /tmp/ab-$who.md) window warnings"
done
