#!/usr/bin/env bash
# Call 2 (one H200, right after call 1, whose builds it uses): the peaks of 2.7B and xl cells recorded
# on the GPU beside their dry runs (batch 4), and the train step of this tree against 4c963b6's, base
# and new alternating.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
ls -la build-gpu/lmscope /root/base-build/lmscope | cut -c30-
# Peaks recorded on the GPU beside the dry run of the same cell (batch 4).
for cell in "2.7B 1024 bf16 flash train" "2.7B 1024 fp32 flash inference" "2.7B 1024 fp32 naive train" \
    "xl 1024 bf16 flash train"; do
  read -r model ctx prec attn mode <<<"$cell"
  args=(memory --device cuda --model "$model" --ctx "$ctx" --precision "$prec" --attention "$attn" --mode "$mode"
    --batch 4 --format json)
  build-gpu/lmscope "${args[@]}" --out /tmp/real.json >/tmp/real.md 2>&1
  build-gpu/lmscope "${args[@]}" --dry-run --out /tmp/dry.json >/tmp/dry.md 2>&1
  $PY - "$cell" <<'PY'
import json, sys
real, dry = json.load(open("/tmp/real.json"))[0], json.load(open("/tmp/dry.json"))[0]
print(f"== {sys.argv[1]}: status {real['status']} / {dry['status']}")
if real["status"] == "ok":
    d, n = real.get("device_memory", {}), dry.get("device_memory", {})
    print(f"   peak on the GPU {real['peak_bytes']}, dry run {dry['peak_bytes']}, equal: {real['peak_bytes'] == dry['peak_bytes']}; "
          f"reserved {real['peak_reserved_bytes']} / {dry['peak_reserved_bytes']}; workspace at the peak {real['peak_by_kind']['workspace']}; "
          f"own at start {d.get('own_bytes')} / {n.get('own_bytes')}, used after the step {d.get('used_after_step_bytes')}, "
          f"need {d.get('need_bytes')} / {n.get('need_bytes')}")
PY
done
[[ "${1:-}" == memory-only ]] && exit 0
# The train step, base and new alternating (bf16 flash, batch 4, graphs and fusion on).
for cell in "small 256" "large 1024" "2.7B 1024"; do
  read -r model ctx <<<"$cell"
  for who in base new new base; do
    exe=/root/base-build/lmscope; [[ $who == new ]] && exe=build-gpu/lmscope
    "$exe" bench --device cuda --model "$model" --ctx "$ctx" --precision bf16 --attention flash --batch 4 \
      --warmup 5 --steps 20 --format json --out /tmp/ab.json >/dev/null 2>&1
    echo "== $model ctx $ctx $who: $($PY -c "import json; r=json.load(open('/tmp/ab.json'))[0]; print(round(r['ms']['step']['median'], 3), 'ms')")"
  done
done
