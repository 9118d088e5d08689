"""The CS336 Transformer LM of shared/MODEL.md in plain PyTorch: lmscope's reference.

The parity tests load the same safetensors weights into this module and into lmscope and compare
logits, loss, gradients and trained parameters; the benchmark scripts time it side by side with
lmscope. Parameter names match the assignment's module, so state_dict() keys are the file's keys.
"""
import functools
import json
import math
import struct

import numpy as np
import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        std = math.sqrt(2.0 / (d_in + d_out))
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x):
        return x @ self.weight.t()


class Embedding(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, d))
        nn.init.trunc_normal_(self.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, ids):
        return self.weight[ids]


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(dtype)


@functools.lru_cache(maxsize=64)
def _rope_tables(T, dk, theta, device, dtype):
    """cos and sin of p·theta^(-2i/dk), [T, dk/2], built once per shape on the tensor's device."""
    inv = theta ** (-torch.arange(0, dk, 2, dtype=torch.float64, device=device) / dk)
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rope(x, theta):
    """Interleaved-pair RoPE on [..., T, d_k], positions 0..T-1."""
    cos, sin = _rope_tables(x.shape[-2], x.shape[-1], theta, x.device, x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    """attention="naive" is the assignment's (scores and probabilities materialised, hand softmax);
    "sdpa" calls F.scaled_dot_product_attention (PyTorch's fused flash/cuDNN kernels)."""

    def __init__(self, d, heads, theta, attention="naive"):
        super().__init__()
        self.heads, self.theta, self.attention = heads, theta, attention
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, d = x.shape
        h, dk = self.heads, d // self.heads
        split = lambda t: t.view(B, T, h, dk).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        q, k = rope(q, self.theta), rope(k, self.theta)
        if self.attention == "sdpa":
            o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.output_proj(o.transpose(1, 2).reshape(B, T, d))
        s = q @ k.transpose(-1, -2) / math.sqrt(dk)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        s = s.masked_fill(mask, float("-inf"))
        p = torch.exp(s - s.amax(-1, keepdim=True))
        p = p / p.sum(-1, keepdim=True)
        o = (p @ v).transpose(1, 2).reshape(B, T, d)
        return self.output_proj(o)


class SwiGLU(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d, d_ff), Linear(d_ff, d), Linear(d, d_ff)

    def forward(self, x):
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, d_ff, heads, theta, attention="naive"):
        super().__init__()
        self.ln1, self.attn = RMSNorm(d), Attention(d, heads, theta, attention)
        self.ln2, self.ffn = RMSNorm(d), SwiGLU(d, d_ff)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class TransformerLM(nn.Module):
    def __init__(self, vocab=10000, d_model=768, d_ff=3072, layers=12, heads=12, rope_theta=10000.0,
                 attention="naive"):
        super().__init__()
        self.token_embeddings = Embedding(vocab, d_model)
        self.layers = nn.ModuleList(Block(d_model, d_ff, heads, rope_theta, attention) for _ in range(layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab)

    def forward(self, ids):
        x = self.token_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


PRESETS = {
    "small": dict(d_model=768, d_ff=3072, layers=12, heads=12),
    "medium": dict(d_model=1024, d_ff=4096, layers=24, heads=16),
    "large": dict(d_model=1280, d_ff=5120, layers=36, heads=20),
    "xl": dict(d_model=1600, d_ff=6400, layers=48, heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, layers=32, heads=32),
    "10B": dict(d_model=4608, d_ff=12288, layers=50, heads=36),  # the 2026 handout's sharded-training model
}


def cross_entropy(logits, targets):
    logits = logits.float().reshape(-1, logits.shape[-1])
    lse = torch.logsumexp(logits, dim=-1)
    return (lse - logits.gather(1, targets.reshape(-1, 1)).squeeze(1)).mean()


class AdamW(torch.optim.Optimizer):
    """The assignment's AdamW (MODEL.md): bias correction folded into the step size, decay after."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                t, m, v, g = st["t"], st["m"], st["v"], p.grad
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                alpha = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.sub_(alpha * m / (v.sqrt() + eps))
                p.sub_(lr * wd * p)


def clip_grad_norm(params, max_norm):
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    scale = min(1.0, max_norm / (float(norm) + 1e-6))
    for g in grads:
        g.mul_(scale)
    return float(norm)


def cosine_lr(it, lr_max, lr_min, warmup, cosine_iters):
    if it < warmup:
        return lr_max * it / warmup
    if it > cosine_iters:
        return lr_min
    return lr_min + 0.5 * (1 + math.cos(math.pi * (it - warmup) / (cosine_iters - warmup))) * (lr_max - lr_min)


def sequential_batch(tokens, step, batch, ctx):
    """lmscope's --sample sequential: row b of step s starts at ((s*B + b) mod W)*ctx."""
    windows = (len(tokens) - 1) // ctx
    starts = [((step * batch + b) % windows) * ctx for b in range(batch)]
    x = np.stack([tokens[s : s + ctx] for s in starts]).astype(np.int64)
    y = np.stack([tokens[s + 1 : s + ctx + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def save_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().float().numpy() if torch.is_tensor(t) else t, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        a = np.frombuffer(raw[8 + n + b : 8 + n + end], dtype=_DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out
