"""The short table of scripts/gpu_multi_check.sh, from the files it leaves in OUT: lmscope allreduce
beside torch.distributed.all_reduce (time, bus bandwidth, PyTorch over lmscope); per model and context
the train step's median (ms) on one GPU (device graphs off and on; bf16 gradients) and on two with
each --ddp mode and --zero 1 (and bucketed with bf16 gradients, summed by all-reduce and by
all-gather), beside PyTorch DDP (also with its
bf16_compress_hook) and ZeRO-1, with the collectives' time, the share hidden behind the backward and
the per-rank peak; lmscope's bucketed step (25 MB) over its one-GPU step without graphs (the target: at
most 1.1), with fp32 and with bf16 gradients (all-reduced and all-gathered), PyTorch DDP's step over lmscope's fastest (> 1: lmscope
faster; with bf16 gradients, PyTorch's hook over lmscope's), and ZeRO-1's measured peak beside the dry
run's prediction. Missing files leave "-".

  python3 tools/ddp_table.py OUT
"""
import json
import os
import sys

from result_tables import fail, markdown_rows

GiB = 2**30
NAMES = {"ddpnaive": "naive", "ddpflat": "flat", "ddpoverlap": "overlap", "ddpbucketedbucketmb1": "bucketed 1 MB",
         "ddpbucketedbucketmb10": "bucketed 10 MB", "ddpbucketedbucketmb25": "bucketed 25 MB",
         "ddpbucketedbucketmb100": "bucketed 100 MB", "ddpbucketedbucketmb1000": "bucketed 1000 MB",
         "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "ddpbucketedbucketmb25graddtypebf16": "bucketed 25 MB, bf16 gradients",
         "ddpbucketedbucketmb25graddtypebf16gradexchangeallgather": "the same, all-gathered"}
BF16 = "ddpbucketedbucketmb25graddtypebf16"
GATHERED = "ddpbucketedbucketmb25graddtypebf16gradexchangeallgather"
VARIANTS = list(NAMES)  # the files' tags (gpu_multi_check.sh: the flags without spaces and dashes), in order


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return []


def cell(row):
    return row["model"]["name"], row["ctx"]


def median(row):
    return row["ms"]["step"]["median"] if row.get("status") == "ok" and "ms" in row else None


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def allreduce_table(out):
    ours = {r["bytes"]: r for r in load(os.path.join(out, "allreduce-lmscope.json")) if r.get("status") == "ok"}
    theirs = {}
    path = os.path.join(out, "allreduce-pytorch.md")
    if os.path.isfile(path):
        units = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
        for r in markdown_rows(path):
            size = r["size"]
            theirs[int(float(size[:-2]) * units[size[-2:]])] = r
    if not ours and not theirs:
        return ""
    backends = sorted({r["backend"] for r in ours.values()} | {r["backend"] for r in theirs.values()})
    ranks = sorted({r["world"] for r in ours.values()} | {int(r["ranks"]) for r in theirs.values()})
    text = (f"## all-reduce, float32, {'/'.join(map(str, ranks))} ranks ({', '.join(backends)})\n\n| size | lmscope ms | lmscope busbw GB/s | PyTorch ms | "
            "PyTorch busbw GB/s | PyTorch / lmscope |\n|---:|---:|---:|---:|---:|---:|\n")
    for size in sorted(set(ours) | set(theirs)):
        o, t = ours.get(size), theirs.get(size)
        o_ms = o["ms"]["mean"] if o else None
        t_ms = float(t["mean ms"]) if t else None
        text += (f"| {size / 1e6:g} MB | {fmt(o_ms, '.3f')} | {fmt(o['busbw_gbs'] if o else None, '.1f')} | "
                 f"{fmt(t_ms, '.3f')} | {t['busbw GB/s'] if t else '-'} | "
                 f"{fmt(t_ms / o_ms if o_ms and t_ms else None)} |\n")
    return text + "\n"


