"""PyTorch's data parallelism on the cells `lmscope bench --ddp` runs, one process per GPU started by
torchrun: the reference model (cs336_reference.py, SDPA attention, bf16 autocast around forward and
loss) in DistributedDataParallel (buckets of --bucket-mb, 25 by default as in DDP) with
torch.optim.AdamW(fused=True) (variant ddp), or the same DDP with ZeroRedundancyOptimizer over that
AdamW (variant zero1: AdamW's state sharded, each rank's updated parameters broadcast), or DDP with
its bf16_compress_hook (variant ddp-bf16: each bucket cast to bf16, all-reduced, cast back), or FSDP2
(variant fsdp2: `fully_shard` on every block and then on the whole model, fp32 masters sharded, the
parameters all-gathered in bf16 and the gradients reduce-scattered in fp32 by its MixedPrecisionPolicy,
the same AdamW over the shards). --batch is per rank. A step is zero_grad, forward, backward (DDP's all-reduces overlap it) and the optimizer
step, timed on the host between synchronisations after --warmup steps; one Markdown row per cell with the
median step, the per-rank peak memory (max_memory_allocated, the largest of the ranks) and the
status, printed by rank 0 (an OOM row by the rank out of memory, below).

A rank out of memory cannot take back the collectives its peers have already entered, and a sweep
that went on would pair one cell's all-reduces with the next cell's: so that rank prints the cell's
OOM row and ends its process, torchrun stops the others, and the caller starts the sweep again with
--skip set to the cells printed so far (scripts/gpu_multi_check.sh does; two ranks out of memory at
once print the same row twice, which it drops).

  torchrun --nproc-per-node 2 pytorch/bench_ddp.py --model xl,2.7B --ctx 512,1024 --batch 4 --variant ddp,zero1
"""
import argparse
import datetime
import gc
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import cs336_reference as ref


def run_cell(a, model_name, ctx, variant, rank):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ref.TransformerLM(**ref.PRESETS[model_name], attention="sdpa").cuda()
    if variant == "fsdp2":
        # Imported here: PyTorch's FSDP2 (2.6 on); older ones (Debian's) run the other variants.
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    else:
        model = DDP(model, device_ids=[torch.cuda.current_device()], bucket_cap_mb=a.bucket_mb)
    if variant == "ddp-bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    adamw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
    if variant == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
    else:
        opt = torch.optim.AdamW(model.parameters(), **adamw)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    x = torch.randint(0, 10000, (a.batch, ctx), device="cuda", generator=g)
    y = torch.randint(0, 10000, (a.batch, ctx), device="cuda", generator=g)
    torch.cuda.reset_peak_memory_stats()
    steps = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = ref.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            steps.append((time.perf_counter() - t0) * 1e3)
    peak = torch.tensor([torch.cuda.max_memory_allocated()], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return statistics.median(steps), statistics.stdev(steps), peak.item() / 2**30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="xl")
    ap.add_argument("--ctx", default="512")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank")
    ap.add_argument("--variant", default="ddp,zero1", help="ddp, zero1, ddp-bf16 and/or fsdp2")
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=0, help="start after this many cells of the sweep (no header)")
    a = ap.parse_args()
    if a.skip < 0:  # one sentence and exit code 2 (gpu_multi_check.sh passes it; argparse would add its usage)
        print(f"bench_ddp.py: --skip must be non-negative, got {a.skip}", file=sys.stderr)
        sys.exit(2)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    # A rank stuck in a collective all the same (a peer that failed otherwise) gives up after 3 minutes.
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=180))
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0 and a.skip == 0:
        print("| framework | model | ranks | variant | bucket MB | batch per rank | ctx | step median ms | step std ms "
              "| peak GiB per rank | status |")
        print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    cells = [(m, c, v) for m in a.model.split(",") for c in map(int, a.ctx.split(",")) for v in a.variant.split(",")]
    for model_name, ctx, variant in cells[a.skip:]:
        head = f"| PyTorch {torch.__version__} | {model_name} | {n} | {variant} | {a.bucket_mb:g} | {a.batch} | {ctx} "
        try:
            median, std, peak = run_cell(a, model_name, ctx, variant, rank)
        except torch.cuda.OutOfMemoryError:
            print(head + "| - | - | - | OOM |", flush=True)
            os._exit(3)  # no clean-up: it could wait on a collective the other ranks will never join
        if rank == 0:
            print(head + f"| {median:.2f} | {std:.2f} | {peak:.2f} | ok |", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
