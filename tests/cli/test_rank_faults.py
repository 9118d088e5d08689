"""Ranks lost in the middle of a run, on 2 and 4 Gloo CPU ranks under lmscope launch, with the test-only
fault LMSCOPE_TEST_FAULT=RANK:STEP:ACTION:N (the N-th collective of step STEP; N=1 is the first bucket's
all-reduce, started inside the backward): a rank killed there has every rank out within 60 s and is
named; a rank that hangs there is caught by --collective-timeout, whose sentence names the collective,
and the ranks' flight records say that the hung rank never entered it; a rank killed there and the
ranks started again (--max-restarts) end with the bytes of the run never interrupted. Run by ctest with
LMSCOPE pointing at the built program; with LMSCOPE_FAULT_DEVICE=cuda the same on two GPUs through NCCL
(scripts/gpu_multi_check.sh), where a rank whose peer was killed waits inside NCCL until the launcher
stops it or its watchdog's timeout ends it."""
import os
import re
import signal
import subprocess
import time
import unittest

from cli_support import FilesTest, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
DEVICE = os.environ.get("LMSCOPE_FAULT_DEVICE", "cpu")
LIBRARY = "NCCL" if DEVICE == "cuda" else "Gloo"
WORLDS = (2,) if DEVICE == "cuda" else (2, 4)  # the GPU machine's two GPUs; CPU ranks share the cores
SHAPE = ["--device", DEVICE, "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2", "--vocab", "300",
         "--ctx", "16"]


class RankFaults(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = write_tokens(cls.path("tokens.bin"), 20000, vocab=300)

    def launch(self, nproc, fault, *args, timeout=60, restarts=0):
        """lmscope launch of `nproc` ranks training, with `fault`; (result, seconds taken)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": self.path("")}
        if fault:
            env["LMSCOPE_TEST_FAULT"] = fault
        start = time.monotonic()
        try:
            r = subprocess.run([LMSCOPE, "launch", "--nproc", str(nproc), "--oversubscribe", "--max-restarts",
                                str(restarts), "--", "train", *SHAPE, "--data", self.data, "--batch", str(nproc),
                                "--sample", "sequential", *args],
                               capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:  # what the ranks had said by then
            self.fail(f"still running after {timeout} s:\n{e.stdout}\n{e.stderr}")
        return r, time.monotonic() - start

    def test_a_rank_killed_in_the_backwards_exchange_has_every_rank_out_and_named(self):
        for nproc in WORLDS:
            with self.subTest(nproc=nproc):
                victim = nproc - 1
                r, took = self.launch(nproc, f"{victim}:3:die:1", "--steps", "6")
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertLess(took, 60)
                self.assertIn(f"lmscope launch: rank {victim} was killed by SIGKILL", r.stderr)
                self.assertIn(f"rank {victim} left no record", r.stderr)
                # Every other rank says in one sentence which collective of which step failed.
                for rank in range(nproc):
                    if rank == victim:
                        continue
                    said = [line for line in r.stderr.splitlines() if line.startswith(f"lmscope: rank {rank}: error:")]
                    self.assertLessEqual(len(said), 1, r.stderr)
                    for line in said:
                        self.assertRegex(line, rf"the all-reduce #\d+ of step 3 \(.*\) over {LIBRARY} (failed on rank|has "
                                               r"not finished after)")
                self.assertNotIn("internal error", r.stderr)

    def test_a_hung_rank_is_caught_by_the_collective_timeout_and_named_by_the_flight_records(self):
        for nproc in WORLDS:
            with self.subTest(nproc=nproc):
                r, took = self.launch(nproc, "1:3:hang:1", "--steps", "6", "--collective-timeout", "3")
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertLess(took, 60)
                timed_out = re.findall(r"lmscope: rank (\d+): error: the all-reduce #(\d+) of step 3 \((.*?)\) over "
                                       rf"{LIBRARY} has not finished after \d+ s \(--collective-timeout 3\): a rank stopped "
                                       r"before it, or never called it; its last collectives are in '(.*?)'", r.stderr)
                self.assertTrue(timed_out, r.stderr)
                rank, seq, size, path = timed_out[0]
                self.assertNotEqual(rank, "1")
                self.assertTrue(os.path.isfile(path), path)
                self.assertRegex(r.stderr, rf"lmscope launch: rank 1 never entered all-reduce #{seq} \({re.escape(size)}"
                                           r", step 3\), in which ranks? [\d, and]+ waited; its last collective was "
                                           r"all-reduce #\d+ \(.*, step 2\), completed")
                self.assertIn("lmscope launch: the ranks' flight records are in", r.stderr)

    @unittest.skipIf(DEVICE == "cuda", "the launcher's part, the same on every device")
    def test_ranks_stopped_by_a_signal_to_the_launcher_get_as_long_as_they_take(self):
        # Rank 1 hangs after step 2 and rank 0 waits in step 3's exchange: neither stops on SIGTERM.
        # The launcher once sent SIGKILL 10 s after passing a signal on, killing a rank 0 in the middle
        # of a large checkpoint; now only a second signal does.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": self.path(""), "LMSCOPE_TEST_FAULT": "1:2:hang"}
        p = subprocess.Popen([LMSCOPE, "launch", "--nproc", "2", "--oversubscribe", "--", "train", *SHAPE, "--data",
                              self.data, "--batch", "2", "--steps", "6"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        try:
            time.sleep(4)
            p.send_signal(signal.SIGTERM)
            time.sleep(12)
            self.assertIsNone(p.poll(), "the launcher ended its ranks without a second signal")
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=10)
        finally:
            p.kill()
            p.wait()
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("lmscope launch: got SIGTERM; stopping the ranks", err)

    def test_a_restart_after_a_rank_died_in_the_exchange_ends_with_the_uninterrupted_runs_bytes(self):
        whole, restarted = self.path("whole.safetensors"), self.path("restarted.safetensors")
        common = ["--steps", "5", "--ddp", "bucketed", "--bucket-mb", "0.1"]
        nproc = WORLDS[-1]
        r, _ = self.launch(nproc, None, *common, "--save", whole, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        r, took = self.launch(nproc, f"{nproc - 1}:4:die:2", *common, "--save", restarted, "--checkpoint-dir", self.path("ck"),
                              "--save-every", "2", timeout=120, restarts=1)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"lmscope launch: rank {nproc - 1} was killed by SIGKILL", r.stderr)
        self.assertIn("starting the ranks again (restart 1 of 1)", r.stderr)
        self.assertIn("resumed at step 2 from", r.stdout)
        with open(whole, "rb") as a, open(restarted, "rb") as b:
            self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main()
