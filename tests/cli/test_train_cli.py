"""lmscope train's checkpoints, resume and held-out loss, end to end on the CPU: a run killed
(SIGKILL) at a random step and resumed ends with the losses, AdamW state and weights of the run
never stopped, bit for bit; SIGTERM and SIGHUP save the step before stopping; a damaged or truncated newest
checkpoint is passed over with a warning; bad inputs end in one sentence and exit 2.
Run by ctest with LMSCOPE pointing at the built program; LMSCOPE_TRAIN_DEVICE=cuda and
LMSCOPE_TRAIN_PRECISION=bf16 or fp16 run the same tests on the GPU (scripts/gpu_check.sh --training);
in fp16 the loss scale's state is part of what a resumed run must equal, and overflowing steps are
skipped and logged."""
import glob
import json
import math
import os
import random
import shutil
import signal
import subprocess
import time
import unittest

import numpy as np

from cli_support import FilesTest, read_train_log

LMSCOPE = os.environ["LMSCOPE"]
STEPS = 80
DEVICE = os.environ.get("LMSCOPE_TRAIN_DEVICE", "cpu")  # the GPU machine runs the same tests on cuda
PRECISION = os.environ.get("LMSCOPE_TRAIN_PRECISION", "fp32")  # and in bf16 and fp16 there
OTHER_PRECISION = "fp32" if PRECISION == "bf16" else "bf16"
RUN = ["--device", DEVICE, "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2", "--heads", "2",
       "--precision", PRECISION,
       "--batch", "4", "--ctx", "32", "--lr", "3e-3", "--lr-schedule", "cosine", "--warmup-iters", "5",
       "--steps", str(STEPS), "--save-every", "10", "--print-every", "20"]


def run(*args):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=300)


