#!/usr/bin/env bash
# Prefill tokens/s of kvlab and of transformers on the same GGUF, prompt length and thread count,
# measured back to back in one run, and their ratio (kvlab / transformers; > 1 = kvlab faster).
#
# Usage: bench/prefill_compare.sh [TOKENS=512] [THREADS=$(nproc)] [REPS=3]
# Env:   KVLAB_BIN (default: the first of build*/apps/kvlab), PYTHON (default /opt/kvlab-py/bin/python),
#        KVLAB_MODELS (where smollm2-135m/ lives; see data_scripts/get_smollm2.sh)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tokens="${1:-512}"
threads="${2:-$(nproc)}"
reps="${3:-3}"
python="${PYTHON:-/opt/kvlab-py/bin/python}"
kvlab="${KVLAB_BIN:-}"
if [[ -z "$kvlab" ]]; then
  for b in "$repo"/build/apps/kvlab "$repo"/build*/apps/kvlab; do
    if [[ -x "$b" ]]; then kvlab="$b"; break; fi
  done
fi
[[ -x "$kvlab" ]] || { echo "kvlab binary not found; build it or set KVLAB_BIN" >&2; exit 1; }
gguf="$("$repo/data_scripts/get_smollm2.sh")"

k_json="$("$kvlab" --threads "$threads" bench prefill --model "$gguf" --tokens "$tokens" --reps "$reps" --json)"
t_json="$("$python" "$repo/bench/prefill_transformers.py" --gguf "$gguf" --tokens "$tokens" --threads "$threads" --reps "$reps" --json \
  2> >(grep -v 'de-quantizing GGUF' >&2))"  # drop transformers' GGUF progress bar
"$python" - "$k_json" "$t_json" <<'PY'
import json, sys
k, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"model {t['model']}  tokens {k['tokens']}  threads {k['threads']}")
print(f"kvlab        {k['tokens_per_s']:9.1f} tokens/s  ({k['seconds']:.3f} s)")
print(f"transformers {t['tokens_per_s']:9.1f} tokens/s  ({t['seconds']:.3f} s, {t['attn_implementation']}, "
      f"transformers {t['transformers_version']}, torch {t['torch_version']})")
print(f"ratio kvlab/transformers {k['tokens_per_s'] / t['tokens_per_s']:.2f}")
PY
