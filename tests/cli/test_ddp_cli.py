"""Data parallelism end to end: two ranks started by `lmscope launch` (on the CPU, Gloo over
loopback) with the global batch split between them give the losses and parameters of one process
with the whole batch, within 1e-6 relative, for every --ddp mode (with either --grad-exchange) and for
--zero 1, 2 and 3, which give DDP's bits where nothing is clipped; a world of one
through the same code path gives that process's bits, in every mode; bad input ends in one sentence
and exit 2. Run by ctest with LMSCOPE pointing at the built program. LMSCOPE_DDP_DEVICE=cuda runs
them on the GPUs through NCCL (scripts/gpu_check.sh --data-parallel), with LMSCOPE_DDP_PRECISION
(default fp32), LMSCOPE_DDP_GRAD_DTYPE (--grad-dtype, default fp32) and LMSCOPE_DDP_STEPS (default 5);
tests of two ranks then need two GPUs. Each comparison
prints how close it came."""
import csv
import json
import os
import shutil
import subprocess
import unittest

import numpy as np

from cli_support import FilesTest, read_safetensors, read_train_log, write_tokens

LMSCOPE = os.environ["LMSCOPE"]
DEVICE = os.environ.get("LMSCOPE_DDP_DEVICE", "cpu")
PRECISION = os.environ.get("LMSCOPE_DDP_PRECISION", "fp32")
STEPS = int(os.environ.get("LMSCOPE_DDP_STEPS", "5"))
GRAD_DTYPE = os.environ.get("LMSCOPE_DDP_GRAD_DTYPE", "fp32")
# How close N ranks come to one process: fp32 1e-6 relative; in bf16 the ranks' GEMMs over half the
# rows round differently from one over all of them, and the difference grows with the steps.
TOLERANCE = 1e-6 if PRECISION == "fp32" else 2e-2
# (--comm-sms: on GPUs the backward's GEMMs are chosen for the SMs the exchange leaves; elsewhere, or
# in a world of one, it changes nothing.)
MODES = (["--ddp", "naive"], ["--ddp", "flat"], ["--ddp", "overlap"], ["--ddp", "bucketed", "--bucket-mb", "0.01"],
         ["--ddp", "bucketed"], ["--ddp", "bucketed", "--symmetric-memory", "off"],
         ["--ddp", "bucketed", "--bucket-mb", "0.01", "--comm-sms", "8"],
         ["--ddp", "bucketed", "--bucket-mb", "0.01", "--grad-exchange", "all-gather"],
         ["--ddp", "naive", "--grad-exchange", "all-gather"])
MODEL = ["--device", DEVICE, "--precision", PRECISION, "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2", "--heads", "2",
         "--grad-dtype", GRAD_DTYPE, "--batch", "4", "--ctx", "16", "--lr", "3e-3", "--print-every", "5"]


def ranks_possible():
    """How many ranks this machine can run: any number of CPU processes, one per GPU."""
    if DEVICE == "cpu":
        return 4
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len(r.stdout.strip().splitlines()) if r.returncode == 0 else 0


TWO_RANKS = unittest.skipUnless(ranks_possible() >= 2, "two ranks need two GPUs")
# More CPU ranks than this machine's cores (four on CI's two) need lmscope launch --oversubscribe.
OVERSUBSCRIBE = ["--oversubscribe"] if DEVICE == "cpu" else []


def run(*args, env=None):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=300, env=env)


def losses(path):
    return [row["loss"] for row in read_train_log(path)]


