"""What lmscope train (and bench's and memory's --out) do with the files around a run, end to end on
the CPU: what is at --save or a resumed --log is replaced only when it is a regular file (a symbolic
link is followed); output paths are checked before the first step and the check leaves nothing
behind; a failed write to the log ends the run (exit 1); a step whose gradients are not finite is
skipped, and --keep holds the newest checkpoint whose weights are finite; a fresh run does not write
into another run's checkpoints without --overwrite; a checkpoint whose state.json does not match its
CRC-32 or its directory, or whose file cannot be read, is passed over on --resume.
Run by ctest with LMSCOPE pointing at the built program; LMSCOPE_TRAIN_DEVICE=cuda and
LMSCOPE_TRAIN_PRECISION run the same tests on the GPU."""
import glob
import json
import os
import shutil
import stat
import subprocess
import unittest
import zlib

import numpy as np

from cli_support import FilesTest, read_safetensors, read_train_log, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
DEVICE = os.environ.get("LMSCOPE_TRAIN_DEVICE", "cpu")
PRECISION = os.environ.get("LMSCOPE_TRAIN_PRECISION", "fp32")
MODEL = ["--device", DEVICE, "--precision", PRECISION, "--d-model", "64", "--d-ff", "128", "--layers", "2",
         "--heads", "2", "--vocab", "300", "--ctx", "16", "--batch", "2", "--print-every", "1"]


def run(*args, timeout=120):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=timeout)


def checkpoints(directory):
    return sorted(os.path.basename(c) for c in glob.glob(os.path.join(directory, "step-*")))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def weights_finite(path):
    return all(np.isfinite(t).all() for t in read_safetensors(path).values())


def state_crc(state):
    """state.json's CRC-32 as lmscope computes it: over the object without its "crc32", written
    compactly with its keys in their order."""
    rest = {k: v for k, v in state.items() if k != "crc32"}
    return zlib.crc32(json.dumps(rest, separators=(",", ":")).encode())


