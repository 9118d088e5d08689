"""What slows a kernel that runs beside another on the same GPU.

Each rank (torchrun, one GPU a rank) times a foreground loop on its own stream (a bf16 GEMM, an
elementwise add, SDPA's flash attention) alone, then beside a background load on a second stream:
NCCL all-reduces of 268 MB (both ranks), or spinN_smem, a kernel that only holds N SMs (one block
an SM whose 200 KiB of shared memory leaves no room there for blocks that need much of it, as GEMMs'
do; no memory traffic). The background is sized
to outlast the foreground (a line says when a foreground outlasted it). Rank 0 prints each
foreground's time per call and its ratio to alone, per rank; medians of --rounds. NCCL's
environment (NCCL_MAX_CTAS, ...) is read at start, so compare settings with one run each.

    torchrun --nproc-per-node 2 pytorch/overlap_probe.py --label default
    NCCL_MAX_CTAS=16 torchrun --nproc-per-node 2 pytorch/overlap_probe.py --backgrounds none,allreduce,spin16_smem
"""

import argparse
import os
import statistics
import time

import cupy as cp
import torch
import torch.distributed as dist
import torch.nn.functional as F

KERNELS = r"""
extern "C" __global__ void spin(long long cycles, int* sink) {
  extern __shared__ int smem[];
  long long t0 = clock64();
  int acc = 0;
  while (clock64() - t0 < cycles) ++acc;
  smem[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) sink[blockIdx.x] = smem[0];
}
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", default="default")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fg-ms", type=float, default=80.0, help="foreground loop length alone")
    p.add_argument("--carveout", type=int, default=0,
                   help="also time the GEMMs with PyTorch's experimental SM carveout of this many SMs (on "
                        "2.11 it left torch.matmul's time alone unchanged: it seems not to reach that path)")
    p.add_argument("--backgrounds", default="none,allreduce,spin2_smem,spin16_smem")
    args = p.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    torch.manual_seed(rank)
    cp.cuda.Device(rank).use()
    module = cp.RawModule(code=KERNELS)
    spin = module.get_function("spin")
    smem_bytes = 200 * 1024
    spin.max_dynamic_shared_size_bytes = smem_bytes
    sink = cp.zeros(1024, dtype=cp.int32)
    spin_cycles = 20_000_000  # about 10 ms at the H100's and H200's clocks; units are timed anyway

    fg_stream, bg_stream = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, dtype=torch.bfloat16)

    a8, b8 = rnd(8192, 8192), rnd(8192, 8192)
    x_tok, w_up = rnd(4096, 1600), rnd(1600, 6400)
    g_up = rnd(6400, 4096)
    e1, e2 = rnd(256 << 20), rnd(256 << 20)
    q, k, v = rnd(4, 25, 1024, 64), rnd(4, 25, 1024, 64), rnd(4, 25, 1024, 64)
    foregrounds = {
        "gemm 8192^3": lambda: torch.matmul(a8, b8),
        "gemm 4096x1600x6400": lambda: torch.matmul(x_tok, w_up),
        "gemm wgrad 6400x4096x1600": lambda: torch.matmul(g_up, x_tok),
    }
    if args.carveout:
        def carved(fn):
            def run():
                torch._C._set_sm_carveout_experimental(args.carveout)
                fn()
                torch._C._set_sm_carveout_experimental(None)
            return run
        foregrounds.update({f"{name}, {args.carveout} SMs fewer": carved(fn) for name, fn in list(foregrounds.items())})
    foregrounds |= {
        "add 256M bf16": lambda: torch.add(e1, e2),
        "sdpa flash fwd": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }

    ar = torch.randn(64 << 20, device=dev)  # 268 MB of fp32

    def cp_launch(fn, grid, block, args_, shared=0):
        with cp.cuda.ExternalStream(bg_stream.cuda_stream):
            fn((grid,), (block,), args_, shared_mem=shared)

    def unit(name):
        """One unit of a background, enqueued on bg_stream."""
        with torch.cuda.stream(bg_stream):
            if name == "allreduce":
                dist.all_reduce(ar)
            elif name.startswith("spin") and name.endswith("_smem"):
                cp_launch(spin, int(name[4:-5]), 128, (cp.int64(spin_cycles), sink), smem_bytes)
            else:
                raise SystemExit(f"unknown background {name!r} (allreduce or spinN_smem)")

    def time_stream(stream, fn, n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            for _ in range(n):
                fn()
            end.record()
        return start, end

    def agreed_max(value):
        t = torch.tensor([float(value)], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    # How many calls make each foreground last fg_ms alone, and how many units each background
    # needs to outlast that (both ranks agree on the counts: all-reduces must match).
    for fn in foregrounds.values():
        fn()
    torch.cuda.synchronize()
    counts = {}
    for name, fn in foregrounds.items():
        s, e = time_stream(fg_stream, fn, 10)
        torch.cuda.synchronize()
        counts[name] = int(agreed_max(max(1, args.fg_ms / (s.elapsed_time(e) / 10))))
    backgrounds = [b for b in args.backgrounds.split(",") if b != "none"]
    units = {}
    for b in backgrounds:
        unit(b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()  # host clock: NCCL runs on its own stream, not bg_stream
        for _ in range(3):
            unit(b)
        torch.cuda.synchronize()
        per = (time.perf_counter() - t0) * 1e3 / 3
        units[b] = int(agreed_max(max(1, 4 * args.fg_ms / per)))  # outlasts a foreground slowed up to 4x
        if rank == 0:
            print(f"# background {b}: {per:.3f} ms a unit alone, {units[b]} units", flush=True)

    results = {}  # (fg, bg) -> list of ms per call
    for r in range(args.rounds):
        for fg, fn in foregrounds.items():
            for b in ["none"] + backgrounds:
                torch.cuda.synchronize()
                dist.barrier()
                bg_end = torch.cuda.Event(enable_timing=True)
                if b != "none":
                    for _ in range(units[b]):
                        unit(b)
                    bg_end.record(bg_stream)
                s, e = time_stream(fg_stream, fn, counts[fg])
                torch.cuda.synchronize()
                if b != "none" and s.elapsed_time(bg_end) < s.elapsed_time(e):
                    print(f"# rank {rank}: {fg} outlasted {b} (round {r}): its time is a lower bound", flush=True)
                results.setdefault((fg, b), []).append(s.elapsed_time(e) / counts[fg])

    medians = torch.tensor([statistics.median(v) for v in results.values()], device=dev)
    gathered = [torch.empty_like(medians) for _ in range(world)]
    dist.all_gather(gathered, medians)
    if rank == 0:
        keys = list(results)
        print(f"\n## {args.label}: {torch.cuda.get_device_name(dev)}, NCCL {torch.cuda.nccl.version()}, "
              f"NCCL_MAX_CTAS={os.environ.get('NCCL_MAX_CTAS', '-')}, medians of {args.rounds}\n")
        print("| foreground | background | " + " | ".join(f"rank {i} ms" for i in range(world)) + " | "
              + " | ".join(f"rank {i} / alone" for i in range(world)) + " |")
        print("|---|---|" + "---:|" * (2 * world))
        for i, (fg, b) in enumerate(keys):
            base = keys.index((fg, "none"))
            ms = [g[i].item() for g in gathered]
            ratio = [g[i].item() / g[base].item() for g in gathered]
            print(f"| {fg} | {b} | " + " | ".join(f"{m:.4f}" for m in ms) + " | "
                  + " | ".join(f"{x:.3f}" for x in ratio) + " |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
