"""The walk-through of docs/python.md as one script: the memory of the 2.7B model's training step
(bf16, batch 4, as an 80 GB H100 would hold it) at four contexts, from lmscope.dry_run, drawn with
matplotlib as stacked bars by what holds the bytes at the peak, beside the GPU's budget.

    python3 docs/python/memory_by_context.py [out.png]      (default: docs/images/python-memory-2.7B.png)
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import lmscope  # noqa: E402

CONTEXTS = [1024, 2048, 4096, 8192]
KINDS = ["parameter", "optimizer_state", "gradient", "activation", "workspace", "input"]
COLOURS = ["#4C72B0", "#8172B2", "#C44E52", "#DD8452", "#937860", "#8C8C8C"]


def main(out):
    spec = lmscope.RunSpec(model="2.7B", batch=4, precision="bf16")
    reports = [lmscope.dry_run(spec.replace(ctx=ctx)) for ctx in CONTEXTS]
    budget = reports[0].budget_bytes / 2**30

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    bottoms = [0.0] * len(CONTEXTS)
    labels = [str(c) for c in CONTEXTS]
    for kind, colour in zip(KINDS, COLOURS):
        heights = [r.by_kind.get(kind, 0) / 2**30 for r in reports]
        ax.bar(labels, heights, bottom=bottoms, color=colour, label=kind.replace("_", " "))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.axhline(budget, color="black", linestyle="--", linewidth=1)
    ax.text(-0.4, budget + 1, f"budget: {reports[0].row['device_name'].split('(')[-1].rstrip(')')}, {budget:.1f} GiB",
            va="bottom", ha="left", fontsize=8)
    for i, r in enumerate(reports):
        ax.text(i, r.peak_gib, f"{r.peak_gib:.1f} GiB" + ("" if r.fits else "\ndoes not fit"), ha="center",
                va="bottom", fontsize=8)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("GiB at the step's peak")
    ax.set_title("2.7B training step, bf16, batch 4: memory at the peak, by kind (lmscope.dry_run)", fontsize=10)
    ax.set_ylim(0, max(r.peak_gib for r in reports) * 1.18)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))
    fig.tight_layout()
    fig.savefig(out)
    return reports


if __name__ == "__main__":
    for r in main(sys.argv[1] if len(sys.argv) > 1 else "docs/images/python-memory-2.7B.png"):
        print(r)
