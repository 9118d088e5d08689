"""bench --trace end to end on the CPU: the file follows the trace-event format's rules as the viewers
(ui.perfetto.dev, chrome://tracing) read it: complete events with times and durations, nested on
their thread; every measured step holds its phases, every phase its layers and ops; the memory
counters agree with the allocator's own peak; on CUDA every kernel sits on its stream's track with an
arrow from the host call that launched it. Bad inputs end in one sentence and exit 2.
Run by ctest with LMSCOPE pointing at the built program; LMSCOPE_TRACE_DEVICE=cuda runs it on the GPU."""
import json
import os
import subprocess
import tempfile
import unittest

LMSCOPE = os.environ["LMSCOPE"]
DEVICE = os.environ.get("LMSCOPE_TRACE_DEVICE", "cpu")
LAYERS = 2
CELL = ["bench", "--device", DEVICE, "--model", "small", "--layers", str(LAYERS), "--vocab", "256", "--d-model", "64",
        "--d-ff", "128", "--heads", "2", "--batch", "2", "--ctx", "32", "--warmup", "1"]


def run(*args):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=300)


class Trace(unittest.TestCase):
    def traced(self, *extra, steps=3):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            r = run(*CELL, "--steps", str(steps), "--format", "json", "--trace", path, *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(path) as f:
                return json.load(f), json.loads(r.stdout)[0]

    def host(self, events):
        """The host thread's (pid, tid), named "host"."""
        (track,) = [(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
                    and e["args"]["name"] == "host"]
        return track

    def nested(self, events):
        """Complete events of the host thread, each inside the one open when it began (the viewers' rule)."""
        pid, tid = self.host(events)
        xs = sorted((e for e in events if e["ph"] == "X" and e["pid"] == pid and e["tid"] == tid),
                    key=lambda e: (e["ts"], -e["dur"]))
        stack, parent = [], {}
        for e in xs:
            self.assertGreaterEqual(e["dur"], 0, e)
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                outer = stack[-1]
                self.assertLessEqual(e["ts"] + e["dur"], outer["ts"] + outer["dur"], (e, outer))
                parent[id(e)] = outer
            stack.append(e)
        return xs, parent

    def test_steps_phases_layers_and_ops_nest(self):
        trace, row = self.traced()
        events = trace["traceEvents"]
        names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M" and "name" in e["args"]}
        self.assertIn(("thread_name", "host"), names)
        self.assertTrue(any(n == "process_name" and "lmscope bench" in v for n, v in names))
        xs, parent = self.nested(events)
        steps = [e for e in xs if e["cat"] == "step"]
        self.assertEqual([e["name"] for e in steps], ["step 0", "step 1", "step 2"])
        levels = {"phase": "step", "layer": "phase", "op": ("layer", "phase")}
        for e in xs:
            if e["cat"] in levels:
                self.assertIn(parent[id(e)]["cat"], levels[e["cat"]], e)
        for s in steps:
            inside = [e for e in xs if e["cat"] == "phase" and parent[id(e)] is s]
            self.assertEqual([e["name"] for e in inside], ["forward", "backward", "optimizer"])
        layers = [e for e in xs if e["cat"] == "layer"]
        self.assertEqual(len(layers), 3 * 2 * LAYERS)  # forward and backward of each, every step
        ops = [e for e in xs if e["cat"] == "op"]
        self.assertIn("attention", {e["name"] for e in ops})
        self.assertEqual(len([e for e in ops if e["name"] == "attention"]), 3 * 2 * LAYERS)

    def test_memory_counters_agree_with_the_allocator(self):
        trace, row = self.traced()
        allocated = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "allocated"]
        reserved = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "reserved"]
        self.assertGreater(len(allocated), 10)
        values = [e["args"]["bytes"] for e in allocated]
        self.assertTrue(all(v >= 0 for v in values))
        self.assertEqual(max(values), row["peak_bytes"])  # the steady step reaches the run's peak
        self.assertEqual(values[0], values[-1])  # a train step gives back all it takes
        self.assertGreaterEqual(min(e["args"]["bytes"] for e in reserved), max(values))

    def device_work(self, *extra):
        """The device's work of a traced cell, each checked on its stream track with an arrow from the host
        call that launched it; returns the work, the launches by correlation id and the host ranges' parents."""
        trace, _ = self.traced(*extra)
        events = trace["traceEvents"]
        xs, parent = self.nested(events)
        work = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memset", "gpu_memcpy")]
        if DEVICE == "cpu":
            self.assertEqual(work, [])
            self.assertEqual([e for e in xs if e["cat"].startswith("cuda_")], [])
            return None
        self.assertGreater(len(work), 50)
        streams = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        launches = {e["args"]["correlation"]: e for e in xs if e["cat"] in ("cuda_runtime", "cuda_driver")}
        starts = {e["id"]: e for e in events if e["ph"] == "s"}
        heads = {(e["pid"], e["tid"], e["ts"]): e for e in events if e["ph"] == "f"}
        self.assertEqual(len(starts), len([e for e in events if e["ph"] == "s"]), "a flow id used twice")
        self.assertEqual(len(heads), len(work))  # one arrow per kernel, memset and memcpy
        for k in work:
            self.assertIn((k["pid"], k["tid"]), streams)
            launch = launches[k["args"]["correlation"]]
            self.assertLessEqual(launch["ts"], k["ts"])
            head = heads[(k["pid"], k["tid"], k["ts"])]  # the arrow ends at the kernel...
            self.assertEqual(starts[head["id"]]["ts"], launch["ts"])  # ...and starts at its launch
            # Every launch of the measured steps is made inside one of the model's or runner's ranges.
            self.assertIn(parent[id(launch)]["cat"], ("step", "phase", "layer", "op"))
        return work, launches, parent

    def test_device_work_is_on_stream_tracks_with_arrows_from_its_launch(self):
        seen = self.device_work("--graphs", "off")
        if seen is None:
            return
        work, launches, parent = seen
        attention = [k for k in work if k["args"].get("category") == "attention"]
        self.assertTrue(attention)
        for k in attention:  # launched by the attention op, forward or backward
            op = parent[id(launches[k["args"]["correlation"]])]
            self.assertEqual(op["name"], "attention", op)

    def test_graph_replays_are_launched_by_their_phase(self):
        seen = self.device_work("--graphs", "on")
        if seen is None:
            return
        work, launches, parent = seen
        replayed = [k for k in work if launches[k["args"]["correlation"]]["name"] == "cudaGraphLaunch"]
        # The measured steps replay graphs recorded in the warm-up: one launch per phase a step.
        self.assertGreater(len(replayed), 0.9 * len(work))
        graph_launches = {k["args"]["correlation"] for k in replayed}
        self.assertEqual(len(graph_launches), 3 * 3)
        for k in replayed:
            phase = parent[id(launches[k["args"]["correlation"]])]
            self.assertEqual(phase["cat"], "phase", phase)
            self.assertEqual(k["args"]["phase"], phase["name"])
        self.assertIn("attention", {k["args"].get("category") for k in replayed})

    def test_micro_batches_each_have_their_phases(self):
        trace, _ = self.traced("--grad-accum", "2", steps=1)
        xs, parent = self.nested(trace["traceEvents"])
        self.assertEqual([e["name"] for e in xs if e["cat"] == "phase"],
                         ["forward", "backward", "forward", "backward", "optimizer"])

    def test_train_traces_its_first_steps_and_goes_on(self):
        import numpy as np
        with tempfile.TemporaryDirectory() as d:
            data, val, path = (os.path.join(d, n) for n in ("t.bin", "v.bin", "t.json"))
            rng = np.random.default_rng(0)
            rng.integers(0, 256, size=5000, dtype=np.uint16).tofile(data)
            rng.integers(0, 256, size=2000, dtype=np.uint16).tofile(val)
            r = run("train", "--device", DEVICE, *CELL[5:15], "--batch", "2", "--ctx", "32", "--data", data,
                    "--val-data", val, "--eval-every", "1", "--eval-batches", "1", "--checkpoint-dir",
                    os.path.join(d, "ck"), "--save-every", "1", "--steps", "5", "--trace", path, "--trace-steps", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"wrote the trace of steps 1 to 2 to '{path}'", r.stdout)
            self.assertIn("step      5/5", r.stdout)
            with open(path) as f:
                trace = json.load(f)
        xs, parent = self.nested(trace["traceEvents"])
        self.assertEqual([e["name"] for e in xs if e["cat"] == "step"], ["step 1", "step 2"])
        self.assertEqual([e["name"] for e in xs if e["cat"] == "phase"],
                         ["forward", "backward", "optimizer", "held-out loss", "checkpoint"] * 2)
        self.assertEqual(len([e for e in xs if e["cat"] == "layer"]), 2 * (2 + 1) * LAYERS)  # + held-out forward

    # Issue 57 point 14: a trace that could not be written ended the run; the weights are what matters.
    @unittest.skipUnless(os.path.exists("/dev/full"), "no /dev/full here")
    def test_a_trace_that_cannot_be_written_is_a_warning_and_training_goes_on(self):
        import numpy as np
        with tempfile.TemporaryDirectory() as d:
            data, ckpt, save = (os.path.join(d, n) for n in ("t.bin", "ck", "w.safetensors"))
            np.random.default_rng(0).integers(0, 256, size=5000, dtype=np.uint16).tofile(data)
            r = run("train", "--device", DEVICE, *CELL[5:15], "--batch", "2", "--ctx", "32", "--data", data,
                    "--checkpoint-dir", ckpt, "--steps", "3", "--trace", "/dev/full", "--trace-steps", "1",
                    "--save", save)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "lmscope: warning: writing '/dev/full' failed: No space left on device; the "
                                       "trace is not written, and training goes on\n")
            self.assertIn("step      3/3", r.stdout)
            self.assertTrue(os.path.exists(save))
            self.assertTrue(os.path.isdir(os.path.join(ckpt, "step-00000003")))

    def test_bad_inputs_end_in_one_sentence_and_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            t = os.path.join(d, "t.json")
            cases = [
                (["--mode", "train,forward", "--trace", t], "--trace records one cell"),
                (["--dry-run", "--trace", t], "a dry run runs nothing"),
                (["--trace", "/nonexistent-dir/t.json"], "/nonexistent-dir/t.json"),
            ]
            for extra, says in cases:
                r = run(*CELL, "--steps", "1", *extra)
                with self.subTest(extra=extra):
                    self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                    lines = r.stderr.strip().splitlines()
                    self.assertEqual(len(lines), 1, r.stderr)
                    self.assertIn(says, lines[0])
            for extra, says in ((["--trace-steps", "2"], "--trace-steps needs --trace"),
                                (["--trace", t, "--trace-steps", "0"], "--trace-steps must be positive"),
                                (["--trace", "/nonexistent-dir/t.json"], "/nonexistent-dir/t.json")):
                r = run("train", "--device", "cpu", "--data", t, "--steps", "1", *extra)
                with self.subTest(extra=extra):
                    self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                    lines = r.stderr.strip().splitlines()
                    self.assertEqual(len(lines), 1, r.stderr)
                    self.assertIn(says, lines[0])


if __name__ == "__main__":
    unittest.main()
