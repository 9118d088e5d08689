#!/usr/bin/env bash
# Two GPUs, the tree of HEAD: GPU tests on GPU 0 beside compute-sanitizer on GPU 1; the data-parallel
# tests on both (PyTorch's NCCL 2.28.9); a two-rank allreduce and bench row naming NCCL's version.
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:$NCCL/lib
B=build-carry; PY=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/gpus.txt; date -u >> $OUT/gpus.txt
( CUDA_VISIBLE_DEVICES=0 timeout 330 $B/tests/lmscope_gpu_tests > $OUT/gpu-tests.log 2>&1; echo rc=$? >> $OUT/gpu-tests.log ) &
( CUDA_VISIBLE_DEVICES=1 timeout 330 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/lmscope_gpu_tests --gtest_filter='-*Training*:*OutOfMemory*:*Model*:*KernelTracer*:*CudaProfile*:*TraceOnGpu*:*MemoryOnGpu*' > $OUT/sanitizer.log 2>&1; echo rc=$? >> $OUT/sanitizer.log ) &
wait
grep -E "PASSED|FAILED|SKIPPED \]|rc=" $OUT/gpu-tests.log | head -12; grep -E "ERROR SUMMARY|PASSED|FAILED|rc=" $OUT/sanitizer.log | head
$B/lmscope launch --nproc 2 -- allreduce --device cuda --sizes 1MB,100MB --format csv --out $OUT/allreduce.csv 2>&1 | tail -4
$B/lmscope launch --nproc 2 -- bench --device cuda --model small --ctx 256 --precision bf16 --attention flash --batch 8 --ddp bucketed --warmup 2 --steps 5 2>&1 | tail -4
cd tests/cli
LMSCOPE=../../$B/lmscope LMSCOPE_DDP_DEVICE=cuda LMSCOPE_DDP_PRECISION=fp32 timeout 150 $PY test_ddp_cli.py -v > $OUT/ddp-cuda-fp32.log 2>&1
echo "== ddp fp32 (NCCL 2.28.9) exit $?"; grep -E "ok$|skipped|FAIL|Error|Ran|^OK" $OUT/ddp-cuda-fp32.log | head -12
