"""What a run needs and how long it takes: the memory report, the bench row, the plan."""

import json
import sys

from . import _lmscope
from .spec import as_spec


def _limit(memory_limit):
    """The memory limit as --memory-limit reads it: bytes as an int, or text such as "40GiB"."""
    return "" if memory_limit is None else str(memory_limit)


def _one_row(text):
    rows = json.loads(text)
    return rows[0]


class MemoryReport:
    """One step's memory, as `lmscope memory --format json` writes its row (that dict is .row).

    peak_bytes: the step's peak of allocated bytes; fits: whether it fits the budget (False only where
    memory ran out); status: "ok", "does not fit: needs X of Y", "OOM: ...", or why the run failed;
    by_kind: bytes held at the peak by kind (parameters, gradients, optimizer state, activations, ...);
    by_op: (op, bytes) of the activations held at the peak by the op that made them; largest: the
    largest buffers live at the peak; phase_peaks: each phase's peak; need_bytes: what the whole
    device needs (its own overhead and the allocator's segments included), where known; budget_bytes:
    what the step must fit in (the device's memory, or the memory limit).
    """

    def __init__(self, row):
        self.row = row
        self.status = row["status"]
        self.fits = not (self.status.startswith("OOM") or self.status.startswith("does not fit"))
        self.peak_bytes = row.get("peak_bytes")
        self.by_kind = dict(row.get("peak_by_kind", {}))
        self.by_op = [(entry["op"], entry["bytes"]) for entry in row.get("peak_by_op", [])]
        self.largest = list(row.get("largest_at_peak", []))
        self.phase_peaks = dict(row.get("phase_peak_bytes", {}))
        self.need_bytes = row.get("device_memory", {}).get("need_bytes")
        self.budget_bytes = row.get("budget_bytes")

    @property
    def peak_gib(self):
        return None if self.peak_bytes is None else self.peak_bytes / 2**30

    def __repr__(self):
        peak = "no step" if self.peak_bytes is None else f"peak {self.peak_gib:.2f} GiB"
        return f"<MemoryReport {self.row.get('model', {}).get('name', '?')} ctx {self.row.get('ctx')}: {peak}, {self.status}>"


def dry_run(spec=None, *, memory_limit=None, top=10, warmup=1, **flags):
    """The memory of one step of the run, by the dry run: nothing computed, no device needed, every
    allocation as the device would make it (device defaults to cuda, an H100 80GB where no GPU is
    visible). memory_limit: the budget (bytes, or text such as "40GiB"); top: the largest buffers
    listed. Equal to `lmscope memory --dry-run --format json`'s row."""
    spec = as_spec(spec, flags, "dry_run")
    return MemoryReport(_one_row(_lmscope.memory_json(spec._flag_list(), True, _limit(memory_limit), top, warmup)))


def memory(spec=None, *, top=10, warmup=1, **flags):
    """The memory of one step of the run, recorded on the device after `warmup` steps
    (`lmscope memory --format json`'s row)."""
    spec = as_spec(spec, flags, "memory")
    return MemoryReport(_one_row(_lmscope.memory_json(spec._flag_list(), False, "", top, warmup)))


def bench(spec=None, *, warmup=5, steps=10, progress=False, **flags):
    """Times `steps` steps of the run after `warmup` (`lmscope bench --format json`'s row, a dict):
    forward, backward, optimizer and whole-step milliseconds, tokens/s, model TFLOP/s, the peak.
    progress: print a line per step on stderr (or a callable taking done, total)."""
    spec = as_spec(spec, flags, "bench")
    callback = None
    if callable(progress):
        callback = progress
    elif progress:
        def callback(done, total):
            print(f"lmscope bench: step {done}/{total}", file=sys.stderr, flush=True)
    return _one_row(_lmscope.bench_json(spec._flag_list(), warmup, steps, callback))


def plan(spec=None, *, memory_limit=None, ctx_multiple=128, **flags):
    """What fits the budget, by dry runs (`lmscope plan --format json`'s row, a dict): the step's peak
    at the run's batch and context, and the largest context (a multiple of ctx_multiple) and the
    largest batch whose step fits."""
    spec = as_spec(spec, flags, "plan")
    return _one_row(_lmscope.plan_json(spec._flag_list(), _limit(memory_limit), ctx_multiple))


def plan_recommend(spec=None, *, memory_limit=None, measure=False, measure_steps=3, **flags):
    """The fastest way to train the run's batch at its context within the budget (`lmscope plan
    --recommend --format json`'s row, a dict): the candidates that fit (recompute mode, weight copies,
    micro-batches, ZeRO stage over ranks) with their dry-run peaks, and the one chosen; measure: time
    each on the device and choose the fastest."""
    spec = as_spec(spec, flags, "plan_recommend")
    return _one_row(_lmscope.recommend_json(spec._flag_list(), _limit(memory_limit), measure, measure_steps))