class TwoRanks(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.data = write_tokens(cls.path("train.bin"), 20000)
        cls.reference = {}

    def train(self, name, *extra, ranks=0, steps=STEPS, batch=None):
        """Trains `name` (one process when ranks is 0, else under lmscope launch), with MODEL's global
        batch unless `batch` is given; returns its losses and parameters."""
        model = list(MODEL)
        if batch is not None:
            model[model.index("--batch") + 1] = str(batch)
        args = ["train", "--data", self.data, *model, "--steps", str(steps), "--log", self.path(name + ".jsonl"),
                "--save", self.path(name + ".safetensors"), *extra]
        r = run("launch", "--nproc", str(ranks), *OVERSUBSCRIBE, "--", *args) if ranks else run(*args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return losses(self.path(name + ".jsonl")), read_safetensors(self.path(name + ".safetensors"))

    def one_process(self, *extra):
        key = tuple(extra)
        if key not in self.reference:
            self.reference[key] = self.train("one" + str(len(self.reference)), *extra)
        return self.reference[key]

    def assertClose(self, got, want, what, steps=STEPS):
        (got_losses, got_params), (want_losses, want_params) = got, want
        self.assertEqual(len(got_losses), steps, what)
        loss_diff = max(abs(g - w) / abs(w) for g, w in zip(got_losses, want_losses))
        self.assertEqual(sorted(got_params), sorted(want_params))
        # The parameters as one vector: AdamW's m/√v turns a last-bit difference in a near-zero
        # gradient into a difference of lr, so single elements are compared only through the whole.
        diff = np.sqrt(sum(np.sum((got_params[n] - w) ** 2) for n, w in want_params.items()))
        size = np.sqrt(sum(np.sum(w ** 2) for w in want_params.values()))
        print(f"\n{what}: losses within {loss_diff:.2e} relative, parameters {diff / size:.2e}", flush=True)
        self.assertLess(loss_diff, TOLERANCE, what)
        self.assertLess(diff / size, TOLERANCE, what)

    @TWO_RANKS
    def test_every_mode_steps_as_one_process_with_the_whole_batch(self):
        reference = self.one_process("--sample", "sequential")
        for mode in (*MODES, ["--zero", "1", "--bucket-mb", "0.01"], ["--zero", "1"], ["--zero", "2", "--bucket-mb", "0.01"],
                     ["--zero", "2"], ["--zero", "3"], ["--zero", "3", "--recompute", "full"]):
            with self.subTest(mode=mode):
                got = self.train("two", "--sample", "sequential", *mode, ranks=2)
                self.assertClose(got, reference, " ".join(mode))
        # The ranks' share of the rows moved: the parameters did not stay where one process leaves them
        # by accident of a tiny learning rate.
        start = self.train("start", "--sample", "sequential", steps=1)[1]
        moved = max(np.abs(reference[1][n] - start[n]).max() for n in start)
        self.assertGreater(moved, 1e-3)

    @TWO_RANKS
    def test_tensor_parallel_steps_as_one_process(self):
        # --tp 2: each rank the whole batch with half the heads and half of d_ff, one all-reduce after
        # each row-split product; clipping on (the norm over the ranks' blocks and the whole weights).
        for mode, like in ((["--tp", "2"], []), (["--tp", "2", "--recompute", "full"], []),
                           (["--tp", "2", "--grad-accum", "2"], ["--grad-accum", "2"]),
                           (["--tp", "2", "--attention", "naive"], ["--attention", "naive"])):
            with self.subTest(mode=mode):
                reference = self.one_process("--sample", "sequential", *like)
                got = self.train("tp", "--sample", "sequential", *mode, ranks=2)
                self.assertClose(got, reference, " ".join(mode))

    @TWO_RANKS
    def test_tensor_parallel_checkpoints_resume_where_they_stopped(self):
        # Rank 0 writes the blocks whole, so the run resumed as saved (taking --tp 2 from the
        # checkpoint) gives the bits of the run never stopped, and one process goes on from it too.
        tp = ["--tp", "2"]
        ref = self.train("tp-whole", "--sample", "sequential", *tp, ranks=2)
        directory = self.path("tp-checkpoints")
        self.train("tp-first", "--sample", "sequential", *tp, "--checkpoint-dir", directory, ranks=2, steps=3)
        name = self.path("tp-resumed")
        shutil.copytree(directory, name)
        r = run("launch", "--nproc", "2", *OVERSUBSCRIBE, "--", "train", "--resume", name, "--steps", str(STEPS),
                "--log", name + ".jsonl", "--save", name + ".safetensors")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("over 2 ranks (TP 2: every row, a part of each layer)", r.stdout)
        self.assertNotIn("parallelism is", r.stdout)
        got = losses(name + ".jsonl"), read_safetensors(name + ".safetensors")
        self.assertEqual(got[0], ref[0][3:])
        for n in ref[1]:
            np.testing.assert_array_equal(got[1][n], ref[1][n])
        alone = self.path("tp-resumed-alone")
        shutil.copytree(directory, alone)
        r = run("train", "--resume", alone, "--steps", str(STEPS), "--log", alone + ".jsonl", "--save",
                alone + ".safetensors")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("note: the parallelism is one process here and was TP 2 in the checkpoint's run", r.stdout)
        got = losses(alone + ".jsonl"), read_safetensors(alone + ".safetensors")
        self.assertClose(got, (ref[0][3:], ref[1]), "--tp 2 resumed in one process", steps=STEPS - 3)

    @unittest.skipUnless(ranks_possible() >= 4, "four ranks need four GPUs")
    def test_four_ranks_sum_the_gathered_gradients_in_rank_order(self):
        # Three additions a gradient, each rank's part read before the running sum can reach it.
        reference = self.one_process("--sample", "sequential")
        for mode in (["--ddp", "bucketed", "--grad-exchange", "all-gather"],
                     ["--ddp", "bucketed", "--grad-exchange", "all-reduce"], ["--zero", "2", "--bucket-mb", "0.01"],
                     ["--zero", "3"]):
            with self.subTest(mode=mode):
                got = self.train("four", "--sample", "sequential", *mode, ranks=4)
                self.assertClose(got, reference, "four ranks " + " ".join(mode))

    @unittest.skipUnless(ranks_possible() >= 3, "three ranks need three GPUs")
    def test_three_ranks_pad_each_bucket_to_a_multiple_of_three(self):
        # 10 KiB buckets of an odd number of elements here and there: each padded with zeros that take
        # part in the reduce-scatter and are never read back.
        reference = self.train("three-one", "--sample", "sequential", batch=6)
        for mode in (["--zero", "1", "--bucket-mb", "0.01"], ["--zero", "2", "--bucket-mb", "0.01"], ["--zero", "3"]):
            with self.subTest(mode=mode):
                got = self.train("three", "--sample", "sequential", *mode, ranks=3, batch=6)
                self.assertClose(got, reference, "three ranks " + " ".join(mode))

    @TWO_RANKS
    def test_zero_gives_the_bits_of_ddp_when_nothing_is_clipped(self):
        # Two ranks' sum is the same in either order, and each rank updates its slice with the
        # elementwise AdamW every rank runs under DDP: the same bits at every step. Clipping reads the
        # global norm, which ZeRO assembles from each rank's slice (a sum in another order, so the last
        # bits of the norm may differ): with it on, ZeRO is within 1e-6 (test_every_mode_...).
        ddp = self.train("bits-ddp", "--sample", "sequential", "--clip", "0", "--ddp", "bucketed", ranks=2)
        for mode in (["--zero", "1", "--bucket-mb", "0.01"], ["--zero", "2", "--bucket-mb", "0.01"], ["--zero", "2"],
                     ["--zero", "3"], ["--zero", "3", "--recompute", "selective"]):
            with self.subTest(mode=mode):
                got = self.train("bits-zero", "--sample", "sequential", "--clip", "0", *mode, ranks=2)
                self.assertEqual(got[0], ddp[0], " ".join(mode))
                for name in ddp[1]:
                    np.testing.assert_array_equal(got[1][name], ddp[1][name], name)

    @TWO_RANKS
    def test_random_batches_and_micro_batches_split_the_same_way(self):
        for extra in (["--sample", "random", "--seed", "3"], ["--grad-accum", "2"]):
            with self.subTest(extra=extra):
                reference = self.one_process(*extra)
                self.assertClose(self.train("two", *extra, "--ddp", "bucketed", "--bucket-mb", "0.01", ranks=2),
                                 reference, " ".join(extra))
                self.assertClose(self.train("gathered", *extra, "--ddp", "bucketed", "--grad-exchange", "all-gather",
                                            ranks=2), reference, "all-gather " + " ".join(extra))
                for stage in (["1", "--bucket-mb", "0.01"], ["2", "--bucket-mb", "0.01"], ["3"]):
                    self.assertClose(self.train("zero", *extra, "--zero", *stage, ranks=2), reference,
                                     "zero " + " ".join(stage + extra))

    def test_a_world_of_one_through_the_same_path_gives_the_same_bits(self):
        # (Device graphs are off with data parallelism: the process it is compared with runs without.)
        losses_one, params_one = self.one_process("--sample", "sequential", "--graphs", "off")
        for mode in MODES:
            with self.subTest(mode=mode):
                got_losses, got_params = self.train("world1", "--sample", "sequential", *mode)
                self.assertEqual(got_losses, losses_one)
                for name in params_one:
                    np.testing.assert_array_equal(got_params[name], params_one[name])

    @TWO_RANKS
    def test_the_held_out_loss_is_one_processs(self):
        val = self.path("val.bin")
        write_tokens(val, 3000, seed=1)
        held_out = ["--val-data", val, "--eval-every", "2", "--eval-batches", "3", "--sample", "sequential"]
        self.train("val1", *held_out)
        self.train("val2", *held_out, "--ddp", "flat", ranks=2)
        # ZeRO-3's gathers, prefetched by the order of the stretches seen before, meet a held-out
        # forward between steps (a stretch that did not come last time: the prefetch is let go).
        self.train("val3", *held_out, "--zero", "3", ranks=2)
        logs = []
        for name in ("val1", "val2", "val3"):
            logs.append([row["val_loss"] for row in read_train_log(self.path(name + ".jsonl")) if "val_loss" in row])
        self.assertEqual(len(logs[0]), STEPS // 2 + STEPS % 2)  # every second step, and the last
        np.testing.assert_allclose(logs[1], logs[0], rtol=TOLERANCE)
        np.testing.assert_allclose(logs[2], logs[0], rtol=TOLERANCE)

    @TWO_RANKS
    def test_checkpoints_of_two_ranks_resume_where_they_stopped(self):
        # ZeRO with 10 KiB buckets: the ranks' parts of the moments cut through parameters, and the
        # checkpoint holds them whole, so a run of another stage, or without sharding, resumes from it
        # too. Resumed without its flags, a run takes its layout from the checkpoint (state.json keeps
        # the RunSpec).
        flat, zero1, zero2 = ["--ddp", "flat"], ["--zero", "1", "--bucket-mb", "0.01"], ["--zero", "2", "--bucket-mb", "0.01"]
        zero3 = ["--zero", "3"]
        words = {"flat": "DDP flat", "1": "ZeRO-1 (0.01 MiB buckets)", "2": "ZeRO-2 (0.01 MiB buckets)",
                 "3": "ZeRO-3"}
        for mode, resumed_as in ((flat, [[], flat]), (zero1, [[], zero1, flat, zero2, zero3]), (zero2, [[], zero1]),
                                 (zero3, [[], flat])):
            tag = mode[1]
            ref = self.train("whole" + tag, "--sample", "sequential", *mode, ranks=2)
            directory = self.path("checkpoints" + tag)
            self.train("first" + tag, "--sample", "sequential", *mode, "--checkpoint-dir", directory, ranks=2, steps=3)
            for again in resumed_as:
                with self.subTest(mode=mode, resumed_as=again):
                    name = self.path(f"resumed-{tag}-{again[1] if again else 'as-saved'}")
                    shutil.copytree(directory, name)  # a resumed run saves into its directory
                    r = run("launch", "--nproc", "2", "--", "train", "--resume", name, "--steps", str(STEPS),
                            *again, "--log", name + ".jsonl", "--save", name + ".safetensors")
                    self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                    self.assertIn(f"rows each, {words[(again or mode)[1]]} over", r.stdout)
                    got = losses(name + ".jsonl"), read_safetensors(name + ".safetensors")
                    if again in ([], mode):  # the same run, stopped and resumed: the same bits
                        self.assertNotIn("data parallelism is", r.stdout)
                        self.assertEqual(got[0], ref[0][3:])
                        for n in ref[1]:
                            np.testing.assert_array_equal(got[1][n], ref[1][n])
                    else:  # another exchange from step 3, said: the sums' order differs
                        self.assertIn(f"note: the data parallelism is {words[again[1]]} here and was {words[tag]} in "
                                      "the checkpoint's run", r.stdout)
                        self.assertClose(got, (ref[0][3:], ref[1]), " ".join(mode + ["resumed as"] + again),
                                         steps=STEPS - 3)
            # One process goes on from the ranks' checkpoint, and says it is one.
            name = self.path(f"resumed-{tag}-alone")
            shutil.copytree(directory, name)
            r = run("train", "--resume", name, "--steps", "4")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("note: the checkpoint's run was on 2 ranks and this one is on 1 rank", r.stdout)
            self.assertIn(f"note: the data parallelism is one process here and was {words[tag]}", r.stdout)

    @TWO_RANKS
    def test_bench_rows_say_the_exchange(self):
        bench = ["bench", *MODEL[:MODEL.index("--lr")], "--steps", "3", "--warmup", "1", "--format", "json"]
        for mode, hidden_possible in ((["--ddp", "naive"], False), (["--ddp", "overlap"], True),
                                      (["--zero", "1"], False)):
            with self.subTest(mode=mode):
                out = self.path("bench.json")
                r = run("launch", "--nproc", "2", "--", *bench, *mode, "--out", out)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertEqual(r.stdout.count("| ok |"), 1, r.stdout)  # rank 0's table only
                self.assertIn("Gradient exchange", r.stdout)
                with open(out) as f:
                    [row] = json.load(f)
                self.assertEqual(row["status"], "ok")
                self.assertEqual(row["data_parallel"]["world_size"], 2)
                # The library that summed, with the version it loaded where it says one (NCCL).
                library = row["data_parallel"]["collectives_library"]
                self.assertRegex(library, r"^nccl \d+\.\d+\.\d+$" if DEVICE == "cuda" else r"^gloo$")
                self.assertIn("| " + library + " |", r.stdout)
                self.assertFalse(row["graphs"])  # op by op with data parallelism, and the row says so
                self.assertGreater(row["ms"]["communication"]["mean"], 0)
                self.assertGreaterEqual(row["ms"]["exchange"]["mean"], 0)
                self.assertTrue(0 <= row["hidden_share"] <= 1)
                if not hidden_possible:  # everything exchanged after the backward
                    self.assertEqual(row["hidden_share"], 0)
        # The CSV of a data-parallel row: as many fields as the header names, the library among them.
        out = self.path("bench.csv")
        r = run("launch", "--nproc", "2", "--", *bench[:-2], "--format", "csv", "--ddp", "bucketed", "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            rows = list(csv.reader(f))
        self.assertEqual(len(rows), 2, rows)
        self.assertEqual(len(rows[1]), len(rows[0]), rows)
        self.assertEqual(dict(zip(*rows))["collectives_library"], library)

    def test_the_dry_run_of_a_rank_shards_the_optimizer_state(self):
        memory = ["memory", "--dry-run", "--device", "cuda", "--model", "xl", "--ctx", "128", "--batch", "4",
                  "--format", "json"]
        state = {}
        for name, extra in (("one", []), ("ddp", ["--world-size", "2"]), ("2 ranks", ["--world-size", "2", "--zero", "1"]),
                            ("4 ranks", ["--world-size", "4", "--zero", "1"]),
                            ("gather", ["--world-size", "2", "--grad-exchange", "all-gather"])):
            r = run(*memory, *extra, "--out", self.path(name + ".json"))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(self.path(name + ".json")) as f:
                [row] = json.load(f)
            state[name] = row["step_start_bytes"], row["peak_by_kind"]["optimizer_state"], row["peak_by_kind"]["gradient"]
        moments = state["one"][1]
        # The all-gather holds every rank's gradients: twice one rank's in a world of two.
        self.assertEqual(state["gather"][2], 2 * state["ddp"][2])
        self.assertEqual(state["ddp"][1], moments)
        for n in (2, 4):  # 1/N of the moments (each bucket padded to N elements: a few bytes more)
            self.assertAlmostEqual(state[f"{n} ranks"][1] / moments, 1 / n, places=3)
            self.assertAlmostEqual((state["one"][0] - state[f"{n} ranks"][0]) / moments, 1 - 1 / n, places=3)
        r = run(*memory, "--world-size", "3", "--zero", "1")
        self.assertEqual(r.returncode, 2)
        self.assertIn("split evenly", r.stderr)
        r = run(memory[0], *memory[2:], "--world-size", "2")  # --world-size without --dry-run
        self.assertEqual(r.returncode, 2)
        self.assertIn("--world-size", r.stderr)

    def test_zero_2_frees_each_bucket_of_gradients_in_the_backward(self):
        # With full recomputation the backward's activations are small, and what a rank holds at its
        # peak is the gradients: all of them under DDP and ZeRO-1 (reduce-scattered by the optimizer),
        # under ZeRO-2 its half of their sums and the buckets still in flight.
        memory = ["memory", "--dry-run", "--device", "cuda", "--model", "xl", "--ctx", "128", "--batch", "4",
                  "--precision", "bf16", "--recompute", "full", "--world-size", "2", "--format", "json"]
        rows = {}
        for stage in ("0", "1", "2"):
            r = run(*memory, "--zero", stage, "--out", self.path(f"stage{stage}.json"))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(self.path(f"stage{stage}.json")) as f:
                [rows[stage]] = json.load(f)
        gradients = rows["0"]["peak_by_kind"]["gradient"]
        self.assertLess(rows["2"]["peak_by_kind"]["gradient"], 0.6 * gradients)
        self.assertLess(rows["2"]["peak_bytes"], rows["1"]["peak_bytes"] - 0.4 * gradients)
        self.assertLess(rows["1"]["peak_bytes"], rows["0"]["peak_bytes"])
        self.assertEqual(rows["2"]["peak_by_kind"]["optimizer_state"], rows["1"]["peak_by_kind"]["optimizer_state"])

    def test_zero_3_keeps_a_shard_of_the_parameters_between_steps(self):
        # Between steps a ZeRO-3 rank of two holds half of the fp32 masters and half of the moments:
        # 1.5 times its moments, beside cuBLASLt's workspace (32 MiB) and a few small buffers. In the
        # step it gathers one stretch at a time, so its peak stays below ZeRO-2's by more than the
        # half of the masters and the bf16 copies it does not keep.
        memory = ["memory", "--dry-run", "--device", "cuda", "--model", "xl", "--ctx", "128", "--batch", "4",
                  "--precision", "bf16", "--world-size", "2", "--format", "json"]
        rows = {}
        for stage in ("2", "3"):
            r = run(*memory, "--zero", stage, "--out", self.path(f"stage{stage}.json"))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(self.path(f"stage{stage}.json")) as f:
                [rows[stage]] = json.load(f)
        moments = rows["3"]["peak_by_kind"]["optimizer_state"]
        self.assertEqual(moments, rows["2"]["peak_by_kind"]["optimizer_state"])
        for held in (rows["3"]["step_start_bytes"], rows["3"]["step_end_bytes"]):
            self.assertLess(abs(held - 1.5 * moments - 32 * 2**20), 2**20, held)
        masters = moments / 2  # a rank's half of the moments holds as many fp32 numbers as all the masters
        self.assertLess(rows["3"]["peak_bytes"], rows["2"]["peak_bytes"] - 0.5 * masters)

    @TWO_RANKS
    def test_a_ranks_dry_run_is_its_record(self):
        # Rank 0's allocator record of one step on two ranks, byte for byte the dry run of a rank of two:
        # ZeRO-2's buckets freed as their reduce-scatters are waited for, in the same order.
        memory = ["memory", "--device", DEVICE, "--precision", PRECISION, "--vocab", "1000", "--d-model", "128",
                  "--d-ff", "256", "--layers", "3", "--heads", "4", "--batch", "4", "--ctx", "32", "--format", "json"]
        keys = ("peak_bytes", "phase_peak_bytes", "held_at_backward_bytes", "peak_by_kind", "peak_by_op",
                "largest_at_peak", "peak_reached", "step_start_bytes")
        for mode in (["--ddp", "bucketed", "--bucket-mb", "0.1"], ["--zero", "1", "--bucket-mb", "0.1"],
                     ["--zero", "2", "--bucket-mb", "0.1"], ["--zero", "2", "--bucket-mb", "0.1", "--grad-accum", "2"],
                     ["--zero", "3"], ["--zero", "3", "--recompute", "selective", "--grad-accum", "2"],
                     ["--tp", "2"], ["--tp", "2", "--recompute", "full"]):
            with self.subTest(mode=mode):
                real, dry = self.path("real.json"), self.path("dry.json")
                r = run("launch", "--nproc", "2", "--", *memory, *mode, "--out", real)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                r = run(*memory, *mode, "--dry-run", "--world-size", "2", "--out", dry)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                with open(real) as f, open(dry) as g:
                    [a], [b] = json.load(f), json.load(g)
                for key in keys:
                    self.assertEqual(a[key], b[key], key)

    def test_bad_input_is_one_sentence_and_exit_2(self):
        base = ["train", "--data", self.data, *MODEL, "--steps", "1"]
        odd = list(base)  # a global batch of 3 on two ranks (two GPUs suffice, where three would be refused)
        odd[odd.index("--batch") + 1] = "3"
        cases = [
            (["launch", "--nproc", "2", "--", *odd], "split evenly"),
            ([*base, "--zero", "1"], "--zero 1"),
            ([*base, "--zero", "2"], "--zero 2 shards the gradients and the optimizer's state across ranks"),
            ([*base, "--zero", "3"], "--zero 3 shards the parameters, gradients and optimizer's state across ranks"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "3", "--bucket-mb", "1"], "--zero 3 exchanges each"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "4"], "--zero takes 0, 1, 2 or 3"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "-1"], "--zero takes 0, 1, 2 or 3"),
            (["bench", "--dry-run", "--device", "cuda", "--precision", "bf16", "--vocab", "50", "--d-model", "32",
              "--d-ff", "64", "--layers", "2", "--heads", "2", "--batch", "4", "--ctx", "16", "--steps", "1",
              "--weight-copies", "resident", "--zero", "3", "--world-size", "2"], "use kept or transient"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "2", "--ddp", "bucketed"], "leave --ddp out"),
            ([*base, "--ddp", "ring"], "unknown --ddp"),
            ([*base, "--ddp", "flat", "--symmetric-memory", "yes"], "unknown --symmetric-memory"),
            ([*base, "--ddp", "flat", "--bucket-mb", "0"], "--bucket-mb"),
            ([*base, "--ddp", "bucketed", "--comm-sms", "-1"], "--comm-sms"),
            ([*base, "--ddp", "flat", "--comm-sms", "8"], "overlap or bucketed"),
            ([*base, "--ddp", "bucketed", "--grad-exchange", "ring"], "unknown --grad-exchange"),
            ([*base, "--ddp", "flat", "--grad-exchange", "all-gather"], "naive, overlap or bucketed"),
            ([*base, "--ddp", "bucketed", "--grad-exchange", "all-gather", "--comm-sms", "8"], "not planned around"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "1", "--grad-exchange", "all-gather"], "its own way"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "1", "--symmetric-memory", "off"], "leave them out"),
            (["launch", "--nproc", "2", "--", *base, "--zero", "1", "--ddp", "flat"], "leave --ddp out"),
            (["bench", *MODEL[:MODEL.index("--lr")], "--steps", "1", "--mode", "forward", "--ddp", "flat"],
             "--mode train or forward-backward"),
            (["bench", *MODEL[:MODEL.index("--lr")], "--steps", "1", "--mode", "forward-backward", "--zero", "1",
              "--world-size", "2", "--dry-run"], "it takes --mode train"),
            ([*base, "--tp", "2"], "--tp 2 splits each projection over 2 ranks, and the world has 1"),
            ([*base, "--tp", "0"], "--tp must be at least 1"),
            (["launch", "--nproc", "2", "--", *base, "--tp", "2", "--zero", "1"], "--tp 2 runs over the whole world"),
            (["memory", *MODEL[:MODEL.index("--lr")], "--dry-run", "--world-size", "3", "--tp", "3"],
             "--tp 3 must divide the model's 2 heads"),
        ]
        for args, words in cases:
            if args[0] == "launch" and ranks_possible() < 2:
                continue  # on one GPU, launch refuses two ranks before the flags are read
            with self.subTest(args=args):
                r = run(*args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(words, r.stderr)
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        env.update(RANK="1", WORLD_SIZE="2")
        r = run(*base, env=env)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("MASTER_ADDR", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
