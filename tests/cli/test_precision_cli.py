"""lmscope precision end to end: the accumulation experiment equals PyTorch's own sums bit for bit
(the same additions done by torch tensors of each dtype), the dtype table says what the engine holds
under each precision, and bad inputs end in one sentence and exit 2.
Run by ctest with LMSCOPE pointing at the built program."""
import json
import os
import subprocess
import tempfile
import unittest

LMSCOPE = os.environ["LMSCOPE"]


def run(*args):
    return subprocess.run([LMSCOPE, "precision", *args], capture_output=True, text=True, timeout=300)


class Accumulation(unittest.TestCase):
    def test_every_sum_is_what_pytorch_gets(self):
        import torch
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        # The last two round differently straight from double than through fp32, as PyTorch stores them.
        for addend, count in ((0.01, 1000), (0.1, 300), (3e-5, 2000), (1.0004882821813226, 3), (1.0039062509313226, 3)):
            r = run("--study", "accumulation", "--addend", str(addend), "--count", str(count), "--format", "json")
            self.assertEqual(r.returncode, 0, r.stderr)
            results = json.loads(r.stdout)["accumulation"]["results"]
            self.assertEqual(len(results), 5)
            for row in results:
                s = torch.tensor(0, dtype=dtypes[row["accumulator"]])
                x = torch.tensor(addend, dtype=dtypes[row["addend_format"]])
                for _ in range(count):
                    s += x
                with self.subTest(addend=addend, row=row):
                    self.assertEqual(row["sum"], s.item())
                    self.assertEqual(row["addend_stored"], x.item())

    def test_the_seeds_numbers_and_why(self):
        r = run("--study", "accumulation")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| fp16 | fp16 | 0.01000213623 | 9.953125 |", r.stdout)
        self.assertIn("| fp32 | fp16 | 0.01000213623 | 10.00213623 |", r.stdout)
        self.assertIn("from addition 351 on the sum stays at 4", r.stdout)
        r = run("--study", "accumulation", "--addend", "70000", "--count", "2")
        self.assertIn("70000 is past fp16's largest number (65504)", r.stdout)
        r = run("--study", "accumulation", "--addend", "1e-8")
        self.assertIn("so the addend is stored as 0 and adds nothing", r.stdout)


class Dtypes(unittest.TestCase):
    def test_what_stays_fp32_under_bf16_and_fp16(self):
        r = run("--study", "dtypes", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2",
                "--ctx", "32", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors = json.loads(r.stdout)["dtypes"]["tensors"]
        by = {(t["kind"], t["tensor"]): t["dtype"] for t in tensors}
        # Masters, gradients, AdamW's moments, the loss and the norms' statistics stay fp32.
        for key in (("parameter", "layers.{i}.ffn.w1.weight"), ("gradient", "layers.{i}.ffn.w1.weight"),
                    ("optimizer_state", "adamw.m.layers.{i}.ffn.w1.weight"), ("workspace", "loss"),
                    ("activation", "ln1.rstd"), ("activation", "attn.lse")):
            self.assertEqual(by[key], {"fp32": "f32", "tf32": "f32", "bf16": "f32", "fp16": "f32"}, key)
        # The matmuls' inputs and outputs are 16-bit under bf16 and fp16 only, and the weight copies
        # exist only there.
        self.assertEqual(by[("activation", "lm_head.logits")],
                         {"fp32": "f32", "tf32": "f32", "bf16": "bf16", "fp16": "f16"})
        self.assertEqual(by[("parameter", "layers.{i}.ffn.w1.weight (bf16 copy)")], {"bf16": "bf16"})
        self.assertEqual(by[("parameter", "layers.{i}.ffn.w1.weight (f16 copy)")], {"fp16": "f16"})
        for t in tensors:
            self.assertNotIn("16", t["dtype"].get("fp32", ""), t)

    def test_bf16_masters_hold_the_model_in_bf16_and_the_statistics_in_fp32(self):
        r = run("--study", "dtypes", "--d-model", "64", "--d-ff", "128", "--layers", "2", "--heads", "2",
                "--ctx", "32", "--precision", "fp32,bf16", "--master-dtype", "fp32,bf16", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        tensors = json.loads(r.stdout)["dtypes"]["tensors"]
        by = {(t["kind"], t["tensor"]): t["dtype"] for t in tensors}
        masters = "bf16, bf16 masters"  # fp32 has no column with bf16 masters: they need bf16 compute
        for key in (("parameter", "layers.{i}.ffn.w1.weight"), ("gradient", "layers.{i}.ffn.w1.weight"),
                    ("optimizer_state", "adamw.m.layers.{i}.ffn.w1.weight"), ("activation", "attn.residual")):
            self.assertEqual(by[key], {"fp32": "f32", "bf16": "f32", masters: "bf16"}, key)
        for key in (("workspace", "loss"), ("activation", "ln1.rstd"), ("activation", "attn.lse"),
                    ("workspace", "adamw.grad_norm")):
            self.assertEqual(by[key][masters], "f32", key)
        # No copies: the bf16 weights are the masters.
        self.assertNotIn(masters, by[("parameter", "layers.{i}.ffn.w1.weight (bf16 copy)")])

    def test_markdown_and_out_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "p.md")
            r = run("--study", "dtypes", "--precision", "bf16", "--out", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                self.assertEqual(f.read(), r.stdout)
            self.assertIn("| parameter | `lm_head.weight (bf16 copy)` | bf16 |", r.stdout)


class BadInput(unittest.TestCase):
    def test_one_sentence_and_exit_2(self):
        cases = [
            (["--study", "speed"], "unknown --study 'speed'"),
            (["--addend", "0"], "--addend must be a positive, finite number"),
            (["--addend", "1e400"], "--addend takes a finite number"),
            (["--count", "0"], "--count must be between"),
            (["--precision", "fp8"], "unknown --precision 'fp8'"),
            (["--master-dtype", "bf16", "--precision", "fp32,fp16"], "--master-dtype bf16 needs bf16 among --precision"),
            (["--master-dtype", "fp8"], "unknown --master-dtype 'fp8'"),
            (["--format", "csv"], "--format csv is not offered"),
            (["--out", "/nonexistent-dir/p.md"], "/nonexistent-dir/p.md"),
            (["--model", "huge"], "huge"),
        ]
        for args, says in cases:
            r = run(*args)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                lines = r.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertIn(says, lines[0])


if __name__ == "__main__":
    unittest.main()