def start(*args):
    return subprocess.Popen([LMSCOPE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_log(path):
    """The log's lines without their wall-clock field, which differs between any two runs."""
    rows = read_train_log(path)
    for r in rows:
        del r["elapsed_s"]
    return rows


def logged_steps(path):
    """The complete step lines of a log (a killed run may leave its last line half written; the run's
    description has no step); 0 before the run has made it."""
    try:
        with open(path) as f:
            return sum(1 for line in f if line.endswith("\n") and line.startswith('{"step":'))
    except FileNotFoundError:
        return 0


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def checkpoints(directory):
    return sorted(glob.glob(os.path.join(directory, "step-*")))


class Checkpoints(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        rng = np.random.default_rng(0)
        cls.data, cls.val = cls.path("train.bin"), cls.path("val.bin")
        rng.integers(0, 50, size=20000, dtype=np.uint16).tofile(cls.data)
        rng.integers(0, 50, size=3000, dtype=np.uint16).tofile(cls.val)
        # The run never stopped, every other run is compared with.
        cls.ref = cls.train_args("ref")
        r = run("train", *cls.ref)
        assert r.returncode == 0, r.stderr
        cls.ref_log = read_log(cls.path("ref.jsonl"))
        cls.ref_weights = read_bytes(cls.path("ref.safetensors"))

    @classmethod
    def train_args(cls, name):
        return [*RUN, "--data", cls.data, "--val-data", cls.val, "--eval-every", "20", "--eval-batches", "2",
                "--checkpoint-dir", cls.path(name), "--log", cls.path(name + ".jsonl"),
                "--save", cls.path(name + ".safetensors")]

    def resume(self, name, *extra):
        r = run("train", "--resume", self.path(name), "--log", self.path(name + ".jsonl"),
                "--save", self.path(name + ".safetensors"), *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def assertSameAsTheRunNeverStopped(self, name):
        self.assertEqual(read_log(self.path(name + ".jsonl")), self.ref_log)
        self.assertEqual(read_bytes(self.path(name + ".safetensors")), self.ref_weights)
        last = os.path.join(self.path(name), f"step-{STEPS:08d}")
        ref_last = os.path.join(self.path("ref"), f"step-{STEPS:08d}")
        for f in ("model.safetensors", "optimizer.safetensors"):
            self.assertEqual(read_bytes(os.path.join(last, f)), read_bytes(os.path.join(ref_last, f)), f)

    def stopped_run(self, name, stop):
        """Starts the run `name`, waits until its log shows a random step past its first checkpoint, then
        calls stop(process); the process's result, or None if it ended first or the stop came after
        its last step (then the run had nothing left to lose). Waiting on steps, not on time, keeps
        the stop inside the run however loaded the machine is."""
        p = start("train", *self.train_args(name))
        target = random.randint(12, STEPS - 10)
        log = self.path(name + ".jsonl")
        while logged_steps(log) < target:
            if p.poll() is not None:
                p.communicate()
                return None
            time.sleep(0.001)
        stop(p)
        out, err = p.communicate(timeout=60)
        if logged_steps(log) == STEPS:
            return None
        return p.returncode, out, err

    def test_the_reference_run_checkpoints_evaluates_and_logs(self):
        self.assertEqual([r["step"] for r in self.ref_log], list(range(1, STEPS + 1)))
        evaluated = [r for r in self.ref_log if "val_loss" in r]
        self.assertEqual([r["step"] for r in evaluated], [20, 40, 60, 80])
        for r in evaluated:
            self.assertAlmostEqual(r["val_perplexity"], math.exp(r["val_loss"]), places=9)
        self.assertLess(evaluated[-1]["val_loss"], evaluated[0]["val_loss"] + 0.5)
        self.assertEqual([os.path.basename(c) for c in checkpoints(self.path("ref"))],
                         [f"step-{s:08d}" for s in range(10, STEPS + 1, 10)])
        with open(os.path.join(checkpoints(self.path("ref"))[-1], "state.json")) as f:
            state = json.load(f)
        self.assertEqual((state["step"], state["adamw_steps"], state["sampler"]["batches"]), (STEPS, STEPS, STEPS))
        # The weights are what --save writes and --init reads.
        self.assertEqual(read_bytes(os.path.join(checkpoints(self.path("ref"))[-1], "model.safetensors")),
                         self.ref_weights)
        r = run("train", *RUN[:14], "--data", self.data, "--steps", "1", "--init",
                os.path.join(checkpoints(self.path("ref"))[0], "model.safetensors"))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_evaluation_changes_nothing_in_training(self):
        r = run("train", *RUN[:-4], "--data", self.data, "--log", self.path("noval.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        plain = read_log(self.path("noval.jsonl"))
        self.assertEqual(plain, [{k: v for k, v in row.items() if not k.startswith("val_")} for row in self.ref_log])

    def test_killed_at_a_random_step_and_resumed_equals_the_run_never_stopped(self):
        for attempt in range(5):
            name = f"killed{attempt}"
            if self.stopped_run(name, lambda p: p.send_signal(signal.SIGKILL)) is None:
                continue  # it finished before the kill: draw again
            self.assertLess(logged_steps(self.path(name + ".jsonl")), STEPS)
            r = self.resume(name)
            self.assertIn("resumed at step", r.stdout)
            self.assertSameAsTheRunNeverStopped(name)
            return
        self.fail("the run always ended before the kill")

    def test_sigterm_saves_its_step_and_the_resumed_run_is_the_same(self):
        self.stop_saves_and_resumes(signal.SIGTERM, resume=True)

    def test_sighup_saves_its_step_as_sigterm_does(self):
        # A closed terminal, or a scheduler's notice: the same clean stop.
        self.stop_saves_and_resumes(signal.SIGHUP, resume=False)

    def stop_saves_and_resumes(self, sig, resume):
        for attempt in range(5):
            name = f"{sig.name}{attempt}"
            result = self.stopped_run(name, lambda p: p.send_signal(sig))
            if result is None:
                continue
            code, out, err = result
            self.assertEqual(code, 128 + sig, err)
            stopped_at = logged_steps(self.path(name + ".jsonl"))
            self.assertIn(f"stopped by {sig.name} after step {stopped_at}", out)
            self.assertEqual(os.path.basename(checkpoints(self.path(name))[-1]), f"step-{stopped_at:08d}")
            if resume:
                self.resume(name)
                self.assertSameAsTheRunNeverStopped(name)
            return
        self.fail(f"the run always ended before {sig.name}")

    def test_a_damaged_or_truncated_newest_checkpoint_is_passed_over(self):
        for how in ("damaged", "truncated"):
            name = f"bad-{how}"
            shutil.copytree(self.path("ref"), self.path(name))
            shutil.copy(self.path("ref.jsonl"), self.path(name + ".jsonl"))
            newest = checkpoints(self.path(name))[-1]
            victim = os.path.join(newest, "optimizer.safetensors" if how == "damaged" else "model.safetensors")
            data = bytearray(read_bytes(victim))
            if how == "damaged":
                data[len(data) // 2] ^= 0x10
            else:
                data = data[: len(data) - 100]
            with open(victim, "wb") as f:
                f.write(data)
            r = self.resume(name)
            self.assertIn(f"lmscope: warning: passed over '{newest}'", r.stderr)
            self.assertIn("CRC-32" if how == "damaged" else "truncated", r.stderr)
            self.assertIn(f"resumed at step {STEPS - 10}", r.stdout)
            self.assertSameAsTheRunNeverStopped(name)

    def test_keep_holds_the_newest_and_a_partial_one_is_ignored(self):
        r = run("train", *self.train_args("kept"), "--keep", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([os.path.basename(c) for c in checkpoints(self.path("kept"))],
                         [f"step-{STEPS - 10:08d}", f"step-{STEPS:08d}"])
        # What a run killed while writing leaves: a partial directory, never read, removed by the next save.
        os.makedirs(os.path.join(self.path("kept"), f".partial-step-{STEPS + 5:08d}"))
        r = self.resume("kept", "--steps", str(STEPS + 5), "--lr", "1e-3")
        self.assertIn(f"resumed at step {STEPS}", r.stdout)
        self.assertIn("--steps is 85 here and was 80 in the checkpoint's run; going on with 85", r.stdout)
        self.assertIn("--lr is 0.001 here and was 0.003", r.stdout)
        self.assertEqual([os.path.basename(c) for c in checkpoints(self.path("kept"))],
                         [f"step-{STEPS:08d}", f"step-{STEPS + 5:08d}"])
        self.assertFalse(glob.glob(os.path.join(self.path("kept"), ".partial-*")))

    def test_without_save_every_it_saves_at_the_end_only(self):
        r = run("train", *RUN[:-6], "--data", self.data, "--steps", "7", "--checkpoint-dir", self.path("end"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([os.path.basename(c) for c in checkpoints(self.path("end"))], ["step-00000007"])

    def test_bad_inputs_end_in_one_sentence_and_exit_2(self):
        ref = self.path("ref")
        cases = [
            (["--resume", self.path("absent")], "does not exist"),
            (["--resume", ref, "--d-model", "16"], "is of another model"),
            (["--resume", ref, "--precision", OTHER_PRECISION], f"was trained in {PRECISION}"),
            (["--resume", ref, "--init", self.path("ref.safetensors")], "give one"),
            ([*RUN[:-4], "--data", self.data, "--checkpoint-dir", self.path("x"), "--save-every", "0"],
             "--save-every must be positive"),
            ([*RUN[:-4], "--data", self.data, "--save-every", "5"], "need --checkpoint-dir"),
            ([*RUN[:-4], "--data", self.data, "--checkpoint-dir", self.path("x"), "--keep", "0"],
             "--keep must be positive"),
            ([*RUN[:-4], "--data", self.data, "--eval-every", "5"], "need --val-data"),
            ([*RUN[:-4]], "--data is required"),
            ([*RUN[:-4], "--data", self.data, "--loss-scale", "1000"], "--loss-scale must be a positive power of two"),
            ([*RUN[:-4], "--data", self.data, "--loss-scale-interval", "0"], "--loss-scale-interval must be positive"),
            ([*RUN[:-4], "--data", self.data, "--graphs", "yes"], "unknown --graphs 'yes'"),
            ([*RUN[:-4], "--data", self.data, "--fusion", "1"], "unknown --fusion '1'"),
            ([*RUN[:-4], "--data", self.data, "--grad-dtype", "f16"], "unknown --grad-dtype 'f16'"),
        ]
        if PRECISION != "bf16":
            cases.append(([*RUN[:-4], "--data", self.data, "--grad-dtype", "bf16"], "needs --precision bf16"))
        empty = self.path("empty")
        os.makedirs(empty, exist_ok=True)
        cases.append((["--resume", empty], "holds no checkpoint"))
        for args, says in cases:
            r = run("train", *args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn(says, lines[0])

    @unittest.skipUnless(PRECISION == "fp16", "loss scaling is fp16's")
    def test_fp16_skips_overflowing_steps_and_logs_the_scale(self):
        # 2^40 times the loss's gradient overflows fp16 (largest 65504): the first steps are skipped,
        # each halving the scale, until the gradients fit.
        log = self.path("fp16.jsonl")
        r = run("train", *RUN[:-6], "--steps", "30", "--print-every", "1", "--data", self.data, "--log", log,
                "--loss-scale", str(2 ** 40))
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = read_log(log)
        skipped = [row for row in rows if row["skipped"]]
        self.assertGreater(len(skipped), 0)
        self.assertEqual(rows[0]["loss_scale"], 2 ** 40)
        for a, b in zip(rows, rows[1:]):
            self.assertEqual(b["loss_scale"], a["loss_scale"] / 2 if a["skipped"] else a["loss_scale"])
        for row in skipped:
            self.assertIsNone(row["grad_norm"])  # not finite: JSON has no infinity
        self.assertFalse(rows[-1]["skipped"])
        self.assertLess(rows[-1]["loss"], rows[0]["loss"])
        self.assertIn("overflow: step skipped", r.stdout)
        self.assertIn(f"({len(skipped)} skipped in all)", r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    unittest.main()
