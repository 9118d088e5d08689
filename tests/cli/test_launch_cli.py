"""lmscope launch end to end: N ranks of a command, each told its rank; the first rank to fail named
in one line with the launcher's exit code following it (2 for a user error, 1 otherwise); signals to
the launcher reaching the ranks, also while they start; a rank's own stop on a signal followed by the
others and the launcher; no more ranks than cores or GPUs; a taken port; two nodes on one host;
bad input. Run by ctest with
LMSCOPE pointing at the built program."""
import array
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from cli_support import free_port, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
TINY = ["--model", "small", "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2", "--heads", "2"]
# A rank that runs until stopped: CPU steps of a tiny model (data parallel: one row per rank).
LONG = ["bench", "--device", "cpu", *TINY, "--ctx", "16", "--batch", "2", "--warmup", "0", "--steps", "1000000"]
# The launcher's own lines, less what it reads from the ranks' flight records after a failure: whether
# a rank saw its collective fail before it was stopped is a race, and either ending is right.
LAUNCHER_LINE = re.compile(r"^lmscope launch: (?!ranks? [\d, and]+ (saw |left no record|never entered)|"
                           r"still waiting in |ranks \d+ and \d+ called different|the ranks' flight records are in)",
                           re.M)
CORES = len(os.sched_getaffinity(0))


def run(*args, env=None):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def has_allreduce():
    return run("allreduce", "--help").returncode == 0


