"""lmscope from Python: describe a run as the command line does, ask what it needs, time it, train it.

    import lmscope
    spec = lmscope.RunSpec(model="2.7B", ctx=1024, batch=4, precision="bf16")
    report = lmscope.dry_run(spec)          # the memory report, computed on no device
    report.peak_bytes, report.fits, report.by_kind
    row = lmscope.bench(spec.replace(model="small", device="cpu", ctx=128))
    session = lmscope.Session(model="small", device="cpu", ctx=64, data=token_ids)
    result = session.step()                 # result.loss, result.grad_norm

FlashAttention-2 for PyTorch models is in lmscope.torch (it imports torch; this module does not).
"""

from ._lmscope import EnvironmentFailure, OutOfMemory, RankFailure, Unsupported, UserError
from .reports import MemoryReport, bench, dry_run, memory, plan, plan_recommend
from .session import Session, StepResult
from .spec import RunSpec

__all__ = [
    "RunSpec",
    "dry_run",
    "memory",
    "bench",
    "plan",
    "plan_recommend",
    "MemoryReport",
    "Session",
    "StepResult",
    "UserError",
    "Unsupported",
    "OutOfMemory",
    "EnvironmentFailure",
    "RankFailure",
]
