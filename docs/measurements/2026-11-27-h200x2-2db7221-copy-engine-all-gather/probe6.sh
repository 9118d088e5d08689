#!/usr/bin/env bash
# Two GPUs: GEMMs beside local and NVLink traffic (8 and 24 blocks), and the two probes refactored in f5ddd0d.
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpus.txt; nvidia-smi topo -m >> $OUT/gpus.txt; date -u >> $OUT/gpus.txt
git log -1 --format=%H >> $OUT/gpus.txt 2>/dev/null
$B/gemm_beside_traffic 8 256 > $OUT/gemm-beside-traffic-8.md 2>&1; echo "== traffic 8: exit $?"; cat $OUT/gemm-beside-traffic-8.md
$B/gemm_beside_traffic 24 256 > $OUT/gemm-beside-traffic-24.md 2>&1; echo "== traffic 24: exit $?"; cat $OUT/gemm-beside-traffic-24.md
CUDA_VISIBLE_DEVICES=0 $B/gemm_beside_held_sms 2,8,24 > $OUT/gemm-beside-held-sms.md 2>&1; echo "== held: exit $?"; tail -12 $OUT/gemm-beside-held-sms.md
$B/nccl_symmetric_beside_gemm 25 8 > $OUT/nccl-symmetric-beside-gemm.md 2>&1; echo "== nccl sym: exit $?"; tail -14 $OUT/nccl-symmetric-beside-gemm.md
