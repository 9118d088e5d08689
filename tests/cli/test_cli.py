"""lmscope's command line end to end: the three commands, their output formats, sweeps that
survive failing cells, and every bad input ending in exit code 2 with one sentence.
Run by ctest with LMSCOPE pointing at the built program."""
import csv
import json
import os
import subprocess
import unittest

import numpy as np

from cli_support import FilesTest, read_safetensors, read_train_log, write_safetensors, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
TINY = ["--vocab", "50", "--d-model", "16", "--d-ff", "24", "--layers", "2", "--heads", "2"]


def run(*args):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=300)


class Cli(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = write_tokens(cls.path("tokens.bin"), 4000)

    def assertUserError(self, result, needle):
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, f"one sentence expected, got: {result.stderr!r}")
        self.assertTrue(lines[0].startswith("lmscope: error: "), lines[0])
        self.assertIn(needle, lines[0])

    # --- info ---
    def test_info_json_counts_every_preset(self):
        expected = {"small": 128625408, "medium": 423183360, "large": 969411840, "xl": 1998235200,
                    "2.7B": 3406809600}
        for name, count in expected.items():
            r = run("info", "--model", name, "--format", "json")
            self.assertEqual(r.returncode, 0, r.stderr)
            j = json.loads(r.stdout)
            self.assertIsInstance(j["parameters"], int)
            self.assertEqual(j["parameters"], count)
            self.assertEqual(sum(t["parameters"] for t in j["tensors"]), count)
            self.assertEqual(j["bytes"]["optimizer_state"], 8 * count)
            self.assertGreater(j["flops_per_token"]["train_step"], 6 * count * 0.9)

    def test_info_markdown_and_custom_shape(self):
        r = run("info", *TINY)
        self.assertEqual(r.returncode, 0, r.stderr)
        # 2·50·16 + 2·(4·256 + 3·16·24 + 2·16) + 16
        self.assertIn("Parameters: 6032", r.stdout)
        self.assertIn("| layers.{i}.ffn.w1.weight | [24, 16] |", r.stdout)

    # --- train ---
    def test_train_logs_saves_and_resumes(self):
        log, saved = self.path("log.jsonl"), self.path("w.safetensors")
        r = run("train", *TINY, "--data", self.data, "--steps", "12", "--batch", "4", "--ctx", "16",
                "--lr", "1e-2", "--log", log, "--save", saved, "--print-every", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = read_train_log(log)
        self.assertEqual([x["step"] for x in rows], list(range(1, 13)))
        for key in ("loss", "lr", "grad_norm"):
            self.assertTrue(all(key in x for x in rows))
        self.assertLess(rows[-1]["loss"], rows[0]["loss"])
        self.assertIn("step     12/12", r.stdout)
        r2 = run("train", *TINY, "--data", self.data, "--steps", "1", "--batch", "4", "--ctx", "16",
                 "--init", saved, "--lr", "0")
        self.assertEqual(r2.returncode, 0, r2.stderr)

    def test_train_accumulates_micro_batches_and_recomputes(self):
        # Sequential sampling gives micro-batch k of step s the rows a batch of K·B would have, so
        # --batch 2 --grad-accum 3 trains as --batch 6 does (fp32 on the CPU, up to summation order),
        # and recomputation changes nothing at all.
        logs = {}
        for name, extra in {"whole": ["--batch", "6"], "accumulated": ["--batch", "2", "--grad-accum", "3"],
                            "recomputed": ["--batch", "6", "--recompute", "full"]}.items():
            logs[name] = self.path(f"{name}.jsonl")
            r = run("train", *TINY, "--device", "cpu", "--data", self.data, "--steps", "5", "--ctx", "16",
                    "--lr", "3e-3", "--sample", "sequential", "--log", logs[name], *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
        whole, accumulated, recomputed = (read_train_log(logs[k]) for k in ("whole", "accumulated", "recomputed"))
        self.assertEqual([x["tokens"] for x in accumulated], [x["tokens"] for x in whole])
        for a, w in zip(accumulated, whole):
            self.assertAlmostEqual(a["loss"], w["loss"], delta=1e-5 * w["loss"])
        self.assertEqual([x["loss"] for x in recomputed], [x["loss"] for x in whole])
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--grad-accum", "0"),
                             "--grad-accum")
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--recompute", "most"),
                             "--recompute")

    def test_train_npy_data_and_cosine(self):
        npy = self.path("tokens.npy")
        np.save(npy, np.random.default_rng(1).integers(0, 50, size=1000).astype(np.int64))
        log = self.path("cos.jsonl")
        r = run("train", *TINY, "--data", npy, "--steps", "6", "--batch", "2", "--ctx", "8", "--lr-schedule", "cosine",
                "--warmup-iters", "2", "--cosine-iters", "5", "--lr", "1e-2", "--min-lr", "1e-3", "--log", log)
        self.assertEqual(r.returncode, 0, r.stderr)
        lrs = [x["lr"] for x in read_train_log(log)]
        self.assertAlmostEqual(lrs[0], 0.0)
        self.assertAlmostEqual(lrs[1], 5e-3)
        self.assertAlmostEqual(lrs[2], 1e-2)
        self.assertAlmostEqual(lrs[5], 1e-3)

    # --- bench ---
    def test_bench_sweep_formats_and_failing_cells(self):
        out = self.path("bench.csv")
        r = run("bench", *TINY, "--ctx", "8,16", "--batch", "2", "--mode", "forward,forward-backward,train",
                "--precision", "fp32,bf16", "--warmup", "1", "--steps", "3", "--format", "csv", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 2 * 3 * 2)
        ok = [x for x in rows if x["status"] == "ok"]
        self.assertEqual(len(ok), 6)
        for x in ok:
            self.assertGreater(float(x["step_mean_ms"]), 0)
            self.assertGreater(float(x["tokens_per_s"]), 0)
            self.assertGreater(int(x["peak_bytes"]), 0)
            has_bwd = x["mode"] != "forward"
            self.assertEqual(x["backward_mean_ms"] != "", has_bwd)
            self.assertEqual(x["optimizer_mean_ms"] != "", x["mode"] == "train")
        for x in rows:
            if x["precision"] == "bf16":
                self.assertTrue(x["status"].startswith("unsupported:"), x["status"])
        self.assertIn("| model | device |", r.stdout)  # the table still prints with --out

    def test_bench_json_and_out_of_memory_row(self):
        # A 2-billion-token vocabulary asks for terabytes: that cell is OOM, the next one still runs.
        r = run("bench", "--model", "small", "--vocab", "2000000000", "--d-model", "64", "--heads", "2",
                "--d-ff", "64", "--layers", "1", "--ctx", "8", "--batch", "1", "--warmup", "0", "--steps", "1",
                "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = json.loads(r.stdout)
        self.assertTrue(row["status"].startswith("OOM: asked for"), row["status"])
        r = run("bench", *TINY, "--ctx", "8", "--batch", "1", "--warmup", "0", "--steps", "2", "--device", "cpu,cuda",
                "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = json.loads(r.stdout)
        self.assertEqual(rows[0]["status"], "ok")
        self.assertEqual(set(rows[0]["ms"]), {"forward", "backward", "optimizer", "step"})
        for k in ("mean", "std", "median", "min", "max"):
            self.assertIn(k, rows[0]["ms"]["step"])
        # ok where a GPU is visible, a stated "unsupported" row where none is
        self.assertTrue(rows[1]["status"] == "ok" or rows[1]["status"].startswith("unsupported: "), rows[1]["status"])

    # --- bad input: exit 2, one sentence ---
    def test_empty_values_are_refused(self):
        # Each would otherwise become a value (lr 0, clipping off) or be ignored (no weights saved).
        for flag in ("--lr", "--clip", "--save", "--init", "--checkpoint-dir", "--rendezvous"):
            self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", flag, ""),
                                 f"{flag} was given an empty value")
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--lr="),
                             "--lr was given an empty value")
        self.assertUserError(run("bench", *TINY, "--ctx", ""), "--ctx was given an empty value")

    def test_impossible_configs(self):
        self.assertUserError(run("info", "--d-model", "100", "--heads", "3"), "not divisible by --heads 3")
        self.assertUserError(run("info", "--layers", "-2"), "--layers must be a positive integer")
        self.assertUserError(run("info", "--model", "huge"), "unknown model preset 'huge'")
        self.assertUserError(run("info", "--ctx", "0"), "--ctx must be positive")
        self.assertUserError(run("bench", *TINY, "--ctx", "0"), "--ctx must be positive")
        self.assertUserError(run("bench", *TINY, "--ctx", "12,abc"), "'abc' is not one")
        self.assertUserError(run("bench", *TINY, "--mode", "sideways"), "unknown --mode 'sideways'")
        self.assertUserError(run("bench", *TINY, "--device", "tpu"), "unknown --device 'tpu'")
        self.assertUserError(run("bench", *TINY, "--format", "xml"), "unknown --format 'xml'")
        self.assertUserError(run("bench", *TINY, "--graphs", "maybe"), "unknown --graphs 'maybe'")
        self.assertUserError(run("bench", *TINY, "--fusion", "on,of"), "unknown --fusion 'of'")
        self.assertUserError(run("bench", *TINY, "--device", "cpu", "--profile"), "it needs --device cuda")
        self.assertUserError(run("bench", "--no-such-flag"), "no-such-flag")
        self.assertUserError(run("frobnicate"), "unknown command 'frobnicate'")
        self.assertUserError(run(), "a command is required")
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--batch", "-1"),
                             "--batch must be positive")
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--device", "cpu",
                                 "--precision", "tf32"), "the CPU backend computes in fp32 only")
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--precision", "fp8"),
                             "unknown --precision 'fp8'")

    def test_bad_data(self):
        big = self.path("big_ids.npy")
        np.save(big, np.array([1, 2, 3, 77, 4] * 20, dtype=np.int32))
        self.assertUserError(run("train", *TINY, "--data", big, "--steps", "1", "--ctx", "4"),
                             "token id 77 at position 3")
        short = self.path("short.bin")
        np.arange(10, dtype=np.uint16).tofile(short)
        self.assertUserError(run("train", *TINY, "--data", short, "--steps", "1", "--ctx", "16"),
                             "fewer than one window")
        self.assertUserError(run("train", *TINY, "--data", self.path("absent.bin"), "--steps", "1"), "cannot open")

    def test_bad_weights(self):
        good = self.path("good.safetensors")
        r = run("train", *TINY, "--data", self.data, "--steps", "0", "--save", good)
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors = read_safetensors(good)

        def train_from(name, ts, dtype="F32"):
            p = self.path(name)
            write_safetensors(p, ts, dtype)
            return run("train", *TINY, "--data", self.data, "--steps", "1", "--ctx", "8", "--init", p)

        missing = dict(tensors)
        del missing["ln_final.weight"]
        self.assertUserError(train_from("missing.st", missing), "lacks tensor 'ln_final.weight'")
        self.assertUserError(train_from("extra.st", {**tensors, "bias": np.zeros(3)}), "holds tensor 'bias'")
        bad_shape = {**tensors, "lm_head.weight": np.zeros((16, 50))}
        self.assertUserError(train_from("shape.st", bad_shape), "has shape [16, 50], but the model needs [50, 16]")
        self.assertUserError(train_from("dtype.st", tensors, "I64"), "must be F32, F64, BF16 or F16")
        trunc = self.path("trunc.st")
        with open(good, "rb") as f:
            raw = f.read()
        with open(trunc, "wb") as f:
            f.write(raw[: len(raw) - 100])
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--init", trunc), "truncated")


    # --- attention ---
    def test_attention_benchmark_measures_what_it_saves(self):
        out = self.path("attn.json")
        r = run("attention", "--device", "cpu", "--precision", "fp32", "--seq", "64,200", "--d", "16",
                "--batch", "2", "--iters", "3", "--warmup", "1", "--format", "json", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = json.load(open(out))
        self.assertEqual([(x["attention"], x["seq"]) for x in rows],
                         [("naive", 64), ("flash", 64), ("naive", 200), ("flash", 200)])
        for x in rows:
            self.assertEqual(x["status"], "ok")
            self.assertEqual(x["ms"]["forward"]["n"], 3)
            b = x["bytes"]
            # measured (rounded to 256-byte blocks) against the formula: O plus P (naive) or L (flash)
            self.assertLess(abs(b["saved_for_backward"] - b["saved_for_backward_formula"]), 3 * 256)
            self.assertGreater(x["tflops"]["forward_backward"], 0)
            self.assertTrue(x["deterministic"])  # the CPU sums dq in one order, whatever was asked
        naive, flash = rows[2]["bytes"]["saved_for_backward"], rows[3]["bytes"]["saved_for_backward"]
        self.assertGreater(naive, 8 * flash)  # T² against T at T = 200
        bf16 = run("attention", "--device", "cpu", "--precision", "bf16", "--seq", "64", "--d", "16", "--iters", "1")
        self.assertEqual(bf16.returncode, 0, bf16.stderr)
        self.assertIn("unsupported", bf16.stdout)

    def test_attention_choice_everywhere(self):
        for attention in ("naive", "flash"):
            r = run("bench", *TINY, "--device", "cpu", "--ctx", "33", "--steps", "2", "--warmup", "0",
                    "--attention", attention, "--format", "csv")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f",{attention},", r.stdout)
        info = json.loads(run("info", "--model", "small", "--ctx", "1024", "--attention", "naive", "--format", "json").stdout)
        self.assertEqual(info["attention"]["saved_bytes_per_sequence_fp32"], 12 * 12 * 1024 * 1024 * 4)
        self.assertUserError(run("bench", *TINY, "--attention", "fast"), "unknown attention 'fast'")
        self.assertUserError(run("train", *TINY, "--data", self.data, "--steps", "1", "--attention", "fast"), "unknown attention")
        self.assertUserError(run("attention", "--suite", "huge"), "unknown --suite 'huge'")
        self.assertUserError(run("attention", "--precision", "tf32"), "unknown --precision 'tf32'")
        self.assertUserError(run("attention", "--seq", "0"), "--seq must be positive")
        self.assertUserError(run("attention", "--deterministic", "--atomic-dq"), "--deterministic excludes --atomic-dq")


if __name__ == "__main__":
    unittest.main(verbosity=2)
