"""tools/ab_table.py: the table of an A/B run from committed H100 measurements (two rounds of five
cells, base and new), and its bad inputs; and scripts/gpu_check.sh --ab's arguments, refused before
anything is built (one sentence on stderr, exit code 2, nothing on stdout), so this runs without a GPU."""
import os
import shutil
import subprocess
import tempfile

from tool_checks import check, check_refusals, run

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "ab_table.py")
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")
MEASURED = os.path.join(ROOT, "docs", "measurements", "2026-11-27-h100-4b243ef-rmsnorm-dx-dw", "capped")


def main():
    full = run(TOOL, MEASURED)
    check(full.returncode == 0, f"exits 0 ({full.stderr})")
    rows = [line for line in full.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    check([r.split("|")[1].strip() for r in rows] == ["small", "medium", "large", "xl", "2.7B"],
          f"the presets smallest first: {rows}")
    large = [c.strip() for c in rows[2].strip("|").split("|")]
    # base 66.86, 66.86 and new 65.87, 65.91 (step medians); means 66.86 and 65.89.
    check(large[2:4] == ["66.86, 66.86", "65.87, 65.91"], f"each round's step median: {large}")
    check(large[-1] == "0.985", f"65.89 / 66.86: {large}")

    with tempfile.TemporaryDirectory() as one_sided:
        for r in (1, 2):
            shutil.copy(os.path.join(MEASURED, f"base-small-1024-{r}.json"), one_sided)
        alone = run(TOOL, one_sided)
        check(alone.returncode == 0, f"exits 0 with one side ({alone.stderr})")
        last = [c.strip() for c in alone.stdout.splitlines()[-1].strip("|").split("|")]
        check(last[3] == "-" and last[-1] == "-", f"a side without runs shows '-': {last}")
        with open(os.path.join(one_sided, "new-small-1024-1.json"), "w") as f:
            f.write("{}")
        check_refusals(TOOL, (([one_sided], "is not lmscope bench's JSON"),))

    check_refusals(TOOL, (
        ([], "give the directory"),
        ([os.path.join(MEASURED, "missing")], "no such directory"),
        ([os.path.join(ROOT, "tools")], "holds no base-MODEL-CTX-ROUND.json"),
    ))

    for args, said in (
        (["--ab", "a", "b"], "--ab takes BASE NEW CELLS [ROUNDS]"),
        (["--ab", "a", "b", "small@256", "0"], "--ab: ROUNDS must be a whole number from 1, not '0'"),
        (["--ab", "a", "b", "small@256,large"], "--ab: a cell is MODEL@CTX, not 'large'"),
    ):
        bad = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)
        check(bad.returncode == 2 and bad.stderr.strip() == f"gpu_check.sh: {said}" and bad.stdout == "",
              f"{args}: refused with '{said}', got {bad.returncode} {bad.stderr!r} {bad.stdout!r}")
    print("ab_table.py and gpu_check.sh --ab: ok")


if __name__ == "__main__":
    main()
