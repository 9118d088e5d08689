#!/usr/bin/env bash
# One H100, 87d62bb's build: flash attention at the 2.7B step's shape (batch 4 × 32 heads = 128
# sequences of 1024, causal, bf16) at head dims 64, 80 (2.7B's: mma.sync kernels) and 128 (Hopper
# kernels), dq summed deterministically (the model's way) and by atomics; PyTorch SDPA beside it.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpu.txt; date -u >> $OUT/gpu.txt
for mode in --deterministic --atomic-dq; do
  timeout 120 $B/lmscope attention --device cuda --attention flash --precision bf16 --batch 128 --seq 1024 \
    --d 64,80,128 $mode --warmup 10 --iters 50 > $OUT/lmscope$mode.md 2>&1; echo "lmscope $mode: $?"; cat $OUT/lmscope$mode.md | tail -5
done
cd pytorch && timeout 200 /opt/torch/.venv/bin/python bench_attention.py --impl sdpa --precision bf16 --batch 128 \
  --seq 1024 --d 64,80,128 --warmup 10 --iters 50 > $OUT/sdpa.md 2>&1; echo "sdpa: $?"; tail -5 $OUT/sdpa.md
