"""Files that lie: a valid file lmscope wrote, edited so that one thing inside it is wrong while the
rest still parses, to reach the deep parts of each reader. safetensors headers (for --init and inside
a checkpoint, its sizes recomputed in state.json) whose length, offsets, shapes, dtypes and names lie
or whose values are NaN; .npy headers whose version, dtype, shape and length lie, and token ids out of
range; state.json fields of every kind and size (its own CRC-32 left out, as an older lmscope wrote
it); report inputs with each field swapped for extreme numbers and values of other kinds; checkpoint
directories of FIFOs, loops and files; non-UTF-8 file names; unreadable files (unless root reads them
anyway). Each case ends within 20 s with exit 0, 1 or 2, a failure in one "lmscope: error: ..."
sentence and no library's text. Failures are collected and shown together. Run by ctest with LMSCOPE
pointing at the built program."""
import concurrent.futures
import json
import os
import random
import shutil
import struct
import subprocess
import unittest
import zlib

import numpy as np

from cli_support import FilesTest, failure_of, write_tokens
from test_bad_inputs import npy

LMSCOPE = os.environ["LMSCOPE"]
SANITIZED = os.environ.get("LMSCOPE_SANITIZED") == "1"
MODEL = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab", "300",
         "--ctx", "16", "--batch", "2"]
# Values that a field of any kind may be swapped for.
EXTREMES = [-1, 0, 1e308, -1e308, 2**63, 2**64 - 1, -2**63, 5e-324, 1.5, "", "\u0000<&>\"'", "\ud83d\ude00" * 3,
            "x" * 100000, "a\nline\rbreak\x1b[2J", True, None, [], {}, [[[]]], {"a": {"b": 1}},
            {"a\nb": {"c\nd": 1}}]


