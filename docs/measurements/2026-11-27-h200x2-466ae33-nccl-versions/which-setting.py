# Which setting makes two-rank --ddp bucketed differ from one process (tests/cli/test_ddp_cli.py's model).
import json, os, subprocess, sys, tempfile
sys.path.insert(0, "tests/cli")
from cli_support import write_tokens
L = os.environ.get("BIN", "build-carry/lmscope")
d = tempfile.mkdtemp()
data = write_tokens(os.path.join(d, "train.bin"), 20000)
MODEL = ["--device", "cuda", "--precision", "fp32", "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2",
         "--heads", "2", "--grad-dtype", "fp32", "--batch", "4", "--ctx", "16", "--lr", "3e-3", "--print-every", "5",
         "--sample", "sequential"]
def train(name, extra, ranks):
    log = os.path.join(d, name + ".jsonl")
    args = ["train", "--data", data, *MODEL, "--steps", "5", "--log", log, *extra]
    cmd = [L, "launch", "--nproc", str(ranks), "--", *args] if ranks else [L, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if os.environ.get("DUMP"): open(os.environ["DUMP"] + "-" + name + ".txt", "w").write(r.stdout + r.stderr)
    if r.returncode: print(name, "failed", r.stderr[-500:]); return None
    return [json.loads(x)["loss"] for x in open(log)]
ref = train("one", [], 0)
import itertools
VARIANTS = [e.split() for e in os.environ["VARIANTS"].split(";")]
for i, extra in enumerate(VARIANTS):
    got = train(f"two{i}", extra, 2)
    if got: print(" ".join(extra), os.environ.get("TAG", ""), "max rel loss diff %.2e" % max(abs(g - w) / abs(w) for g, w in zip(got, ref)), flush=True)
