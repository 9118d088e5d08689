#!/usr/bin/env bash
# Sets up, builds and runs every test: unit tests, CLI end to end, and parity with PyTorch;
# then the same CPU tests again in an AddressSanitizer + UndefinedBehaviorSanitizer build.
# LMSCOPE_SKIP_SANITIZE=1 skips the second pass.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")

if [[ "${LMSCOPE_SKIP_SANITIZE:-}" != 1 ]]; then
  echo "== the same tests under ASan + UBSan"
  cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMSCOPE_CUDA=OFF -DLMSCOPE_SANITIZE=ON >/dev/null
  cmake --build build-sanitize
  # LMSCOPE_SANITIZED: tests leave out what the sanitizers change (a failed allocation ends the process).
  (cd build-sanitize && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 LMSCOPE_SANITIZED=1 ctest --output-on-failure -j "$(nproc)")
fi
