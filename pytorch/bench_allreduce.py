"""torch.distributed.all_reduce over the ranks torchrun starts (NCCL on GPUs, Gloo on the CPU), timed
as `lmscope allreduce` times itself: a float32 tensor of each size (decimal MB, random values), warm-up
all-reduces, then per iteration a barrier and the host clock from the call until the device has
synchronised. Rank 0 prints one Markdown row per size: the mean over ranks of each rank's mean, the
sample standard deviation of all ranks' iterations, algbw = bytes / mean and busbw = algbw · 2(n−1)/n
(nccl-tests' convention), in GB/s of 10^9 bytes.

  torchrun --nproc-per-node 2 pytorch/bench_allreduce.py --sizes 1MB,10MB,100MB,1GB
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


def size_bytes(text):
    for unit, scale in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    raise SystemExit(f"bench_allreduce.py: a size needs KB, MB or GB: {text}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1MB,10MB,100MB,1GB")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if rank == 0:
        print("| framework | size | ranks | backend | mean ms | std ms | algbw GB/s | busbw GB/s |")
        print("|---|---:|---:|---|---:|---:|---:|---:|")
    for text in a.sizes.split(","):
        nbytes = size_bytes(text)
        x = torch.rand(nbytes // 4, device=device, generator=None) + 1
        for _ in range(a.warmup):
            dist.all_reduce(x)
        sync()
        times = []
        for _ in range(a.iters):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        every = [None] * n
        dist.all_gather_object(every, times)
        if rank == 0:
            mean = statistics.mean(statistics.mean(t) for t in every)
            pooled = [t for ts in every for t in ts]
            algbw = nbytes / (mean / 1e3) / 1e9
            print(f"| PyTorch {torch.__version__} | {text} | {n} | {dist.get_backend()} | {mean:.3f} | "
                  f"{statistics.stdev(pooled):.3f} | {algbw:.4g} | {algbw * 2 * (n - 1) / n:.4g} |", flush=True)
        del x
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
