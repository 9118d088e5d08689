"""lmscope plan, bench --dry-run and info --dry-run end to end: the plan's rows and their
boundaries (the largest context and batch fit, one more does not, by the same dry run `memory`
makes), its formats and bad inputs, and the dry runs of bench and info against memory's.
Run by ctest with LMSCOPE pointing at the built program."""
import csv
import io
import json
import os
import subprocess
import time
import unittest

LMSCOPE = os.environ["LMSCOPE"]
TINY = ["--model", "small", "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2", "--heads", "2",
        "--precision", "fp32"]
LIMIT = ["--memory-limit", "64MiB"]


def run(*args):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=300)


def dry_memory(*args):
    r = run("memory", "--dry-run", "--format", "json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


class Plan(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = run("plan", "--device", "cpu", *TINY, *LIMIT, "--ctx", "64", "--batch", "2", "--format", "json")
        assert r.returncode == 0, r.stderr
        cls.rows = json.loads(r.stdout)

    def test_one_row_per_attention_and_flash_reaches_further(self):
        self.assertEqual([r["attention"] for r in self.rows], ["naive", "flash"])
        naive, flash = self.rows
        for r in self.rows:
            self.assertEqual(r["reference"]["status"], "ok")
            self.assertGreater(r["reference"]["peak_bytes"], 0)
            self.assertGreaterEqual(r["reference"]["device_need_bytes"], r["reference"]["peak_bytes"])
            self.assertLessEqual(r["reference"]["device_need_bytes"], r["memory_limit_bytes"])
            self.assertEqual(r["memory_limit_bytes"], 64 << 20)
            self.assertEqual(r["largest_ctx"] % 128, 0)
            self.assertGreater(r["largest_batch"], 2)
        self.assertGreater(flash["largest_ctx"], naive["largest_ctx"])

    def test_the_largest_fit_and_one_more_does_not(self):
        for r in self.rows:
            cell = ["--device", "cpu", *TINY, *LIMIT, "--attention", r["attention"]]
            t, b = r["largest_ctx"], r["largest_batch"]
            self.assertEqual(dry_memory(*cell, "--batch", "2", "--ctx", str(t))["status"], "ok")
            self.assertTrue(dry_memory(*cell, "--batch", "2", "--ctx", str(t + 128))["status"].startswith("does not"))
            self.assertEqual(dry_memory(*cell, "--batch", str(b), "--ctx", "64")["status"], "ok")
            self.assertTrue(dry_memory(*cell, "--batch", str(b + 1), "--ctx", "64")["status"].startswith("does not"))

    def test_every_preset_for_the_h100_in_seconds(self):
        t0 = time.monotonic()
        r = run("plan", "--precision", "bf16", "--attention", "flash", "--format", "json")
        # Seconds, not minutes: about 0.5 s here, 5-11 s under ASan on a loaded 2-core machine.
        self.assertLess(time.monotonic() - t0, 60)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = {x["model"]["name"]: x for x in json.loads(r.stdout)}
        self.assertEqual(list(rows), ["small", "medium", "large", "xl", "2.7B"])
        # Run for real on the H100 (docs/measurements/2026-11-24-h100-eb849f6/edge-plan-check.md
        # and docs/measurements/2026-11-26-h100-1e168e3/plan-edge-2.7B.md): ctx 2304 ran and 2432 ran
        # out of memory; batch 36 is the plan's answer at ctx 256 (37 at 1e168e3, whose fused step made
        # 24 copies at once, and 37 ran there).
        self.assertEqual(rows["2.7B"]["largest_ctx"], 2304)
        self.assertEqual(rows["2.7B"]["largest_batch"], 36)
        self.assertIn("H100", rows["2.7B"]["device_name"])

    def test_markdown_and_csv(self):
        md = run("plan", "--device", "cpu", *TINY, *LIMIT)
        self.assertEqual(md.returncode, 0, md.stderr)
        self.assertIn("largest ctx (batch 4)", md.stdout)
        self.assertIn("Budget of the dry run of cpu: 0.06 GiB", md.stdout)
        c = run("plan", "--device", "cpu", *TINY, *LIMIT, "--format", "csv", "--recompute", "none,full",
                "--grad-accum", "1,2")
        table = list(csv.reader(io.StringIO(c.stdout)))
        self.assertEqual(len(table), 1 + 8)
        for row in table:
            self.assertEqual(len(row), len(table[0]), row)
        rows = [dict(zip(table[0], row)) for row in table[1:]]
        self.assertEqual({(r["recompute"], r["grad_accum"]) for r in rows},
                         {("none", "1"), ("none", "2"), ("full", "1"), ("full", "2")})
        for r in rows:  # full recompute only ever reaches further
            if r["recompute"] == "full":
                plain = [x for x in rows if x["attention"] == r["attention"] and x["grad_accum"] == r["grad_accum"]
                         and x["recompute"] == "none"][0]
                self.assertGreater(int(r["largest_ctx"]), int(plain["largest_ctx"]))

    def test_bad_inputs_end_in_one_sentence_and_exit_2(self):
        cases = [["--ctx", "128,256"], ["--batch", "1,2"], ["--mode", "train,inference"], ["--ctx-multiple", "0"],
                 ["--memory-limit", "lots"], ["--format", "xml"], ["--precision", "fp64"],
                 ["--out", "/nonexistent/dir/plan.md"]]
        for extra in cases:
            r = run("plan", "--device", "cpu", *TINY, *extra)
            self.assertEqual(r.returncode, 2, (extra, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (extra, r.stderr))


class MemoryDiet(unittest.TestCase):
    def test_recompute_per_layer_and_its_bad_spellings(self):
        # The first layer in full and the second selective peaks below selective, and here below full
        # too: full reruns the last layer first, holding its whole activations beside the first's input,
        # where the mix kept only its selective set (why plan --recommend tries full last).
        rows = [dry_memory("--device", "cpu", *TINY, "--ctx", "64", "--recompute", r)
                for r in ("selective", "full:1+selective", "full")]
        self.assertEqual([row["recompute"] for row in rows], ["selective", "full:1+selective", "full"])
        peaks = [row["peak_bytes"] for row in rows]
        self.assertLess(peaks[1], peaks[0])
        self.assertLess(peaks[1], peaks[2])
        for bad, says in (("full:3+selective", "names the first 3 layers; the model has 2"),
                          ("full:0", "is not a number of layers from 1"), ("full:1+some", "unknown mode 'some'"),
                          ("full:1+full", "say 'full'"), ("most", "unknown --recompute 'most'")):
            for command in ("memory", "bench"):
                r = run(command, "--device", "cpu", *TINY, "--ctx", "64", "--recompute", bad,
                        *(["--dry-run"] if command == "memory" else ["--steps", "1"]))
                self.assertEqual(r.returncode, 2, (command, bad, r.stderr))
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, (command, bad, r.stderr))
                self.assertIn(says, r.stderr, (command, bad))

    def test_bf16_masters_halve_the_static_memory_and_their_bad_settings(self):
        r = run("memory", "--dry-run", "--model", "small", "--precision", "bf16", "--master-dtype", "fp32,bf16",
                "--ctx", "512", "--batch", "4", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        fp32, bf16 = json.loads(r.stdout)
        self.assertEqual((fp32["master_dtype"], bf16["master_dtype"]), ("fp32", "bf16"))
        self.assertEqual(bf16["grad_dtype"], "bf16")  # a bf16 model's gradients
        info = run("info", "--model", "small", "--format", "json")
        self.assertEqual(info.returncode, 0, info.stderr)
        params = json.loads(info.stdout)["parameters"]
        # 2 bytes a weight and 4 for its moments, each tensor rounded up to 256 bytes (one per tensor
        # at most: 3 + 9 * 12 tensors), where fp32 masters hold 4 and 8, and 2 for the copies.
        tensors = 3 + 9 * 12
        self.assertGreaterEqual(bf16["peak_by_kind"]["parameter"], 2 * params)
        self.assertLess(bf16["peak_by_kind"]["parameter"], 2 * params + 256 * tensors)
        self.assertGreaterEqual(bf16["peak_by_kind"]["optimizer_state"], 4 * params)
        self.assertLess(bf16["peak_by_kind"]["optimizer_state"], 4 * params + 512 * tensors)
        self.assertGreaterEqual(fp32["peak_by_kind"]["optimizer_state"], 8 * params)
        self.assertLess(bf16["peak_bytes"], fp32["peak_bytes"])
        # The planner keeps them, and tries no copies (there are none to place).
        r = run("plan", "--recommend", "--model", "small", "--ctx", "1024", "--batch", "4", "--precision", "bf16",
                "--attention", "flash", "--master-dtype", "bf16", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = json.loads(r.stdout)[0]
        self.assertEqual(plan["master_dtype"], "bf16")
        self.assertTrue(plan["candidates"])
        for c in plan["candidates"]:
            self.assertEqual((c["weight_copies"], c["run"]["master_dtype"]), ("kept", "bf16"))
        md = run("plan", "--recommend", "--model", "small", "--ctx", "1024", "--batch", "4", "--precision", "bf16",
                 "--attention", "flash", "--master-dtype", "bf16")
        self.assertIn("bf16 masters", md.stdout)
        self.assertIn("--master-dtype bf16", md.stdout)
        for args, says in ((["memory", "--dry-run", "--master-dtype", "bf16"],
                            "--master-dtype bf16 needs --precision bf16 on --device cuda"),
                           (["bench", "--device", "cpu", "--precision", "bf16", "--master-dtype", "bf16"],
                            "--master-dtype bf16 needs --precision bf16 on --device cuda"),
                           (["memory", "--dry-run", "--master-dtype", "fp8"], "unknown --master-dtype 'fp8'"),
                           (["memory", "--dry-run", "--precision", "bf16", "--master-dtype", "bf16", "--world-size",
                             "2"], "with data parallelism, ZeRO or tensor parallelism it is not yet built"),
                           (["train", "--device", "cpu", "--master-dtype", "bf16", "--precision", "bf16", "--data",
                             "none.bin", "--steps", "1"], "runs on CUDA only")):
            r = run(*args, "--model", "small")
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))
            self.assertIn(says, r.stderr, args)

    def test_recommend_under_tensor_parallelism_gives_every_rank_every_sequence(self):
        # One sequence on two ranks of --tp 2: not split across them, as data parallelism would; and no
        # resident copies (tensor parallelism runs without device graphs).
        r = run("plan", "--recommend", "--model", "small", "--ctx", "1024", "--batch", "1", "--precision", "bf16",
                "--attention", "flash", "--world-size", "2", "--tp", "2", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = json.loads(r.stdout)[0]
        self.assertTrue(plan["candidates"], plan)
        for c in plan["candidates"]:
            self.assertNotEqual(c["weight_copies"], "resident")
            self.assertEqual(c["run"]["tensor_parallel"], 2)
        one = dry_memory("--model", "small", "--ctx", "1024", "--batch", "1", "--precision", "bf16")
        self.assertLess(plan["candidates"][plan["chosen"]]["peak_bytes"], one["peak_bytes"])

    def test_2_7b_trains_at_ctx_4096_within_80_gib_with_full_recompute(self):
        r = run("memory", "--dry-run", "--model", "2.7B", "--ctx", "4096", "--precision", "bf16",
                "--recompute", "none,full", "--memory-limit", "80GiB", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        none, full = json.loads(r.stdout)
        self.assertTrue(none["status"].startswith("does not fit"))
        self.assertEqual(full["status"], "ok")
        need = full["peak_reserved_bytes"] + full["device_memory"]["own_bytes"]
        self.assertLess(need, 80 << 30)
        # Run for real on the H100 (docs/memory.md): 53.03 GiB allocated at the peak, and since then
        # cuBLASLt's 32 MiB workspace in the allocator's record.
        self.assertAlmostEqual(full["peak_bytes"] / 2**30, 53.03 + 1 / 32, delta=0.005)

    def test_transient_copies_hold_at_most_one_layers_copies(self):
        r = run("memory", "--dry-run", "--model", "2.7B", "--ctx", "1024", "--precision", "bf16",
                "--weight-copies", "kept,transient", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        kept, transient = json.loads(r.stdout)
        self.assertEqual((kept["weight_copies"], transient["weight_copies"]), ("kept", "transient"))
        info = run("info", "--model", "2.7B", "--format", "json")
        self.assertEqual(info.returncode, 0, info.stderr)
        info = json.loads(info.stdout)
        m = info["model"]
        layer = 4 * m["d_model"] ** 2 + 3 * m["d_model"] * m["d_ff"]  # one layer's matmul weights
        # The transient step's peak holds the fp32 masters and at most one layer's bf16 copies ...
        self.assertLessEqual(transient["peak_by_kind"]["parameter"], 4 * info["parameters"] + 2 * layer)
        # ... the kept one's every copy but the LM head's and a layer's, which its backward has freed.
        saved = kept["peak_bytes"] - transient["peak_bytes"]
        self.assertGreaterEqual(saved, 2 * (info["matmul_parameters"] - layer - m["vocab"] * m["d_model"]))
        for cmd in (["memory", "--dry-run"], ["info", "--dry-run"]):
            for copies in ("transient", "resident"):
                r = run(*cmd, "--model", "small", "--precision", "fp32", "--weight-copies", copies)
                self.assertEqual(r.returncode, 2, cmd)
                self.assertIn(f"--weight-copies {copies} needs --precision bf16", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_accumulation_holds_one_micro_batch(self):
        rows = {}
        for batch, accum in (("8", "1"), ("2", "4")):
            r = run("memory", "--dry-run", "--model", "medium", "--ctx", "1024", "--batch", batch,
                    "--grad-accum", accum, "--format", "json")
            self.assertEqual(r.returncode, 0, r.stderr)
            rows[accum] = json.loads(r.stdout)[0]
        self.assertEqual(rows["4"]["grad_accum"], 4)
        activations = {k: v["peak_by_kind"]["activation"] for k, v in rows.items()}
        self.assertLess(activations["4"], activations["1"] / 3)


class BenchAndInfoDryRuns(unittest.TestCase):
    def test_bench_dry_run_rows_carry_the_dry_runs_peak(self):
        r = run("bench", "--dry-run", "--device", "cpu", *TINY, "--ctx", "32,64", "--warmup", "1", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = json.loads(r.stdout)
        self.assertEqual(len(rows), 2)
        for row in rows:
            self.assertTrue(row["dry_run"])
            self.assertNotIn("ms", row)
            mem = dry_memory("--device", "cpu", *TINY, "--ctx", str(row["ctx"]), "--warmup", "1")
            self.assertEqual(row["peak_bytes"], mem["peak_bytes"])

    def test_bench_dry_run_says_what_cannot_fit(self):
        r = run("bench", "--dry-run", "--model", "2.7B", "--ctx", "3072", "--precision", "bf16")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("cuda (dry run)", r.stdout)
        self.assertIn("does not fit: needs", r.stdout)

    def test_bench_refuses_what_a_dry_run_cannot_do(self):
        for extra in (["--dry-run", "--profile", "--device", "cuda"], ["--memory-limit", "1GiB"],
                      ["--recompute", "most"], ["--grad-accum", "1,x"], ["--profile", "--device", "cpu"]):
            r = run("bench", *TINY, *extra)
            self.assertEqual(r.returncode, 2, (extra, r.stderr))
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (extra, r.stderr))

    def test_info_dry_run_reports_every_mode(self):
        r = run("info", *TINY, "--ctx", "64", "--dry-run", "--device", "cpu", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        steps = json.loads(r.stdout)["dry_run"]
        self.assertEqual([s["mode"] for s in steps], ["inference", "forward", "forward-backward", "train"])
        mem = dry_memory("--device", "cpu", *TINY, "--ctx", "64", "--batch", "4")
        self.assertEqual(steps[3]["peak_bytes"], mem["peak_bytes"])
        peaks = [s["peak_bytes"] for s in steps]
        self.assertEqual(peaks, sorted(peaks))
        md = run("info", *TINY, "--ctx", "64", "--dry-run", "--device", "cpu")
        self.assertIn("## One step at batch 4, ctx 64", md.stdout)
        self.assertIn("the train step's peak, by kind", md.stdout)
        for extra in (["--memory-limit", "1GiB"], ["--batch", "2"], ["--recompute", "full"], ["--grad-dtype", "bf16"]):
            bad = run("info", *TINY, *extra)
            self.assertEqual(bad.returncode, 2, (extra, bad.stderr))
            self.assertIn("--dry-run", bad.stderr)

    def test_info_dry_run_takes_the_gradients_type(self):
        cell = ["--model", "small", "--ctx", "128", "--precision", "bf16", "--device", "cuda"]
        r = run("info", *cell, "--dry-run", "--grad-dtype", "bf16", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        steps = json.loads(r.stdout)["dry_run"]
        # Modes without a backward have no gradients to type; the others hold bf16 ones, as memory says.
        self.assertEqual([s["grad_dtype"] for s in steps], ["fp32", "fp32", "bf16", "bf16"])
        for step in steps[2:]:
            mem = dry_memory(*cell, "--batch", "4", "--mode", step["mode"], "--grad-dtype", "bf16")
            self.assertEqual(step["peak_bytes"], mem["peak_bytes"])
        fp32 = json.loads(run("info", *cell, "--dry-run", "--format", "json").stdout)["dry_run"]
        self.assertLess(steps[2]["peak_by_kind"]["gradient"], fp32[2]["peak_by_kind"]["gradient"])
        md = run("info", *cell, "--dry-run", "--grad-dtype", "bf16").stdout
        self.assertIn("ctx 128, bf16 with bf16 gradients, flash attention", md)
        bad = run("info", "--model", "small", "--dry-run", "--grad-dtype", "bf16")  # fp32 precision
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertEqual(len(bad.stderr.strip().splitlines()), 1, bad.stderr)
        self.assertIn("--grad-dtype bf16 needs --precision bf16", bad.stderr)

    def test_csv_rows_have_as_many_fields_as_their_header(self):
        for args in (["bench", "--dry-run", "--device", "cpu", *TINY, "--ctx", "16,32", "--mode", "inference,train",
                      "--recompute", "none,full", "--grad-accum", "1,2"],
                     ["memory", "--dry-run", "--device", "cpu", *TINY, "--ctx", "16", "--mode", "inference,train",
                      "--grad-accum", "1,3"],
                     ["memory", "--dry-run", "--device", "cpu", *TINY, "--ctx", "16", "--memory-limit", "1KiB"]):
            r = run(*args, "--format", "csv")
            self.assertEqual(r.returncode, 0, r.stderr)
            table = list(csv.reader(io.StringIO(r.stdout)))
            for row in table[1:]:
                self.assertEqual(len(row), len(table[0]), (args, row))
        # A mode without a backward runs once, not once per --grad-accum.
        modes = [row[table[0].index("mode")] for row in list(csv.reader(io.StringIO(
            run("memory", "--dry-run", "--device", "cpu", *TINY, "--ctx", "16", "--mode", "inference,train",
                "--grad-accum", "1,3", "--format", "csv").stdout)))[1:]]
        self.assertEqual(modes, ["inference", "train", "train"])


class Recommend(unittest.TestCase):
    # A tiny model whose ctx 640 step fits 48 MiB three ways: its first 3 layers recomputed in full and
    # the last selective in one batch, selective in two micro-batches, none in four.
    CELL = ["--device", "cpu", "--model", "small", "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "4",
            "--heads", "2", "--precision", "fp32", "--attention", "naive", "--memory-limit", "48MiB", "--batch", "4"]

    def recommend(self, *args):
        r = run("plan", "--recommend", *self.CELL, "--format", "json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def fits(self, ctx, recompute, accum, micro):
        row = dry_memory(*self.CELL[:-2], "--batch", str(micro), "--ctx", str(ctx), "--recompute", recompute,
                         "--grad-accum", str(accum))
        return row["status"] == "ok", row

    def test_candidates_are_the_least_recomputation_per_split(self):
        (rec,) = self.recommend("--ctx", "640")
        ways = [(c["recompute"], c["grad_accum"], c["micro_batch"]) for c in rec["candidates"]]
        self.assertEqual(ways, [("full:3+selective", 1, 4), ("selective", 2, 2), ("none", 4, 1)])
        self.assertEqual(rec["chosen"], 0)  # not timed: the coarsest split
        self.assertFalse(rec["measured"])
        # The ladder of recomputation the planner climbs over the 4 layers, least first.
        order = ["none", "selective", "full:1+selective", "full:2+selective", "full:3+selective", "full"]
        for c in rec["candidates"]:
            ok, row = self.fits(640, c["recompute"], c["grad_accum"], c["micro_batch"])
            self.assertTrue(ok)
            self.assertEqual(row["peak_bytes"], c["peak_bytes"])
            for less in order[:order.index(c["recompute"])]:  # less recomputation at that split does not fit
                self.assertFalse(self.fits(640, less, c["grad_accum"], c["micro_batch"])[0], less)

    def test_measure_names_the_fastest_candidate(self):
        (rec,) = self.recommend("--ctx", "640", "--measure", "--measure-steps", "2")
        self.assertTrue(rec["measured"])
        times = [c["step_ms"] for c in rec["candidates"]]
        self.assertTrue(all(t is not None and t > 0 for t in times), times)
        self.assertEqual(times[rec["chosen"]], min(times))

    def test_transient_copies_where_they_save_recomputation(self):
        # xl at ctx 4096 on an H100: resident and kept copies need selective recompute or two
        # micro-batches; transient ones fit the plain step, and are named first. Where resident copies
        # fit, kept ones (more work under device graphs, less memory) are no candidate.
        r = run("plan", "--recommend", "--model", "xl", "--precision", "bf16", "--attention", "flash", "--ctx", "4096",
                "--batch", "4", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        (rec,) = json.loads(r.stdout)
        ways = [(c["recompute"], c["weight_copies"], c["grad_accum"]) for c in rec["candidates"]]
        self.assertEqual(ways, [("none", "transient", 1), ("selective", "resident", 1), ("none", "resident", 2)])
        self.assertEqual(rec["chosen"], 0)
        for recompute, copies, accum in ways + [("none", "kept", 1), ("none", "resident", 1)]:
            row = dry_memory("--model", "xl", "--precision", "bf16", "--ctx", "4096", "--batch", str(4 // accum),
                             "--grad-accum", str(accum), "--recompute", recompute, "--weight-copies", copies)
            self.assertEqual(row["status"] == "ok", (recompute, copies, accum) in ways, row["status"])
        # The kept ways of the resident ones fit too, but do more work: no candidates.
        for recompute, accum in (("selective", 1), ("none", 2)):
            row = dry_memory("--model", "xl", "--precision", "bf16", "--ctx", "4096", "--batch", str(4 // accum),
                             "--grad-accum", str(accum), "--recompute", recompute, "--weight-copies", "kept")
            self.assertEqual(row["status"], "ok")
        md = run("plan", "--recommend", "--model", "xl", "--precision", "bf16", "--attention", "flash", "--ctx", "4096",
                 "--batch", "4")
        self.assertIn("`--weight-copies transient`", md.stdout)

    def test_resident_copies_where_they_fit_under_device_graphs(self):
        # Where every way fits the plain step, resident copies are named: the forward casts no copy.
        r = run("plan", "--recommend", "--model", "small", "--precision", "bf16", "--attention", "flash", "--ctx", "256",
                "--batch", "4", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        (rec,) = json.loads(r.stdout)
        self.assertEqual([(c["recompute"], c["weight_copies"], c["grad_accum"]) for c in rec["candidates"]],
                         [("none", "resident", 1)])
        md = run("plan", "--recommend", "--model", "small", "--precision", "bf16", "--attention", "flash", "--ctx",
                 "256", "--batch", "4")
        self.assertIn("`--weight-copies resident`", md.stdout)
        # Without copies (fp32), or without device graphs (data parallelism turns them off), no way is resident.
        for args in (["--precision", "fp32"], ["--precision", "bf16", "--world-size", "2", "--ddp", "bucketed"]):
            r = run("plan", "--recommend", "--model", "small", "--attention", "flash", "--ctx", "256", "--batch", "4",
                    "--format", "json", *args)
            self.assertEqual(r.returncode, 0, r.stderr)
            (rec,) = json.loads(r.stdout)
            self.assertEqual([c["weight_copies"] for c in rec["candidates"]], ["kept"], args)

    def test_what_fits_as_is_and_what_fits_nowhere(self):
        small, huge = self.recommend("--ctx", "64,4096")
        self.assertEqual([(c["recompute"], c["grad_accum"]) for c in small["candidates"]], [("none", 1)])
        self.assertEqual(huge["candidates"], [])
        self.assertIsNone(huge["chosen"])
        md = run("plan", "--recommend", *self.CELL, "--ctx", "64,640,4096")
        self.assertEqual(md.returncode, 0, md.stderr)
        self.assertIn("`(as is)`", md.stdout)
        self.assertIn("`--recompute full:3+selective`", md.stdout)
        self.assertIn("nothing fits", md.stdout)
        self.assertIn("not timed", md.stdout)

    def test_splits_stop_where_the_ranks_cannot_share_a_micro_batch(self):
        # 4 sequences on 2 ranks: micro-batches of 4 and 2, never 1, which the ranks cannot share; a
        # step that fits neither is "nothing fits", not a refusal of the split.
        fits, none = self.recommend("--ctx", "1280,4096", "--world-size", "2", "--zero", "1")
        self.assertEqual([(c["recompute"], c["grad_accum"], c["micro_batch"]) for c in fits["candidates"]],
                         [("full:2+selective", 2, 2)])
        self.assertEqual((none["candidates"], none["failure"], none["chosen"]), ([], None, None))
        # Each candidate carries its whole run as lmscope describes one, the layout over the ranks too.
        (c,) = fits["candidates"]
        self.assertEqual((c["run"]["recompute"], c["run"]["grad_accum"], c["run"]["batch"]), ("full:2+selective", 2, 2))
        self.assertEqual((c["run"]["world_size"], c["run"]["data_parallel"]["zero"]), (2, 1))

    def test_on_ranks_the_zero_stage_is_searched_too(self):
        # Eight layers' gradients outweigh the activations at the backward's end: within 31 MiB a rank
        # of two runs the step whole only under ZeRO-2, which frees each 0.25 MiB bucket of gradients
        # in the backward, where DDP and ZeRO-1 hold them all (with any recomputation).
        cell = ["--device", "cpu", "--vocab", "1000", "--d-model", "128", "--d-ff", "512", "--layers", "8", "--heads", "2",
                "--precision", "fp32", "--attention", "naive", "--batch", "4", "--ctx", "32", "--world-size", "2",
                "--bucket-mb", "0.25", "--memory-limit", "31MiB"]
        r = run("plan", "--recommend", *cell, "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        [rec] = json.loads(r.stdout)
        best = rec["candidates"][rec["chosen"]]
        self.assertEqual((best["zero"], best["recompute"], best["grad_accum"]), (2, "none", 1))
        self.assertEqual(best["run"]["data_parallel"]["zero"], 2)
        for stage in ("0", "1"):
            for recompute in ("none", "full"):
                row = dry_memory(*cell[:-2], "--zero", stage, "--recompute", recompute, "--memory-limit", "31MiB")
                self.assertIn("does not fit", row["status"], (stage, recompute))
        self.assertEqual(dry_memory(*cell, "--zero", "2")["peak_bytes"], best["peak_bytes"])
        md = run("plan", "--recommend", *cell)
        self.assertIn("| no recompute, ZeRO-2, one batch of 4 | `--zero 2` |", md.stdout)
        self.assertIn("and ZeRO stage (from 0 to 3)", md.stdout)

    def test_presets_reshaped_alike_are_one_model(self):
        # plan's default --model is every preset: given every dimension, they are one model, planned once.
        r = run("plan", "--device", "cpu", "--vocab", "50", "--d-model", "32", "--d-ff", "64", "--layers", "2",
                "--heads", "2", "--precision", "fp32", "--attention", "flash", *LIMIT, "--ctx", "64", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([row["model"]["name"] for row in json.loads(r.stdout)], ["custom(d32,ff64,L2,h2)"])

    def test_bad_inputs_end_in_one_sentence(self):
        for args, says in ((["--measure"], "--measure times the candidates of --recommend"),
                           (["--recommend", "--recompute", "full"], "chooses --recompute, --grad-accum and --weight-copies"),
                           (["--recommend", "--weight-copies", "transient"], "and --weight-copies itself"),
                           (["--recommend", "--mode", "inference"], "for steps with a backward"),
                           (["--recommend", "--batch", "2,4"], "takes one --batch"),
                           (["--recommend", "--measure", "--measure-steps", "0"], "--measure-steps must be")):
            r = run("plan", *self.CELL[:-2], *args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(says, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
