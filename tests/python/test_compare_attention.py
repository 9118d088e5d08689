"""tools/compare_attention.py: the joined table, with and without --ceiling, and its bad inputs
(one sentence on stderr, exit code 2). Inputs are a committed H100 measurement pair."""
import os

from tool_checks import check, check_refusals, run

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "compare_attention.py")
MEASURED = os.path.join(ROOT, "docs", "measurements", "2026-11-23-h100-d73727d", "call7-attn-seeds-d128")
OURS, THEIRS = MEASURED + "-lmscope.csv", MEASURED + "-pytorch.md"


def main():
    plain = run(TOOL, OURS, THEIRS)
    check(plain.returncode == 0, f"plain run exits 0 ({plain.stderr})")
    rows = [line for line in plain.stdout.splitlines() if line.startswith("| flash | sdpa")]
    check(len(rows) == 5, f"five d 128 cells joined, got {len(rows)}")
    check("(of peak)" in plain.stdout and "of 800" not in plain.stdout, "no ceiling column without --ceiling")
    # seq 16384: lmscope 3.686 ms against SDPA's 3.994 in that call, 522.1 TFLOP/s.
    last = rows[-1]
    check("| 16384 | 128 |" in last and "| 1.08x |" in last, f"ratio of the 16384 cell: {last}")

    with_ceiling = run(TOOL, OURS, THEIRS, "--ceiling", "800")
    check(with_ceiling.returncode == 0, "run with --ceiling exits 0")
    check("(of peak / of 800)" in with_ceiling.stdout, "header names the ceiling")
    check("522.1 (53% / 65%)" in with_ceiling.stdout, "shares of the 989 peak and of the 800 ceiling")

    check_refusals(TOOL, (
        ([OURS, THEIRS, "--ceiling", "0"], "positive"),
        ([OURS, THEIRS, "--ceiling", "-5"], "positive"),
        ([OURS, THEIRS, "--ceiling", "inf"], "positive"),
        ([OURS, THEIRS, "--ceiling", "fast"], "TFLOP/s figure"),
        ([OURS, THEIRS, "--ceiling"], "TFLOP/s figure"),
        ([], "give lmscope's .csv"),
        ([OURS, "missing.md"], "no such file"),
    ))
    print("compare_attention.py: ok")


if __name__ == "__main__":
    main()