class TrainFiles(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = write_tokens(cls.path("tok.bin"), 4000, vocab=300)

    def train(self, *args, timeout=120):
        return run("train", *MODEL, "--data", self.data, *args, timeout=timeout)

    def assertOneSentence(self, r, code, *says):
        self.assertEqual(r.returncode, code, (r.stdout, r.stderr))
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        for s in says:
            self.assertIn(s, lines[0])

    # 1: what is at --save, or at a log a resumed run rewrites, is replaced only when it is a regular file.
    def test_save_refuses_what_is_not_a_regular_file_and_follows_a_link(self):
        fifo, directory = self.path("save.fifo"), self.path("save.dir")
        os.mkfifo(fifo)
        os.makedirs(directory)
        cases = [(fifo, "FIFO"), (directory, "directory")]
        try:
            os.mknod(self.path("nul"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            cases.append((self.path("nul"), "character device"))
        except PermissionError:
            pass  # making a device node needs root; the FIFO and the directory stand for it
        for path, kind in cases:
            r = self.train("--steps", "3", "--save", path)
            self.assertOneSentence(r, 2, f"--save '{path}'", kind, "not a regular file")
            self.assertNotIn("step ", r.stdout)  # refused before the first step
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertTrue(os.path.isdir(directory))
        if len(cases) == 3:
            self.assertTrue(stat.S_ISCHR(os.lstat(self.path("nul")).st_mode))
        # A symbolic link is followed: the file it points to gets the weights, and the link stays.
        target, link = self.path("target.safetensors"), self.path("link.safetensors")
        with open(target, "w") as f:
            f.write("old")
        os.symlink(target, link)
        r = self.train("--steps", "2", "--save", link)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.islink(link))
        self.assertIn("token_embeddings.weight", read_safetensors(target))

    def test_the_log_describes_each_run_as_its_checkpoint_does(self):
        ckpt, log = self.path("described"), self.path("described.jsonl")
        r = self.train("--steps", "4", "--checkpoint-dir", ckpt, "--save-every", "2", "--log", log)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(ckpt, "step-00000004", "state.json")) as f:
            config = json.load(f)["config"]
        runs = []
        self.assertEqual([row["step"] for row in read_train_log(log, runs)], [1, 2, 3, 4])
        self.assertEqual(runs, [{"from_step": 0, **config}])
        with open(log) as f:
            self.assertIn('"from_step":0', f.readline())  # the first line
        # Resumed at step 2: the first run's description and steps up to 2 stay, the resumed run's follows.
        shutil.rmtree(os.path.join(ckpt, "step-00000004"))
        r = run("train", "--resume", ckpt, "--steps", "5", "--lr", "2e-3", "--log", log)
        self.assertEqual(r.returncode, 0, r.stderr)
        runs = []
        with open(log) as f:
            order = [row.get("step", f"from {row.get('from_step')}") for row in map(json.loads, f)]
        self.assertEqual(order, ["from 0", 1, 2, "from 2", 3, 4, 5])
        read_train_log(log, runs)
        self.assertEqual(runs[1]["run"]["optimizer"]["lr"], 2e-3)
        self.assertEqual(runs[1]["run"]["model"], config["run"]["model"])
        r = run("report", "--train", log, "--out", self.path("described.html"))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_a_resumed_log_is_rewritten_only_when_it_is_a_regular_file(self):
        ckpt = self.path("logged")
        r = self.train("--steps", "3", "--checkpoint-dir", ckpt, "--log", self.path("real.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        fifo = self.path("log.fifo")
        os.mkfifo(fifo)
        r = run("train", "--resume", ckpt, "--steps", "4", "--log", fifo, timeout=60)
        self.assertOneSentence(r, 2, f"--log '{fifo}'", "FIFO", "not a regular file")
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertEqual(checkpoints(ckpt), ["step-00000003"])  # nothing trained
        link = self.path("link.jsonl")
        os.symlink(self.path("real.jsonl"), link)
        r = run("train", "--resume", ckpt, "--steps", "5", "--log", link)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.islink(link))
        self.assertEqual([row["step"] for row in read_train_log(self.path("real.jsonl"))], [1, 2, 3, 4, 5])

    # 3: a write to the log that fails ends the run, naming the file and why.
    def test_a_failed_log_write_ends_the_run_with_exit_1(self):
        if not os.path.exists("/dev/full"):
            self.skipTest("no /dev/full here")
        r = self.train("--steps", "3", "--log", "/dev/full")
        self.assertOneSentence(r, 1, "'/dev/full'", "No space left on device")

    # 4: output paths are checked before the first step, and the check leaves no file behind.
    def test_outputs_are_checked_before_the_first_step_leaving_nothing_behind(self):
        trace = self.path("fresh-trace.json")
        for flag, others in (("--save", ["--trace", trace]), ("--trace", ["--log", self.path("fresh.jsonl")])):
            r = self.train("--steps", "200", *others, flag, self.path("nodir/out"))
            self.assertOneSentence(r, 2, f"{flag} '{self.path('nodir/out')}'", "does not exist")
            self.assertNotIn("step ", r.stdout)
            self.assertFalse(os.path.exists(trace))
        self.assertFalse(os.path.exists(self.path("fresh.jsonl")))
        # bench and memory: --out kept as it was (not emptied) when another output is refused.
        out = self.path("table.md")
        with open(out, "w") as f:
            f.write("the last sweep's table\n")
        cell = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab",
                "300", "--ctx", "16", "--batch", "2"]
        for cmd, other in (("bench", ["--steps", "1", "--warmup", "0", "--trace", self.path("nodir/t.json")]),
                           ("memory", ["--svg", self.path("nodir/m.svg")])):
            r = run(cmd, *cell, *other, "--out", out)
            self.assertOneSentence(r, 2, "does not exist")
            with open(out) as f:
                self.assertEqual(f.read(), "the last sweep's table\n")
            r = run(cmd, *cell, *other[:-2], "--out", self.path("new-table.md"), "--trace" if cmd == "bench" else "--svg",
                    self.path("nodir/x"))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertFalse(os.path.exists(self.path("new-table.md")))

    # 2: a step whose gradients are not finite is not applied, and --keep holds finite weights.
    def test_a_nonfinite_step_is_skipped_and_keep_holds_finite_weights(self):
        ckpt, log = self.path("nk1"), self.path("nk1.jsonl")
        r = self.train("--steps", "10", "--lr", "1e3", "--clip", "0", "--checkpoint-dir", ckpt, "--save-every", "1",
                       "--keep", "1", "--log", log)
        rows = read_train_log(log)
        skipped = [row["step"] for row in rows if row.get("skipped")]
        self.assertTrue(skipped, r.stdout)
        for row in rows:
            if row["step"] in skipped:
                self.assertIsNone(row["grad_norm"])
        for s in skipped:
            if PRECISION == "fp16":  # the loss scale's overflow, said on the progress line
                self.assertRegex(r.stdout, rf"step +{s}/10 .*overflow: step skipped")
            else:
                self.assertIn(f"step {s}: the gradients are not finite", r.stdout)
        for c in checkpoints(ckpt):
            self.assertTrue(weights_finite(os.path.join(ckpt, c, "model.safetensors")), c)

    def test_keep_holds_the_newest_checkpoint_with_finite_weights(self):
        # A rate no float holds: step 1 (warm-up, rate 0) is finite, step 2's update makes the weights
        # infinite with finite gradients, and every later step's gradients are not finite.
        ckpt = self.path("inf")
        r = self.train("--steps", "5", "--lr", "1e300", "--lr-schedule", "cosine", "--warmup-iters", "3",
                       "--checkpoint-dir", ckpt, "--save-every", "1", "--keep", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(checkpoints(ckpt), ["step-00000001", "step-00000005"])
        self.assertTrue(weights_finite(os.path.join(ckpt, "step-00000001", "model.safetensors")))
        with open(os.path.join(ckpt, "step-00000005", "state.json")) as f:
            self.assertFalse(json.load(f)["weights_finite"])

    @unittest.skipIf(PRECISION == "fp16", "fp16's loss scale first halves at each such step")
    def test_a_run_whose_gradients_stay_nonfinite_stops_saying_what_to_lower(self):
        for clip, advice in (("0", "lower --lr or turn on --clip"), ("1", "lower --lr")):
            r = self.train("--steps", "60", "--lr", "1e300", "--lr-schedule", "cosine", "--warmup-iters", "3",
                           "--clip", clip)
            self.assertEqual(r.returncode, 2, r.stderr)
            lines = r.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertIn("not finite for 20 steps in a row (steps 3 to 22)", lines[0])
            self.assertTrue(lines[0].endswith(advice), lines[0])

    # 6: a fresh run does not write into another run's checkpoints unless told to.
    def test_a_fresh_run_into_a_used_checkpoint_dir_needs_resume_or_overwrite(self):
        ckpt = self.path("used")
        r = self.train("--steps", "4", "--checkpoint-dir", ckpt, "--save-every", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        before = read_bytes(os.path.join(ckpt, "step-00000004", "model.safetensors"))
        r = self.train("--steps", "2", "--seed", "7", "--checkpoint-dir", ckpt)
        self.assertOneSentence(r, 2, f"'{ckpt}'", "--resume", "--overwrite")
        self.assertEqual(checkpoints(ckpt), ["step-00000002", "step-00000004"])
        self.assertEqual(read_bytes(os.path.join(ckpt, "step-00000004", "model.safetensors")), before)
        # --resume into it goes on; --overwrite removes the old run's checkpoints and starts afresh.
        os.makedirs(os.path.join(ckpt, "notes"))
        r = self.train("--steps", "2", "--seed", "7", "--checkpoint-dir", ckpt, "--overwrite")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(checkpoints(ckpt), ["step-00000002"])
        self.assertTrue(os.path.isdir(os.path.join(ckpt, "notes")))  # what is not a checkpoint stays
        r = run("train", "--resume", ckpt, "--steps", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resumed at step 2", r.stdout)
        r = run("train", "--resume", ckpt, "--steps", "3", "--overwrite")
        self.assertOneSentence(r, 2, "--overwrite")

    # 7 and 8: a checkpoint whose state.json is not what was written, or whose file cannot be read, is
    # passed over for the one before it.
    def resumable(self, name):
        ckpt = self.path(name)
        r = self.train("--steps", "4", "--checkpoint-dir", ckpt, "--save-every", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        return ckpt, os.path.join(ckpt, "step-00000004")

    def edit_state(self, newest, change, keep_crc=True):
        path = os.path.join(newest, "state.json")
        with open(path) as f:
            state = json.load(f)
        change(state)
        if keep_crc and "crc32" in state:
            state["crc32"] = state_crc(state)
        with open(path, "w") as f:
            json.dump(state, f, indent=2)

    def assertPassedOver(self, ckpt, newest, why):
        r = run("train", "--resume", ckpt, "--steps", "5", timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"lmscope: warning: passed over '{newest}'", r.stderr)
        self.assertIn(why, r.stderr)
        self.assertIn("resumed at step 2", r.stdout)

    def test_state_json_carries_its_crc_and_the_step_of_its_directory(self):
        with open(os.path.join(self.resumable("crc")[1], "state.json")) as f:
            state = json.load(f)
        self.assertEqual(state["crc32"], state_crc(state))
        self.assertTrue(state["weights_finite"])
        cases = [("big", lambda s: s.update(step=1e300), "state.json's step is 1e+300, not a whole number"),
                 ("half", lambda s: s.update(step=3.5), "state.json's step is 3.5, not a whole number"),
                 ("other", lambda s: s.update(step=2), "state.json says step 2, and its directory step 4"),
                 ("negative", lambda s: s.update(adamw_steps=-1), "state.json's adamw_steps is -1, not a whole number")]
        for name, change, why in cases:
            ckpt, newest = self.resumable(name)
            self.edit_state(newest, change)
            self.assertPassedOver(ckpt, newest, why)
        ckpt, newest = self.resumable("edited")
        self.edit_state(newest, lambda s: s["config"]["run"]["optimizer"].update(lr=0.5), keep_crc=False)
        self.assertPassedOver(ckpt, newest, "state.json does not match its CRC-32")

    def test_a_checkpoint_of_the_flat_configuration_resumes_as_it_did(self):
        # state.json keeps {"run": the RunSpec, "train": train's own}; one written before kept a flat
        # object under the flags' names, and resumes to the same bits.
        def flatten(state):
            run, train = state["config"]["run"], state["config"]["train"]
            opt, sched = run["optimizer"], run["schedule"]
            state["config"] = {**train, "model": run["model"], "precision": run["precision"], "device": run["device"],
                               "attention": run["attention"], "recompute": run["recompute"],
                               "weight_copies": run["weight_copies"], "grad_dtype": run["grad_dtype"],
                               "graphs": "on" if run["graphs"] else "off", "fusion": "on" if run["fusion"] else "off",
                               "batch": run["batch"], "ctx": run["ctx"], "grad_accum": run["grad_accum"],
                               "seed": run["seed"], "lr": opt["lr"], "lr_schedule": sched["kind"],
                               "warmup_iters": sched["warmup_iters"], "cosine_iters": sched["cosine_iters"],
                               "min_lr": sched["lr_min"], **{k: opt[k] for k in ("beta1", "beta2", "eps", "weight_decay",
                                                                                   "clip", "loss_scale", "loss_scale_interval")}}
        ckpt, newest = self.resumable("flat")
        shutil.copytree(ckpt, ckpt + "-as-written")
        self.edit_state(newest, flatten)
        for directory in (ckpt, ckpt + "-as-written"):
            r = run("train", "--resume", directory, "--steps", "6", "--save", directory + ".safetensors")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("resumed at step 4", r.stdout)
        self.assertEqual(read_bytes(ckpt + ".safetensors"), read_bytes(ckpt + "-as-written.safetensors"))

    def test_a_state_json_without_a_crc_is_read_with_a_warning(self):
        ckpt, newest = self.resumable("old")
        self.edit_state(newest, lambda s: s.pop("crc32"))
        r = run("train", "--resume", ckpt, "--steps", "5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("resumed at step 4", r.stdout)
        self.assertIn("no CRC-32", r.stderr)

    # Issue 57 point 14: a configuration field of another kind gave the JSON library's sentence, and
    # --seed -1 wrapped round to 2^64 - 1; each is one sentence naming the flag and the value.
    def test_a_configuration_of_another_kind_is_said_in_our_words(self):
        ckpt, newest = self.resumable("kinds")
        cases = [(lambda c: c["run"].update(batch="two"), "gives batch the value \"two\""),
                 (lambda c: c["run"].update(seed=-1), "gives seed the value -1"),
                 (lambda c: c["run"].update(grad_accum=2**40), "gives grad_accum the value 1099511627776"),
                 (lambda c: c["run"]["optimizer"].update(lr=[1]), "gives optimizer.lr the value [1]"),
                 (lambda c: c["run"]["model"].update(d_model="64"), "gives model.d_model the value \"64\""),
                 (lambda c: c["run"].pop("precision"), "has no precision"),
                 (lambda c: c["train"].update(steps="five"), "gives --steps the value \"five\""),
                 (lambda c: c.pop("train"), "holds no object \"train\"")]
        with open(os.path.join(newest, "state.json")) as f:
            good = f.read()
        for change, says in cases:
            with open(os.path.join(newest, "state.json"), "w") as f:
                f.write(good)
            self.edit_state(newest, lambda s: change(s["config"]))
            r = run("train", "--resume", ckpt, "--steps", "5")
            self.assertOneSentence(r, 2, f"the checkpoint in '{ckpt}'", says)
            self.assertNotIn("json", r.stderr)

    def test_a_checkpoint_file_that_cannot_be_read_is_passed_over(self):
        ckpt, newest = self.resumable("dir-in-place")
        victim = os.path.join(newest, "optimizer.safetensors")
        os.remove(victim)
        os.makedirs(victim)
        self.assertPassedOver(ckpt, newest, "optimizer.safetensors")
        if os.geteuid() == 0:
            return  # root reads a file of mode 000 all the same
        ckpt, newest = self.resumable("mode-000")
        os.chmod(os.path.join(newest, "model.safetensors"), 0)
        self.assertPassedOver(ckpt, newest, "model.safetensors")


if __name__ == "__main__":
    unittest.main()
