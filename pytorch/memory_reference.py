"""Peak memory of the PyTorch reference (cs336_reference.py) the way the seeds measure it:
torch.cuda.max_memory_allocated over one step after a warm-up step (and max_memory_reserved, what its
caching allocator held from the device at most over both steps), the step being one of
  inference          a forward under torch.no_grad() (the seeds' "forward only" profile)
  forward            a forward that builds the autograd graph, then drops it
  train              forward, backward and torch.optim.AdamW(fused=True), gradients set to None after
bf16 is torch.autocast(bfloat16) around forward and loss, as the seeds do. One Markdown row per cell,
OOM cells as rows. --snapshot FILE writes the last cell's step with torch.cuda.memory._dump_snapshot.
--top N lists each cell's N largest allocations live at the step's peak, with the line of
cs336_reference.py that made each, and the step's N largest allocations grouped by size and line
(both replayed from the allocator's recorded history).

  python pytorch/memory_reference.py --model 2.7B --ctx 128,256,512,1024 --mode inference,train --precision fp32,bf16
"""
import argparse
import gc

import torch

import cs336_reference as ref


def step(a, model, opt, x, y, mode):
    if mode == "inference":
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                ref.cross_entropy(model(x), y)
        return
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        loss = ref.cross_entropy(model(x), y)
    if mode == "train":
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def largest_at_peak(trace, step_start, top):
    """Replays the allocator's trace; returns the peak over the measured step and the top live blocks then."""
    live, total, peak, at_peak = {}, 0, -1, []
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if i >= step_start and total > peak:
                peak, at_peak = total, sorted(live.values(), key=lambda b: -b["size"])[:top]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    return peak, at_peak


def made_in_step(trace, step_start, top):
    """The step's allocations grouped by size and the line that made them, largest first."""
    groups = {}
    for e in trace[step_start:]:
        if e["action"] == "alloc":
            key = (e["size"], where(e))
            groups[key] = groups.get(key, 0) + 1
    return sorted(groups.items(), key=lambda kv: (-kv[0][0], -kv[1]))[:top]


def where(block):
    frames = block.get("frames", [])
    for f in frames:
        if "cs336_reference" in f["filename"] or "memory_reference" in f["filename"]:
            return f"{f['filename'].split('/')[-1]}:{f['line']} ({f['name']})"
    return f"{frames[0]['filename'].split('/')[-1]}:{frames[0]['line']}" if frames else "?"


def run_cell(a, model_name, ctx, mode, snapshot):
    torch.manual_seed(0)
    if a.top:
        torch.cuda.memory._record_memory_history(max_entries=1000000, stacks="python")
    with torch.device("cuda"):
        model = ref.TransformerLM(**ref.PRESETS[model_name], attention=a.attention)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True) if mode == "train" else None
    x = torch.randint(0, 10000, (a.batch, ctx), device="cuda")
    y = torch.randint(0, 10000, (a.batch, ctx), device="cuda")
    step(a, model, opt, x, y, mode)  # warm-up: AdamW's state and cuBLAS's workspace come here
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step_start = len(torch.cuda.memory._snapshot()["device_traces"][0]) if a.top else 0
    if snapshot and not a.top:
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    step(a, model, opt, x, y, mode)
    torch.cuda.synchronize()
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
    if a.top:
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        replayed, blocks = largest_at_peak(trace, step_start, a.top)
        a.tops.append((model_name, ctx, mode, a.precision, replayed, blocks, made_in_step(trace, step_start, a.top)))
    if snapshot or a.top:
        torch.cuda.memory._record_memory_history(enabled=None)
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--ctx", default="256")
    ap.add_argument("--mode", default="train")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--attention", default="naive", choices=["naive", "sdpa"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--snapshot", default="")
    ap.add_argument("--top", type=int, default=0)
    a = ap.parse_args()
    a.tops = []
    print("| model | precision | attention | mode | batch | ctx | peak GiB | peak bytes | reserved GiB | status |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    cells = [(m, p, mode, int(c)) for m in a.model.split(",") for p in a.precision.split(",")
             for mode in a.mode.split(",") for c in a.ctx.split(",")]
    for i, (m, p, mode, ctx) in enumerate(cells):
        a.precision = p
        try:
            peak, reserved = run_cell(a, m, ctx, mode, a.snapshot if i == len(cells) - 1 else "")
            row = f"{peak / 2**30:.2f} | {peak} | {reserved / 2**30:.2f} | ok"
        except torch.OutOfMemoryError:
            row = "- | - | - | OOM"
        gc.collect()
        torch.cuda.empty_cache()
        print(f"| {m} | {p} | {a.attention} | {mode} | {a.batch} | {ctx} | {row} |", flush=True)
    for m, ctx, mode, p, peak, blocks, made in a.tops:
        print(f"\n{m} {p} {a.attention} {mode} batch {a.batch} ctx {ctx}: the {len(blocks)} largest live at the peak "
              f"({peak / 2**30:.2f} GiB replayed from the trace)\n\n| MiB | allocated at |\n|---:|---|")
        for b in blocks:
            print(f"| {b['size'] / 2**20:.1f} | {where(b)} |")
        print(f"\nThe step's largest allocations by size and line\n\n| MiB | count | allocated at |\n|---:|---:|---|")
        for (size, line), count in made:
            print(f"| {size / 2**20:.2f} | {count} | {line} |")


if __name__ == "__main__":
    main()
