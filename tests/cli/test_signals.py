"""Signals at random moments: SIGINT, SIGTERM and SIGHUP sent to lmscope after a random delay (seeded;
the seed and each case's delay are in the failure message, to replay it), from the first moments of
start-up to after the end. Every command ends by itself, never by the signal: exit 0 (it finished
first) or 128 + the signal with one line saying so. train with --checkpoint-dir stops after the step
under way and leaves what --resume continues to the weights of the run never stopped, bit for bit, also
when a second signal stops it at once; so does lmscope launch of two Gloo ranks. Run by ctest with
LMSCOPE pointing at the built program."""
import os
import random
import shutil
import signal
import subprocess
import time
import unittest

from cli_support import FilesTest, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
SEED = int(os.environ.get("LMSCOPE_SIGNAL_SEED", random.randrange(1 << 30)))
SANITIZED = os.environ.get("LMSCOPE_SANITIZED") == "1"
SHAPE = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab", "300",
         "--ctx", "16", "--batch", "2"]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# ASan's runs are several times slower: fewer steps and cases keep the file within its time.
STEPS = (lambda n: max(20, n // 6)) if SANITIZED else (lambda n: n)


class Signals(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = write_tokens(cls.path("tokens.bin"), 20000, vocab=300)
        cls.rng = random.Random(SEED)
        cls.env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": cls.path("")}
        # Before main() a signal's default action still holds: the signals come after three times the
        # time the program takes to start and end (ASan's start-up is slower).
        start = time.monotonic()
        subprocess.run([LMSCOPE, "--version"], capture_output=True, timeout=60, check=True)
        cls.earliest = 3 * (time.monotonic() - start) + 0.01

    def timed(self, args):
        """How long lmscope `args` takes unsignalled (it must succeed): the signals' delays are drawn
        within it, so that most land while it runs, from start-up to its end."""
        start = time.monotonic()
        r = subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=120, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        return time.monotonic() - start

    def delay(self, within):
        return self.rng.uniform(self.earliest, max(self.earliest + 0.01, within * 1.1))

    def signalled(self, args, sig, delay, second=None):
        """lmscope `args`, sent `sig` after `delay` s (and `second` s later the same again); (exit, stdout,
        stderr, what to say on failure)."""
        p = subprocess.Popen([LMSCOPE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env)
        time.sleep(delay)
        for wait in (0, second):
            if wait is None or p.poll() is not None:
                break
            time.sleep(wait)
            p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        case = f"seed {SEED}: {signal.Signals(sig).name} after {delay:.3f} s" + (
            f" and again {second:.3f} s later" if second is not None else "") + f" to {' '.join(args[:2])}"
        return p.returncode, out, err, f"{case}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"

    def assertEndedItself(self, code, sig, out, err, case):
        """Exit 0, or 128 + sig with a line saying it stopped (train's clean stop says so on stdout)."""
        self.assertIn(code, (0, 128 + sig), case)
        self.assertNotIn("internal error", err, case)
        if code != 0:
            self.assertRegex(out + err, r"(stopped by SIG(INT|TERM|HUP)|a second signal: stopped at once)", case)

    def test_commands_stopped_at_random_moments_end_with_one_line(self):
        commands = [["info", *SHAPE[2:12], "--dry-run"],
                    ["bench", *SHAPE, "--warmup", "2", "--steps", str(STEPS(1500))],
                    ["memory", "--device", "cpu", "--d-model", "256", "--d-ff", "512", "--layers", "8", "--heads", "4",
                     "--vocab", "1000", "--ctx", "64,128,256", "--batch", "2", "--mode", "train"],
                    ["train", *SHAPE, "--data", self.data, "--steps", str(STEPS(1500))]]
        for i, args in enumerate(commands):
            took = self.timed(args)
            for sig in SIGNALS[i % 3:i % 3 + 1] if SANITIZED else SIGNALS:
                code, out, err, case = self.signalled(args, sig, self.delay(took))
                with self.subTest(case=case.splitlines()[0]):
                    self.assertEndedItself(code, sig, out, err, case)
                    if code:
                        self.assertRegex(err.strip().splitlines()[-1], r"^lmscope: stopped by SIG(INT|TERM|HUP)$", case)

    def check_resumes_to_the_whole_run(self, name, code, sig, case, launch=()):
        """What run `name` left in its checkpoint directory, resumed, ends with the weights of `whole`."""
        directory = self.path(name)
        if code == 0 or not os.path.isdir(directory) or not any(n.startswith("step-") for n in os.listdir(directory)):
            return  # it finished, or stopped before its first checkpoint (a second signal: inside it)
        r = subprocess.run([LMSCOPE, *launch, "train", "--resume", directory, "--save", self.path(name + ".st")],
                           capture_output=True, text=True, timeout=120, env=self.env)
        self.assertEqual(r.returncode, 0, case + "\nresume: " + r.stdout[-500:] + r.stderr[-500:])
        with open(self.whole, "rb") as a, open(self.path(name + ".st"), "rb") as b:
            self.assertEqual(a.read(), b.read(), case)

    def test_checkpointed_training_stopped_at_random_moments_resumes_to_the_same_weights(self):
        train = ["train", *SHAPE, "--data", self.data, "--steps", str(STEPS(1000)), "--sample", "sequential"]
        self.whole = self.path("whole.st")
        took = self.timed([*train, "--save", self.whole])
        cases = 3 if SANITIZED else 6
        for i in range(cases):
            sig = SIGNALS[i % 3]
            second = self.rng.uniform(0.0, 0.05) if i >= 3 else None  # a second signal: stopped at once
            name = f"ck{i}"
            code, out, err, case = self.signalled([*train, "--checkpoint-dir", self.path(name), "--save-every", "7"], sig,
                                                  self.delay(took), second)
            with self.subTest(case=case.splitlines()[0]):
                self.assertEndedItself(code, sig, out, err, case)
                self.check_resumes_to_the_whole_run(name, code, sig, case)

    def test_training_stopped_while_it_saves_resumes_to_the_same_weights(self):
        # A model whose checkpoint (40 MB, flushed) takes much of each step: most signals land in a save.
        shape = [*SHAPE[:2], "--d-model", "256", "--d-ff", "1024", "--layers", "4", "--heads", "4", "--vocab", "300",
                 "--ctx", "16", "--batch", "1"]
        steps = "6" if SANITIZED else "10"
        train = ["train", *shape, "--data", self.data, "--steps", steps, "--sample", "sequential", "--save-every", "1"]
        self.whole = self.path("whole-saves.st")
        took = self.timed([*train, "--checkpoint-dir", self.path("saves-whole"), "--save", self.whole])
        for i in range(2 if SANITIZED else 3):
            sig = SIGNALS[self.rng.randrange(3)]
            second = self.rng.uniform(0.0, 0.05) if i % 2 else None  # a second one stops it inside a save
            name = f"saves{i}"
            code, out, err, case = self.signalled([*train, "--checkpoint-dir", self.path(name)], sig, self.delay(took),
                                                  second)
            with self.subTest(case=case.splitlines()[0]):
                self.assertEndedItself(code, sig, out, err, case)
                self.check_resumes_to_the_whole_run(name, code, sig, case)

    def test_two_ranks_stopped_at_a_random_moment_resume_to_the_same_weights(self):
        launch = ["launch", "--nproc", "2", "--oversubscribe", "--"]
        train = ["train", *SHAPE, "--data", self.data, "--steps", str(STEPS(300)), "--sample", "sequential"]
        self.whole = self.path("whole-ranks.st")
        took = self.timed([*launch, *train, "--save", self.whole])
        sig = SIGNALS[self.rng.randrange(3)]
        code, out, err, case = self.signalled([*launch, *train, "--checkpoint-dir", self.path("ranks"), "--save-every", "5"], sig,
                                              self.delay(took))
        self.assertIn(code, (0, 128 + sig), case)
        self.assertNotIn("internal error", err, case)
        self.check_resumes_to_the_whole_run("ranks", code, sig, case, launch)


if __name__ == "__main__":
    unittest.main()