def main(out):
    if not os.path.isdir(out):
        fail(f"no such directory: {out}")
    one = {}
    for r in load(os.path.join(out, "ddp-one-gpu.json")):
        one[(cell(r), r["graphs"], r.get("grad_dtype", "fp32"))] = median(r)
    two = {}
    for v in VARIANTS:
        for r in load(os.path.join(out, f"ddp-{v}.json")):
            two[(cell(r), v)] = r
    pt = {}
    path = os.path.join(out, "ddp-pytorch.md")
    if os.path.isfile(path):
        for r in markdown_rows(path):
            ok = r["status"] == "ok"
            pt[((r["model"], int(r["ctx"])), r["variant"])] = (
                float(r["step median ms"]) if ok else None, float(r["peak GiB per rank"]) if ok else None)
    dry = {cell(r): r.get("peak_bytes") for r in load(os.path.join(out, "zero-dry-run.json"))}
    cells = sorted({k[0] for k in one} | {c for c, _ in two} | {c for c, _ in pt})
    if not cells:
        fail(f"{out} holds none of gpu_multi_check.sh's results")
    text = allreduce_table(out)
    rows = [r for r in two.values()] + load(os.path.join(out, "ddp-one-gpu.json"))
    precision = ", ".join(sorted({r["precision"] for r in rows})) or "?"
    text += (f"## train step, {precision}, one GPU's batch per rank: median ms\n\n| model | ctx | one GPU, graphs off | "
             "one GPU, graphs on | one GPU, bf16 gradients | " + " | ".join(NAMES[v] for v in VARIANTS)
             + " | PyTorch DDP | PyTorch DDP, bf16 hook | PyTorch ZeRO-1 | bucketed 25 MB / one GPU | "
             "the same, bf16 gradients | the same, all-gathered | PyTorch DDP / lmscope's fastest | "
             "PyTorch's bf16 hook / lmscope's bf16 |\n"
             + "|---|---:|" + "---:|" * (len(VARIANTS) + 11) + "\n")

    def ratio(a, b):
        return a / b if a and b else None

    for c in cells:
        steps = {v: median(two[(c, v)]) if (c, v) in two else None for v in VARIANTS}
        ddp = [s for v, s in steps.items() if s is not None and v not in ("zero1", "zero2", "zero3", BF16, GATHERED)]
        base, base_bf16 = one.get((c, False, "fp32")), one.get((c, False, "bf16"))
        pt_ddp, pt_bf16 = pt.get((c, "ddp"), (None, None))[0], pt.get((c, "ddp-bf16"), (None, None))[0]
        text += (f"| {c[0]} | {c[1]} | {fmt(base)} | {fmt(one.get((c, True, 'fp32')))} | {fmt(base_bf16)} | "
                 + " | ".join(fmt(steps[v]) for v in VARIANTS)
                 + f" | {fmt(pt_ddp)} | {fmt(pt_bf16)} | {fmt(pt.get((c, 'zero1'), (None, None))[0])} | "
                 + f"{fmt(ratio(steps['ddpbucketedbucketmb25'], base))} | {fmt(ratio(steps[BF16], base_bf16))} | "
                 + f"{fmt(ratio(steps[GATHERED], base_bf16))} | "
                 + f"{fmt(ratio(pt_ddp, min(ddp) if ddp else None))} | {fmt(ratio(pt_bf16, steps[BF16]))} |\n")
    text += ("\n## where the exchange goes (two GPUs): collectives ms / exposed after the backward ms / hidden\n\n"
             "| model | ctx | " + " | ".join(NAMES[v] for v in VARIANTS) + " |\n|---|---:|" + "---|" * len(VARIANTS)
             + "\n")
    for c in cells:
        parts = []
        for v in VARIANTS:
            r = two.get((c, v))
            if r is None or median(r) is None:
                parts.append("-")
            else:
                parts.append(f"{r['ms']['communication']['mean']:.1f} / {r['ms']['exchange']['mean']:.1f} / "
                             f"{100 * r['hidden_share']:.0f}%")
        text += f"| {c[0]} | {c[1]} | " + " | ".join(parts) + " |\n"
    text += ("\n## per-rank peak memory, GiB (two GPUs)\n\n| model | ctx | DDP bucketed 25 MB | ZeRO-1 measured | "
             "ZeRO-1 dry run | measured − predicted, bytes | PyTorch DDP | PyTorch ZeRO-1 |\n"
             "|---|---:|---:|---:|---:|---:|---:|---:|\n")
    for c in cells:
        b, z = two.get((c, "ddpbucketedbucketmb25")), two.get((c, "zero1"))
        zb = z["peak_bytes"] if z and median(z) is not None else None
        d = dry.get(c)
        text += (f"| {c[0]} | {c[1]} | {fmt(b['peak_bytes'] / GiB if b and median(b) else None, '.4g')} | "
                 f"{fmt(zb / GiB if zb else None, '.4g')} | {fmt(d / GiB if d else None, '.4g')} | "
                 f"{zb - d if zb is not None and d is not None else '-'} | "
                 f"{fmt(pt.get((c, 'ddp'), (None, None))[1])} | {fmt(pt.get((c, 'zero1'), (None, None))[1])} |\n")
    print(text + sharding_table(out, cells, two, pt), end="")


