#!/usr/bin/env bash
# Two GPUs: GEMMs beside NCCL's ring, symmetric all-reduce and the copy engines' all-gather.
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
B=build-carry
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpus.txt; date -u >> $OUT/gpus.txt
env | grep -E "NCCL|TORCH_SYMM" >> $OUT/gpus.txt
mkdir -p /tmp/ncl
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL NCCL_DEBUG_FILE=/tmp/ncl/nccl.%p.log $B/nccl_symmetric_beside_gemm 25 8 > $OUT/nccl-beside-gemm-25.md 2>&1; echo "== 25 MiB: exit $?"; cat $OUT/nccl-beside-gemm-25.md
cat /tmp/ncl/*.log | grep -iE "copy engine|CTA policy|\[CE\]| CE " | sort | uniq -c | sort -rn | head -20 > $OUT/nccl-ce-lines.txt
cat /tmp/ncl/*.log | grep -E "AllGather" | head -5 >> $OUT/nccl-ce-lines.txt
cat $OUT/nccl-ce-lines.txt
