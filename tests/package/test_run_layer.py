"""The run layer from Python: RunSpec's keywords as the command line's flags, its reports equal to
the command line's JSON, and a Session equal to lmscope train bit for bit."""

import json

import numpy as np
import pytest

import lmscope
from conftest import TINY, flags_of


def cli_json(lmscope_cli, tmp_path, *args):
    out = tmp_path / "out.json"
    lmscope_cli(*args, "--format", "json", "--out", out)
    return json.loads(out.read_text())


def test_dry_run_equals_the_command_lines_json(lmscope_cli, tmp_path):
    keywords = {"model": "2.7B", "ctx": 1024, "batch": 4, "precision": "bf16", "recompute": "selective"}
    expected = cli_json(lmscope_cli, tmp_path, "memory", "--dry-run", *flags_of(keywords))
    report = lmscope.dry_run(lmscope.RunSpec(**keywords))
    assert report.row == expected[0]
    assert report.peak_bytes == expected[0]["peak_bytes"] > 0
    assert report.fits and report.status == "ok"
    assert sum(report.by_kind.values()) == report.peak_bytes
    assert report.by_op and report.largest and report.largest[0]["bytes"] >= report.largest[-1]["bytes"]


def test_defaults_are_the_command_lines(lmscope_cli, tmp_path):
    # Nothing given on either side: the same run, the same report.
    assert lmscope.dry_run().row == cli_json(lmscope_cli, tmp_path, "memory", "--dry-run")[0]


def test_a_budget_that_is_too_small_says_so(lmscope_cli, tmp_path):
    expected = cli_json(lmscope_cli, tmp_path, "memory", "--dry-run", "--model", "xl", "--memory-limit", "8GiB")
    report = lmscope.dry_run(model="xl", memory_limit="8GiB")
    assert report.row == expected[0]
    assert not report.fits and report.status.startswith("does not fit")


def test_data_parallel_dry_run(lmscope_cli, tmp_path):
    keywords = {"model": "medium", "world_size": 4, "zero": 3, "batch": 8}
    expected = cli_json(lmscope_cli, tmp_path, "memory", "--dry-run", *flags_of(keywords))
    assert lmscope.dry_run(**keywords).row == expected[0]


def test_plan_and_recommend_equal_the_command_lines(lmscope_cli, tmp_path):
    keywords = {"model": "medium", "precision": "bf16", "attention": "flash", "ctx": 1024}
    expected = cli_json(lmscope_cli, tmp_path, "plan", *flags_of(keywords), "--memory-limit", "20GiB")
    assert lmscope.plan(memory_limit="20GiB", **keywords) == expected[0]
    expected = cli_json(lmscope_cli, tmp_path, "plan", "--recommend", *flags_of(keywords), "--memory-limit", "20GiB")
    row = lmscope.plan_recommend(lmscope.RunSpec(**keywords), memory_limit=20 * 2**30)
    assert row == expected[0]
    assert row["candidates"]


def test_bench_row(capsys):
    row = lmscope.bench(device="cpu", ctx=32, batch=2, warmup=1, steps=2, **TINY)
    assert row["status"] == "ok"
    assert row["steps"] == 2 and row["ms"]["step"]["mean"] >= row["ms"]["step"]["min"] > 0
    assert row["model"]["d_model"] == 64 and row["ctx"] == 32
    assert capsys.readouterr() == ("", "")  # progress is off unless asked
    seen = []
    lmscope.bench(device="cpu", ctx=32, batch=2, warmup=1, steps=2, progress=lambda d, t: seen.append((d, t)), **TINY)
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_errors_carry_the_command_lines_sentence(lmscope_cli):
    said = lmscope_cli("memory", "--dry-run", "--precision", "fp64", check=False)
    assert said.returncode == 2
    with pytest.raises(lmscope.UserError) as e:
        lmscope.RunSpec(precision="fp64")
    assert isinstance(e.value, ValueError)
    assert said.stderr.strip() == f"lmscope: error: {e.value}"
    with pytest.raises(lmscope.UserError, match="--weight-copies"):
        lmscope.RunSpec(precision="fp32", weight_copies="transient")
    with pytest.raises(TypeError, match="unexpected keyword argument 'contex'"):
        lmscope.RunSpec(contex=1024)
    with pytest.raises(TypeError, match="one value"):
        lmscope.RunSpec(ctx=[256, 512])
    with pytest.raises(lmscope.UserError, match="one run"):
        lmscope.RunSpec(model="small,medium")
    with pytest.raises(lmscope.UserError, match="finite number"):
        lmscope.RunSpec(lr="1e999")  # numbers read as strictly as the command line reads them
    with pytest.raises(lmscope.UserError, match="empty value"):
        lmscope.RunSpec(ctx="")


