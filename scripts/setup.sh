#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds kvlab into build/.
# Fast when nothing changed: a dpkg query, then a no-op ninja.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build ccache git python3 python3-venv unzip
          libtorch-dev libopenblas0-openmp libhdf5-dev nlohmann-json3-dev libcli11-dev libfmt-dev doctest-dev python3-jieba
          clang libclang-rt-14-dev)  # clang + libFuzzer: the fuzz_short test
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# OpenBLAS on LibTorch's own OpenMP runtime: with the pthread build (Debian's default choice) the two
# thread pools fight over the cores and prefill runs ~4x slower (issue 13: 148 vs 610 tokens/s at
# 512 tokens on 2 cores). Select it through the BLAS alternatives when another is selected.
arch_lib=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
for alt in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  name="$alt-$(basename "$arch_lib")"
  want="$arch_lib/openblas-openmp/$alt"
  [ -e "$want" ] || continue
  if [ "$(readlink -f "/etc/alternatives/$name" 2>/dev/null)" != "$(readlink -f "$want")" ]; then
    echo "[setup] selecting $want for $name" >&2
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd update-alternatives --quiet --set "$name" "$want" >&2
  fi
done

build_dir=${KVLAB_BUILD_DIR:-build}
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${KVLAB_CMAKE_ARGS:-} >&2
fi
jobs=${KVLAB_JOBS:-$(nproc)}
cmake --build "$build_dir" -j "$jobs" >&2
echo "[setup] built $build_dir/apps/kvlab" >&2
