"""Every flag of every command at bad values: each subcommand's options that take a value are read
from its --help (so a flag added later is swept too), and each is given, one at a time in a small valid
command, an empty value, -1, 0, whole numbers past 64 bits, 1e308, nan, inf and bytes that are not
UTF-8. Each case ends by itself within 20 s with exit 0, 1 (the machine's failure) or 2, a failure in
one "lmscope: error: ..." sentence on the last line of stderr, and never a signal, an abort or a
library's text. Failures are collected and shown together. Under LMSCOPE_SANITIZED (CI's ASan pass) a
fixed rotation of two values a flag runs. Run by ctest with LMSCOPE pointing at the built program."""
import concurrent.futures
import os
import re
import subprocess
import tempfile
import unittest

from cli_support import FOREIGN, FilesTest, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
SANITIZED = os.environ.get("LMSCOPE_SANITIZED") == "1"
VALUES = ["", "-1", "0", "99999999999999999999", "9223372036854775808", "1e308", "nan", "inf", b"\xff\xfe"]
MODEL = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab", "300"]
# Flags left out: --help, and launch's --nproc past the cores (refused) is swept like the rest.
SKIPPED = {"--help"}


def options(command):
    """The options of `lmscope command` that take a value, as its --help lists them."""
    text = subprocess.run([LMSCOPE, *command, "--help"], capture_output=True, text=True, timeout=20).stdout
    found = []
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-\w,)?(--[\w-]+)(?:,[^ ]+)?\s+(TEXT|INT|UINT|FLOAT|ENUM|[A-Z]+)\b", line)
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
            "plan": ["plan", "--model", "small", "--ctx", "128"],
            "precision": ["precision", "--study", "dtypes", *shape, "--ctx", "16", "--batch", "2", "--count", "10"],
            "report": ["report", "--bench", rows, "--out", cls.path("report.html")],
            "allreduce": ["allreduce", "--device", "cpu", "--sizes", "10KB", "--iters", "1", "--warmup", "0"],
            "launch": ["launch", "--nproc", "1", "--", "info", "--model", "small"],
        }

    def run_case(self, base, flag, value, cwd):
        argv = [LMSCOPE, *replaced(base, flag, value)]
        try:
            p = subprocess.run(argv, capture_output=True, timeout=20, cwd=cwd)
        except subprocess.TimeoutExpired:
            return f"{argv[1:]!r}: still running after 20 s"
        out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        why = None
        if p.returncode not in (0, 1, 2):
            why = f"exit {p.returncode}"
        elif any(word in out + err for word in FOREIGN):
            why = "foreign text"
        elif p.returncode != 0:
            lines = err.strip().splitlines()
            if not lines or not re.match(r"^lmscope: (rank \d+: )?error: ", lines[-1]) or \
                    sum("error: " in line for line in lines) != 1:
                why = "not one sentence"
        return None if why is None else f"{argv[1:]!r}: {why}\n    stderr: {err[-400:]!r}"

    def test_every_flag_at_bad_values_ends_in_one_sentence(self):
        cases = []
        for name, base in self.bases.items():
            for i, flag in enumerate(options([name])):
                values = VALUES
                if SANITIZED:  # two values a flag, turning through the list
                    values = [VALUES[(i * 2) % len(VALUES)], VALUES[(i * 2 + 1) % len(VALUES)]]
                cases += [(base, flag, v) for v in values]
        self.assertGreater(len(cases), 300 if not SANITIZED else 80)
        with tempfile.TemporaryDirectory() as cwd, concurrent.futures.ThreadPoolExecutor(2) as pool:
            failures = [f for f in pool.map(lambda c: self.run_case(*c, cwd), cases) if f]
        self.assertFalse(failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:40]))


if __name__ == "__main__":
    unittest.main()
