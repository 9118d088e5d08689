"""Times the PyTorch reference (cs336_reference.py) the way lmscope bench times itself: phases
between synchronisations, warm-up steps first, random tokens. The optimizer is PyTorch's fastest eager AdamW,
torch.optim.AdamW(fused=True) on CUDA (one kernel pass over p, g, m and v); --optimizer foreach takes
its multi-tensor form, and --optimizer assignment the assignment's per-tensor AdamW
(cs336_reference.AdamW). On the CPU, fused falls back to torch's default form. Gradients are set to
None between steps, as the seeds do. --compile default or max-autotune wraps the model in torch.compile
(that mode; the optimizer stays the eager fused AdamW), compiling in the first warm-up step, whose time
the "first step ms" column shows. By default (--compile-shapes auto) a sweep's second context length
of a model compiles it again with the length dynamic, which the later lengths reuse, as in any
torch.compile sweep; --compile-shapes static compiles every cell anew for its own shapes
(torch.compile(dynamic=False) after torch._dynamo.reset()), PyTorch's best for each cell. Comma lists
in --model and --ctx sweep in one process; a cell out of memory prints an OOM row and the sweep
goes on. One Markdown row per cell, so the two tables line up.

  python3 pytorch/bench_reference.py --model small --ctx 128 --batch 4 --device cpu --threads 2
  python pytorch/bench_reference.py --device cuda --model small,medium --ctx 128,256 --precision fp32
"""
import argparse
import contextlib
import gc
import statistics
import sys
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


def forward_loss(a, model, x, y):
    if a.precision == "bf16":
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16):
            return ref.cross_entropy(model(x), y)
    return ref.cross_entropy(model(x), y)


_compiled_model = [None]  # the model torch.compile last compiled


def run_cell(a, model_name, ctx, mode):
    torch.manual_seed(0)
    # Built on the GPU: initialising 2.7B parameters on the host took longer than timing them.
    with torch.device(a.device) if a.device == "cuda" else contextlib.nullcontext():
        model = ref.TransformerLM(**ref.PRESETS[model_name], attention=a.attention).to(a.device)
    if a.compile != "none":
        # A new model starts from nothing; within a model's sweep torch.compile behaves as in any
        # sweep (auto: the second context length recompiles with the length dynamic, later ones reuse
        # it) or compiles each cell for itself (static; reset, so no sweep meets Dynamo's recompile limit).
        if _compiled_model[0] != model_name or a.compile_shapes == "static":
            torch._dynamo.reset()
            _compiled_model[0] = model_name
        model = torch.compile(model, mode=None if a.compile == "default" else a.compile,
                              dynamic=False if a.compile_shapes == "static" else None)
    if a.optimizer == "assignment":
        opt = ref.AdamW(model.parameters())
    else:  # the same update rule up to where eps enters
        # Only where fused exists: Debian's torch 1.13 has no fused AdamW (its default form runs then).
        form = {"fused": True} if a.optimizer == "fused" and a.device == "cuda" else {}
        if a.optimizer == "foreach":
            form = {"foreach": True}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **form)
    x = torch.randint(0, 10000, (a.batch, ctx), device=a.device)
    y = torch.randint(0, 10000, (a.batch, ctx), device=a.device)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fwd, bwd, step_opt, first = [], [], [], 0.0
    for i in range(a.warmup + a.steps):
        opt.zero_grad(set_to_none=True)
        box = {}
        f = timed(a.device, lambda: box.update(loss=forward_loss(a, model, x, y)))
        b = timed(a.device, lambda: box["loss"].backward()) if mode != "forward" else 0.0
        o = timed(a.device, opt.step) if mode == "train" else 0.0
        box.clear()  # forward mode: the graph goes with the loss
        if i == 0:
            first = f + b + o
        if i >= a.warmup:
            fwd.append(f), bwd.append(b), step_opt.append(o)
    total = [f + b + o for f, b, o in zip(fwd, bwd, step_opt)]
    peak = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else float("nan")
    return fwd, bwd, step_opt, total, peak, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small", help="preset(s), comma list")
    ap.add_argument("--ctx", default="128", help="context length(s), comma list")
    ap.add_argument("--mode", default="train", help="forward, forward-backward or train; comma list")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--attention", default="naive", choices=["naive", "sdpa"],
                    help="the assignment's attention (default) or F.scaled_dot_product_attention")
    ap.add_argument("--optimizer", default="fused", choices=["fused", "foreach", "assignment"],
                    help="torch.optim.AdamW fused (default, CUDA) or foreach, or the assignment's AdamW")
    ap.add_argument("--compile", default="none", choices=["none", "default", "max-autotune"],
                    help="torch.compile the model in that mode (none: eager)")
    ap.add_argument("--compile-shapes", default="auto", choices=["auto", "static"],
                    help="auto: PyTorch's default (a second shape recompiles dynamic); static: every shape "
                         "compiled for itself")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU); 0 keeps the default")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                    help="matmul math on CUDA; bf16 = torch.autocast(bfloat16) around forward and loss")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    ms = lambda v: f"{statistics.mean(v):.2f} ± {statistics.stdev(v) if len(v) > 1 else 0:.2f}"
    print("| framework | model | device | precision | mode | attention | optimizer | compile | batch | ctx | forward ms "
          "| backward ms | optimizer ms | step ms | step median ms | first step ms | peak GiB | status |")
    print("|---|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    cells = [(m, mode, int(c)) for m in a.model.split(",") for mode in a.mode.split(",") for c in a.ctx.split(",")]
    for model_name, mode, ctx in cells:
        head = f"| PyTorch {torch.__version__} | {model_name} | {a.device} | {a.precision} | {mode} | {a.attention} | {a.optimizer} | {a.compile} | {a.batch} | {ctx} "
        if a.compile != "none":
            torch._dynamo.utils.counters.clear()
        try:
            fwd, bwd, opt, total, peak, first = run_cell(a, model_name, ctx, mode)
            print(head + f"| {ms(fwd)} | {ms(bwd)} | {ms(opt)} | {ms(total)} | {statistics.median(total):.2f} "
                  f"| {first:.0f} | {peak:.1f} | ok |", flush=True)
            said = f"first step {first / 1e3:.1f} s"
        except torch.cuda.OutOfMemoryError:
            print(head + "| - | - | - | - | - | - | - | OOM |", flush=True)
            said = "out of memory"
        if a.compile != "none":  # whether torch.compile's cache on disk served it (out of memory: what it had compiled)
            seen = torch._dynamo.utils.counters
            print(f"{model_name} {mode} ctx {ctx} --compile {a.compile}: {said}, "
                  f"FX graph cache {seen['inductor']['fxgraph_cache_hit']} hit / "
                  f"{seen['inductor']['fxgraph_cache_miss']} missed, AOT autograd cache "
                  f"{seen['aot_autograd']['autograd_cache_hit']} hit / "
                  f"{seen['aot_autograd']['autograd_cache_miss']} missed", file=sys.stderr, flush=True)
        gc.collect()
        if a.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
