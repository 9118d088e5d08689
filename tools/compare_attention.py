"""Joins `lmscope attention --format csv` files with pytorch/bench_attention.py's Markdown rows of
the same run: per cell, lmscope flash against SDPA and lmscope naive against PyTorch naive
(ratio = PyTorch ms / lmscope ms, > 1: lmscope faster), with TFLOP/s (causal FLOPs counted once)
as a share of the datasheet peak and, with --ceiling, of a measured ceiling (ANCHORS.md: 800 for
bf16 GEMMs on the H100).

  python3 tools/compare_attention.py lmscope.csv pytorch.md [--ceiling TFLOPS]
"""
import sys

from result_tables import fail, read_inputs, require_inputs


def parse(args):
    """(input paths, ceiling TFLOP/s or 0) from the command line."""
    ceiling = 0.0
    if "--ceiling" in args:
        at = args.index("--ceiling")
        value = args[at + 1] if at + 1 < len(args) else ""
        try:
            ceiling = float(value)
        except ValueError:
            fail(f"--ceiling takes a TFLOP/s figure, got '{value}'")
        if not 0 < ceiling < float("inf"):
            fail(f"--ceiling must be a positive TFLOP/s figure, got '{value}'")
        args = args[:at] + args[at + 2:]
    require_inputs(args, "give lmscope's .csv and PyTorch's Markdown output to join")
    return args, ceiling


def main(args):
    paths, ceiling = parse(args)
    ours, pytorch = read_inputs(paths)
    theirs = {(r["attention"], r["precision"], int(r["batch"]), int(r["seq"]), int(r["d"])): r for r in pytorch}
    shares = f"of peak / of {ceiling:g}" if ceiling else "of peak"
    print(f"| lmscope | vs | precision | batch | seq | d | lmscope fwd / bwd / fwd+bwd ms | fwd+bwd TFLOP/s ({shares}) "
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
        of = ([f"{100 * tf / peak:.0f}%"] if peak > 0 else []) + ([f"{100 * tf / ceiling:.0f}%"] if ceiling else [])
        share = f" ({' / '.join(of)})" if of else ""
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
