#!/usr/bin/env bash
# Creates the reference environment that bench/prefill_compare.sh runs transformers from: a Python
# virtual environment with pinned versions (the ones kvlab's speed figures were measured against),
# so that a fresh machine measures the same reference. Idempotent: an environment whose stamp
# file lists the same pins is left alone; one with other pins is made again.
#
# Usage: bench/setup_reference.sh            (prints the environment's python on its last line)
# Env:   KVLAB_REF_VENV (default /opt/kvlab-ref), PYTHON3 (the interpreter that makes it; python3)
set -euo pipefail
venv="${KVLAB_REF_VENV:-/opt/kvlab-ref}"
python3="${PYTHON3:-python3}"
pins=(
  torch==2.15.0
  transformers==5.24.0
  tokenizers==0.23.3
  safetensors==0.8.0
  gguf==0.19.0
  accelerate==1.15.0
  numpy==2.4.6
)
stamp="$venv/.kvlab-ref-pins"
want="$(printf '%s\n' "${pins[@]}")"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "[setup_reference] $venv already has: ${pins[*]}" >&2
  echo "$venv/bin/python"
  exit 0
fi
echo "[setup_reference] creating $venv with: ${pins[*]} (torch's wheel is large: several GB)" >&2
rm -rf "$venv"
"$python3" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip >&2
"$venv/bin/pip" install --quiet "${pins[@]}" >&2
# The pins hold: a resolver that picked other versions is an error, not a silent reference.
"$venv/bin/python" - "${pins[@]}" <<'EOF' >&2
import sys
from importlib.metadata import version
bad = [p for p in sys.argv[1:] if version(p.split("==")[0]) != p.split("==")[1]]
if bad:
    sys.exit("setup_reference: installed versions differ from the pins: " + ", ".join(
        f"{p} (found {version(p.split('==')[0])})" for p in bad))
print("[setup_reference] versions as pinned")
EOF
printf '%s\n' "${pins[@]}" > "$stamp"
echo "$venv/bin/python"
