"""lmscope's FlashAttention-2 in PyTorch models: an autograd Function over lmscope's own kernels.

    from lmscope.torch import FlashAttention2, flash_attention
    o = FlashAttention2.apply(q, k, v, True)          # q, k, v: (batch, n, d) or (batch, heads, n, d)
    o = flash_attention(q, k, v, is_causal=True)      # the same, with keywords
    o = flash_attn_func(q, k, v, causal=True)         # the flash-attn package's: (batch, n, heads, d)

The tensors pass to lmscope's kernels and back through DLPack without copies (a tensor that is not
contiguous is made so first), and the kernels run on the caller's current CUDA stream. Among the
tensors the forward saves, one holds the log-sum-exp of each query's row, L, of shape (batch, n) for
(batch, n, d) inputs (natural log, float32 on CUDA; the inputs' dtype on the CPU). Causal masks key
j > query i. The CPU computes float32 and float64 (so torch.autograd.gradcheck runs in float64); CUDA
takes float32, bfloat16 and float16 with head dims up to 128. Anything else raises, with no fallback.
"""

import atexit
import math

import torch
import torch.utils.dlpack

from . import _lmscope

atexit.register(_lmscope.release_attention_backends)  # while CUDA is still up

_DTYPES = {
    "cpu": (torch.float32, torch.float64),
    "cuda": (torch.float32, torch.bfloat16, torch.float16),
}


def _capsule(t):
    return torch.utils.dlpack.to_dlpack(t)


try:  # the current stream's handle without a torch.cuda.Stream made for it (a tenth of the host time)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:
    _raw_stream = None


def _stream(t):
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream


def _check(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlashAttention2: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() not in (3, 4):
        raise ValueError(f"FlashAttention2 takes (batch, n, d) or (batch, heads, n, d) tensors; q has shape {tuple(q.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"FlashAttention2: k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    if k.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"FlashAttention2: q {tuple(q.shape)} and k {tuple(k.shape)} must agree in every dimension but the "
            "positions (-2)")
    if min(q.shape) == 0 or min(k.shape) == 0:
        raise ValueError(f"FlashAttention2 needs at least one query, key and channel; q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"FlashAttention2: q, k and v must have one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"FlashAttention2: q, k and v must lie on one device, got {q.device}, {k.device} and {v.device}")
    kinds = _DTYPES.get(q.device.type)
    if kinds is None:
        raise ValueError(f"FlashAttention2 runs on the CPU and CUDA, not {q.device.type}")
    if q.dtype not in kinds:
        names = ", ".join(str(d).replace("torch.", "") for d in kinds)
        raise TypeError(f"FlashAttention2 on {q.device.type} takes {names}, not {str(q.dtype).replace('torch.', '')}")


def _packed(t):
    """(…, n, d) as [prod(…), n, d], contiguous (a packed (batch, n, d) tensor as it is: no view made)."""
    if t.dim() == 3 and t.is_contiguous():
        return t
    t = t.contiguous()
    return t.view(-1, t.shape[-2], t.shape[-1])


class FlashAttention2(torch.autograd.Function):
    """softmax(q kᵀ / √d) v, causal when is_causal, by lmscope's FlashAttention-2 kernels, forward and
    backward. scale: in place of 1/√d; deterministic: sum dq in a fixed order (on CUDA the backward
    otherwise takes whichever way is faster, as SDPA's does)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, deterministic=False):
        _check(q, k, v)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        q3, k3, v3 = _packed(q), _packed(k), _packed(v)
        out = torch.empty_like(q3)
        lse = torch.empty(q3.shape[:2], dtype=torch.float32 if q.is_cuda else q.dtype, device=q.device)
        _lmscope.flash_attention_forward(_capsule(q3), _capsule(k3), _capsule(v3), _capsule(out), _capsule(lse),
                                         scale, bool(is_causal), _stream(q))
        # Kept packed for the backward, which hands them to the kernels as they are; L as (batch, n).
        ctx.save_for_backward(q3, k3, v3, out, lse.view(q.shape[:-1]))
        ctx.scale, ctx.is_causal, ctx.deterministic = scale, bool(is_causal), bool(deterministic)
        ctx.shapes = q.shape, k.shape
        return out.view(q.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        q_shape, k_shape = ctx.shapes
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _lmscope.flash_attention_backward(
            _capsule(q), _capsule(k), _capsule(v), _capsule(o), _capsule(lse.view(q.shape[:2])),
            _capsule(_packed(do.to(q.dtype))), _capsule(dq), _capsule(dk), _capsule(dv), ctx.scale, ctx.is_causal,
            ctx.deterministic, _stream(q))
        return dq.view(q_shape), dk.view(k_shape), dv.view(k_shape), None, None, None


def flash_attention(q, k, v, is_causal=False, scale=None, deterministic=False):
    """FlashAttention2.apply with keywords: (batch, n, d) or (batch, heads, n, d) in, the same shape out."""
    return FlashAttention2.apply(q, k, v, is_causal, scale, deterministic)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, deterministic=False):
    """The flash-attn package's interface: q, k, v of shape (batch, seqlen, nheads, headdim), the output
    likewise. lmscope's kernels take each head's rows together, so the tensors are transposed to (batch,
    nheads, seqlen, headdim) and back (copies, which flash_attention on that layout does not make).
    Dropout is not there: dropout_p must be 0."""
    if dropout_p != 0.0:
        raise ValueError(f"flash_attn_func: lmscope's kernels have no dropout, and dropout_p is {dropout_p}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"flash_attn_func takes (batch, seqlen, nheads, headdim) tensors; {name} is not one")
    o = FlashAttention2.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, softmax_scale,
                              deterministic)
    return o.transpose(1, 2)


__all__ = ["FlashAttention2", "flash_attention", "flash_attn_func"]
