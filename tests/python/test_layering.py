"""The layers' includes: a file of one layer (a folder of src/lmscope) includes headers of its own
layer and of the layers it uses (directly or through another), never one above or beside it. CMake
writes the layers and their uses (lmscope_layer in CMakeLists.txt) to LAYERS_JSON; the link checks
catch calls that climb, this catches what a header alone lets climb (a type, an inline function)."""
import json
import os
import re
import sys
import unittest
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+"lmscope/([a-z_]+)/', re.MULTILINE)


def reach(layers):
    """Every layer each layer may include, itself among them; ValueError on a cycle or an unknown use."""
    reached = {}

    def visit(name, path):
        if name in path:
            raise ValueError("the layers' uses run in a circle: " + " -> ".join(path + [name]))
        if name not in layers:
            raise ValueError(f"{path[-1]} uses '{name}', which is no layer")
        if name not in reached:
            below = {name}
            for use in layers[name]["uses"]:
                below |= visit(use, path + [name])
            reached[name] = below
        return reached[name]

    for name in layers:
        visit(name, [])
    return reached


def climbs(layers, files):
    """files: (folder of src/lmscope, path, text). The includes that leave their layer's reach, as
    sentences; a folder no layer holds is one too."""
    reached = reach(layers)
    found = []
    for folder, path, text in files:
        if folder not in layers:
            found.append(f"{path}: its folder '{folder}' is no layer (lmscope_layer in CMakeLists.txt)")
            continue
        for target in INCLUDE.findall(text):
            if target not in reached[folder]:
                found.append(f"{path}: layer '{folder}' includes lmscope/{target}/, which it does not use")
    return found


def source_files(src):
    for path in sorted((src / "lmscope").rglob("*")):
        if path.suffix in {".h", ".cpp", ".cu", ".cuh"}:
            folder = path.relative_to(src / "lmscope").parts[0]
            yield folder, str(path.relative_to(src.parent)), path.read_text()


class Layering(unittest.TestCase):
    def test_no_include_climbs(self):
        layers = json.loads(Path(os.environ["LAYERS_JSON"]).read_text())
        src = Path(__file__).resolve().parents[2] / "src"
        files = list(source_files(src))
        self.assertGreater(len(files), 50)
        self.assertEqual(climbs(layers, files), [])

    def test_the_check_sees_a_climb(self):
        layers = {"core": {"folders": ["core"], "uses": []},
                  "model": {"folders": ["model"], "uses": ["backend"]},
                  "backend": {"folders": ["backend", "cuda"], "uses": ["core"]}}
        files = [("core", "core/a.h", '#include "lmscope/core/b.h"\n'),
                 ("model", "model/m.cpp", '#include "lmscope/backend/cuda/k.h"\n#include "lmscope/core/a.h"\n'),
                 ("backend", "backend/x.h", '#include <vector>\n  #include "lmscope/model/m.h"\n'),
                 ("bench", "bench/r.cpp", "")]
        found = climbs(layers, files)
        self.assertEqual(len(found), 2, found)
        self.assertIn("backend/x.h: layer 'backend' includes lmscope/model/", found[0])
        self.assertIn("is no layer", found[1])

    def test_a_circle_of_uses_is_refused(self):
        layers = {"a": {"uses": ["b"]}, "b": {"uses": ["a"]}}
        with self.assertRaisesRegex(ValueError, "circle"):
            reach(layers)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
