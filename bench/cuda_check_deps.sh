#!/usr/bin/env bash
# Gathers what bench/cuda_check.sh needs on a machine that reaches no registry, into DEPS (default
# .dev, which .git/info/exclude should ignore): Debian's HDF5, fmt, CLI11 and nlohmann-json
# packages (not installed: `apt-get download`), stories260K, the haystack essays and SmolLM2's
# config and tokenizer from ${KVLAB_SHARED:-../shared}.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=${1:-.dev}
shared=${KVLAB_SHARED:-../shared}
mkdir -p "$deps/debs" "$deps/niah" "$deps/smollm2"
(cd "$deps/debs" && apt-get download -q libhdf5-dev libhdf5-103-1 libhdf5-cpp-103-1 libhdf5-hl-100 \
  libhdf5-hl-cpp-100 libsz2 libaec0 libaec-dev nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 2>&1 | grep -v '^W:' || true)
mkdir -p "$deps/models" && cp -r "$shared/models/stories260K" "$deps/models/"
cp -r "$shared/data/niah/PaulGrahamEssays" "$deps/niah/"
cp "$shared/tokenizers/smollm2/config.json" "$shared/tokenizers/smollm2/tokenizer.json" "$deps/smollm2/"
du -sh "$deps"
