#!/usr/bin/env bash
# Whether the working tree compiles to the same GPU code as a revision: every .cu of the CUDA backend
# compiled as each tree's CMake build compiles it (its compile_commands.json, Release), and the
# cubins and PTX nvcc leaves (--keep) compared byte for byte. For moves and renames that must change
# nothing on the device. Needs nvcc (no GPU).
#   scripts/same_device_code.sh [REV]    REV defaults to HEAD
# Exit 0 when every cubin and PTX file is identical, 1 when any differs, 2 on a bad revision or build.
set -uo pipefail
rev=${1:-HEAD}
root=$(cd "$(dirname "$0")/.." && pwd)
git -C "$root" rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "no revision '$rev'"; exit 2; }
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "nvcc not found (looked in PATH and /usr/local/cuda/bin)"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# nvcc names anonymous namespaces after the source file's path, so both trees are compiled from the
# same path ($work/src) and build directory ($work/build), one after the other.
src=$work/src build=$work/build

# compile NAME: each .cu's cubins and PTX under $work/NAME/<file>/, from what $src holds now.
compile() {
  local name=$1
  rm -rf "$build"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLMSCOPE_CUDA=ON \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$work/$name-configure.log" 2>&1 ||
    { echo "cmake failed for $name:"; tail -5 "$work/$name-configure.log"; return 2; }
  python3 - "$build" "$work/$name" <<'EOF2' | xargs -0 -P "$(nproc)" -n 1 bash -c || { echo "nvcc failed for $name"; return 2; }
import json, os, shlex, sys
build, out = sys.argv[1], sys.argv[2]
for e in json.load(open(os.path.join(build, "compile_commands.json"))):
    if not e["file"].endswith(".cu"):
        continue
    keep = os.path.join(out, os.path.basename(e["file"]))
    args = shlex.split(e["command"])
    i = args.index("-o")
    args[i + 1] = os.path.join(keep, "object.o")
    cmd = f"mkdir -p {shlex.quote(keep)} && cd {shlex.quote(e['directory'])} && " + shlex.join(
        args + ["--keep", "--keep-dir", keep])
    sys.stdout.write(cmd + "\0")
EOF2
}

echo "compiling $rev, then the working tree (a few minutes each)"
mkdir -p "$src" && git -C "$root" archive "$rev" | tar -x -C "$src"
compile rev || exit 2
rm -rf "$src" && mkdir -p "$src"
# The working tree as the build sees it: tracked and untracked files git does not ignore.
(cd "$root" && git ls-files -z -co --exclude-standard | python3 -c '
import os, sys
sys.stdout.write("".join(p + "\0" for p in sys.stdin.read().split("\0") if p and os.path.isfile(p)))' |
  tar --null -T - -cf -) | tar -x -C "$src"
compile tree || exit 2

status=0
for dir in "$work"/tree/*/; do
  unit=$(basename "$dir")
  [[ -d "$work/rev/$unit" ]] || { echo "new in the working tree: $unit"; status=1; continue; }
  for f in "$dir"*.cubin "$dir"*.ptx; do
    if cmp -s "$f" "$work/rev/$unit/$(basename "$f")"; then
      echo "identical  $unit $(basename "$f")"
    else
      echo "DIFFERENT  $unit $(basename "$f")"
      status=1
    fi
  done
done
for dir in "$work"/rev/*/; do
  [[ -d "$work/tree/$(basename "$dir")" ]] || { echo "gone from the working tree: $(basename "$dir")"; status=1; }
done
exit $status
