"""tools/compare_grid.py: a committed H100 grid joined with its PyTorch rows, lmscope's variants of a
cell told apart in the mode column (transient copies, bf16 gradients), and its bad inputs (one
sentence on stderr, exit code 2)."""
import os
import tempfile

from tool_checks import check, check_refusals, run

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "compare_grid.py")
MEASURED = os.path.join(ROOT, "docs", "measurements", "2026-11-22-h100-5c4becf", "bf16-grid-")
HEADER = "model,precision,mode,attention,ctx,step_mean_ms,peak_bytes,mfu,status,weight_copies,grad_dtype\n"
PYTORCH = """| framework | model | device | precision | mode | attention | optimizer | batch | ctx | step ms | peak GiB | status |
|---|---|---|---|---|---|---|---:|---:|---:|---:|---|
| PyTorch 2.11 | xl | cuda | bf16 | train | sdpa | fused | 4 | 512 | 150.00 ± 1.00 | 40.0 | ok |
| PyTorch 2.11 | 2.7B | cuda | bf16 | train | sdpa | fused | 4 | 512 | - | - | OOM |
"""


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def main():
    grid = run(TOOL, MEASURED + "lmscope.csv", MEASURED + "pytorch.md")
    check(grid.returncode == 0, f"exits 0 ({grid.stderr})")
    rows = [cells(line) for line in grid.stdout.splitlines()[2:]]
    check(len(rows) > 10 and all(len(r) == 9 for r in rows), f"one row of 9 cells per lmscope cell: {rows[:2]}")
    # The file's small naive forward at ctx 128: lmscope 1.8678 ms, PyTorch 20.76.
    first = rows[0]
    check(first[:5] == ["small", "bf16", "forward", "naive vs naive", "128"], f"the first cell: {first}")
    check(first[-1] == f"{20.76 / 1.8678:.2f}x", f"20.76 / 1.8678: {first[-1]}")

    with tempfile.TemporaryDirectory() as d:
        ours = os.path.join(d, "lmscope.csv")
        with open(ours, "w") as f:
            f.write(HEADER)
            f.write("xl,bf16,train,flash,512,100.0,10737418240,0.4,ok,kept,fp32\n")
            f.write("xl,bf16,train,flash,512,75.0,10737418240,0.4,ok,transient,bf16\n")
            f.write("2.7B,bf16,train,flash,512,120.0,21474836480,0.4,ok,kept,bf16\n")
        theirs = os.path.join(d, "pytorch.md")
        with open(theirs, "w") as f:
            f.write(PYTORCH)
        out = run(TOOL, ours, theirs)
        check(out.returncode == 0, f"exits 0 ({out.stderr})")
        rows = [cells(line) for line in out.stdout.splitlines()[2:]]
        check([r[2] for r in rows] == ["train", "train, transient copies, bf16 gradients", "train, bf16 gradients"],
              f"the variants in the mode column: {[r[2] for r in rows]}")
        check([r[-1] for r in rows] == ["1.50x", "2.00x", "lmscope only"], f"each against the one PyTorch row: {rows}")
        check(rows[0][3] == "flash vs sdpa" and rows[0][5] == "100.0 [10.0]", f"attention and ms [GiB]: {rows[0]}")

        check_refusals(TOOL, (
            ([], "give lmscope's .csv"),
            ([theirs], "give lmscope's .csv"),
            ([ours, os.path.join(d, "missing.md")], "no such file"),
            ([theirs.replace("pytorch.md", "x.csv")], "no such file"),
        ))
        empty = os.path.join(d, "empty.csv")
        with open(empty, "w") as f:
            f.write("model,ctx\nsmall,128\n")
        check_refusals(TOOL, (([empty, theirs], "no lmscope bench rows"),))
    print("compare_grid.py: ok")


if __name__ == "__main__":
    main()
