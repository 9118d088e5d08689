"""--master-dtype bf16 against PyTorch's bf16 model on the GPU: the reference model
(pytorch/cs336_reference.py) cast to bfloat16, as torch_dtype=bfloat16 makes it, trained with
torch.optim.AdamW on its bf16 parameters (so its moments are bf16 too) after clipping the
gradients' norm to 1, against lmscope train with
--precision bf16 --master-dtype bf16, from the same weights on the same batches for 5 steps.

bf16 keeps 8 significant bits (a value's rounding error is up to 2^-9 of it), and two correct bf16
trainings part by a rounding here and there: the losses must agree within 1%, every parameter within
2% (relative error of the tensor), and both must be closer to each other than lmscope's bf16 model
is to the same training with fp32 masters, so the test sees bf16 masters and not mixed precision.

Run on the GPU machine (scripts/gpu_check.sh) with LMSCOPE pointing at the built program; skipped
without a CUDA GPU that PyTorch sees."""
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

LMSCOPE = os.environ.get("LMSCOPE", "build/lmscope")
SHAPE = dict(vocab=512, d_model=256, d_ff=672, layers=3, heads=4, rope_theta=10000.0)
BATCH, CTX, STEPS, LR, WD, CLIP = 4, 128, 5, 3e-3, 0.1, 1.0


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def shape_flags():
    return ["--vocab", str(SHAPE["vocab"]), "--d-model", str(SHAPE["d_model"]), "--d-ff", str(SHAPE["d_ff"]),
            "--layers", str(SHAPE["layers"]), "--heads", str(SHAPE["heads"])]


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA GPU visible to PyTorch")
class MasterBf16Parity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(1234)
        cls.dir = tempfile.TemporaryDirectory()
        cls.weights = os.path.join(cls.dir.name, "init.safetensors")
        cls.data = os.path.join(cls.dir.name, "tokens.bin")
        model = ref.TransformerLM(**SHAPE)
        with torch.no_grad():  # norm weights away from ones, so their updates are generic
            for _, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(0.2 * torch.randn_like(p))
        ref.save_safetensors(cls.weights, model.state_dict())
        rng = np.random.default_rng(7)
        cls.tokens = rng.integers(0, SHAPE["vocab"], size=20000, dtype=np.uint16)
        cls.tokens.tofile(cls.data)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def lmscope_train(self, masters, fusion="on"):
        saved = os.path.join(self.dir.name, f"trained-{masters}-{fusion}.safetensors")
        log = os.path.join(self.dir.name, f"log-{masters}-{fusion}.jsonl")
        subprocess.run([LMSCOPE, "train", *shape_flags(), "--data", self.data, "--init", self.weights, "--save", saved,
                        "--log", log, "--steps", str(STEPS), "--batch", str(BATCH), "--ctx", str(CTX), "--sample",
                        "sequential", "--lr", str(LR), "--weight-decay", str(WD), "--beta1", "0.9", "--beta2", "0.999", "--eps",
                        "1e-8", "--clip", str(CLIP), "--device", "cuda", "--precision",
                        "bf16", "--master-dtype", masters, "--fusion", fusion], check=True, stdout=subprocess.DEVNULL)
        with open(log) as f:
            losses = [row["loss"] for row in map(json.loads, f) if "step" in row]
        return losses, ref.load_safetensors(saved)

    def pytorch_train(self):
        model = ref.TransformerLM(**SHAPE)
        model.load_state_dict(ref.load_safetensors(self.weights))
        model = model.to(device="cuda", dtype=torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
        losses = []
        for it in range(STEPS):
            x, y = ref.sequential_batch(self.tokens, it, BATCH, CTX)
            opt.zero_grad()
            loss = ref.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            losses.append(float(loss.detach()))
        for name, p in model.named_parameters():
            self.assertEqual(p.dtype, torch.bfloat16, name)
            self.assertEqual(opt.state[p]["exp_avg"].dtype, torch.bfloat16, name)
        return losses, {name: p.detach().float().cpu() for name, p in model.named_parameters()}

    def test_five_steps_against_pytorch_bf16(self):
        want_losses, want = self.pytorch_train()
        fp32_losses, fp32_masters = self.lmscope_train("fp32")
        initial = ref.load_safetensors(self.weights)
        print(f"\nlosses: PyTorch bf16 {want_losses}\n        lmscope fp32 masters {fp32_losses}")
        for fusion in ("on", "off"):  # the fused kernels and the unfused ops alike
            got_losses, got = self.lmscope_train("bf16", fusion)
            print(f"        lmscope bf16 masters, fusion {fusion}: {got_losses}")
            self.assertEqual(len(got_losses), STEPS)
            for g, w in zip(got_losses, want_losses):
                self.assertLess(abs(g - w) / w, 1e-2, fusion)
            worst, worst_fp32 = 0.0, 0.0
            for name, w in want.items():
                with self.subTest(param=name, fusion=fusion):
                    self.assertGreater(float((w - initial[name]).norm()), 0, "the parameter must have moved")
                    # What lmscope saved is bf16 values: each one exactly a bf16 number.
                    self.assertTrue(torch.equal(got[name], got[name].bfloat16().float()), "not bf16 values")
                    err, err_fp32 = rel_err(got[name], w), rel_err(fp32_masters[name], w)
                    worst, worst_fp32 = max(worst, err), max(worst_fp32, err_fp32)
                    self.assertLess(err, 2e-2)
            print(f"largest parameter error against PyTorch bf16, fusion {fusion}: bf16 masters {worst:.2e}, "
                  f"fp32 masters {worst_fp32:.2e}")
            self.assertLess(worst, worst_fp32, fusion)


if __name__ == "__main__":
    unittest.main(verbosity=2)
