"""lmscope report end to end: result files from real bench, attention, memory and train runs on the CPU
become one self-contained HTML page whose tables hold every row, whose pictures are valid SVG, and
which headless Chromium draws with the charts' colours; files of the wrong kind end in one sentence
and exit 2. Run by ctest with LMSCOPE pointing at the built program."""
import array
import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import unittest
import xml.etree.ElementTree as ET
import zlib

from cli_support import FilesTest

LMSCOPE = os.environ["LMSCOPE"]
TINY = ["--layers", "1", "--vocab", "256"]


def run(*args):
    return subprocess.run([LMSCOPE, *args], capture_output=True, text=True, timeout=600)


def png_pixels(path):
    """The RGB(A) pixels of an 8-bit PNG (as Chromium writes it), decoded by the PNG rules."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        filt, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if filt == 1:
                line[i] = (line[i] + a) & 255
            elif filt == 2:
                line[i] = (line[i] + b) & 255
            elif filt == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif filt == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return [tuple(r[x * channels:x * channels + 3]) for r in rows for x in range(width)]


class Tags(html.parser.HTMLParser):
    """Every start tag with its attributes, and whether the elements that must close did."""
    VOID = {"meta", "br", "img", "input", "link", "hr", "rect", "circle", "line", "polyline", "polygon", "path"}

    def __init__(self):
        super().__init__()
        self.tags, self.open = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()


class Report(FilesTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        d = cls.dir = cls.tmp.name
        cls.bench, cls.attention, cls.memory = (os.path.join(d, n) for n in ("b.json", "a.json", "m.json"))
        cls.timeline = os.path.join(d, "t.svg")
        tokens, held_out = os.path.join(d, "tokens.bin"), os.path.join(d, "val.bin")
        for path, n, step in ((tokens, 6000, 7), (held_out, 1500, 11)):
            with open(path, "wb") as f:
                array.array("H", [(i * step + i // 5) % 256 for i in range(n)]).tofile(f)
        cls.logs = [os.path.join(d, f"run-lr{lr}.jsonl") for lr in ("3e-3", "1e-3")]
        for args in (["bench", "--device", "cpu", "--model", "small,medium", *TINY, "--ctx", "16,32", "--batch", "1",
                      "--warmup", "1", "--steps", "2", "--format", "json", "--out", cls.bench],
                     ["attention", "--device", "cpu", "--precision", "fp32", "--attention", "naive,flash", "--seq",
                      "64,128,256", "--d", "16", "--batch", "1", "--max-seconds", "0.05", "--format", "json",
                      "--out", cls.attention],
                     ["memory", "--device", "cpu", "--model", "small", *TINY, "--ctx", "16,32", "--batch", "1",
                      "--mode", "train,inference", "--format", "json", "--out", cls.memory],
                     ["memory", "--device", "cpu", "--model", "small", *TINY, "--ctx", "32", "--batch", "1",
                      "--svg", cls.timeline],
                     *(["train", "--device", "cpu", "--model", "small", *TINY, "--d-model", "64", "--d-ff", "128",
                        "--heads", "2", "--ctx", "32", "--batch", "2", "--steps", "12", "--lr", lr, "--data", tokens,
                        "--val-data", held_out, "--eval-every", "4", "--eval-batches", "2", "--log", log]
                       for lr, log in zip(("3e-3", "1e-3"), cls.logs))):
            r = run(*args)
            assert r.returncode == 0, (args, r.stderr)
        # Cells that ran out of memory, as a GPU run writes them: the page marks where memory ran out.
        with open(cls.attention) as f:
            rows = json.load(f)
        for impl in ("naive", "flash"):
            oom = {k: v for k, v in rows[0].items() if k not in ("ms", "tflops", "bytes")}
            oom.update(attention=impl, seq=512, status="OOM: asked for 1.00 GiB with 79.00 GiB in use of 79.10 GiB")
            rows.append(oom)
        cls.attention_oom = os.path.join(d, "a-oom.json")
        with open(cls.attention_oom, "w") as f:
            json.dump(rows, f)
        cls.html = os.path.join(d, "report.html")
        r = run("report", "--bench", cls.bench, "--attention", cls.attention_oom, "--memory", cls.memory,
                "--timeline", cls.timeline, "--train", ",".join(cls.logs), "--title", "CPU <example>", "--out", cls.html)
        assert r.returncode == 0, r.stderr
        with open(cls.html) as f:
            cls.page = f.read()

    def test_the_page_is_whole_and_needs_nothing_from_outside(self):
        tags = Tags()
        tags.feed(self.page)
        tags.close()
        self.assertEqual(tags.open, [], "elements left open")
        for tag, attrs in tags.tags:
            self.assertNotEqual(tag, "script")
            for name in ("src", "href"):
                self.assertNotIn(name, attrs, (tag, attrs))
        self.assertIn("<title>CPU &lt;example&gt;</title>", self.page)
        # Every picture is an SVG document by XML's rules, as a browser's SVG parser reads it.
        svgs = re.findall(r"<svg.*?</svg>", self.page, flags=re.S)
        self.assertGreaterEqual(len(svgs), 9)
        for svg in svgs:
            ET.fromstring(svg)

    def test_every_row_is_in_a_table(self):
        counts = {}
        for name, path in (("bench", self.bench), ("memory", self.memory), ("attention", self.attention_oom)):
            with open(path) as f:
                counts[name] = len(json.load(f))
        counts["training"] = len(self.logs)  # a row per run
        sections = re.split(r'<h2 id="', self.page)[1:]
        found = {s.split('"')[0]: s.count("<tr") - 1 for s in sections}  # less the header row
        self.assertEqual(found, counts)
        for log in self.logs:  # each run's last logged loss is in its row
            with open(log) as f:
                last = json.loads(f.readlines()[-1])
            self.assertIn(f"<td>{last['loss']:.4f}</td>", self.page)

    def test_the_charts_say_what_they_show(self):
        for title in ("Step time against context", "Step time against model size", "Where a step&#39;s time goes",
                      "Memory at the peak, by kind", "Attention forward + backward time", "Memory saved for backward",
                      "Active memory", "Training loss", "Held-out loss", "run-lr3e-3", "run-lr1e-3"):
            self.assertIn(title.replace("&#39;", "'"), self.page)
        self.assertIn("naive fp32 d 16 b1: ran up to seq 256; out of memory from seq 512", self.page)
        self.assertIn("✕ out of memory", self.page)

    def test_chromium_draws_it(self):
        chromium = shutil.which("chromium")
        if not chromium:
            self.skipTest("no chromium")
        png = os.path.join(self.dir, "report.png")
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--hide-scrollbars", f"--user-data-dir={self.dir}/chrome", "--window-size=1280,2400",
                        f"--screenshot={png}", "file://" + self.html], capture_output=True, timeout=120)
        pixels = png_pixels(png)
        colours = {p for p in pixels}
        self.assertGreater(len(colours), 50)
        # The first series' blue and the timeline's parameter blue, as drawn.
        for hex_colour in ("4e79a7", "4c72b0"):
            rgb = tuple(bytes.fromhex(hex_colour))
            self.assertGreater(sum(1 for p in pixels if p == rgb), 200, hex_colour)


class FailedRows(unittest.TestCase):
    def test_rows_that_did_not_run_are_reported_not_refused(self):
        with tempfile.TemporaryDirectory() as d:
            memory, page = os.path.join(d, "m.json"), os.path.join(d, "r.html")
            # bf16 on the CPU is unsupported: that row has a status and no peak.
            r = run("memory", "--device", "cpu", "--model", "small", *TINY, "--ctx", "16", "--batch", "1",
                    "--precision", "fp32,bf16", "--format", "json", "--out", memory)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = run("report", "--memory", memory, "--out", page)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(page) as f:
                text = f.read()
            self.assertIn('<tr class="failed">', text)
            self.assertIn("unsupported", text)


class TrainLogs(unittest.TestCase):
    def test_same_names_are_told_apart_and_a_resumed_log_keeps_its_rate(self):
        with tempfile.TemporaryDirectory() as d:
            logs = []
            for folder, loss in (("a", 2.0), ("b", 3.0)):
                os.makedirs(os.path.join(d, folder))
                logs.append(os.path.join(d, folder, "run.jsonl"))
                with open(logs[-1], "w") as f:
                    # 100 tokens a second; stopped after step 3 and resumed: elapsed_s starts again.
                    for step, elapsed in ((1, 1.0), (2, 2.0), (3, 3.0), (4, 1.0), (5, 2.0), (6, 3.0)):
                        f.write(json.dumps({"step": step, "loss": loss - step / 10, "lr": 1e-3, "grad_norm": None,
                                            "tokens": 100 * step, "elapsed_s": elapsed, "val_loss": None}) + "\n")
            page = os.path.join(d, "r.html")
            r = run("report", "--train", ",".join(logs), "--out", page)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(page) as f:
                text = f.read()
            for name in ("a/run", "b/run"):
                self.assertIn(f'<td class="l">{os.path.join(d, name)}</td>', text)
            self.assertEqual(text.count("<td>100</td>"), 2)  # tokens/s of each, from its last stretch
            self.assertIn("<td>1.0000</td>", text)  # b's loss is 1 from a's at every step


class BadInput(unittest.TestCase):
    def test_one_sentence_and_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            bench = os.path.join(d, "b.json")
            r = run("bench", "--device", "cpu", "--model", "small", *TINY, "--ctx", "8", "--batch", "1", "--warmup",
                    "0", "--steps", "1", "--format", "json", "--out", bench)
            self.assertEqual(r.returncode, 0, r.stderr)
            notjson = os.path.join(d, "n.json")
            with open(notjson, "w") as f:
                f.write("model,ctx\nsmall,8\n")
            empty, norows, badrow = (os.path.join(d, n) for n in ("e.json", "r.json", "x.json"))
            open(empty, "w").close()
            with open(norows, "w") as f:
                f.write("[]")
            with open(bench) as f:
                rows = json.load(f)
            good_row = dict(rows[0])
            rows[0]["model"] = "small"  # a name where an object belongs
            with open(badrow, "w") as f:
                json.dump(rows, f)
            # Fields of another kind, each named in our words (the JSON library's sentence was the message).
            wrong_kinds = []
            for i, (key, value, says) in enumerate((("batch", "4", 'row 1: its "batch" is a string, not a whole number'),
                                                    ("ms", [1], 'row 1: its "ms" is not an object'),
                                                    ("graphs", "off", 'its "graphs" is a string, not true or false'),
                                                    ("ctx", 2**64, 'its "ctx" is a number, not a whole number'))):
                wrong_kinds.append((["--bench", os.path.join(d, f"k{i}.json")], says))
                with open(wrong_kinds[-1][0][1], "w") as f:
                    json.dump([{**good_row, key: value}], f)
            badlog = os.path.join(d, "l.jsonl")
            with open(badlog, "w") as f:
                f.write('{"step": 1, "loss": 2.5}\n{"step": "two", "loss": 2.4}\n')
            wrong_kinds.append((["--train", badlog], 'line 2: its "step" is a string, not a whole number'))
            cases = [
                ([], "nothing to report"),
                (["--memory", bench], "is not a memory results file"),
                (["--attention", bench], "is not an attention results file"),
                (["--bench", notjson], "it is not JSON"),
                (["--bench", os.path.join(d, "absent.json")], "cannot open the bench results"),
                (["--bench", empty], "is empty"),
                (["--bench", norows], "it has no rows"),
                (["--bench", badrow], 'row 1: its "model" is not an object'),
                *wrong_kinds,
                (["--bench", d], "is a directory"),
                (["--timeline", bench], "is not a memory timeline"),
                (["--train", bench], "is not a training log"),
                (["--train", empty], "is empty"),
                (["--bench", bench, "--out", "/nonexistent-dir/r.html"], "/nonexistent-dir/r.html"),
            ]
            for args, says in cases:
                r = run("report", *args)
                with self.subTest(args=args):
                    self.assertEqual(r.returncode, 2, (r.stdout, r.stderr))
                    lines = r.stderr.strip().splitlines()
                    self.assertEqual(len(lines), 1, r.stderr)
                    self.assertIn(says, lines[0])
                    self.assertNotIn("json.exception", lines[0])


if __name__ == "__main__":
    unittest.main()
