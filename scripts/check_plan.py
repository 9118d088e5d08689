#!/usr/bin/env python3
"""Holds `lmscope plan` to the device: for each of its rows, runs the real step (lmscope memory,
a fresh process each) at the largest context it says fits and at one multiple more, and, with
--batches, at the largest batch and one more. The first must run and the second run out of memory.

  python3 scripts/check_plan.py build-gpu/lmscope plan.json [--batches] > plan-check.md

Prints one Markdown row per run; exits 1 when any disagrees with the plan.
"""
import json
import subprocess
import sys
import tempfile


def run_step(lmscope, row, batch, ctx):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [lmscope, "memory", "--device", row["device"], "--model", row["model"]["name"],
               "--precision", row["precision"], "--attention", row["attention"], "--mode", row["mode"],
               "--recompute", row["recompute"], "--grad-accum", str(row["grad_accum"]),
               "--warmup", str(row["warmup"]), "--batch", str(batch), "--ctx", str(ctx), "--top", "1",
               "--format", "json", "--out", out.name]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        cell = json.load(open(out.name))[0]
    return cell["status"], cell.get("peak_bytes")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: check_plan.py LMSCOPE PLAN.json [--batches]")
    lmscope, plan = sys.argv[1], json.load(open(sys.argv[2]))
    batches = "--batches" in sys.argv[3:]
    print("| model | precision | attention | batch | ctx | plan says | device says | peak GiB | agree |")
    print("|---|---|---|---:|---:|---|---|---:|---|")
    disagree = 0
    for row in plan:
        ref = row["reference"]
        probes = []
        if row["largest_ctx"] and not row["largest_ctx_at_cap"]:
            probes += [(ref["batch"], row["largest_ctx"], True),
                       (ref["batch"], row["largest_ctx"] + row["ctx_multiple"], False)]
        if batches and row["largest_batch"] and not row["largest_batch_at_cap"]:
            probes += [(row["largest_batch"], ref["ctx"], True), (row["largest_batch"] + 1, ref["ctx"], False)]
        for batch, ctx, fits in probes:
            status, peak = run_step(lmscope, row, batch, ctx)
            ran = status == "ok"
            agree = ran == fits and (ran or status.startswith("OOM"))
            disagree += not agree
            peak_gib = f"{peak / 2**30:.2f}" if peak else "-"
            print(f"| {row['model']['name']} | {row['precision']} | {row['attention']} | {batch} | {ctx} | "
                  f"{'fits' if fits else 'does not fit'} | {status} | {peak_gib} | {'yes' if agree else 'NO'} |",
                  flush=True)
    print(f"\n{disagree} disagreement(s)")
    sys.exit(1 if disagree else 0)


if __name__ == "__main__":
    main()
