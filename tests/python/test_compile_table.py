"""tools/compile_table.py: the seeds' compile table from committed H200 measurements (every column in
one call; a call whose torch.compile sweep ran out of time), and its bad inputs (one sentence on
stderr, exit code 2)."""
import os

from tool_checks import check, check_refusals, run

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "compile_table.py")
MEASURED = os.path.join(ROOT, "docs", "measurements", "2026-11-26-h200-bb92617", "compile-train-")


def files(call, compiles):
    return [MEASURED + call + "-lmscope.csv"] + [MEASURED + f"{call}-{c}-pytorch.md" for c in compiles]


def main():
    full = run(TOOL, *files("d", ["default", "max-autotune"]))  # that call's eager file did not come back
    check(full.returncode == 0, f"exits 0 ({full.stderr})")
    check("| torch.compile | max-autotune |" in full.stdout and "PyTorch eager" not in full.stdout,
          "a column for each PyTorch mode given")
    rows = [line for line in full.stdout.splitlines() if line.startswith("| small | 256 |")]
    check(len(rows) == 1, f"one small ctx 256 row, got {rows}")
    # lmscope's four builds, then torch.compile 13.43 and max-autotune 9.51; the faster over lmscope's 4.75.
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    check(cells[2:6] == ["6.26", "5.37", "5.51", "4.75"], f"lmscope's four builds in order: {cells}")
    check(cells[-1] == "2.00x", f"9.51 / 4.75: {cells[-1]}")
    check("over the 1 cells with torch.compile's times: 2.00x" in full.stdout, "the geometric mean")

    partial = run(TOOL, *files("b", ["none", "default"]))
    check(partial.returncode == 0, f"exits 0 ({partial.stderr})")
    xl128 = next(line for line in partial.stdout.splitlines() if line.startswith("| xl | 128 |"))
    check(xl128.endswith("| 1.63x |"), f"64.60 / 39.65: {xl128}")
    later = [line for line in partial.stdout.splitlines() if line.startswith("| 2.7B |")]
    check(len(later) == 4 and all(line.endswith("x* |") for line in later), f"starred without a compile time: {later}")
    check("over the 1 cells with PyTorch eager's and torch.compile's times" in partial.stdout, "the mean over the cells with a torch.compile time only")

    # Four H200 groups' forward sweep: max-autotune timed one cell only, torch.compile thirteen.
    forward = os.path.join(ROOT, "docs", "measurements", "2026-11-26-h200x4-d0cdac4-compile", "forward")
    fwd = run(TOOL, os.path.join(forward, "lmscope-compile-forward.csv"),
              *[os.path.join(forward, f"pytorch-compile-forward-{c}.md") for c in ["none", "default", "max-autotune"]])
    check(fwd.returncode == 0, f"exits 0 ({fwd.stderr})")
    small128 = next(line for line in fwd.stdout.splitlines() if line.startswith("| small | 128 |"))
    check(small128.endswith("| 2.04 | 2.61x |"), f"max-autotune's 2.04 / 0.78: {small128}")
    check("over the 13 cells with PyTorch eager's and torch.compile's times" in fwd.stdout, "a cell without max-autotune's time still counts")

    check_refusals(TOOL, (
        ([], "give lmscope's .csv"),
        ([MEASURED + "d-default-pytorch.md"], "give lmscope's .csv"),
        ([MEASURED + "d-lmscope.csv", "missing.md"], "no such file"),
        ([MEASURED + "z-lmscope.csv"], "no such file"),
    ))
    print("compile_table.py: ok")


if __name__ == "__main__":
    main()
