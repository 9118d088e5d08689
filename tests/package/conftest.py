"""The Python package's tests: run by ctest (python_package) with PYTHONPATH at the build's package
directory and LMSCOPE naming the built command, whose output the package must equal."""

import os
import subprocess

import pytest

LMSCOPE = os.environ.get("LMSCOPE", "build/lmscope")

# A model small enough to train on the CPU in a second a step.
TINY = {"d_model": 64, "d_ff": 128, "layers": 2, "heads": 2, "vocab": 512}


def flags_of(keywords):
    """The command line's spelling of RunSpec keywords."""
    out = []
    for key, value in keywords.items():
        out += ["--" + key.replace("_", "-"), str(value)]
    return out


@pytest.fixture
def lmscope_cli():
    def run(*args, check=True):
        r = subprocess.run([LMSCOPE, *map(str, args)], capture_output=True, text=True, timeout=600)
        if check and r.returncode != 0:
            raise AssertionError(f"lmscope {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}")
        return r

    return run
