"""What the command-line tests share: a test class with a temporary directory of its own, token
files of random ids, and safetensors files written and read the way lmscope writes them (a
little-endian header length, a JSON header, the raw tensors)."""
import json
import os
import struct
import tempfile
import unittest

import numpy as np


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
