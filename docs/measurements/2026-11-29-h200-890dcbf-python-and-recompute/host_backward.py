import time, types, statistics, torch, torch.nn.functional as F
import torch.utils.dlpack as dl
from lmscope import _lmscope
from lmscope.torch import FlashAttention2

def host_us(fn, n=20, rounds=15):
    """Host time per call with the launch queue far from full: min over rounds of n calls."""
    best = []
    for _ in range(rounds):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return min(best), statistics.median(best)

def gpu_us(fn, n=50):
    for _ in range(5): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3

for shape in ((1, 128, 64), (16, 4096, 64)):
    q = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    o = torch.empty_like(q); lse = torch.empty(shape[:2], device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    s = torch.cuda.current_stream().cuda_stream
    _lmscope.flash_attention_forward(*[dl.to_dlpack(t) for t in (q, k, v, o, lse)], 0.125, True, s)
    caps = [dl.to_dlpack(t) for t in (q, k, v, o, lse, do, dq, dk, dv)]
    bwd = lambda: _lmscope.flash_attention_backward(*caps, 0.125, True, False, s)
    fcaps = [dl.to_dlpack(t) for t in (q, k, v, o, lse)]
    fwd = lambda: _lmscope.flash_attention_forward(*fcaps, 0.125, True, s)
    ctx = types.SimpleNamespace(saved_tensors=(q, k, v, o, lse), shapes=(q.shape, k.shape), scale=0.125,
                                is_causal=True, deterministic=False)
    body = lambda: FlashAttention2.backward.__wrapped__(ctx, do)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    full = lambda: torch.autograd.grad(FlashAttention2.apply(qg, kg, vg, True), (qg, kg, vg), do)
    fonly = lambda: FlashAttention2.apply(qg, kg, vg, True)
    q4, k4, v4 = (t.view(shape[0], 1, shape[1], shape[2]) for t in (qg, kg, vg))
    sd = lambda: torch.autograd.grad(F.scaled_dot_product_attention(q4, k4, v4, is_causal=True), (qg, kg, vg),
                                     do.view(q4.shape))
    sdf = lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
    print(f"== {shape}: host us (min, median over rounds of 20 calls); GPU us per call")
    for name, fn in (("binding fwd", fwd), ("binding bwd", bwd), ("Function backward body", body),
                     ("Function fwd", fonly), ("Function fwd+bwd", full), ("SDPA fwd", sdf), ("SDPA fwd+bwd", sd)):
        h = host_us(fn)
        print(f"{name:24s} host {h[0]:8.1f} {h[1]:8.1f}   gpu {gpu_us(fn):8.1f}")
