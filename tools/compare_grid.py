"""Joins an `lmscope bench --format csv` file with the Markdown rows of pytorch/bench_reference.py
measured in the same run, and prints one Markdown table: step time, peak memory and the ratio
PyTorch/lmscope per cell (> 1 means lmscope is faster). lmscope's naive attention is compared with
PyTorch's naive attention, its flash attention with PyTorch's SDPA.

  python3 tools/compare_grid.py lmscope.csv [more.csv ...] pytorch.md [more.md ...]
"""
import sys

from result_tables import fail, read_inputs, require_inputs


# lmscope's attention -> the PyTorch attention it is compared with: its own naive form, or SDPA for flash.
PEER_ATTENTION = {"naive": "naive", "flash": "sdpa"}


def keyed(rows):
    """PyTorch rows by (model, precision, mode, attention, ctx); older files have no mode column
    (train) and no attention column (naive)."""
    return {(r["model"], r["precision"], r.get("mode", "train"), r.get("attention", "naive"), int(r["ctx"])):
            {"step": r["step ms"], "peak": r["peak GiB"], "status": r["status"]} for r in rows}


def main(paths):
    require_inputs(paths, "give lmscope's .csv (bench --format csv) and PyTorch's Markdown "
                          "(pytorch/bench_reference.py)")
    lm, pytorch = read_inputs(paths)
    if not lm or any("step_mean_ms" not in r or "status" not in r for r in lm):
        fail("the .csv has no lmscope bench rows (model, ..., step_mean_ms, status)")
    pt = keyed(pytorch)
    print("| model | precision | mode | attention | ctx | lmscope ms [GiB] | MFU | PyTorch ms [GiB] | PyTorch / lmscope |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for r in lm:
        key = (r["model"], r["precision"], r["mode"], r.get("attention", "naive"), int(r["ctx"]))
        peer = PEER_ATTENTION[key[3]]
        ours_ok = r["status"] == "ok"
        ours = f"{float(r['step_mean_ms']):.1f} [{int(r['peak_bytes']) / 2**30:.1f}]" if ours_ok else r["status"]
        mfu = f"{100 * float(r['mfu']):.1f}%" if ours_ok and r.get("mfu") else "-"
        p = pt.get(key[:3] + (peer,) + key[4:])
        if p is None:
            theirs, ratio = "not measured", "-"
        elif p["status"] != "ok":
            theirs, ratio = p["status"], "lmscope only" if ours_ok else "-"
        else:
            step = float(p["step"].split("±")[0])
            theirs = f"{step:.1f} [{p['peak']}]"
            ratio = f"{step / float(r['step_mean_ms']):.2f}x" if ours_ok else "-"
        # lmscope's own variants of a cell (PyTorch has one of each) told apart in the mode column.
        mode = key[2] + (", transient copies" if r.get("weight_copies", "kept") == "transient" else "")
        mode += f", {r['grad_dtype']} gradients" if r.get("grad_dtype", "fp32") != "fp32" else ""
        print(f"| {key[0]} | {key[1]} | {mode} | {key[3]} vs {peer} | {key[4]} | {ours} | {mfu} | {theirs} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1:])
