"""Times the PyTorch reference (cs336_reference.py) the way lmscope bench times itself: per-phase
host timers around synchronised regions, warm-up steps first, random tokens, the assignment's
AdamW. Prints one Markdown row per cell, so the two tables line up.

  python3 pytorch/bench_reference.py --model small --ctx 128 --batch 4 --device cpu --threads 2
"""
import argparse
import statistics
import time

import torch

import cs336_reference as ref


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device, fn):
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU); 0 keeps the default")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32"], help="matmul math on CUDA")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.manual_seed(0)
    model = ref.TransformerLM(**ref.PRESETS[a.model]).to(a.device)
    opt = ref.AdamW(model.parameters())
    x = torch.randint(0, 10000, (a.batch, a.ctx), device=a.device)
    y = torch.randint(0, 10000, (a.batch, a.ctx), device=a.device)
    fwd, bwd, step_opt = [], [], []
    for i in range(a.warmup + a.steps):
        opt.zero_grad(set_to_none=False)
        box = {}
        f = timed(a.device, lambda: box.update(loss=ref.cross_entropy(model(x), y)))
        b = timed(a.device, lambda: box["loss"].backward())
        o = timed(a.device, opt.step)
        if i >= a.warmup:
            fwd.append(f), bwd.append(b), step_opt.append(o)
    total = [f + b + o for f, b, o in zip(fwd, bwd, step_opt)]
    ms = lambda v: f"{statistics.mean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0:.2f}"
    print("| framework | model | device | precision | threads | batch | ctx | forward ms | backward ms | optimizer ms | step ms |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| PyTorch {torch.__version__} | {a.model} | {a.device} | {a.precision} | {torch.get_num_threads()} | {a.batch} | {a.ctx} "
          f"| {ms(fwd)} | {ms(bwd)} | {ms(step_opt)} | {ms(total)} |")


if __name__ == "__main__":
    main()
