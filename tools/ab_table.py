"""The table of an A/B run (scripts/gpu_check.sh --ab): two builds or settings, one process a cell,
alternating, for some rounds. Reads DIR/SIDE-MODEL-CTX-ROUND.json (SIDE base or new, lmscope bench's
JSON) and prints, for each cell, each side's step medians by round, the means of their phase medians,
and new over base for the step: a cell's rounds show the spread that a ratio must stand out from.

    ab_table.py DIR
"""
import glob
import json
import os
import re
import statistics
import sys

from result_tables import fail

NAME = re.compile(r"^(base|new)-(.+)-(\d+)-(\d+)\.json$")
PHASES = ("forward", "backward", "optimizer", "step")
PRESETS = ("small", "medium", "large", "xl", "2.7B")  # MODEL.md's, smallest first; others after them


def read(directory):
    """{(model, ctx): {side: [(round, {phase: median ms} or a status), ...]}}."""
    cells = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        side, model, ctx, rnd = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        try:
            with open(path) as f:
                rows = json.load(f)
            row = rows[0]
            ms = row.get("ms") or {}
            got = {p: ms[p]["median"] for p in PHASES} if ms else row["status"]
        except (ValueError, KeyError, IndexError, TypeError):
            fail(f"{path} is not lmscope bench's JSON")
        cells.setdefault((model, ctx), {}).setdefault(side, []).append((rnd, got))
    return cells


def main():
    if len(sys.argv) != 2:
        fail("give the directory of an A/B run's JSON files")
    directory = sys.argv[1]
    if not os.path.isdir(directory):
        fail(f"no such directory: {directory}")
    cells = read(directory)
    if not cells:
        fail(f"{directory} holds no base-MODEL-CTX-ROUND.json or new-MODEL-CTX-ROUND.json")
    print("| model | ctx | base step ms by round | new step ms by round | base fwd / bwd / opt | "
          "new fwd / bwd / opt | new / base, step |")
    print("|---|---:|---|---|---|---|---:|")
    for (model, ctx) in sorted(cells, key=lambda c: (c[1], PRESETS.index(c[0]) if c[0] in PRESETS else len(PRESETS), c[0])):
        sides = cells[(model, ctx)]
        shown, means = [], {}
        for side in ("base", "new"):
            runs = sorted(sides.get(side, []))
            ok = [got for _, got in runs if isinstance(got, dict)]
            shown.append(", ".join(f"{got['step']:.2f}" if isinstance(got, dict) else got for _, got in runs) or "-")
            means[side] = {p: statistics.mean(g[p] for g in ok) for p in PHASES} if ok else None
        phases = [" / ".join(f"{means[s][p]:.2f}" for p in PHASES[:3]) if means[s] else "-" for s in ("base", "new")]
        ratio = f"{means['new']['step'] / means['base']['step']:.3f}" if means["base"] and means["new"] else "-"
        print(f"| {model} | {ctx} | {shown[0]} | {shown[1]} | {phases[0]} | {phases[1]} | {ratio} |")


if __name__ == "__main__":
    main()
