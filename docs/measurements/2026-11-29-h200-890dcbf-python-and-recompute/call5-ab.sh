#!/usr/bin/env bash
# A/B in one call: bench of 8410e53 (ab-base/) against the working tree, both built here for sm_90a.
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
PY=/opt/torch/.venv/bin/python
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
conf="-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DLMSCOPE_NCCL_ROOT=$NCCL -DLMSCOPE_PYTHON=$PY"
cmake -S . -B build-gpu $conf >"$OUT/configure-new.log" 2>&1 && cmake -S ab-base -B ab-base/b $conf >"$OUT/configure-base.log" 2>&1 || { tail "$OUT"/configure-*.log; exit 1; }
cmake --build build-gpu -j 8 --target lmscope >"$OUT/build-new.log" 2>&1 & 
cmake --build ab-base/b -j 8 --target lmscope >"$OUT/build-base.log" 2>&1; b=$?; wait $!; n=$?
echo "== built base $b new $n"; date -u +%FT%TZ; grep -c "fno-gnu-unique" build-gpu/build.ninja
mkdir -p "$OUT/ab"
for cell in small@512 2.7B@512; do
  model=${cell%@*} ctx=${cell#*@}
  [[ $model == small ]] && steps=(--warmup 5 --steps 20) || steps=(--warmup 3 --steps 10)
  for side in base new; do
    [[ $side == base ]] && bin=ab-base/b/lmscope || bin=build-gpu/lmscope
    timeout 100 $bin bench --device cuda --model $model --ctx $ctx --precision bf16 --attention flash --batch 4 \
      "${steps[@]}" --format json --out "$OUT/ab/$side-$model-$ctx-1.json" >"$OUT/ab/$side-$model-$ctx-1.md" 2>&1
    echo "== $side $cell: exit $?"
  done
done
$PY tools/ab_table.py "$OUT/ab" | tee "$OUT/ab.md"
