#!/usr/bin/env bash
# The main job: set up, build, and run the default benchmark (small model, ctx 128, batch 4,
# train steps timed per phase). Arguments replace the benchmark's own: scripts/run.sh --model medium
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
if (($# == 0)); then
  set -- --model small --ctx 128 --batch 4 --mode train --warmup 2 --steps 5
fi
exec build/lmscope bench "$@"