def test_runspec_keywords_are_flags(lmscope_cli):
    helps = {c: lmscope_cli(c, "--help").stdout for c in ("memory", "train", "bench")}
    for name in lmscope.RunSpec.flag_names():
        flag = "--" + name.replace("_", "-")
        assert any(flag in text for text in helps.values()), flag
    spec = lmscope.RunSpec(model="small", ctx=512, graphs=False)
    described = spec.describe()
    assert described["ctx"] == 512 and described["graphs"] is False
    assert spec.replace(ctx=128).describe()["ctx"] == 128 and spec.ctx == 512


def write_tokens(path, count, vocab, seed=0):
    ids = np.random.default_rng(seed).integers(0, vocab, size=count, dtype=np.uint16)
    np.save(path, ids)
    return ids


TRAIN = {**TINY, "device": "cpu", "ctx": 32, "batch": 4, "lr": 3e-3, "seed": 7}


def train_log(lmscope_cli, tmp_path, tokens, steps, extra=()):
    log = tmp_path / "log.jsonl"
    lmscope_cli("train", "--data", tokens, "--steps", steps, "--log", log, *flags_of(TRAIN), *extra)
    return [json.loads(line) for line in log.read_text().splitlines() if '"step"' in line]


def test_session_equals_train_bit_for_bit(lmscope_cli, tmp_path):
    tokens = tmp_path / "tokens.npy"
    ids = write_tokens(tokens, 20000, TINY["vocab"])
    expected = train_log(lmscope_cli, tmp_path, tokens, 5)
    session = lmscope.Session(data=ids, **TRAIN)
    got = [session.step() for _ in range(5)]
    assert [(r.step, r.loss, r.lr, r.grad_norm) for r in got] == [
        (e["step"], e["loss"], e["lr"], e["grad_norm"]) for e in expected
    ]
    # The weights saved equal train --save's.
    lmscope_cli("train", "--data", tokens, "--steps", 5, "--save", tmp_path / "cli.safetensors", *flags_of(TRAIN))
    session.save(tmp_path / "py.safetensors")
    assert (tmp_path / "cli.safetensors").read_bytes() == (tmp_path / "py.safetensors").read_bytes()


def test_session_with_accumulation_and_a_memmap(lmscope_cli, tmp_path):
    tokens = tmp_path / "tokens.bin"
    np.random.default_rng(3).integers(0, TINY["vocab"], size=30000, dtype=np.uint16).tofile(tokens)
    expected = train_log(lmscope_cli, tmp_path, tokens, 3, ("--grad-accum", 2, "--sample", "sequential"))
    session = lmscope.Session(data=np.memmap(tokens, dtype=np.uint16, mode="r"), grad_accum=2, sample="sequential",
                              **TRAIN)
    assert [session.step().loss for _ in range(3)] == [e["loss"] for e in expected]


def test_batches_given_equal_batches_drawn(tmp_path):
    ids = write_tokens(tmp_path / "t.npy", 5000, TINY["vocab"], seed=1).astype(np.int64)
    drawn = lmscope.Session(data=ids, sample="sequential", **TRAIN)
    given = lmscope.Session(**TRAIN)
    batch, ctx = TRAIN["batch"], TRAIN["ctx"]
    windows = (len(ids) - 1) // ctx
    for step in range(3):
        starts = [((step * batch + b) % windows) * ctx for b in range(batch)]
        x = np.stack([ids[s:s + ctx] for s in starts]).astype(np.int32)
        y = np.stack([ids[s + 1:s + ctx + 1] for s in starts])  # int64: converted
        assert given.step(x, y) == drawn.step()
    with pytest.raises(lmscope.UserError, match="rows of ctx"):
        given.step(x[:, :-1], y[:, :-1])
    with pytest.raises(lmscope.UserError, match="outside the vocabulary"):
        given.step(x + TINY["vocab"], y)
    with pytest.raises(lmscope.UserError, match="without data="):
        given.step()


def test_session_parameters_through_dlpack(tmp_path):
    session = lmscope.Session(**TRAIN)
    names = session.parameter_names()
    assert "lm_head.weight" in names
    before = np.from_dlpack(session.parameter("lm_head.weight")).copy()
    assert before.shape == (TINY["vocab"], TINY["d_model"]) and before.dtype == np.float32
    x = np.zeros((TRAIN["batch"], TRAIN["ctx"]), np.int32) + 5
    session.step(x, x + 1)
    after = np.from_dlpack(session.parameter("lm_head.weight"))
    assert not np.array_equal(before, after)  # a view of the weights the optimizer updated
    with pytest.raises(KeyError):
        session.parameter("no.such.weight")


def test_session_refuses_what_it_cannot_run():
    with pytest.raises(lmscope.UserError, match="trains"):
        lmscope.Session(mode="forward", **{k: v for k, v in TRAIN.items()})
    with pytest.raises(lmscope.UserError, match="uint16, int32 or int64"):
        lmscope.Session(data=np.zeros(100, np.float32), **TRAIN)
    with pytest.raises(lmscope.UserError, match="fewer than one window"):
        lmscope.Session(data=np.zeros(10, np.int32), **TRAIN)
