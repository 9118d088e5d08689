"""docs/python.md's walk-through runs as written, and its picture shows what the page says: four bars,
each holding the parameters, the optimizer state and the activations in their colours, growing with
the context past the budget's line."""

import pathlib
import runpy

import pytest

matplotlib = pytest.importorskip("matplotlib")
import matplotlib.image  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python" / "memory_by_context.py"


def rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def test_walkthrough_draws_the_memory_by_context(tmp_path):
    walkthrough = runpy.run_path(str(SCRIPT))
    out = tmp_path / "memory.png"
    reports = walkthrough["main"](str(out))
    fits = [r.fits for r in reports]
    assert fits == sorted(fits, reverse=True), fits  # past a context that does not fit, none does
    if "H100 80GB" in reports[0].row["device_name"]:  # the page's budget (where no GPU is visible, the stand-in)
        assert fits == [True, True, False, False]
    assert [r.peak_bytes for r in reports] == sorted(r.peak_bytes for r in reports)
    image = matplotlib.image.imread(out)
    assert image.shape[:2] == (540, 900)
    pixels = {tuple(int(round(c * 255)) for c in px[:3]) for row in image[::3] for px in row[::3]}
    for kind in ("parameter", "optimizer_state", "activation"):
        colour = rgb(walkthrough["COLOURS"][walkthrough["KINDS"].index(kind)])
        assert colour in pixels, kind
