"""tools/ddp_table.py over what scripts/gpu_multi_check.sh leaves, made here on the CPU (two Gloo
ranks of a tiny model: one process with graphs off and on, two of the --ddp variants and --zero 1, 2
and 3, the dry run of each ZeRO stage's rank, lmscope allreduce) beside PyTorch rows written here
(FSDP2's among them): every cell a row, the ratios from the medians, each stage's measured peak equal
to the dry run's (0 bytes apart: the CPU's allocator is the one the dry run replays), and its bad
inputs (bench_ddp.py's too). LMSCOPE names the built program."""
import glob
import json
import os
import subprocess
import tempfile

from tool_checks import check, check_refusals, run

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "ddp_table.py")
LMSCOPE = os.environ["LMSCOPE"]
TINY = ["--device", "cpu", "--vocab", "50", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2",
        "--ctx", "32,64", "--precision", "fp32", "--format", "json"]


def lmscope(*args):
    r = subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"lmscope {' '.join(args)}: {r.stderr}")


def main():
    with tempfile.TemporaryDirectory() as out:
        path = lambda name: os.path.join(out, name)
        bench = ["bench", *TINY, "--warmup", "1", "--steps", "3"]
        lmscope(*bench, "--batch", "4", "--graphs", "off,on", "--out", path("ddp-one-gpu.json"))
        for par, tag in ((["--ddp", "naive"], "ddpnaive"), (["--ddp", "bucketed", "--bucket-mb", "25"],
                                                             "ddpbucketedbucketmb25"), (["--zero", "1"], "zero1"),
                         (["--zero", "2"], "zero2"), (["--zero", "3"], "zero3")):
            lmscope("launch", "--nproc", "2", "--", *bench, "--batch", "8", *par, "--out", path(f"ddp-{tag}.json"))
        for stage, name in (("1", "zero"), ("2", "zero2"), ("3", "zero3")):
            lmscope("memory", "--dry-run", *TINY, "--batch", "8", "--world-size", "2", "--zero", stage, "--out",
                    path(f"{name}-dry-run.json"))
        lmscope("launch", "--nproc", "2", "--", "allreduce", "--device", "cpu", "--sizes", "1MB", "--iters", "3",
                "--format", "json", "--out", path("allreduce-lmscope.json"))
        with open(path("allreduce-pytorch.md"), "w") as f:
            f.write("| framework | size | ranks | backend | mean ms | std ms | algbw GB/s | busbw GB/s |\n"
                    "|---|---:|---:|---|---:|---:|---:|---:|\n| PyTorch 2.11 | 1MB | 2 | gloo | 0.500 | 0.1 | 2 | 2 |\n")
        with open(path("ddp-pytorch.md"), "w") as f:
            f.write("| framework | model | ranks | variant | bucket MB | batch per rank | ctx | step median ms | "
                    "step std ms | peak GiB per rank | status |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|\n"
                    "| PyTorch 2.11 | custom(d64,ff128,L2,h2) | 2 | ddp | 25 | 4 | 32 | 1000.00 | 1 | 1.50 | ok |\n"
                    "| PyTorch 2.11 | custom(d64,ff128,L2,h2) | 2 | zero1 | 25 | 4 | 32 | - | - | - | OOM |\n"
                    "| PyTorch 2.11 | custom(d64,ff128,L2,h2) | 2 | fsdp2 | 25 | 4 | 32 | 2000.00 | 1 | 1.25 | ok |\n")
        table = run(TOOL, out)
        check(table.returncode == 0, f"exits 0 ({table.stderr})")
        text = table.stdout

        def row(prefix):
            rows = [line for line in text.splitlines() if line.startswith(prefix)]
            check(len(rows) >= 1, f"a row starting {prefix!r} in\n{text}")
            return [c.strip() for c in rows[0].strip("|").split("|")]

        with open(path("allreduce-lmscope.json")) as f:
            ours = json.load(f)[0]["ms"]["mean"]
        a = row("| 1 MB |")
        check(a[5] == f"{0.5 / float(a[1]):.2f}" and abs(float(a[1]) - ours) < 1e-3, f"PyTorch over lmscope: {a}")
        with open(path("ddp-one-gpu.json")) as f:
            base = {(r["ctx"], r["graphs"]): r["ms"]["step"]["median"] for r in json.load(f)}
        with open(path("ddp-ddpbucketedbucketmb25.json")) as f:
            bucketed = {r["ctx"]: r["ms"]["step"]["median"] for r in json.load(f)}
        steps = row("| custom(d64,ff128,L2,h2) | 32 |")
        check(steps[2] == f"{base[(32, False)]:.2f}" and steps[3] == f"{base[(32, True)]:.2f}", f"one GPU: {steps}")
        check(steps[-5] == f"{bucketed[32] / base[(32, False)]:.2f}", f"bucketed over one GPU: {steps}")
        check(steps[-8] == "1000.00" and steps[-6] == "-", f"PyTorch DDP and its OOM: {steps}")
        check(steps[4] == steps[-7] == steps[-4] == steps[-3] == steps[-1] == "-",
              f"no bf16 gradients on the CPU: {steps}")
        # PyTorch's step over the fastest --ddp row (ZeRO-1 aside), from the files: no speed assumed.
        fastest = min(r["ms"]["step"]["median"] for p in glob.glob(path("ddp-ddp*.json")) for r in json.load(open(p))
                      if r["ctx"] == 32 and r["status"] == "ok")
        check(steps[-2] == f"{1000 / fastest:.2f}", f"PyTorch's 1000 ms over lmscope's fastest: {steps}")
        check(row("| custom(d64,ff128,L2,h2) | 64 |")[-8] == "-", "no PyTorch row at ctx 64")
        memory = [line for line in text.splitlines() if line.startswith("| custom") and line.count("|") == 9]
        check(len(memory) == 2, f"two memory rows: {memory}")
        for line in memory:
            cells = [c.strip() for c in line.strip("|").split("|")]
            check(cells[3] == cells[4] and cells[5] == "0", f"ZeRO-1 measured = dry run: {cells}")

        # The sharded-training tables: ZeRO's stages over DDP from the files, FSDP2 over the fastest
        # stage, each stage's measured peak beside its dry run's.
        sharded = text[text.index("## sharded training (two GPUs)"):]
        steps_of = {}
        for tag in ("ddpbucketedbucketmb25", "zero1", "zero2", "zero3"):
            with open(path(f"ddp-{tag}.json")) as f:
                steps_of[tag] = {r["ctx"]: r["ms"]["step"]["median"] for r in json.load(f)}
        cells = [c.strip() for c in
                 next(line for line in sharded.splitlines() if line.startswith("| custom(d64,ff128,L2,h2) | 32 |"))
                 .strip("|").split("|")]
        check(cells[2] == f"{steps_of['ddpbucketedbucketmb25'][32]:.2f}" and cells[6] == "2000.00", f"steps: {cells}")
        check(cells[9] == f"{steps_of['zero3'][32] / steps_of['ddpbucketedbucketmb25'][32]:.2f}", f"ZeRO-3 / DDP: {cells}")
        fastest = min(steps_of[z][32] for z in ("zero1", "zero2", "zero3"))
        check(cells[10] == f"{2000 / fastest:.2f}", f"FSDP2 over the fastest stage: {cells}")
        peaks = [line for line in sharded[sharded.index("per-rank peak"):].splitlines() if line.startswith("| custom")]
        check(len(peaks) == 2, f"two peak rows: {peaks}")
        for line in peaks:
            cells = [c.strip() for c in line.strip("|").split("|")]
            check(all(c.endswith("(0)") for c in cells[2:5]), f"every stage's peak = its dry run: {cells}")
        check(peaks[0].endswith("| 1.25 |"), f"FSDP2's peak: {peaks[0]}")

        empty = os.path.join(out, "empty")
        os.mkdir(empty)
        check_refusals(TOOL, [([], "give the directory"), ([os.path.join(out, "nowhere")], "no such directory"),
                              ([empty], "none of")])
    # PyTorch's side refuses a negative --skip before it starts a process group.
    check_refusals(os.path.join(ROOT, "pytorch", "bench_ddp.py"), [(["--skip", "-1"], "--skip must be non-negative")])
    print("ddp_table.py: ok")


if __name__ == "__main__":
    main()
