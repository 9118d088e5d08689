#!/usr/bin/env bash
# Installs what lmscope needs from Debian's packages, and nothing that is already there.
#   scripts/setup.sh          build dependencies (the Python package's too: the headers, pybind11, DLPack)
#   scripts/setup.sh --test   also what the tests need (Debian's python3 with torch, numpy, pytest and
#                             matplotlib; chromium to draw the memory timeline as a person sees it)
set -euo pipefail

packages=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libfmt-dev libopenblas-openmp-dev libgtest-dev zlib1g-dev
          libgloo-dev python3-dev pybind11-dev libdlpack-dev)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(python3 python3-numpy python3-torch python3-pytest python3-matplotlib chromium)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