def catches(pid, sig, timeout=30):
    """Waits until process pid has a handler of its own for sig (its SigCgt mask in /proc): a signal sent
    before that ends it by the signal's default action, which a loaded machine's slow start makes a race."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        if caught >> (sig - 1) & 1:
            return True
        time.sleep(0.02)
    return False


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
            r = run("launch", "--nproc", "3", "--oversubscribe", "--rendezvous", f"file:{d}/r", "--", "info", *TINY)
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
        # SIGKILL is what the kernel's out-of-memory killer sends, and it leaves the launcher no other trace.
        self.assertIn("lmscope launch: rank 1 was killed by SIGKILL (perhaps by the kernel's out-of-memory killer: "
                      "see dmesg or journalctl -k, where readable); stopped the other ranks\n", err)
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

    def test_a_bench_rank_stopped_by_its_own_signal_has_the_others_stopped(self):
        # train's ranks agree on a step to stop after; bench's others would wait for the stopped one in
        # their next collective, so the launcher stops them and ends with the signal's code.
        p = subprocess.Popen([LMSCOPE, "launch", "--nproc", "2", "--", *LONG], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        kids = ranks_of(p, 2)
        self.assertTrue(catches(kids[1], signal.SIGINT), "rank 1 never took SIGINT over")
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(kids[1], signal.SIGINT)
        _, err = p.communicate(timeout=60)
        self.assertLess(time.monotonic() - t0, 9, err)
        self.assertEqual(p.returncode, 128 + signal.SIGINT, err)
        self.assertIn("lmscope launch: rank 1 stopped on SIGINT; stopped the other ranks\n", err)
        self.assertNotIn("the same step", err)
        self.assertTrue(all(gone(k) for k in kids))

    def test_two_nodes_on_one_host_train_as_one_node_of_two_ranks(self):
        # Each "node" a launch of one rank, meeting at node 0's address and port: the same weights, bit
        # for bit, as one launch of two ranks, and only rank 0 (on node 0) speaks.
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "tok.bin")
            write_tokens(data, 4000, vocab=300)
            train = ["train", "--device", "cpu", "--d-model", "32", "--d-ff", "64", "--layers", "2", "--heads", "2",
                     "--vocab", "300", "--ctx", "16", "--batch", "4", "--data", data, "--steps", "4", "--sample",
                     "sequential"]
            one = run("launch", "--nproc", "2", "--oversubscribe", "--", *train, "--save", os.path.join(d, "one.st"))
            self.assertEqual(one.returncode, 0, one.stderr)
            port = str(free_port())
            nodes = [subprocess.Popen([LMSCOPE, "launch", "--nproc", "1", "--nnodes", "2", "--node-rank", str(n),
                                       "--master-addr", "127.0.0.1", "--port", port, "--", *train,
                                       *(["--save", os.path.join(d, "two.st")] if n == 0 else [])],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (1, 0)]
            outs = [p.communicate(timeout=120) for p in nodes]
            for p, (out, err) in zip(nodes, outs):
                self.assertEqual(p.returncode, 0, err)
            self.assertIn("over 2 ranks", outs[1][0])
            self.assertEqual(outs[0][0], "")  # node 1's rank 1 prints nothing
            with open(os.path.join(d, "one.st"), "rb") as a, open(os.path.join(d, "two.st"), "rb") as b:
                self.assertEqual(a.read(), b.read())

    def test_bad_input_is_one_sentence_and_exit_2(self):
        cases = [
            (["--nproc", "0", "--", "info"], "--nproc"),
            (["--nproc", "2"], "after --"),
            (["--nproc", "2", "--"], "after --"),
            (["--nproc", "2", "--", "launch", "--nproc", "2", "--", "info"], "launch"),
            (["--nproc", "2", "--rendezvous", "nfs:/x", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--rendezvous", "tcp:h", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--rendezvous", "tcp:h:0", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--port", "29500", "--rendezvous", "tcp:127.0.0.1:29500", "--", "info"], "--port"),
            (["--nproc", "2", "--max-restarts", "-1", "--", "info"], "--max-restarts"),
            # No more CPU ranks than cores (--oversubscribe: a few a core), nor GPU ranks than GPUs.
            (["--nproc", "1000000000", "--", "info"], "--nproc"),
            (["--nproc", "1000000000", "--oversubscribe", "--", "bench", "--device", "cpu"], "--nproc"),
            (["--nproc", str(CORES + 1), "--", "bench", "--device", "cpu"], "--oversubscribe"),
            (["--nproc", "2", "--rendezvous", "file:", "--", "info"], "--rendezvous"),
            (["--nproc", "2", "--port", "0", "--", "info"], "--port"),
            (["--nproc", "2", "--port", "65536", "--", "info"], "--port"),
            (["--nproc", "2", "--port", "29500", "--rendezvous", "file:/tmp/r", "--", "info"], "--port"),
            (["--", "info"], "--nproc"),
            # Several nodes meet at node 0's address and a port every node is told.
            (["--nproc", "1", "--nnodes", "0", "--", "info"], "--nnodes"),
            (["--nproc", "1", "--nnodes", "2", "--", "info"], "--master-addr and --port"),
            (["--nproc", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--", "info"], "--master-addr and --port"),
            (["--nproc", "1", "--nnodes", "2", "--node-rank", "2", "--", "info"], "--node-rank"),
            (["--nproc", "1", "--node-rank", "1", "--", "info"], "--node-rank"),
            (["--nproc", "1", "--nnodes", "2", "--rendezvous", "file:/tmp/r", "--", "info"], "--rendezvous"),
            (["--nproc", "1", "--master-addr", "h", "--rendezvous", "file:/tmp/r", "--", "info"], "--master-addr"),
            (["--nproc", "1", "--master-addr", "a b", "--", "info"], "--master-addr"),
            (["--nproc", "2", "--nnodes", "1000000", "--", "info"], "--nnodes"),
            (["--nproc", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--port", "29500", "--max-restarts", "1",
              "--", "info"], "--max-restarts"),
        ]
        for args, name in cases:
            with self.subTest(args=args):
                r = run("launch", *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
                self.assertTrue(r.stderr.startswith("lmscope: error: "), r.stderr)
                self.assertIn(name, r.stderr)

    def test_a_signal_while_the_ranks_start_starts_no_further_rank(self):
        # SIGTERM sent before the launcher could look (it starts with SIGTERM blocked, so the signal
        # waits for it): the launcher sees it before its first rank, starts none and ends at once.
        block = lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        t0 = time.monotonic()
        p = subprocess.Popen([LMSCOPE, "launch", "--nproc", "2", "--", "info", *TINY], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=block)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        self.assertLess(time.monotonic() - t0, 5, err)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertEqual(err, "lmscope launch: got SIGTERM; stopping the ranks\n")
        self.assertNotIn("Parameters: ", out)

    def test_sighup_to_the_launcher_stops_training_with_its_checkpoint(self):
        with tempfile.TemporaryDirectory() as d:
            p, kids = self.long_training(d)
            p.send_signal(signal.SIGHUP)
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 128 + signal.SIGHUP, err)
            self.assertIn("lmscope launch: got SIGHUP; stopping the ranks\n", err)
            self.assertRegex(out, r"stopped by SIGHUP after step \d+; resume with --resume")
            self.assertTrue(any(n.startswith("step-") for n in os.listdir(os.path.join(d, "ck"))))
            self.assertTrue(all(gone(k) for k in kids))

    def test_sigint_to_one_rank_stops_every_rank_and_the_launcher_as_they_did(self):
        # Every rank says the signal one of them got, and the launcher exits as they did: 128 + SIGINT,
        # which is neither success (the run did not finish) nor a failure to restart from.
        with tempfile.TemporaryDirectory() as d:
            p, kids = self.long_training(d)
            os.kill(kids[1], signal.SIGINT)
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 128 + signal.SIGINT, err)
            self.assertRegex(out, r"stopped by SIGINT after step \d+; resume with --resume")
            self.assertRegex(err, r"(?m)^lmscope launch: rank [01] stopped on SIGINT")
            self.assertEqual(len(LAUNCHER_LINE.findall(err)), 1, err)
            self.assertTrue(any(n.startswith("step-") for n in os.listdir(os.path.join(d, "ck"))))

    def long_training(self, d):
        """Two ranks training until stopped, with checkpoints in d/ck; the launcher and its ranks once
        the first step is logged."""
        tokens = os.path.join(d, "tokens.bin")
        with open(tokens, "wb") as f:
            array.array("H", [i % 50 for i in range(20000)]).tofile(f)
        log = os.path.join(d, "log.jsonl")
        p = subprocess.Popen([LMSCOPE, "launch", "--nproc", "2", "--", "train", "--device", "cpu", *TINY, "--ctx", "16",
                              "--batch", "2", "--data", tokens, "--steps", "1000000", "--checkpoint-dir",
                              os.path.join(d, "ck"), "--log", log], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        kids = ranks_of(p, 2)
        # The log's first line describes the run and comes before the first step: wait for a step's line,
        # by which every rank has taken the stop signals over.
        deadline = time.monotonic() + 60
        def stepped():
            if not os.path.exists(log):
                return False
            with open(log) as f:
                return '{"step":' in f.read()
        while not stepped() and time.monotonic() < deadline:
            time.sleep(0.02)
        return p, kids

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
            port = socket.socket()
            port.bind(("127.0.0.1", 0))
            tcp = f"tcp:127.0.0.1:{port.getsockname()[1]}"
            port.close()
            for how in ([], ["--rendezvous", f"file:{d}"], ["--rendezvous", tcp]):
                with self.subTest(how=how):
                    r = run("launch", "--nproc", "2", *how, "--", "allreduce", "--sizes", "1MB", "--backend", "gloo",
                            env={"LMSCOPE_DIST_TIMEOUT": "30"})
                    self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
