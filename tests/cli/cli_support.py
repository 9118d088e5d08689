"""What the command-line tests share: a test class with a temporary directory of its own, token
files of random ids, and safetensors files written and read the way lmscope writes them (a
little-endian header length, a JSON header, the raw tensors)."""
import json
import os
import re
import socket
import struct
import subprocess
import tempfile
import unittest

import numpy as np


# What no message may hold: the C++ runtime's, the JSON library's and Gloo's words, or our own for a bug.
FOREIGN = ("terminate called", "what():", "json.exception", "[json.", "enforce fail", "internal error", "std::",
           "basic_string", "stoll", "stoull", "Traceback")


def utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def failure_of(argv, case, cwd=None, timeout=20, env=None):
    """None when lmscope `argv` (str or bytes) ends by itself within `timeout` s with exit 0, 1 or 2, a
    failure in one "lmscope: error: ..." sentence as stderr's last line, stderr UTF-8 (a value's bytes
    echoed as they came are no sentence) and no FOREIGN text; else what to show, named by `case`."""
    try:
        p = subprocess.run([os.environ["LMSCOPE"], *argv], capture_output=True, timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        return f"{case}: still running after {timeout} s\n    {argv!r}"
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    why = None
    if p.returncode not in (0, 1, 2):
        why = f"exit {p.returncode}"
    elif any(word in out + err for word in FOREIGN):
        why = "foreign text"
    elif not utf8(p.stderr):
        why = "stderr is not UTF-8"
    elif p.returncode != 0:
        lines = err.strip().splitlines()
        if not lines or not re.match(r"^lmscope: (rank \d+: )?error: ", lines[-1]) or \
                sum("error: " in line for line in lines) != 1:
            why = "not one sentence"
    return None if why is None else f"{case}: {why}\n    {argv[:1]} stderr: {err[-300:]!r}"


class FilesTest(unittest.TestCase):
    """A directory made before the class's tests and removed after them; path(name) is in it.
    Subclasses that set up more call super().setUpClass() first."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp.name, name)


def write_tokens(path, count, vocab=50, seed=0):
    """`count` random uint16 token ids below `vocab`, as raw .bin."""
    np.random.default_rng(seed).integers(0, vocab, size=count, dtype=np.uint16).tofile(path)
    return path


_NUMPY = {"F32": np.float32, "I64": np.int64}


def write_safetensors(path, tensors, dtype="F32"):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.asarray(a, dtype=_NUMPY[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """name -> numpy array, for the F32 and I64 tensors of a file (its metadata left out)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype=_NUMPY[t["dtype"]]).reshape(t["shape"])
    return out


def read_train_log(path, runs=None):
    """The step lines of a train --log file; the lines describing each run or resumption (no "step",
    a "run" and "from_step") are appended to `runs` when given, else passed over."""
    steps = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "step" in row:
                steps.append(row)
            else:
                assert "run" in row and "from_step" in row, f"{path}: a line neither a step nor a run's: {line!r}"
                if runs is not None:
                    runs.append(row)
    return steps


def free_port():
    """A TCP port free on 127.0.0.1 now (another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
