"""lmscope against the PyTorch reference (pytorch/cs336_reference.py) on the CPU, in fp32:
same weights through safetensors, same batches; logits, loss and every gradient must agree,
and so must every parameter after 5 training steps with the assignment's AdamW, clipping and
cosine schedule. Run by ctest with LMSCOPE and PARITY_PROBE pointing at the built programs."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pytorch"))
import cs336_reference as ref  # noqa: E402

LMSCOPE = os.environ["LMSCOPE"]
PROBE = os.environ["PARITY_PROBE"]
SHAPE = dict(vocab=97, d_model=48, d_ff=80, layers=2, heads=4, rope_theta=10000.0)
BATCH, CTX = 3, 16


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def shape_flags():
    return ["--vocab", "97", "--d-model", "48", "--d-ff", "80", "--layers", "2", "--heads", "4"]


class Parity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(1234)
        torch.set_num_threads(2)
        cls.dir = tempfile.TemporaryDirectory()
        cls.weights = os.path.join(cls.dir.name, "init.safetensors")
        cls.data = os.path.join(cls.dir.name, "tokens.bin")
        cls.model = ref.TransformerLM(**SHAPE)
        with torch.no_grad():  # norm weights away from ones, so their gradients are generic
            for name, p in cls.model.named_parameters():
                if p.dim() == 1:
                    p.add_(0.2 * torch.randn_like(p))
        ref.save_safetensors(cls.weights, cls.model.state_dict())
        rng = np.random.default_rng(7)
        cls.tokens = rng.integers(0, SHAPE["vocab"], size=2000, dtype=np.uint16)
        cls.tokens.tofile(cls.data)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_logits_loss_and_gradients(self):
        x, y = ref.sequential_batch(self.tokens, 0, BATCH, CTX)
        self.model.zero_grad()
        logits = self.model(x)
        loss = ref.cross_entropy(logits, y)
        loss.backward()
        names = [n for n, _ in self.model.named_parameters()]
        self.assertEqual(len(names), 3 + 9 * SHAPE["layers"])
        for fusion in ("on", "off"):  # the fused kernels and the unfused ops alike
            out = os.path.join(self.dir.name, f"probe-{fusion}.safetensors")
            subprocess.run([PROBE, *shape_flags(), "--init", self.weights, "--data", self.data, "--out", out,
                            "--batch", str(BATCH), "--ctx", str(CTX), "--fusion", fusion], check=True)
            got = ref.load_safetensors(out)
            self.assertLess(rel_err(got["logits"], logits.detach().reshape(-1, SHAPE["vocab"])), 1e-4)
            self.assertLess(abs(float(got["loss"][0]) - float(loss)) / float(loss), 1e-4)
            for name, p in self.model.named_parameters():
                with self.subTest(grad=name, fusion=fusion):
                    self.assertGreater(float(p.grad.norm()), 0)
                    self.assertLess(rel_err(got["grad." + name], p.grad), 1e-4)

    def test_five_training_steps(self):
        steps, lr, clip = 5, 3e-3, 0.5
        saved = os.path.join(self.dir.name, "trained.safetensors")
        log = os.path.join(self.dir.name, "log.jsonl")
        subprocess.run([LMSCOPE, "train", *shape_flags(), "--data", self.data, "--init", self.weights,
                        "--save", saved, "--log", log, "--steps", str(steps), "--batch", str(BATCH),
                        "--ctx", str(CTX), "--sample", "sequential", "--lr", str(lr), "--lr-schedule", "cosine",
                        "--warmup-iters", "2", "--cosine-iters", "4", "--min-lr", "1e-4", "--clip", str(clip),
                        "--weight-decay", "0.1", "--device", "cpu"], check=True, stdout=subprocess.DEVNULL)
        model = ref.TransformerLM(**SHAPE)
        model.load_state_dict(ref.load_safetensors(self.weights))
        opt = ref.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
        losses, clipped = [], 0
        for it in range(steps):
            x, y = ref.sequential_batch(self.tokens, it, BATCH, CTX)
            opt.zero_grad()
            loss = ref.cross_entropy(model(x), y)
            loss.backward()
            clipped += ref.clip_grad_norm(list(model.parameters()), clip) > clip
            for g in opt.param_groups:
                g["lr"] = ref.cosine_lr(it, lr, 1e-4, 2, 4)
            opt.step()
            losses.append(float(loss))
        self.assertGreater(clipped, 0, "the test must exercise clipping")
        with open(log) as f:
            logged = [row for row in map(json.loads, f) if "step" in row]  # the run's description has none
        self.assertEqual([r["step"] for r in logged], list(range(1, steps + 1)))
        for r, want in zip(logged, losses):
            self.assertLess(abs(r["loss"] - want) / want, 1e-4)
        got = ref.load_safetensors(saved)
        initial = ref.load_safetensors(self.weights)
        for name, p in model.named_parameters():
            with self.subTest(param=name):
                self.assertGreater(float((p.detach() - initial[name]).norm()), 0, "the parameter must have moved")
                self.assertLess(rel_err(got[name], p.detach()), 1e-4)


if __name__ == "__main__":
    unittest.main(verbosity=2)
