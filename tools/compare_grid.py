"""Joins an `lmscope bench --format csv` file with the Markdown rows of pytorch/bench_reference.py
measured in the same run, and prints one Markdown table: step time, peak memory and the ratio
PyTorch/lmscope per cell (> 1 means lmscope is faster).

  python3 tools/compare_grid.py lmscope.csv [more.csv ...] pytorch.md [more.md ...]
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
            if len(c) == 12:  # written before the script had --mode: train rows
                c.insert(4, "train")
            rows[(c[1], c[3], c[4], int(c[6]))] = {"step": c[10], "peak": c[11], "status": c[12]}
    return rows


def main(paths):
    lm, pt = [], {}
    for p in paths:
        if p.endswith(".csv"):
            with open(p) as f:
                lm.extend(csv.DictReader(f))
        else:
            pt.update(pytorch_rows(p))
    print("| model | precision | mode | ctx | lmscope ms [GiB] | MFU | PyTorch ms [GiB] | PyTorch / lmscope |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in lm:
        key = (r["model"], r["precision"], r["mode"], int(r["ctx"]))
        ours_ok = r["status"] == "ok"
        ours = f"{float(r['step_mean_ms']):.1f} [{int(r['peak_bytes']) / 2**30:.1f}]" if ours_ok else r["status"]
        mfu = f"{100 * float(r['mfu']):.1f}%" if ours_ok and r.get("mfu") else "-"
        p = pt.get(key)
        if p is None:
            theirs, ratio = "not measured", "-"
        elif p["status"] != "ok":
            theirs, ratio = p["status"], "lmscope only" if ours_ok else "-"
        else:
            step = float(p["step"].split("±")[0])
            theirs = f"{step:.1f} [{p['peak']}]"
            ratio = f"{step / float(r['step_mean_ms']):.2f}x" if ours_ok else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {ours} | {mfu} | {theirs} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1:])
