#!/usr/bin/env bash
# Sets up, builds and runs every test: unit tests, CLI end to end, and parity with PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh
cd build
exec ctest --output-on-failure -j "$(nproc)"
