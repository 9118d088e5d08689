"""What the tests of the tools/ scripts share: running a script, failing with what was expected, and
checking that bad inputs end in one sentence on stderr, exit code 2 and nothing on stdout."""
import subprocess
import sys


def run(tool, *args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}")
        sys.exit(1)


def check_refusals(tool, cases):
    """cases: (arguments, words the one sentence must hold) pairs."""
    for args, said in cases:
        bad = run(tool, *args)
        lines = bad.stderr.strip().splitlines()
        check(bad.returncode == 2, f"{args}: exit code 2, got {bad.returncode}")
        check(len(lines) == 1 and said in lines[0], f"{args}: one sentence saying '{said}', got {bad.stderr!r}")
        check(bad.stdout == "", f"{args}: nothing on stdout")
