"""Session: a run trained step by step, on batches given as NumPy arrays or drawn from token ids."""

import dataclasses
import json
import sys

from . import _lmscope
from .spec import as_spec


@dataclasses.dataclass(frozen=True)
class StepResult:
    step: int  # from 1, as train's log counts
    loss: float  # the mean over the step's tokens (and micro-batches)
    lr: float
    grad_norm: float  # before clipping
    applied: bool  # False: the optimizer skipped the step (its gradients were not finite)
    loss_scale: float = None  # fp16's, where a scaler runs
    note: str = ""  # what train would print of a skipped step


class Parameter:
    """A parameter's values where lmscope keeps them, for torch.from_dlpack or numpy.from_dlpack: a
    view without a copy, which changes as training goes on."""

    def __init__(self, native, name):
        self._native, self.name = native, name

    def __dlpack__(self, stream=None, **_):
        return self._native.parameter(self.name)

    def __dlpack_device__(self):
        return tuple(self._native.dlpack_device())

    def __repr__(self):
        return f"<lmscope parameter {self.name}>"


class Session:
    """A run trained step by step, as `lmscope train` trains it: the same weights (seeded by seed, or
    init= a safetensors file), the same batches (drawn from data= as train draws them from --data, or
    given to step()), so the same losses bit for bit.

        session = lmscope.Session(model="small", device="cpu", ctx=128, lr=1e-3, data=np.load("tokens.npy"))
        for _ in range(100):
            r = session.step()
        session.save("weights.safetensors")

    data: one-dimensional uint16, int32 or int64 token ids, read in place (a np.memmap too); sample:
    "random" (seeded windows, the assignment's get_batch) or "sequential"; progress: print a line per step.
    """

    def __init__(self, spec=None, *, data=None, init=None, sample="random", progress=False, **flags):
        spec = as_spec(spec, flags, "Session")
        self.progress = progress
        self._native = _lmscope.TrainingSession(spec._flag_list(), "" if init is None else str(init), data, sample)
        self._spec = spec

    def step(self, inputs=None, targets=None):
        """One optimizer step. inputs and targets: token ids of shape (batch, ctx), or (grad_accum,
        batch, ctx) with micro-batches (int32 is read in place); neither: the next batch drawn from data."""
        r = StepResult(**self._native.step(inputs, targets))
        if self.progress:
            scale = "" if r.loss_scale is None else f"  loss scale {r.loss_scale:g}"
            print(f"step {r.step:>6}  loss {r.loss:.4f}  lr {r.lr:.3e}  grad norm {r.grad_norm:.3f}{scale}",
                  file=sys.stderr, flush=True)
        if r.note and self.progress:
            print(r.note, file=sys.stderr, flush=True)
        return r

    def train(self, steps):
        """`steps` steps from data; their results."""
        return [self.step() for _ in range(steps)]

    def save(self, path):
        """The weights as a safetensors file with PyTorch's names (train --save's)."""
        self._native.save(str(path))

    @property
    def steps_done(self):
        return self._native.steps_done()

    @property
    def device(self):
        return self._native.device_name()

    @property
    def spec(self):
        return self._spec

    def describe(self):
        """The run as built, every setting filled in."""
        return json.loads(self._native.spec_json())

    def parameter_names(self):
        return self._native.parameter_names()

    def parameter(self, name):
        """Parameter `name` in place: torch.from_dlpack(session.parameter(n)), numpy.from_dlpack(...)."""
        if name not in self._native.parameter_names():
            raise KeyError(f"the model has no parameter '{name}' (parameter_names() lists them)")
        return Parameter(self._native, name)
