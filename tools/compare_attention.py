"""Joins `lmscope attention --format csv` files with pytorch/bench_attention.py's Markdown rows of
the same run: per cell, lmscope flash against SDPA and lmscope naive against PyTorch naive
(ratio = PyTorch ms / lmscope ms, > 1: lmscope faster), with TFLOP/s (causal FLOPs counted once).

  python3 tools/compare_attention.py lmscope.csv pytorch.md
"""
import csv
import sys


def pytorch_rows(path):
    rows = {}
    with open(path) as f:
        for line in f:
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            if not c[0].startswith("PyTorch"):
                continue
            rows[(c[1], c[2], int(c[3]), int(c[4]), int(c[5]))] = c
    return rows


def main(paths):
    ours, theirs = [], {}
    for p in paths:
        if p.endswith(".csv"):
            with open(p) as f:
                ours.extend(csv.DictReader(f))
        else:
            theirs.update(pytorch_rows(p))
    print("| lmscope | vs | precision | batch | seq | d | lmscope fwd / bwd / fwd+bwd ms | fwd+bwd TFLOP/s (of peak) "
          "| PyTorch fwd / bwd / fwd+bwd ms | fwd+bwd ratio | saved MiB lmscope / PyTorch |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in ours:
        peer = "sdpa" if r["attention"] == "flash" else "naive"
        key = (peer, r["precision"], int(r["batch"]) * int(r["heads"]), int(r["seq"]), int(r["d"]))
        head = f"| {r['attention']} | {peer} | {key[1]} | {key[2]} | {key[3]} | {key[4]} "
        if r["status"] != "ok":
            print(head + f"| {r['status']} | - | - | - | - |")
            continue
        f, b, fb = (float(r[f"{p}_mean_ms"]) for p in ("forward", "backward", "forward_backward"))
        tf = float(r["forward_backward_tflops"])
        peak = float(r["peak_tflops"] or 0)
        share = f" ({100 * tf / peak:.0f}%)" if peak > 0 else ""
        saved = f"{int(r['saved_bytes']) / 2**20:.1f}"
        p = theirs.get(key)
        if p is None:
            print(head + f"| {f:.3f} / {b:.3f} / {fb:.3f} | {tf:.1f}{share} | not measured | - | {saved} / - |")
        elif p[12] != "ok":
            print(head + f"| {f:.3f} / {b:.3f} / {fb:.3f} | {tf:.1f}{share} | {p[12]} | lmscope only | {saved} / - |")
        else:
            print(head + f"| {f:.3f} / {b:.3f} / {fb:.3f} | {tf:.1f}{share} | {p[7]} / {p[8]} / {p[9]} "
                  f"| {float(p[9]) / fb:.2f}x | {saved} / {p[10]} |")


if __name__ == "__main__":
    main(sys.argv[1:])