def split_safetensors(data):
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_safetensors(header, body):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def lying_safetensors(data):
    """(name, bytes): the file with one thing in it wrong."""
    header, body = split_safetensors(data)
    raw = data[8:8 + int.from_bytes(data[:8], "little")]
    names = [k for k in header if k != "__metadata__"]
    first, second = names[0], names[1]
    begin, end = header[first]["data_offsets"]
    out = [("header length 2^64-1", struct.pack("<Q", 2**64 - 1) + data[8:]),
           ("header length 0", struct.pack("<Q", 0) + data[8:]),
           ("header length one short", struct.pack("<Q", len(raw) - 1) + data[8:]),
           ("header length past the end", struct.pack("<Q", len(data) - 7) + data[8:]),
           ("header a list", join_safetensors(b"[]", body)),
           ("header nested 100,000 deep", join_safetensors(b"[" * 100000 + b"]" * 100000, body)),
           ("a name not UTF-8", join_safetensors(raw.replace(first.encode(), b"\xff\xfe" + first.encode(), 1), body)),
           ("a name a lone surrogate", join_safetensors(raw.replace(first.encode(), b"\\ud800", 1), body)),
           ("a tensor twice", join_safetensors(raw[:-1].rstrip() + b"," + json.dumps({first: header[first]})[1:].encode(),
                                               body)),
           ("no data section", join_safetensors(raw, b"")),
           ("NaN everywhere", join_safetensors(raw, struct.pack("<f", float("nan")) * (len(body) // 4))),
           ("infinity everywhere", join_safetensors(raw, struct.pack("<f", float("inf")) * (len(body) // 4))),
           ("1e38 everywhere", join_safetensors(raw, struct.pack("<f", 1e38) * (len(body) // 4)))]
    size = len(body)
    fields = {
        "data_offsets": [[size, size + end - begin], [end, begin], [-4, end - begin - 4], [0.5, end - begin],
                         [begin, end, end], [2**64 - 1, 2**64 - 1], [2**63, 2**63 + end - begin], "0-4", None],
        "shape": [[2**32, 2**32], [2**62, 2**62, 2**62], [-1, 64], [1.5], [], "64", [[64]], [0, 0]],
        "dtype": ["F16", "I32", "I64", "BOOL", "F8_E4M3", "Q7", 5, "", None, "F\n32"],
    }
    for key, values in fields.items():
        for v in values:
            h = json.loads(json.dumps(header))
            h[first][key] = v
            out.append((f"{key} {json.dumps(v)[:30]}", join_safetensors(h, body)))
    h = json.loads(json.dumps(header))
    h[second]["data_offsets"] = h[first]["data_offsets"]
    h[second]["shape"] = h[first]["shape"]
    out.append(("two tensors at the same bytes", join_safetensors(h, body)))
    for meta in ([], "x", {"format": 5}, {"d_model": "9" * 400}):
        h = json.loads(json.dumps(header))
        h["__metadata__"] = meta
        out.append((f"metadata {json.dumps(meta)[:20]}", join_safetensors(h, body)))
    h = json.loads(json.dumps(header))
    del h[first]
    out.append(("a tensor missing", join_safetensors(h, body)))
    h = json.loads(json.dumps(header))
    h["extra\u00e9"] = dict(header[first])
    out.append(("a tensor more", join_safetensors(h, body)))
    h = json.loads(json.dumps(header))
    h["a\nline\x1b[2J"] = dict(header[first])
    out.append(("a tensor more, its name two lines", join_safetensors(h, body)))
    return out


def lying_tokens():
    """(name, bytes) of token files whose .npy header or ids lie (the model's vocabulary is 300)."""
    body = np.arange(400, dtype=np.uint16).astype("<u2") % 300
    ok = "{'descr': '<u2', 'fortran_order': False, 'shape': (400,), }"
    out = [(f"npy {h[:40]}", npy(h, body.tobytes())) for h in (
        "{'fortran_order': False, 'shape': (400,), }", "{'descr': '<f4', 'fortran_order': False, 'shape': (400,), }",
        "{'descr': '>u2', 'fortran_order': False, 'shape': (400,), }", "{'descr': 5, 'shape': (400,), }",
        "{'descr': '<u2", "{'descr': '<u2', 'fortran_order': True, 'shape': (400,), }",
        "{'descr': '<u2', 'shape': (), }", "{'descr': '<u2', 'shape': (20, 20), }",
        "{'descr': '<u2', 'shape': (-5,), }", "{'descr': '<u2', 'shape': (99999999999999999999999,), }",
        "{'descr': '<u2', 'shape': (18446744073709551615,), }", "{'descr': '<u2', 'shape': (9223372036854775807,), }",
        "{'descr': '<u2', 'shape': (401,), }", "{'descr': '<u2', 'shape': (400", "{'descr': '<u2', 'shape': 400, }", "{'descr': '<u2', 'shape': (\n\n20,\n), }",
        "{'shape': (400,), 'descr': '<u2', }", "{'descr': '<u2', 'shape': (0,), }", "{'descr': '<u2', 'shape': (1,), }",
        "{'descr': '\xff\xfe', 'shape': (400,), }", "{}", "")]
    out += [(f"npy version {v}", npy(ok, body.tobytes(), version=v)) for v in (0, 2, 3, 4, 255)]
    out.append(("npy header length past the end", b"\x93NUMPY\x01\x00\xff\xff" + ok.encode()))
    out.append(("npy header length 0", b"\x93NUMPY\x01\x00\x00\x00" + body.tobytes()))
    for dtype, ids in (("<i8", [-1, -2**63]), ("<i8", [2**62, 300]), ("<i4", [-2**31, 2**31 - 1]), ("<u2", [65535])):
        a = np.zeros(400, dtype=dtype)
        a[7:7 + len(ids)] = ids
        out.append((f"npy {dtype} ids {ids}", npy(f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': (400,), }}",
                                                 a.tobytes())))
    out.append(("bin ids 65535", np.full(400, 65535, dtype="<u2").tobytes()))
    out.append(("bin of 3 tokens", np.zeros(3, dtype="<u2").tobytes()))
    return out


def leaves(value, path=()):
    """The paths to every scalar (and empty container) in a JSON value."""
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in leaves(v, path + (k,))]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in leaves(v, path + (i,))]
    return [path]


def with_value(value, path, new):
    value = json.loads(json.dumps(value))
    at = value
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = new
    return value


class CraftedFiles(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tokens = write_tokens(cls.path("tokens.bin"), 4000, vocab=300)
        run = lambda *a: subprocess.run([LMSCOPE, *a], capture_output=True, timeout=120, check=True, cwd=cls.path(""))
        run("train", *MODEL, "--data", cls.tokens, "--steps", "3", "--save", cls.path("w.safetensors"), "--log",
            cls.path("log.jsonl"), "--checkpoint-dir", cls.path("ck"), "--save-every", "1")
        run("bench", *MODEL, "--warmup", "0", "--steps", "1", "--format", "json", "--out", cls.path("bench.json"))
        run("memory", *MODEL, "--format", "json", "--out", cls.path("memory.json"), "--svg", cls.path("memory.svg"))
        run("attention", "--device", "cpu", "--seq", "32", "--d", "16", "--iters", "1", "--warmup", "0", "--format",
            "json", "--out", cls.path("attention.json"))
        with open(cls.path("ck/step-00000003/state.json")) as f:
            cls.state = json.load(f)
        cls.rng = random.Random(57)

    def swaps(self, value, fields=60, each=3):
        """(path, new value): `each` of EXTREMES, seeded, for each of at most `fields` fields of `value`."""
        paths = leaves(value)
        paths = sorted(self.rng.sample(paths, fields)) if len(paths) > fields else paths
        return [(p, v) for p in paths for v in self.rng.sample(EXTREMES, each)]

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    def run_all(self, jobs, at_least):
        """Each (argv, case) run two at a time; every failure in one message."""
        if SANITIZED:  # a fixed part, every fourth
            jobs = jobs[::4]
        self.assertGreater(len(jobs), at_least // 4 if SANITIZED else at_least)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            failures = [f for f in pool.map(lambda j: failure_of(j[0], j[1], self.path("")), jobs) if f]
        self.assertFalse(failures, f"{len(failures)} of {len(jobs)} cases:\n" + "\n".join(failures[:40]))

    def checkpoint(self, name, files):
        """A copy of ck of only its newest checkpoint, `files` (name -> bytes, or a dict for state.json)
        written into it; state.json's sizes and CRC-32s of the other files made to match them, and its
        own CRC-32 left out."""
        ck = self.path(name)
        shutil.rmtree(ck, ignore_errors=True)
        shutil.copytree(self.path("ck/step-00000003"), os.path.join(ck, "step-00000003"))
        state = json.loads(json.dumps(self.state))
        for file, body in files.items():
            if file == "state.json":
                state = body
                continue
            with open(os.path.join(ck, "step-00000003", file), "wb") as f:
                f.write(body)
            if isinstance(state, dict) and isinstance(state.get("files"), dict):
                state["files"][file] = {"bytes": len(body), "crc32": zlib.crc32(body)}
        if isinstance(state, dict):
            state.pop("crc32", None)
        with open(os.path.join(ck, "step-00000003", "state.json"), "w") as f:
            json.dump(state, f)
        return ck

    def test_lying_safetensors_for_init_and_in_checkpoints(self):
        # The CRC-32 lmscope writes is zlib's: state.json's sizes can be made to match a crafted file.
        model = self.read("ck/step-00000003/model.safetensors")
        self.assertEqual(self.state["files"]["model.safetensors"]["crc32"], zlib.crc32(model))
        jobs = []
        for i, (name, body) in enumerate(lying_safetensors(self.read("w.safetensors"))):
            path = self.path(f"init{i}.safetensors")
            with open(path, "wb") as f:
                f.write(body)
            jobs.append((["train", *MODEL, "--data", self.tokens, "--steps", "2", "--init", path], f"--init: {name}"))
        for file in ("model.safetensors", "optimizer.safetensors"):
            for i, (name, body) in enumerate(lying_safetensors(self.read(f"ck/step-00000003/{file}"))):
                ck = self.checkpoint(f"ck-{file[0]}{i}", {file: body})
                jobs.append((["train", "--resume", ck, "--steps", "4"], f"--resume, {file}: {name}"))
        self.run_all(jobs, 100)

    def test_lying_token_files(self):
        jobs = []
        for i, (name, body) in enumerate(lying_tokens()):
            path = self.path(f"tokens{i}" + (".npy" if name.startswith("npy") else ".bin"))
            with open(path, "wb") as f:
                f.write(body)
            train = ["train", *MODEL, "--steps", "2"]
            jobs.append(([*train, "--data", path], f"--data: {name}"))
            jobs.append(([*train, "--data", self.tokens, "--val-data", path], f"--val-data: {name}"))
        self.run_all(jobs, 60)

    def test_state_json_fields_of_every_kind(self):
        jobs = []
        for i, (path, v) in enumerate(self.swaps(self.state)):
            if path != ("crc32",):
                ck = self.checkpoint(f"st{i}", {"state.json": with_value(self.state, path, v)})
                jobs.append((["train", "--resume", ck, "--steps", "4"], f"state.json {'.'.join(map(str, path))} = "
                                                                         f"{json.dumps(v)[:30]}"))
        for kind in ([], "x", None, {"config": {}}):
            ck = self.checkpoint(f"st-kind{json.dumps(kind)[:2]}", {"state.json": kind})
            jobs.append((["train", "--resume", ck, "--steps", "4"], f"state.json {json.dumps(kind)}"))
        self.run_all(jobs, 150)

    def test_report_inputs_with_fields_of_every_kind(self):
        jobs = []
        for flag, name in (("--bench", "bench.json"), ("--memory", "memory.json"), ("--attention", "attention.json")):
            rows = json.loads(self.read(name))
            for i, (path, v) in enumerate(self.swaps(rows[0])):
                out = self.path(f"{name}-{i}.json")
                with open(out, "w") as f:
                    json.dump([with_value(rows[0], path, v)], f)
                jobs.append((["report", flag, out, "--out", out + ".html"],
                             f"report {flag}: {'.'.join(map(str, path))} = {json.dumps(v)[:30]}"))
        lines = self.read("log.jsonl").decode().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith('{"step":'))  # past the run's description
        first = json.loads(lines[at])
        for i, (path, v) in enumerate(self.swaps(first, each=len(EXTREMES))):
            out = self.path(f"log-{i}.jsonl")
            with open(out, "w") as f:
                f.write("\n".join(lines[:at] + [json.dumps(with_value(first, path, v))] + lines[at + 1:]) + "\n")
            jobs.append((["report", "--train", out, "--out", out + ".html"],
                         f"report --train: {'.'.join(map(str, path))} = {json.dumps(v)[:30]}"))
        self.run_all(jobs, 300)

    def test_checkpoint_directories_holding_other_things(self):
        """Each file of the newest checkpoint (and the checkpoint, and --resume's directory) a FIFO, a
        directory, a symlink loop or unreadable."""
        jobs = []
        for target in ("", "state.json", "model.safetensors", "optimizer.safetensors"):
            for kind in ("fifo", "directory", "loop", "mode 000", "file"):
                for alone in (True, False):
                    ck = self.path(f"odd-{target}-{kind}-{alone}")
                    shutil.copytree(self.path("ck"), ck)
                    if alone:
                        shutil.rmtree(os.path.join(ck, "step-00000002"))
                        shutil.rmtree(os.path.join(ck, "step-00000001"))
                    place = os.path.join(ck, "step-00000003", target).rstrip("/")
                    if kind == "mode 000":
                        os.chmod(place, 0)
                        if os.access(place, os.R_OK):  # root reads it all the same
                            continue
                    else:
                        shutil.rmtree(place) if os.path.isdir(place) else os.remove(place)
                        {"fifo": os.mkfifo, "directory": os.mkdir, "loop": lambda p: os.symlink(p, p),
                         "file": lambda p: open(p, "wb").close()}[kind](place)
                    jobs.append((["train", "--resume", ck, "--steps", "4"],
                                 f"--resume with {target or 'the checkpoint'} {kind}{' (alone)' if alone else ''}"))
        os.mkfifo(self.path("resume-fifo"))
        os.symlink(self.path("resume-loop"), self.path("resume-loop"))
        for where in ("resume-fifo", "resume-loop", "tokens.bin", "w.safetensors"):
            jobs.append((["train", "--resume", self.path(where), "--steps", "4"], f"--resume {where}"))
        self.run_all(jobs, 30)

    def test_a_resumed_runs_log_of_other_things(self):
        """--log of a resumed run is read to keep its steps up to the checkpoint's."""
        bodies = [("nested 100,000 deep", b"[" * 100000 + b"]" * 100000 + b"\n"), ("not UTF-8", b"\xff\xfe\n" * 100),
                  ("steps of every kind", b"".join(json.dumps({"step": v, "loss": 1}).encode() + b"\n"
                                                   for v in EXTREMES)),
                  ("one line of 20 MB", b'{"step": 1, "x": "' + b"x" * 20_000_000 + b'"}\n'), ("NUL bytes", b"\0" * 1000)]
        jobs = []
        for i, (name, body) in enumerate(bodies + [("a FIFO", None), ("a directory", None), ("a symlink loop", None)]):
            ck = self.path(f"log-ck{i}")
            shutil.copytree(self.path("ck"), ck)
            log = self.path(f"resumed{i}.jsonl")
            if body is not None:
                with open(log, "wb") as f:
                    f.write(body)
            else:
                {"a FIFO": os.mkfifo, "a directory": os.mkdir, "a symlink loop": lambda p: os.symlink(p, p)}[name](log)
            jobs.append((["train", "--resume", ck, "--steps", "4", "--log", log], f"resumed --log: {name}"))
        self.run_all(jobs, 7)

    def test_names_not_utf8_for_every_reader_and_writer(self):
        bad = os.fsencode(self.path("")) + b"\xff\xfe-"
        for name in ("tokens.bin", "w.safetensors", "bench.json", "memory.json", "attention.json", "log.jsonl"):
            shutil.copy(self.path(name), bad + name.encode())
        shutil.copytree(os.fsencode(self.path("ck")), bad + b"ck")
        b = lambda name: bad + name.encode()
        train = ["train", *MODEL, "--steps", "2"]
        jobs = [([*train, "--data", b("tokens.bin")], "--data"),
                ([*train, "--data", self.tokens, "--val-data", b("tokens.bin")], "--val-data"),
                ([*train, "--data", self.tokens, "--init", b("w.safetensors")], "--init"),
                (["train", "--resume", b("ck"), "--steps", "4"], "--resume"),
                ([*train, "--data", b("tokens.bin"), "--checkpoint-dir", b("ck2"), "--log", b("l.jsonl"), "--save",
                  b("s.st")], "train's outputs"),
                (["bench", *MODEL, "--warmup", "0", "--steps", "1", "--format", "json", "--out", b("b.json")], "bench"),
                (["memory", *MODEL, "--format", "json", "--out", b("m.json"), "--svg", b("m.svg")], "memory")]
        for flag in ("bench", "memory", "attention"):
            jobs.append((["report", f"--{flag}", b(f"{flag}.json"), "--out", b("r.html")], f"report --{flag}"))
        jobs.append((["report", "--train", b("log.jsonl"), "--out", b("r.html")], "report --train"))
        self.run_all(jobs, 10)

    def test_timelines_that_would_run_or_fetch_something_are_refused(self):
        """report inlines a --timeline in its page, which promises no scripts and nothing fetched."""
        svg = self.read("memory.svg").decode()
        head = svg.index(">") + 1
        inserts = ['<SCRIPT>alert(1)</SCRIPT>', '<rect ONCLICK = "alert(1)"/>', '<rect\nonmouseover="alert(1)"/>',
                   '<a XLink:HREF="javascript:alert(1)"><text>a</text></a>', '<image href="http://example.com/a.png"/>',
                   '<rect style="fill:url(http://example.com/#a)"/>', '<style>@import "http://example.com/a.css";</style>',
                   '<iframe src="http://example.com"/>', '<foreignObject><div/></foreignObject>',
                   '<embed src="a.swf"/>', '<object data="a"/>']
        cases = [(i, svg[:head] + text + svg[head:]) for i, text in enumerate(inserts)]
        cases.append((len(inserts), svg.replace("<svg ", '<svg onload="alert(1)" ', 1)))
        failures = []
        for i, body in cases:
            path = self.path(f"timeline{i}.svg")
            with open(path, "w") as f:
                f.write(body)
            argv = ["report", "--timeline", path, "--out", self.path("t.html")]
            failure = failure_of(argv, f"timeline {i}", self.path(""))
            r = subprocess.run([LMSCOPE, *argv], capture_output=True, text=True, timeout=20)
            if failure or r.returncode != 2:
                failures.append(failure or f"timeline {i} not refused: {r.returncode} {r.stderr[-200:]!r}")
        r = subprocess.run([LMSCOPE, "report", "--timeline", self.path("memory.svg"), "--out", self.path("t.html")],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(failures, "\n".join(failures))

    def test_outputs_behind_links(self):
        """A link in a loop is refused in one sentence; a dangling one is written through, as a write does."""
        os.symlink(self.path("out-loop"), self.path("out-loop"))
        os.symlink(self.path("out-target.json"), self.path("out-dangling"))
        bench = ["bench", *MODEL, "--warmup", "0", "--steps", "1", "--format", "json", "--out"]
        r = subprocess.run([LMSCOPE, *bench, self.path("out-loop")], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a symbolic link in a loop of links", r.stderr.strip().splitlines()[-1])
        r = subprocess.run([LMSCOPE, *bench, self.path("out-dangling")], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.isfile(self.path("out-target.json")))


if __name__ == "__main__":
    unittest.main()
