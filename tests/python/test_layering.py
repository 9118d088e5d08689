"""The layers hold: every #include "lmscope/X/..." in folder Y of src/lmscope names Y itself or a folder
that Y's library links, directly or through the libraries it links. The graph is the build's own
(CMakeLists.txt's lmscope_layer calls, written by CMake to LMSCOPE_LAYERS as JSON), so a folder that
climbs fails here as well as at link time. src/cli is the top: it may include anything."""
import json
import os
import re
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^\s*#\s*include\s+"lmscope/([a-z_0-9]+)/', re.M)


def closure(layers, name):
    seen, todo = set(), [name]
    while todo:
        for used in layers[todo.pop()]["uses"]:
            if used not in seen:
                seen.add(used)
                todo.append(used)
    return seen


def folders_of(layers):
    """Folder of src/lmscope -> its layer (a layer may hold several folders: backend/ and cuda/)."""
    return {folder: name for name, layer in layers.items() for folder in layer["folders"]}


class Layering(unittest.TestCase):
    def setUp(self):
        path = os.environ.get("LMSCOPE_LAYERS")
        if not path:
            self.fail("LMSCOPE_LAYERS names the build's layer graph (tests/CMakeLists.txt sets it)")
        self.layers = json.loads(Path(path).read_text())

    def test_every_folder_is_a_layer(self):
        folders = {p.name for p in (ROOT / "src/lmscope").iterdir() if p.is_dir()}
        self.assertEqual(folders - set(folders_of(self.layers)), set(), "folders no library builds")

    def test_the_graph_has_no_circle(self):
        for name in self.layers:
            self.assertNotIn(name, closure(self.layers, name), f"{name} uses itself through others")

    def test_no_include_climbs(self):
        owner = folders_of(self.layers)
        climbs = []
        for source in sorted((ROOT / "src/lmscope").rglob("*")):
            if source.suffix not in {".h", ".cpp", ".cu", ".cuh"}:
                continue
            folder = source.relative_to(ROOT / "src/lmscope").parts[0]
            mine = owner[folder]
            allowed = closure(self.layers, mine) | {mine}
            for included in INCLUDE.findall(source.read_text(errors="replace")):
                if owner.get(included) not in allowed:
                    climbs.append(f"{source.relative_to(ROOT)} includes lmscope/{included}/ ({owner.get(included)})")
        self.assertEqual(climbs, [], "includes that climb:\n" + "\n".join(climbs))

    def test_a_climbing_include_is_caught(self):
        # The check itself: core including run/ would climb.
        owner = folders_of(self.layers)
        self.assertNotIn(owner["run"], closure(self.layers, owner["core"]) | {owner["core"]})


if __name__ == "__main__":
    sys.exit(unittest.main())
