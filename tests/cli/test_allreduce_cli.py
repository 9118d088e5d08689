"""lmscope allreduce end to end: two ranks under `lmscope launch` (Gloo over loopback) time each size,
rank 0 alone writes the rows (world 2, positive times, busbw = algbw·2(n−1)/n), a world of one runs
without launch and reports busbw 0, a size no rank can hold becomes an OOM row and the sweep goes on,
and bad input ends in one sentence and exit 2. Run by ctest with LMSCOPE pointing at the built
program."""
import csv
import io
import json
import os
import subprocess
import tempfile
import unittest

LMSCOPE = os.environ["LMSCOPE"]


def run(*args, env=None):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "LMSCOPE_DIST_TIMEOUT": "60", **(env or {})})


def table_rows(markdown):
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return lines[0], lines[2:]


class TwoRanks(unittest.TestCase):
    def test_rows_from_rank_0(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "allreduce.json")
            r = run("launch", "--nproc", "2", "--", "allreduce", "--device", "cpu", "--sizes", "1KB,1MB", "--iters",
                    "3", "--format", "json", "--out", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                rows = json.load(f)
        self.assertEqual([row["bytes"] for row in rows], [1000, 1000000])
        for row in rows:
            with self.subTest(bytes=row["bytes"]):
                self.assertEqual(row["status"], "ok")
                self.assertEqual((row["world"], row["backend"], row["dtype"]), (2, "gloo", "f32"))
                self.assertEqual(row["elements"], row["bytes"] // 4)
                self.assertEqual(row["iters"], 3)
                ms = row["ms"]
                self.assertGreater(ms["mean"], 0)
                self.assertGreaterEqual(ms["std"], 0)
                self.assertLessEqual(ms["min_rank"], ms["mean"] * (1 + 1e-6))
                self.assertGreaterEqual(ms["max_rank"], ms["mean"] * (1 - 1e-6))
                self.assertAlmostEqual(row["algbw_gbs"], row["bytes"] / (ms["mean"] * 1e-3) / 1e9, delta=1e-6 *
                                       row["algbw_gbs"])
                self.assertAlmostEqual(row["busbw_gbs"], row["algbw_gbs"] * 2 * (2 - 1) / 2,
                                       delta=1e-9 + 1e-6 * row["algbw_gbs"])
        # With --out, stdout has the table once (rank 0's) and nothing from rank 1.
        header, body = table_rows(r.stdout)
        self.assertIn("busbw GB/s", header)
        self.assertEqual(len(body), 2, r.stdout)

    def test_markdown_and_csv(self):
        r = run("launch", "--nproc", "2", "--", "allreduce", "--device", "cpu", "--sizes", "4KB,64KiB,1MB", "--iters",
                "2", "--warmup", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        header, body = table_rows(r.stdout)
        self.assertTrue(header.startswith("| size | ranks | backend | mean ms |"), header)
        self.assertEqual(len(body), 3, r.stdout)
        for line, size in zip(body, ("4 KB", "65.536 KB", "1 MB")):
            self.assertTrue(line.startswith(f"| {size} | 2 | gloo | "), line)
            self.assertTrue(line.endswith("| ok |"), line)
        r = run("launch", "--nproc", "2", "--", "allreduce", "--device", "cpu", "--sizes", "8B", "--iters", "2",
                "--format", "csv")
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = csv.DictReader(io.StringIO(r.stdout))
        self.assertEqual((row["bytes"], row["elements"], row["world"], row["status"]), ("8", "2", "2", "ok"))
        self.assertAlmostEqual(float(row["busbw_gbs"]), float(row["algbw_gbs"]), delta=1e-5 * float(row["algbw_gbs"]))

    def test_a_size_no_rank_can_hold_is_a_row(self):
        r = run("launch", "--nproc", "2", "--", "allreduce", "--device", "cpu", "--sizes", "1KB,100000GB,1KB",
                "--iters", "2", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = json.loads(r.stdout)
        self.assertEqual([row["status"][:4] for row in rows], ["ok", "OOM:", "ok"])
        self.assertNotIn("ms", rows[1])


class OneRank(unittest.TestCase):
    def test_a_world_of_one_without_launch(self):
        dist_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")
        env = {k: v for k, v in os.environ.items() if k not in dist_vars}
        r = subprocess.run([LMSCOPE, "allreduce", "--device", "cpu", "--sizes", "1MB", "--iters", "3", "--format",
                            "json"], capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = json.loads(r.stdout)
        self.assertEqual((row["world"], row["backend"], row["status"]), (1, "gloo", "ok"))
        self.assertGreater(row["algbw_gbs"], 0)
        self.assertEqual(row["busbw_gbs"], 0)
        r = subprocess.run([LMSCOPE, "allreduce", "--device", "cpu", "--sizes", "1MB", "--iters", "1"],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("One rank:", r.stdout)


class BadInput(unittest.TestCase):
    def test_one_sentence_and_exit_2(self):
        for args, words in ((["--sizes", "1XB"], "--sizes takes sizes like 1MB"),
                            (["--sizes", "12"], "--sizes takes sizes like 1MB"),
                            (["--sizes", "1MB,3B"], "multiple of 4 bytes"),
                            (["--iters", "0"], "--iters must be positive"),
                            (["--warmup", "-1"], "--warmup must be non-negative"),
                            (["--format", "xml"], "unknown --format 'xml'"),
                            (["--device", "tpu"], "unknown --device 'tpu'"),
                            (["--backend", "mpi"], "unknown --backend 'mpi'"),
                            (["--backend", "nccl", "--device", "cpu"], "runs on --device cuda")):
            with self.subTest(args=args):
                r = run("allreduce", *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith("lmscope: error: "), r.stderr)
                self.assertIn(words, r.stderr)

    def test_under_launch_too(self):
        r = run("launch", "--nproc", "2", "--", "allreduce", "--sizes", "1QB")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--sizes takes sizes like 1MB", r.stderr)


if __name__ == "__main__":
    unittest.main()
