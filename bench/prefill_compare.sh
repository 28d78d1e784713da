#!/usr/bin/env bash
# kvlab against transformers on the same GGUF, prompt, CPU and thread count: prefill tokens/s at
# each length, decode time per token after 2048 tokens, exact attention against a matmul; each
# measurement alternates between the two sides (bench/speed_compare.py does the work).
#
# Usage: bench/prefill_compare.sh [TOKENS=512,2048,8192] [THREADS=$(nproc)] [REPS=3] [-- more speed_compare.py flags]
# Env:   KVLAB_BIN (default build/apps/kvlab), PYTHON (default: the pinned reference environment
#        bench/setup_reference.sh makes, created on first use), KVLAB_MODELS (where smollm2-135m/
#        lives; see data_scripts/get_smollm2.sh)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tokens="${1:-512,2048,8192}"
threads="${2:-$(nproc)}"
reps="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
[[ "${1:-}" == "--" ]] && shift
if [[ -n "${PYTHON:-}" ]]; then
  python="$PYTHON"
else
  python="$("$repo/bench/setup_reference.sh" | tail -n 1)"  # fails the script if the set-up fails
fi
exec "$python" "$repo/bench/speed_compare.py" --tokens "$tokens" --threads "$threads" --reps "$reps" "$@" \
  2> >(grep -v 'de-quantizing GGUF' >&2)  # drop transformers' GGUF progress bar
