"""Every reader given damaged and hostile files: token data (.bin and .npy, --data and --val-data),
weights (--init), checkpoints (--resume: state.json, the weights and AdamW's state), and report's
inputs (bench, memory and attention rows, train logs, memory timelines). Each starts from a valid file
lmscope wrote and is damaged (emptied, cut at several places, overwritten with seeded random bytes,
bytes flipped, garbage in front) or replaced by hostile content (JSON of the wrong kind, nested 100,000
deep, a 20 MB string, non-UTF-8 bytes, a directory, a FIFO, a symlink loop, mode 000 where not root).
Each case ends by itself within 20 s with exit 0, 1 or 2, a failure in one "lmscope: error: ..."
sentence, never a signal, an abort or a library's text; a damaged newest checkpoint beside an intact
older one is passed over with a warning. Failures are collected and shown together. Files whose
insides lie while they still parse are in test_crafted_files.py. Run by ctest with LMSCOPE pointing at
the built program."""
import concurrent.futures
import glob
import os
import random
import shutil
import subprocess
import unittest

from cli_support import FilesTest, failure_of, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
SANITIZED = os.environ.get("LMSCOPE_SANITIZED") == "1"
MODEL = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab", "300",
         "--ctx", "16", "--batch", "2"]


def damaged(data, rng):
    """(name, bytes) of the ways a file is damaged here."""
    n = len(data)
    out = [("empty", b"")]
    for cut in sorted({1, 8, 9, n // 3, n // 2, n - 1}):
        if 0 < cut < n and data[cut:].strip():  # not only trailing white space (the same document)
            out.append((f"cut at {cut}", data[:cut]))
    out.append(("random bytes", bytes(rng.randrange(256) for _ in range(min(n, 4096)))))
    flipped = bytearray(data)
    for _ in range(16):
        i = rng.randrange(n)
        flipped[i] ^= 1 << rng.randrange(8)
    out.append(("16 bits flipped", bytes(flipped)))
    out.append(("garbage in front", b"\x00\xff garbage \xfe" + data))
    out.append(("not UTF-8", b"\xff\xfe\xfd" * 64))
    return out


def hostile_json():
    return [("JSON of another kind: " + k, k.encode()) for k in ("{}", "[]", '"x"', "1", "null", '{"rows": 1}')] + [
        ("JSON nested 100,000 deep", b"[" * 100000 + b"]" * 100000),
        ("a 20 MB JSON string", b'["' + b"x" * 20_000_000 + b'"]'),
        ("JSON with NaN", b'[{"ms": NaN, "model": Infinity}]'),
    ]


class HostileFiles(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rng = random.Random(57)
        d = cls.path("")
        cls.tokens = write_tokens(cls.path("tokens.bin"), 4000, vocab=300)
        cls.npy_tokens = cls.path("tokens.npy")
        import numpy as np
        np.save(cls.npy_tokens, np.fromfile(cls.tokens, dtype=np.uint16))
        run = lambda *a: subprocess.run([LMSCOPE, *a], capture_output=True, timeout=120, check=True, cwd=d)
        run("train", *MODEL, "--data", cls.tokens, "--steps", "3", "--save", cls.path("w.safetensors"), "--log",
            cls.path("log.jsonl"), "--checkpoint-dir", cls.path("ck"), "--save-every", "1")
        run("bench", *MODEL, "--warmup", "0", "--steps", "1", "--format", "json", "--out", cls.path("bench.json"))
        run("memory", *MODEL, "--format", "json", "--out", cls.path("memory.json"), "--svg", cls.path("memory.svg"))
        run("attention", "--device", "cpu", "--seq", "32", "--d", "16", "--iters", "1", "--warmup", "0", "--format",
            "json", "--out", cls.path("attention.json"))
        os.mkfifo(cls.path("fifo"))
        os.symlink(cls.path("loop"), cls.path("loop"))
        shutil.copy(cls.tokens, cls.path("unreadable"))
        os.chmod(cls.path("unreadable"), 0)
        cls.specials = ["fifo", "loop", ""] + ([] if os.access(cls.path("unreadable"), os.R_OK) else ["unreadable"])

    def check(self, argv, case, cwd):
        return failure_of(argv, case, cwd)

    def cases(self):
        """(name, the file to write or None, its bytes, the command reading it)."""
        train = ["train", *MODEL, "--steps", "4"]
        readers = [  # (what, the valid file, command with {} for the file, JSON?)
            ("--data .bin", self.tokens, train + ["--data", "{}"], False),
            ("--data .npy", self.npy_tokens, train + ["--data", "{}"], False),
            ("--val-data", self.tokens, train + ["--data", self.tokens, "--val-data", "{}", "--eval-every", "2"], False),
            ("--init", self.path("w.safetensors"), train + ["--data", self.tokens, "--init", "{}"], False),
            ("report --bench", self.path("bench.json"), ["report", "--bench", "{}", "--out", "r.html"], True),
            ("report --memory", self.path("memory.json"), ["report", "--memory", "{}", "--out", "r.html"], True),
            ("report --attention", self.path("attention.json"), ["report", "--attention", "{}", "--out", "r.html"],
             True),
            ("report --train", self.path("log.jsonl"), ["report", "--train", "{}", "--out", "r.html"], True),
            ("report --timeline", self.path("memory.svg"), ["report", "--bench", self.path("bench.json"),
                                                             "--timeline", "{}", "--out", "r.html"], False),
        ]
        out = []
        for what, valid, command, is_json in readers:
            with open(valid, "rb") as f:
                data = f.read()
            ext = os.path.splitext(valid)[1]
            kinds = damaged(data, self.rng) + (hostile_json() if is_json else [])
            if SANITIZED:
                kinds = kinds[::3]
            for name, body in kinds:
                out.append((f"{what}: {name}", ext, body, command))
            for special in self.specials:  # a FIFO, a symlink loop, a directory, mode 000 (unless root)
                out.append((f"{what}: {special or 'a directory'}", None, self.path(special), command))
        return out

    def test_every_reader_takes_damaged_and_hostile_files_in_one_sentence(self):
        work = self.path("work")
        os.makedirs(work)
        jobs = []
        for i, (case, ext, body, command) in enumerate(self.cases()):
            if ext is None:
                path = body
            else:
                path = os.path.join(work, f"case{i}{ext}")
                with open(path, "wb") as f:
                    f.write(body)
            jobs.append(([a.replace("{}", path) for a in command], case))
        self.assertGreater(len(jobs), 40 if SANITIZED else 120)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            failures = [f for f in pool.map(lambda j: self.check(*j, work), jobs) if f]
        self.assertFalse(failures, f"{len(failures)} of {len(jobs)} cases:\n" + "\n".join(failures[:40]))

    def test_every_checkpoint_file_damaged_is_passed_over_or_said(self):
        files = sorted(glob.glob(self.path("ck/step-00000003/*")))
        self.assertGreaterEqual(len(files), 3)
        failures = []
        for target in files:
            with open(target, "rb") as f:
                data = f.read()
            kinds = damaged(data, self.rng) + (hostile_json() if target.endswith(".json") else [])
            for name, body in kinds[::3] if SANITIZED else kinds:
                for alone in (False, True):
                    ck = self.path("ck-case")

                    def prepare():  # the checkpoints, the newest damaged (a run adds its own)
                        shutil.rmtree(ck, ignore_errors=True)
                        shutil.copytree(self.path("ck"), ck)
                        if alone:  # no older checkpoint to fall back on
                            for old in ("step-00000001", "step-00000002"):
                                shutil.rmtree(os.path.join(ck, old))
                        with open(os.path.join(ck, "step-00000003", os.path.basename(target)), "wb") as f:
                            f.write(body)

                    prepare()
                    case = f"{os.path.basename(target)}: {name}{' (the only checkpoint)' if alone else ''}"
                    argv = ["train", "--resume", ck, "--steps", "4"]
                    failure = self.check(argv, case, self.path(""))
                    if failure is None and not alone:  # on from step 2, saying why not from step 3
                        prepare()
                        r = subprocess.run([LMSCOPE, *argv], capture_output=True, text=True, timeout=20)
                        if r.returncode != 0 or "resumed at step 2 from" not in r.stdout or \
                                "lmscope: warning: passed over" not in r.stderr:
                            failure = f"{case}: not passed over with a warning\n    {r.stdout[-300:]!r} {r.stderr[-300:]!r}"
                    if failure:
                        failures.append(failure)
        self.assertFalse(failures, f"{len(failures)} cases:\n" + "\n".join(failures[:40]))


    # Files of terabytes (sparse: no disk is used) were allocated and read whole: report said "the
    # host's memory cannot hold what this run asked for" without the file, and a 4 TiB state.json grew
    # a buffer until the kernel killed lmscope, as did a resumed run's --log. They are refused by their
    # size, naming the file. (A token file of 4 TiB is read through as data would be: minutes, not here.)
    def test_files_of_terabytes_are_refused_by_their_size(self):
        huge = self.path("huge")
        os.makedirs(huge)

        def sparse(name):
            path = os.path.join(huge, name)
            with open(path, "wb") as f:
                f.truncate(1 << 42)
            return path

        train = ["train", *MODEL, "--steps", "1"]
        failures = []
        cases = [(["report", "--bench", sparse("b.json"), "--out", "r.html"], "the bench results"),
                 (["report", "--memory", sparse("m.json"), "--out", "r.html"], "the memory results"),
                 (["report", "--attention", sparse("a.json"), "--out", "r.html"], "the attention results"),
                 (["report", "--train", sparse("log.jsonl"), "--out", "r.html"], "the training log"),
                 (["report", "--bench", self.path("bench.json"), "--timeline", sparse("t.svg"), "--out", "r.html"],
                  "the timeline"),
                 (train + ["--data", self.tokens, "--init", sparse("w.safetensors")], None),
                 (["train", "--resume", self.path("ck-log"), "--steps", "4", "--log", sparse("resumed.jsonl")],
                  "the log file to go on with")]
        shutil.copytree(self.path("ck"), self.path("ck-log"))  # (refused before its first step)
        for argv, what in cases:
            case = f"{argv[:2]} of 4 TiB"
            failure = self.check(argv, case, huge)
            if failure is None and what is not None:  # refused by its size, naming it
                r = subprocess.run([LMSCOPE, *argv], capture_output=True, text=True, timeout=20, cwd=huge)
                if r.returncode != 2 or f"{what} '" not in r.stderr or "holds 4398046511104 bytes" not in r.stderr:
                    failure = f"{case}: not refused by its size\n    {r.stderr[-300:]!r}"
            if failure:
                failures.append(failure)
        for alone in (False, True):  # state.json of 4 TiB: passed over beside older checkpoints, else said
            ck = self.path("ck-huge")

            def prepare():  # (a run that goes on writes checkpoints of its own)
                shutil.rmtree(ck, ignore_errors=True)
                shutil.copytree(self.path("ck"), ck)
                if alone:
                    for old in ("step-00000001", "step-00000002"):
                        shutil.rmtree(os.path.join(ck, old))
                os.truncate(os.path.join(ck, "step-00000003", "state.json"), 1 << 42)

            prepare()
            argv = ["train", "--resume", ck, "--steps", "4"]
            case = f"state.json of 4 TiB{' (the only checkpoint)' if alone else ''}"
            failure = self.check(argv, case, self.path(""))
            if failure is None:
                prepare()
                r = subprocess.run([LMSCOPE, *argv], capture_output=True, text=True, timeout=20)
                said = "state.json holds 4398046511104 bytes" in r.stderr
                if not said or (r.returncode != 2 if alone else "lmscope: warning: passed over" not in r.stderr):
                    failure = f"{case}: exit {r.returncode}\n    {r.stderr[-300:]!r}"
            if failure:
                failures.append(failure)
        self.assertFalse(failures, f"{len(failures)} cases:\n" + "\n".join(failures))


if __name__ == "__main__":
    unittest.main()
