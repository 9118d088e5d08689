"""scripts/gpu_check.sh --compile-table: bad arguments and settings are refused before anything is
built (one sentence on stderr, exit code 2, nothing on stdout), so this runs without a GPU."""
import os
import subprocess

from tool_checks import check

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")
GOOD = ["--compile-table", "train", "small", "128"]


def main():
    cases = (
        (["--compile-table", "train", "small"], {}, "takes MODE MODELS CTXS"),
        (["--compile-table", "inference", "small", "128"], {}, "not 'inference'"),
        (GOOD, {"LMSCOPE_COMPILE_SECONDS": "9m"}, "LMSCOPE_COMPILE_SECONDS must be whole seconds, not '9m'"),
        (GOOD, {"LMSCOPE_COMPILE_SECONDS": "100", "LMSCOPE_COMPILE_WARM_SECONDS": "200"},
         "up to the deadline (100), not '200'"),
        # Leading zeros are decimal (bash would read 08 as a bad octal number): 080 > 60.
        (GOOD, {"LMSCOPE_COMPILE_SECONDS": "060", "LMSCOPE_COMPILE_WARM_SECONDS": "080"},
         "up to the deadline (60), not '80'"),
        (GOOD, {"LMSCOPE_COMPILE_TIMING": "both"}, "parallel, serial or none, not 'both'"),
        (GOOD, {"LMSCOPE_COMPILE_TIMING": "none"}, "LMSCOPE_COMPILE_TIMING=none needs LMSCOPE_COMPILE_SPLIT"),
        (GOOD, {"LMSCOPE_COMPILE_TIMING": "none", "LMSCOPE_COMPILE_SPLIT": "small", "LMSCOPE_COMPILE_WARM_SECONDS": "0"},
         "leaves nothing to do"),
        (GOOD, {"LMSCOPE_COMPILE_SPLIT": "small;;large"}, "MODELS or MODELS@CTXS, not ''"),
        (GOOD, {"LMSCOPE_COMPILE_SPLIT": "xl@128,,256"}, "not 'xl@128,,256'"),
        (GOOD, {"LMSCOPE_COMPILE_SPLIT": "x l"}, "not 'x l'"),
        (GOOD, {"LMSCOPE_COMPILE_WARM_SPLIT": "small@128;small@256"}, "LMSCOPE_COMPILE_WARM_SPLIT needs LMSCOPE_COMPILE_SPLIT"),
        (GOOD, {"LMSCOPE_COMPILE_SPLIT": "small", "LMSCOPE_COMPILE_WARM_SPLIT": "small@128;small@"},
         "LMSCOPE_COMPILE_WARM_SPLIT: a group is MODELS or MODELS@CTXS, not 'small@'"),
        (GOOD, {"LMSCOPE_COMPILE_SPLIT": "small;medium;"}, "LMSCOPE_COMPILE_SPLIT: a group is MODELS or MODELS@CTXS, not ''"),
        # The compiled cells must be the timed ones (CTXS, 128 here, where a group names none).
        (GOOD, {"LMSCOPE_COMPILE_SPLIT": "small;medium", "LMSCOPE_COMPILE_WARM_SPLIT": "small@128;medium@256"},
         "must hold the same cells; one holds medium@128 medium@256 and the other not"),
    )
    for args, settings, said in cases:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LMSCOPE_COMPILE_")}
        env.update(settings)
        # A build directory that does not exist: a case that got past the checks would stop there.
        env["LMSCOPE_BUILD_DIR"] = "/nonexistent"
        bad = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60)
        lines = bad.stderr.strip().splitlines()
        what = f"{args} {settings}"
        check(bad.returncode == 2, f"{what}: exit code 2, got {bad.returncode} ({bad.stderr!r})")
        check(len(lines) == 1 and said in lines[0], f"{what}: one sentence saying '{said}', got {bad.stderr!r}")
        check(bad.stdout == "", f"{what}: nothing on stdout, got {bad.stdout!r}")
    print("gpu_check.sh --compile-table settings: ok")


if __name__ == "__main__":
    main()
