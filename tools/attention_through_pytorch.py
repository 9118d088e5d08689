"""FlashAttention-2 called from PyTorch: lmscope.torch.FlashAttention2's forward plus backward, timed
in the same process as PyTorch's scaled_dot_product_attention and beside `lmscope attention` at the
same shapes (the kernels without the binding), on one GPU. Each result is checked against SDPA's
first. Prints a Markdown table; --out writes the rows as JSON.

    python tools/attention_through_pytorch.py --lmscope build-gpu/lmscope --out attention.json
"""

import argparse
import json
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

from lmscope.torch import FlashAttention2

# (batch, heads, seq, d): the 2025 leaderboard's shape first, then d 64 and 128 from 4096 to 16384.
CELLS = [(16, 1, 16384, 64)] + [(16, 1, n, d) for d in (64, 128) for n in (4096, 8192)] + [(16, 1, 16384, 128)]


def causal_flops(b, h, n, d):
    """fwd+bwd FLOPs of causal attention, the masked half not counted: 2 GEMMs forward, 5 backward."""
    return 7 * 2 * b * h * n * n * d / 2


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def through_binding(q, k, v, do):
    o = FlashAttention2.apply(q, k, v, True)
    return torch.autograd.grad(o, (q, k, v), do)


def sdpa(q, k, v, do):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.autograd.grad(o, (q, k, v), do)


def cli_ms(lmscope, cell, warmup, iters):
    b, h, n, d = cell
    out = subprocess.run([lmscope, "attention", "--device", "cuda", "--attention", "flash", "--precision", "bf16",
                          "--batch", str(b), "--heads", str(h), "--seq", str(n), "--d", str(d), "--causal", "true",
                          "--warmup", str(warmup), "--iters", str(iters), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    row = json.loads(out[out.index("["):])[0]
    return row["ms"]["forward_backward"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lmscope", required=True, help="the built command, for `lmscope attention`")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out")
    a = p.parse_args()
    rows = []
    for cell in CELLS:
        b, h, n, d = cell
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        ours, theirs = through_binding(q, k, v, do), sdpa(q, k, v, do)
        err = max((x.float() - y.float()).abs().max().item() for x, y in zip(ours, theirs))
        scale = max(y.float().abs().max().item() for y in theirs)
        binding = time_ms(lambda: through_binding(q, k, v, do), a.warmup, a.iters)
        torch_sdpa = time_ms(lambda: sdpa(q, k, v, do), a.warmup, a.iters)
        cli = cli_ms(a.lmscope, cell, a.warmup, a.iters)
        row = {
            "batch": b, "heads": h, "seq": n, "d": d,
            "binding_ms": statistics.mean(binding), "binding_median_ms": statistics.median(binding),
            "sdpa_ms": statistics.mean(torch_sdpa), "sdpa_median_ms": statistics.median(torch_sdpa),
            "cli_ms": cli["mean"], "cli_median_ms": cli["median"],
            "max_abs_diff_to_sdpa": err, "largest_gradient": scale,
        }
        row["binding_tflops"] = causal_flops(b, h, n, d) / row["binding_ms"] / 1e9
        rows.append(row)
        print(f"{cell}: binding {row['binding_ms']:.3f} ms, lmscope attention {row['cli_ms']:.3f} ms, "
              f"SDPA {row['sdpa_ms']:.3f} ms", file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; bf16 causal fwd+bwd, mean of {a.iters} after "
          f"{a.warmup} warm-up (median in brackets)\n")
    print("| batch × heads × seq × d | FlashAttention2 from PyTorch ms | lmscope attention ms | binding / command "
          "| SDPA ms | SDPA / FlashAttention2 | TFLOP/s | max abs diff to SDPA |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']}×{r['heads']}×{r['seq']}×{r['d']} | {r['binding_ms']:.3f} ({r['binding_median_ms']:.3f}) "
              f"| {r['cli_ms']:.3f} ({r['cli_median_ms']:.3f}) | {r['binding_ms'] / r['cli_ms']:.3f} "
              f"| {r['sdpa_ms']:.3f} ({r['sdpa_median_ms']:.3f}) | {r['sdpa_ms'] / r['binding_ms']:.3f} "
              f"| {r['binding_tflops']:.0f} | {r['max_abs_diff_to_sdpa']:.2e} (of {r['largest_gradient']:.1f}) |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
