"""RunSpec: one run, described by the command line's flags as keywords."""

import json

from . import _lmscope

_BOOLEAN_WORDS = {True: "on", False: "off"}


def _flag_value(key, value):
    if isinstance(value, bool):
        return _BOOLEAN_WORDS[value]
    if isinstance(value, (list, tuple, set, dict)):
        raise TypeError(f"RunSpec takes one value for {key}, got {value!r} (sweep by making several RunSpecs)")
    return str(value)


class RunSpec:
    """One run: each keyword is a flag of the command line (ctx=1024 is --ctx 1024, d_model=512 is
    --d-model 512, graphs=False is --graphs off), and a flag left out has the command line's default.

    The flags are checked as the command line checks them: a value it refuses raises lmscope.UserError
    with its sentence. RunSpec.flag_names() lists what it takes.
    """

    def __init__(self, **flags):
        names = set(_lmscope.run_flag_names())
        given = {}
        for key, value in flags.items():
            if key.replace("_", "-") not in names:
                raise TypeError(f"RunSpec() got an unexpected keyword argument '{key}' (RunSpec.flag_names() lists them)")
            if value is not None:
                given[key] = value
        self._given = given
        self._flags = [(key.replace("_", "-"), _flag_value(key, value)) for key, value in given.items()]
        _lmscope.describe_run(self._flags, True)  # refuses now what no use of the run would take

    @staticmethod
    def flag_names():
        """The keywords a RunSpec takes, as Python spells them."""
        return sorted(name.replace("-", "_") for name in _lmscope.run_flag_names())

    def replace(self, **changes):
        """A RunSpec with these keywords changed (None: back to the default)."""
        return RunSpec(**{**self._given, **changes})

    def describe(self, dry_run=False):
        """The run as lmscope builds it, every setting filled in (as a checkpoint's state.json keeps it).
        dry_run: as a dry run reads it (its device defaults to cuda, and world_size may be set)."""
        return json.loads(_lmscope.describe_run(self._flags, dry_run))

    @property
    def given(self):
        """The keywords given, as given."""
        return dict(self._given)

    def _flag_list(self):
        return list(self._flags)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._given:
            return self._given[name]
        raise AttributeError(f"'{name}' was not given to this RunSpec (describe() has every setting)")

    def __eq__(self, other):
        return isinstance(other, RunSpec) and self._flags == other._flags

    def __repr__(self):
        return "RunSpec(" + ", ".join(f"{k}={v!r}" for k, v in self._given.items()) + ")"


def as_spec(spec, flags, function):
    """The RunSpec a function was given, or the one its keywords make; not both."""
    if spec is None:
        return RunSpec(**flags)
    if flags:
        raise TypeError(f"{function}() takes a RunSpec or its keywords, not both")
    if not isinstance(spec, RunSpec):
        raise TypeError(f"{function}() takes a lmscope.RunSpec, got {type(spec).__name__}")
    return spec
