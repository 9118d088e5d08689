"""Reads what the comparison scripts join: lmscope's CSV files and the Markdown rows the PyTorch
scripts print, each row a dict keyed by its table's header names; and how the scripts refuse bad
input (one sentence on stderr naming the script, exit code 2)."""
import csv
import os
import sys


def fail(message):
    print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr)
    sys.exit(2)


def require_inputs(paths, usage):
    """Refuses unless an lmscope .csv is among paths (else says usage) and every path is a file."""
    if not any(p.endswith(".csv") for p in paths):
        fail(usage)
    for path in paths:
        if not os.path.isfile(path):
            fail(f"no such file: {path}")


def markdown_rows(path):
    """The data rows (first cell "PyTorch ...") of the Markdown tables in path."""
    names = None
    with open(path) as f:
        for line in f:
            cells = [x.strip() for x in line.strip().strip("|").split("|")]
            if cells[0] == "framework":
                names = cells
            elif names is not None and cells[0].startswith("PyTorch"):
                yield dict(zip(names, cells))


def read_inputs(paths):
    """(lmscope rows from the .csv paths, PyTorch rows from the others)."""
    ours, theirs = [], []
    for p in paths:
        if p.endswith(".csv"):
            with open(p) as f:
                ours.extend(csv.DictReader(f))
        else:
            theirs.extend(markdown_rows(p))
    return ours, theirs
