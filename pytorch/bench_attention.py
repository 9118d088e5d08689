"""PyTorch's side of `lmscope attention`: the same cells, timed the same way (a synchronised pass
at a time, CUDA events around each), for the reference's naive attention (scores materialised,
masked, hand softmax, as cs336_reference.Attention) and F.scaled_dot_product_attention (its
flash/cuDNN backends; shape (b, 1, s, d)). One Markdown row per cell; OOM becomes a row.

  python pytorch/bench_attention.py --impl naive,sdpa --precision bf16 --batch 8 --seq 1024,4096 --d 64
"""
import argparse
import math
import statistics

import torch
import torch.nn.functional as F


def naive(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p / p.sum(-1, keepdim=True)) @ v


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def time_passes(warmup, iters, max_seconds, before, body):
    for _ in range(warmup):
        body(before())
    out, total = [], 0.0
    for i in range(iters):
        arg = before()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        body(arg)
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
        total += out[-1]
        if i >= 2 and total > max_seconds * 1e3:
            break
    return out


def run_cell(a, impl, dtype, batch, seq, d):
    fn = naive if impl == "naive" else sdpa
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(batch, 1, seq, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    o = fn(q, k, v, a.causal)
    saved = torch.cuda.memory_allocated() - base
    o.backward(do)
    del o
    peak = torch.cuda.max_memory_allocated()
    fwd = time_passes(a.warmup, a.iters, a.max_seconds, lambda: None, lambda _: fn(q, k, v, a.causal))
    bwd = time_passes(a.warmup, a.iters, a.max_seconds, lambda: fn(q, k, v, a.causal), lambda o: o.backward(do))
    fb = time_passes(a.warmup, a.iters, a.max_seconds, lambda: None, lambda _: fn(q, k, v, a.causal).backward(do))
    return fwd, bwd, fb, saved, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="naive,sdpa")
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--batch", default="8")
    ap.add_argument("--seq", default="256,1024,4096,8192,16384")
    ap.add_argument("--d", default="16,32,64,128")
    ap.add_argument("--causal", default="true")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--max-seconds", type=float, default=10)
    a = ap.parse_args()
    a.causal = a.causal == "true"
    torch.backends.cuda.matmul.allow_tf32 = False
    ms = lambda v: f"{statistics.mean(v):.3f}"
    print("| framework | attention | precision | batch | seq | d | causal | forward ms | backward ms | fwd+bwd ms "
          "| saved MiB | peak MiB | status |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    lists = lambda s: s.split(",")
    for prec in lists(a.precision):
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        for d in map(int, lists(a.d)):
            for batch in map(int, lists(a.batch)):
                for seq in map(int, lists(a.seq)):
                    for impl in lists(a.impl):
                        head = (f"| PyTorch {torch.__version__} | {impl} | {prec} | {batch} | {seq} | {d} | "
                                f"{'yes' if a.causal else 'no'} ")
                        try:
                            fwd, bwd, fb, saved, peak = run_cell(a, impl, dtype, batch, seq, d)
                            print(head + f"| {ms(fwd)} | {ms(bwd)} | {ms(fb)} | {saved / 2**20:.1f} "
                                  f"| {peak / 2**20:.1f} | ok |", flush=True)
                        except torch.cuda.OutOfMemoryError:
                            print(head + "| - | - | - | - | - | OOM |", flush=True)
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
