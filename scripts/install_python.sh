#!/usr/bin/env bash
# Installs the Python package lmscope into an interpreter: builds its extension for that interpreter
# (in build/, or LMSCOPE_BUILD_DIR, keeping that build's other settings), then copies the package into
# the interpreter's site-packages (its user site where those are not writable).
#   scripts/install_python.sh                             Debian's python3 (sets its packages up first)
#   scripts/install_python.sh /opt/torch/.venv/bin/python  a venv's interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(command -v "${1:-/usr/bin/python3}") || { echo "install_python.sh: no interpreter '${1:-}'" >&2; exit 2; }
build=${LMSCOPE_BUILD_DIR:-build}
# Debian's interpreter: the headers, pybind11 and DLPack from Debian's packages. Another (a venv) brings
# its own pybind11, and PyTorch's copy of the DLPack header, where no Debian package is there.
if [[ "$python" == /usr/bin/* ]] && command -v apt-get >/dev/null; then scripts/setup.sh; fi
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLMSCOPE_PYTHON="$python" >/dev/null
if ! cmake --build "$build" --target _lmscope lmscope_python_files >"$build/install_python.log" 2>&1; then
  grep -E "error" -A5 "$build/install_python.log" | head -40
  echo "install_python.sh: the build failed ($build/install_python.log)" >&2
  exit 1
fi
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [[ ! -f "$build/python/lmscope/_lmscope$suffix" ]]; then
  echo "install_python.sh: the extension for $python was not built: it needs pybind11, the interpreter's" \
    "headers and DLPack's (cmake -S . -B $build says which is missing)" >&2
  exit 1
fi
dest=$("$python" - <<'PY'
import os, site, sysconfig
purelib = sysconfig.get_paths()["purelib"]
print(purelib if os.access(purelib, os.W_OK) else site.getusersitepackages())
PY
)
rm -rf "$dest/lmscope"
mkdir -p "$dest/lmscope"
cp "$build/python/lmscope/"*.py "$build/python/lmscope/_lmscope$suffix" "$dest/lmscope/"  # this interpreter's only
(cd / && "$python" -c 'import lmscope; print("lmscope installed for", __import__("sys").executable, "in", lmscope.__path__[0])')
