"""The seeds' "vanilla vs compiled" question as one table per mode: lmscope's four builds of a step
(fusion off/on x device graphs off/on, from one `lmscope bench --fusion on,off --graphs on,off
--format csv`) beside PyTorch eager, torch.compile and torch.compile(mode="max-autotune")
(pytorch/bench_reference.py --compile none|default|max-autotune), measured in the same run. Median
step times in ms; the last column is the fastest PyTorch over lmscope with both on (> 1: lmscope is
faster), starred where a PyTorch column of the cell has no time (then it is against those that
have), and a last row their geometric mean over the cells with a time in each column given but
max-autotune's, which counts where it has one (its compilations take so long that a sweep rarely
covers every cell, and a missing one can only flatter lmscope, never the reverse).

  python3 tools/compile_table.py lmscope.csv pytorch-eager.md pytorch-compile.md [pytorch-max-autotune.md]
"""
import math
import sys

from result_tables import fail, read_inputs, require_inputs

VARIANTS = [("off", "off"), ("on", "off"), ("off", "on"), ("on", "on")]  # (fusion, graphs)
PYTORCH = ["none", "default", "max-autotune"]
PYTORCH_NAMES = {"none": "PyTorch eager", "default": "torch.compile", "max-autotune": "max-autotune"}


def pytorch_ms(row):
    """A PyTorch row's step time: its median where printed, else its mean (the rows print mean ± std)."""
    if row["status"] != "ok":
        return None
    return float(row.get("step median ms", row["step ms"]).split("±")[0])


def main(paths):
    require_inputs(paths, "give lmscope's .csv (bench --fusion on,off --graphs on,off --format csv) and PyTorch's "
                          "Markdown")
    lm, pt = read_inputs(paths)
    if not lm or any("fusion" not in r or "graphs" not in r for r in lm):
        fail("the .csv has no rows with fusion and graphs columns (an lmscope bench CSV)")
    ours = {(r["mode"], r["model"], int(r["ctx"]), r["fusion"], r["graphs"]): r for r in lm}
    theirs = {(r["mode"], r["model"], int(r["ctx"]), r.get("compile", "none")): r for r in pt}
    compiles = [c for c in PYTORCH if any(k[3] == c for k in theirs)]
    cells = []
    for r in lm:
        cell = (r["mode"], r["model"], int(r["ctx"]))
        if cell not in cells:
            cells.append(cell)
    for mode in dict.fromkeys(c[0] for c in cells):
        print(f"\n### {mode}, {lm[0]['precision']}, batch {lm[0]['batch']} (median ms)\n")
        head = [f"lmscope fusion {f}, graphs {g}" for f, g in VARIANTS] + [PYTORCH_NAMES[c] for c in compiles]
        print("| model | ctx | " + " | ".join(head) + " | best PyTorch / lmscope |")
        print("|---|---:|" + "---:|" * (len(head) + 1))
        ratios, starred = [], False
        for _, model, ctx in (c for c in cells if c[0] == mode):
            row = []
            for f, g in VARIANTS:
                r = ours.get((mode, model, ctx, f, g))
                row.append(f"{float(r['step_median_ms']):.2f}" if r and r["status"] == "ok" else
                           (r["status"] if r else "-"))
            best, complete, counted = None, True, True
            for c in compiles:
                p = theirs.get((mode, model, ctx, c))
                t = pytorch_ms(p) if p else None
                row.append(f"{t:.2f}" if t is not None else (p["status"] if p else "-"))
                if t is not None:
                    best = t if best is None else min(best, t)
                else:
                    complete = False
                    counted &= c == "max-autotune"
            mine = ours.get((mode, model, ctx, "on", "on"))
            if best is not None and mine and mine["status"] == "ok":
                ratio = best / float(mine["step_median_ms"])
                if counted:
                    ratios.append(ratio)
                starred |= not complete
                row.append(f"{ratio:.2f}x" + ("" if complete else "*"))
            else:
                row.append("-")
            print(f"| {model} | {ctx} | " + " | ".join(row) + " |")
        if starred:
            print("\n*: a PyTorch column of this cell has no time; the ratio is against the columns that have one.")
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            needed = " and ".join(f"{PYTORCH_NAMES[c]}'s" for c in compiles if c != "max-autotune") or "max-autotune's"
            print(f"\nGeometric mean of best PyTorch / lmscope (fusion and graphs on) over the {len(ratios)} "
                  f"cells with {needed} times: {geo:.2f}x; lmscope faster in {sum(x > 1 for x in ratios)} of them.")


if __name__ == "__main__":
    main(sys.argv[1:])