def sharding_table(out, cells, two, pt):
    """ZeRO's stages beside DDP and PyTorch's FSDP2 (bench_ddp.py --variant fsdp2): step medians, the
    ratios the sharded-training issue sets targets for, and each stage's per-rank peak beside the dry
    run's (zero-dry-run.json is ZeRO-1's, zeroN-dry-run.json the others')."""
    stages = [s for s in ("zero1", "zero2", "zero3") if any((c, s) in two for c in cells)]
    if not stages and not any((c, "fsdp2") in pt for c in cells):
        return ""
    dry = {s: {cell(r): r.get("peak_bytes") for r in load(os.path.join(out, ("zero" if s == "zero1" else s) + "-dry-run.json"))}
           for s in stages}
    text = ("\n## sharded training (two GPUs): step median ms, and ratios to DDP bucketed 25 MB\n\n| model | ctx | DDP | "
            + " | ".join(NAMES[s] for s in stages) + " | PyTorch FSDP2 | " + " | ".join(f"{NAMES[s]} / DDP" for s in stages)
            + " | FSDP2 / lmscope's fastest ZeRO |\n|---|---:|" + "---:|" * (2 * len(stages) + 3) + "\n")
    for c in cells:
        ddp = two.get((c, "ddpbucketedbucketmb25"))
        base = median(ddp) if ddp else None
        steps = {s: median(two[(c, s)]) if (c, s) in two else None for s in stages}
        fsdp = pt.get((c, "fsdp2"), (None, None))[0]
        ours = [v for v in steps.values() if v is not None]
        text += (f"| {c[0]} | {c[1]} | {fmt(base)} | " + " | ".join(fmt(steps[s]) for s in stages) + f" | {fmt(fsdp)} | "
                 + " | ".join(fmt(steps[s] / base if steps[s] and base else None) for s in stages)
                 + f" | {fmt(fsdp / min(ours) if fsdp and ours else None)} |\n")
    text += ("\n## sharded training: per-rank peak GiB, measured / dry run (bytes apart)\n\n| model | ctx | "
             + " | ".join(NAMES[s] for s in stages) + " | PyTorch FSDP2 |\n|---|---:|" + "---|" * len(stages) + "---:|\n")
    for c in cells:
        parts = []
        for s in stages:
            r, d = two.get((c, s)), dry[s].get(c)
            got = r["peak_bytes"] if r and median(r) is not None else None
            parts.append(f"{fmt(got / GiB if got else None, '.4g')} / {fmt(d / GiB if d else None, '.4g')} "
                         f"({got - d if got is not None and d is not None else '-'})")
        text += f"| {c[0]} | {c[1]} | " + " | ".join(parts) + f" | {fmt(pt.get((c, 'fsdp2'), (None, None))[1])} |\n"
    return text


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("give the directory gpu_multi_check.sh wrote (its OUT)")
    main(sys.argv[1])
