"""Joins `lmscope attention --format csv` files with pytorch/bench_attention.py's Markdown rows of
the same run: per cell, lmscope flash against SDPA and lmscope naive against PyTorch naive
(ratio = PyTorch ms / lmscope ms, > 1: lmscope faster), with TFLOP/s (causal FLOPs counted once).

  python3 tools/compare_attention.py lmscope.csv pytorch.md
"""
import sys

from result_tables import read_inputs


def main(paths):
    ours, pytorch = read_inputs(paths)
    theirs = {(r["attention"], r["precision"], int(r["batch"]), int(r["seq"]), int(r["d"])): r for r in pytorch}
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
        elif p["status"] != "ok":
            print(head + f"| {f:.3f} / {b:.3f} / {fb:.3f} | {tf:.1f}{share} | {p['status']} | lmscope only | {saved} / - |")
        else:
            print(head + f"| {f:.3f} / {b:.3f} / {fb:.3f} | {tf:.1f}{share} | {p['forward ms']} / {p['backward ms']} / "
                  f"{p['fwd+bwd ms']} | {float(p['fwd+bwd ms']) / fb:.2f}x | {saved} / {p['saved MiB']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
