"""lmscope launch end to end: N ranks of a command, each told its rank; the first rank to fail named
in one line with the launcher's exit code following it (2 for a user error, 1 otherwise); signals to
the launcher reaching the ranks; a taken port; bad input. Run by ctest with LMSCOPE pointing at the
built program."""
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import unittest

LMSCOPE = os.environ["LMSCOPE"]
TINY = ["--model", "small", "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2", "--heads", "2"]
# A rank that runs until stopped: CPU steps of a tiny model (data parallel: one row per rank).
LONG = ["bench", "--device", "cpu", *TINY, "--ctx", "16", "--batch", "2", "--warmup", "0", "--steps", "1000000"]
LAUNCHER_LINE = re.compile(r"^lmscope launch: ", re.M)


def run(*args, env=None):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def has_allreduce():
    return run("allreduce", "--help").returncode == 0


def ranks_of(launcher, n, timeout=30):
    """The launcher's children once all n have started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
        if len(kids) == n:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"the launcher started {len(kids)} of {n} ranks")


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped by init is gone too
        return f.read().split(") ")[1].startswith("Z")


class Launch(unittest.TestCase):
    def test_every_rank_runs_the_command(self):
        r = run("launch", "--nproc", "2", "--", "info", *TINY)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("Parameters: "), 2, r.stdout)
        self.assertEqual(r.stderr, "")

    def test_a_file_rendezvous_is_passed_on(self):
        with tempfile.TemporaryDirectory() as d:
            r = run("launch", "--nproc", "3", "--rendezvous", f"file:{d}/r", "--", "info", *TINY)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("Parameters: "), 3)

    def test_a_user_error_in_the_ranks_is_exit_2_and_one_line(self):
        r = run("launch", "--nproc", "2", "--", "train", "--data", "/nonexistent", "--steps", "1", "--device", "cpu")
        self.assertEqual(r.returncode, 2, r.stderr)
        launcher = LAUNCHER_LINE.findall(r.stderr)
        self.assertEqual(len(launcher), 1, r.stderr)
        self.assertRegex(r.stderr, r"(?m)^lmscope launch: rank [01] exited with code 2(; stopped the other ranks)?$")
        # Each rank's own error says whose it is.
        self.assertRegex(r.stderr, r"(?m)^lmscope: rank [01]: error: cannot open token file '/nonexistent'")

    def test_a_killed_rank_stops_the_others_and_is_exit_1(self):
        p = subprocess.Popen([LMSCOPE, "launch", "--nproc", "2", "--", *LONG], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        kids = ranks_of(p, 2)
        time.sleep(0.5)
        os.kill(kids[1], signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("lmscope launch: rank 1 was killed by SIGKILL; stopped the other ranks\n", err)
        self.assertEqual(len(LAUNCHER_LINE.findall(err)), 1, err)
        self.assertTrue(gone(kids[0]))

    def test_sigterm_to_the_launcher_reaches_every_rank(self):
        p = subprocess.Popen([LMSCOPE, "launch", "--nproc", "2", "--", *LONG], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        kids = ranks_of(p, 2)
        # Each rank leads a process group of its own: a terminal's Ctrl-C reaches the launcher alone.
        # (A child seen the instant after its fork may not have its group yet: a moment's grace.)
        deadline = time.monotonic() + 5
        while [os.getpgid(k) for k in kids] != kids and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual([os.getpgid(k) for k in kids], kids)
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        self.assertLess(time.monotonic() - t0, 9, "the ranks waited for SIGKILL")
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("lmscope launch: got SIGTERM; stopping the ranks\n", err)
        self.assertTrue(all(gone(k) for k in kids))

    def test_bad_input_is_one_sentence_and_exit_2(self):
        cases = [
            (["--nproc", "0", "--", "info"], "--nproc"),
            (["--nproc", "2"], "after --"),
            (["--nproc", "2", "--"], "after --"),
            (["--nproc", "2", "--", "launch", "--nproc", "2", "--", "info"], "launch"),
            (["--nproc", "2", "--rendezvous", "nfs:/x", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--rendezvous", "tcp:h:1", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--rendezvous", "file:", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--port", "0", "--", "info"], "--port"),
            (["--nproc", "2", "--port", "65536", "--", "info"], "--port"),
            (["--nproc", "2", "--port", "29500", "--rendezvous", "file:/tmp/r", "--", "info"], "--port"),
            (["--", "info"], "--nproc"),
        ]
        for args, name in cases:
            with self.subTest(args=args):
                r = run("launch", *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
                self.assertTrue(r.stderr.startswith("lmscope: error: "), r.stderr)
                self.assertIn(name, r.stderr)

    @unittest.skipUnless(has_allreduce(), "needs lmscope allreduce")
    def test_a_taken_port_is_named_by_rank_0(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            r = run("launch", "--nproc", "2", "--port", str(port), "--", "allreduce", "--sizes", "1MB", "--backend",
                    "gloo", env={"LMSCOPE_DIST_TIMEOUT": "20"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"rank 0: ", r.stderr)
        self.assertIn(f"cannot listen on 127.0.0.1:{port} for the rendezvous: Address already in use", r.stderr)
        self.assertRegex(r.stderr, r"(?m)^lmscope launch: rank 0 exited with code [12]")
        self.assertEqual(len(LAUNCHER_LINE.findall(r.stderr)), 1, r.stderr)

    @unittest.skipUnless(has_allreduce(), "needs lmscope allreduce")
    def test_ranks_meet_over_tcp_and_files(self):
        with tempfile.TemporaryDirectory() as d:
            for how in ([], ["--rendezvous", f"file:{d}"]):
                with self.subTest(how=how):
                    r = run("launch", "--nproc", "2", *how, "--", "allreduce", "--sizes", "1MB", "--backend", "gloo",
                            env={"LMSCOPE_DIST_TIMEOUT": "30"})
                    self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
