"""Every flag of every command at bad values: each subcommand's options that take a value are read
from its --help (so a flag added later is swept too), and each is given, one at a time in a small valid
command, an empty value, -1, 0, whole numbers past 64 bits, 1e308, nan, inf and bytes that are not
UTF-8. Each case ends by itself within 20 s (60 under ASan) with exit 0, 1 (the machine's failure) or 2, a failure in
one "lmscope: error: ..." sentence on the last line of stderr, and never a signal, an abort or a
library's text. Failures are collected and shown together. Under LMSCOPE_SANITIZED (CI's ASan pass) a
fixed rotation of two values a flag runs, and for a CUDA build one of three: each of its processes loads
the CUDA libraries as it starts (0.4 s and more where a CPU build takes 0.02; the whole sweep outran 10
minutes on CI's two cores). Run by ctest with LMSCOPE pointing at the built program."""
import concurrent.futures
import os
import re
import subprocess
import tempfile
import unittest

from cli_support import FilesTest, failure_of, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
SANITIZED = os.environ.get("LMSCOPE_SANITIZED") == "1"
CUDA_BUILD = "libcudart" in subprocess.run(["ldd", LMSCOPE], capture_output=True, text=True).stdout
# Values a flag: all of them, or a rotation through them of this many.
ROTATION = 2 if SANITIZED else 3 if CUDA_BUILD else 0
LIMIT = 60 if SANITIZED else 20  # seconds a case may take (ASan's plan of one cell took over 20)
VALUES = ["", "-1", "0", "99999999999999999999", "9223372036854775808", "1e308", "nan", "inf", b"\xff\xfe"]
MODEL = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab", "300"]
# Flags left out: --help, and launch's --nproc past the cores (refused) is swept like the rest.
SKIPPED = {"--help"}
# One OpenMP thread a case: two cases at a time with two threads each spun on a shared two-core machine,
# a 30 ms train case taking over a second.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def options(command):
    """The options of `lmscope command` that take a value, as its --help lists them."""
    text = subprocess.run([LMSCOPE, *command, "--help"], capture_output=True, text=True, timeout=20).stdout
    found = []
    for line in text.splitlines():
        # CLI11 puts the type one space after the name and the description after two or more: launch's
        # "--oversubscribe   CPU ranks: ..." takes no value.
        m = re.match(r"^\s+(?:-\w,)?(--[\w-]+)(?:,[^ ]+)? ([A-Z]+)\b", line)
        if m and m.group(1) not in SKIPPED:
            found.append(m.group(1))
    return found


def replaced(base, flag, value):
    """`base` with `flag` given `value` (replacing the base's own value of it, if any)."""
    args = list(base)
    if flag in args:
        i = args.index(flag)
        del args[i:i + 2]
    if "--" in args:  # launch: the flag before the rank command
        i = args.index("--")
        return args[:i] + [flag, value] + args[i:]
    return args + [flag, value]


class FlagSweep(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        data = write_tokens(cls.path("tokens.bin"), 4000, vocab=300)
        rows = cls.path("bench.json")
        subprocess.run([LMSCOPE, "bench", *MODEL, "--ctx", "16", "--batch", "2", "--warmup", "0", "--steps", "1",
                        "--format", "json", "--out", rows], capture_output=True, timeout=60, check=True)
        shape = MODEL[2:]
        cls.bases = {
            "info": ["info", *shape],
            "train": ["train", *MODEL, "--ctx", "16", "--batch", "2", "--data", data, "--steps", "1"],
            "bench": ["bench", *MODEL, "--ctx", "16", "--batch", "2", "--warmup", "0", "--steps", "1"],
            "attention": ["attention", "--device", "cpu", "--seq", "32", "--d", "16", "--iters", "1", "--warmup", "0"],
            "memory": ["memory", *MODEL, "--ctx", "16", "--batch", "2"],
            "plan": ["plan", "--model", "small", "--ctx", "128", "--precision", "bf16", "--attention", "flash"],
            "precision": ["precision", "--study", "dtypes", *shape, "--ctx", "16", "--batch", "2", "--count", "10"],
            "report": ["report", "--bench", rows, "--out", cls.path("report.html")],
            "allreduce": ["allreduce", "--device", "cpu", "--sizes", "10KB", "--iters", "1", "--warmup", "0"],
            "launch": ["launch", "--nproc", "1", "--", "info", "--model", "small"],
        }

    @staticmethod
    def run_case(base, flag, value):
        # A directory a case: in a shared one, --val-data -1 read the file that another case's --log -1
        # was writing.
        with tempfile.TemporaryDirectory() as cwd:
            argv = replaced(base, flag, value)
            return failure_of(argv, repr(argv), cwd=cwd, timeout=LIMIT, env=ENV)

    def test_every_flag_at_bad_values_ends_in_one_sentence(self):
        cases = []
        for name, base in self.bases.items():
            flags = options([name])
            # A --help whose layout the pattern no longer reads would sweep nothing, silently.
            self.assertTrue(flags, f"no options read from `lmscope {name} --help`")
            for i, flag in enumerate(flags):
                values = VALUES
                if ROTATION:  # a few values a flag, turning through the list
                    values = [VALUES[(i * ROTATION + k) % len(VALUES)] for k in range(ROTATION)]
                cases += [(base, flag, v) for v in values]
        self.assertGreater(len(cases), 300 if not ROTATION else 40 * ROTATION)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            failures = [f for f in pool.map(lambda c: self.run_case(*c), cases) if f]
        self.assertFalse(failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:40]))


if __name__ == "__main__":
    unittest.main()
