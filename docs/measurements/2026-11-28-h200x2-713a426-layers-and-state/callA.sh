#!/usr/bin/env bash
# Call A (warm from call B, build-gpu there): e46b528's lmscope (ab-base/, into /root/base-build),
# then call2.sh: the train logs of both builds compared bit for bit and the A/B of their train steps.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NCCL=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
cmake -S ab-base -B /root/base-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
   -DLMSCOPE_NCCL_ROOT="$NCCL" >/tmp/base-configure.log 2>&1 &&
 cmake --build /root/base-build -j 32 --target lmscope >/tmp/base-build.log 2>&1; echo "== base build exit $? at $(date -u +%T)"
bash "$(dirname "$0")/call2.sh"
