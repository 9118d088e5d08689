"""Ranks of one run, end to end on the CPU (Gloo over loopback). Ranks started one by one with
torchrun's variables, as torchrun, Slurm or a person start them, with different flags: every rank ends
with one sentence naming the flag and both values, exit 2 (before, a different model or exchange
aborted inside Gloo and a different batch or seed trained on). lmscope launch --max-restarts: a rank
dying mid-run (LMSCOPE_TEST_FAULT) and the ranks started again from the newest checkpoint end with the
bytes of the run never interrupted, with DDP and with ZeRO-1. Run by ctest with LMSCOPE pointing at
the built program."""
import os
import subprocess
import unittest

from cli_support import FilesTest, free_port, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
SHAPE = ["--device", "cpu", "--d-model", "64", "--d-ff", "128", "--heads", "2", "--vocab", "300", "--ctx", "16"]


def by_hand(*per_rank):
    """Starts rank r of len(per_rank) with the lmscope arguments per_rank[r] and the variables torchrun
    sets; each rank's (exit code, stderr)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(len(per_rank)), "OMP_NUM_THREADS": "1", "LMSCOPE_DIST_TIMEOUT": "60"}
    ranks = [subprocess.Popen([LMSCOPE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r, args in enumerate(per_rank)]
    errs = [p.communicate(timeout=120)[1] for p in ranks]
    return [(p.returncode, err) for p, err in zip(ranks, errs)]


class Ranks(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = write_tokens(cls.path("tokens.bin"), 20000, vocab=300)

    def test_ranks_started_with_different_flags_each_say_which_and_exit_2(self):
        train = ["train", *SHAPE, "--data", self.data, "--steps", "2"]
        same = ["--layers", "2", "--batch", "2"]
        cases = [  # rank 1's flags (rank 0 runs `same`), and what every rank must say
            (["--layers", "3", "--batch", "2"], "--layers is 3 there and 2 on rank 0"),
            (["--layers", "2", "--batch", "4"], "--batch is 4 there and 2 on rank 0"),
            ([*same, "--seed", "7"], "--seed is 7 there and 0 on rank 0"),
            ([*same, "--zero", "1"], "--zero is 1 there and 0 on rank 0"),
        ]
        for theirs, words in cases:
            with self.subTest(rank1=theirs):
                for rank, (code, err) in enumerate(by_hand([*train, *same], [*train, *theirs])):
                    self.assertEqual(code, 2, err)
                    self.assertEqual(err.count("\n"), 1, err)
                    self.assertTrue(err.startswith(f"lmscope: rank {rank}: error: rank 1 was started with other "
                                                   "flags than rank 0: "), err)
                    self.assertIn(words, err)
        # bench: the ranks run every cell together, so they must be asked for the same cells.
        bench = ["bench", *SHAPE, "--layers", "2", "--batch", "2", "--warmup", "0"]
        for theirs, words in ((["--steps", "3"], "--steps is 3 there and 10 on rank 0"),
                              (["--attention", "flash,naive"], "the number of cells the flags make is 2 there and 1")):
            with self.subTest(bench=theirs):
                for code, err in by_hand(bench, [*bench, *theirs]):
                    self.assertEqual(code, 2, err)
                    self.assertIn(words, err)

    def test_a_restart_after_a_rank_died_ends_with_the_uninterrupted_runs_bytes(self):
        # Rank 1 dies (SIGKILL, as the out-of-memory killer kills) after step 3; the ranks are started
        # again and go on from the checkpoint of step 2.
        train = ["train", *SHAPE, "--layers", "2", "--batch", "2", "--data", self.data, "--steps", "6",
                 "--sample", "sequential"]
        for mode in (["--ddp", "bucketed"], ["--zero", "1", "--bucket-mb", "0.01"], ["--zero", "2", "--bucket-mb", "0.01"],
                     ["--zero", "3"]):
            with self.subTest(mode=mode):
                tag = mode[0].strip("-") + mode[1]
                whole, restarted = self.path(f"whole-{tag}.safetensors"), self.path(f"restarted-{tag}.safetensors")
                r = subprocess.run([LMSCOPE, "launch", "--nproc", "2", "--", *train, *mode, "--save", whole],
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr)
                r = subprocess.run([LMSCOPE, "launch", "--nproc", "2", "--max-restarts", "1", "--", *train, *mode,
                                    "--save", restarted, "--checkpoint-dir", self.path(f"ck-{tag}"), "--save-every",
                                    "2"], capture_output=True, text=True, timeout=300,
                                   env={**os.environ, "LMSCOPE_TEST_FAULT": "1:3:die"})
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("lmscope launch: rank 1 was killed by SIGKILL", r.stderr)
                self.assertIn("lmscope launch: starting the ranks again (restart 1 of 1)\n", r.stderr)
                self.assertIn("resumed at step 2 from", r.stdout)
                with open(whole, "rb") as a, open(restarted, "rb") as b:
                    self.assertEqual(a.read(), b.read())

    def test_restarts_run_out_and_a_user_error_is_not_restarted(self):
        train = ["train", *SHAPE, "--layers", "2", "--batch", "2", "--data", self.data, "--steps", "4"]
        # No restart allowed: the launch ends as the failed rank did.
        r = subprocess.run([LMSCOPE, "launch", "--nproc", "2", "--", *train], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "LMSCOPE_TEST_FAULT": "0:2:exit"})
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("lmscope launch: rank 0 exited with code 1", r.stderr)
        self.assertNotIn("starting the ranks again", r.stderr)
        # Without a --checkpoint-dir the restart starts from the first step, and finishes (the fault
        # fires on the first start only).
        r = subprocess.run([LMSCOPE, "launch", "--nproc", "2", "--max-restarts", "3", "--", *train],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "LMSCOPE_TEST_FAULT": "0:2:exit"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("starting the ranks again"), 1, r.stderr)
        # A user error is the same on every start: not restarted.
        r = subprocess.run([LMSCOPE, "launch", "--nproc", "2", "--max-restarts", "3", "--", "train", *SHAPE,
                            "--data", "/nonexistent", "--steps", "1"], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertNotIn("starting the ranks again", r.stderr)


if __name__ == "__main__":
    unittest.main()
